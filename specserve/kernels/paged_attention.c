// Attention of a ragged batch's query rows over a paged KV cache, read in place. K/V elements are
// float32 or IEEE fp16; fp16 rows are widened to float32 (F16C, exact) a chunk at a time, so both
// caches run the same float32 arithmetic on the values they hold.
//
// Cache layout (one layer): K and V are [Hkv, num_slots, D], slot = block * block_size + offset,
// block = block_table[position / block_size]. Sequence b feeds q_len[b] query rows at positions
// ctx_len[b] - q_len[b] .. ctx_len[b] - 1 (their own K/V are already in the cache); row i may see
// keys j with lo(i) <= j <= pos(i), lo(i) = pos(i) - window + 1 (window 0 = no window, lo = 0).
// Query head h reads KV head h / (H / Hkv), as a repeat-interleaved GQA does.
//
// Softmax is the online, numerically stable form: per chunk of keys, with m the running max and l
// the running sum of exp(s - m),
//     m' = max(m, max_j s_j),  l' = l * e^(m - m') + sum_j e^(s_j - m'),
//     acc' = acc * e^(m - m') + sum_j e^(s_j - m') v_j,
// per split of keys; the splits merge as out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s,
// M = max_s m_s, in split order. The result equals softmax(q k^T * scale) v up to float32
// summation order and exp rounding (within 2 ulp of expf).
//
// Invariance: chunks start at absolute multiples of CHUNK and splits at absolute multiples of
// SPLIT_KEYS, so a row's arithmetic depends only on its query, its position and the keys it may
// see. A chunk a row cannot see is skipped for that row (updating with it would be an exact
// no-op), keys past its position in a chunk it sees are not read, and a split it cannot see
// leaves m = -inf, l = 0, acc = 0, which the merge adds as exact zeros. How rows are grouped into tasks (a decode row, k + 1 verify rows, a prefill block) and
// how many threads run them decides where work runs, never a row's result: a row verified beside
// k others, prefilled in a chunk of any size, or attending to a prefix taken from the prefix
// cache, equals the same row decoded alone, bit for bit.
//
// Two task shapes. A sequence feeding at most SPLIT_QUERY rows (decode, verify) gets one task per
// (KV head, key split), so a long context gives every thread work; its G * q_len rows share every
// K/V row loaded, and its splits merge afterwards. A longer one (a prefill chunk) gets one task
// per (KV head, QBLOCK positions) that runs the splits its rows see in turn and merges them.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_simd.h"
#include "paged_attention.h"
#include "simd.h"

#define CHUNK 32          // keys per online-softmax update
#define SPLIT_KEYS 256    // keys per split (a multiple of CHUNK)
#define SPLIT_QUERY 32    // sequences with more query rows are split by query blocks
#define QBLOCK 16         // query positions per task of such a sequence
#define MAX_D 256

typedef struct {
    const float* q;  // [T, H, D], rows q_stride floats apart
    const char* k;   // [Hkv, slots, D] elements of esize bytes (4: float32, 2: fp16)
    const char* v;
    const int32_t* tables;
    int64_t q_stride, max_blocks, H, Hkv, D, bs, window, slots, esize;
    float scale;
} Problem;

// Query rows [i_lo, i_hi) of one sequence (its rows q_start .. q_start + q_len - 1 in q) against
// KV head kvh, over the key splits [s_lo, s_hi).
typedef struct {
    int64_t seq, kvh, i_lo, i_hi, s_lo, s_hi, q_start, q_len, ctx;
} Task;

// Rows of keys j0 .. j0+n-1 for one KV head as float32, walking the block table: pointers into a
// float32 cache, or into kbuf/vbuf [CHUNK, D] where fp16 rows are widened. Entries past n repeat
// the first key (their scores are masked).
static inline void load_chunk(const Problem* P, const int32_t* table, int64_t kvh, int64_t j0,
                              int64_t n, float* kbuf, float* vbuf, const float** kp,
                              const float** vp) {
    const int64_t bs = P->bs, D = P->D;
    for (int64_t j = 0, blk = j0 / bs, off = j0 % bs; j < n; j++) {
        const int64_t at = (kvh * P->slots + (int64_t)table[blk] * bs + off) * D;
        if (P->esize == 2) {
            widen((const uint16_t*)P->k + at, kbuf + j * D, D);
            widen((const uint16_t*)P->v + at, vbuf + j * D, D);
            kp[j] = kbuf + j * D, vp[j] = vbuf + j * D;
        } else {
            kp[j] = (const float*)P->k + at, vp[j] = (const float*)P->v + at;
        }
        if (++off == bs) off = 0, blk++;
    }
    for (int64_t j = n; j < CHUNK; j++) kp[j] = kp[0], vp[j] = vp[0];
}

// One row's online-softmax update with the chunk's keys j0 .. j0+n-1 (some visible to it).
static inline void update_row(const float* q, int64_t pos, int64_t lo, int64_t j0, int64_t n,
                              const float* const* kp, const float* const* vp, int64_t D,
                              __m256 scale, float* m, float* l, float* acc) {
    // Keys past the row's own position are never read: it reduces over the same keys, in the
    // same lanes, whatever else the chunk holds.
    const int64_t seen = pos - j0 + 1 < n ? pos - j0 + 1 : n;
    float sr[CHUNK];
    for (int64_t j = 0; j < seen; j += 8) _mm256_storeu_ps(sr + j, dot8(q, kp + j, D, scale));
    // Keys this row may not see: ahead of it, behind its window, or past the chunk's end.
    if (n < CHUNK || j0 + CHUNK - 1 > pos || j0 < lo)
        for (int64_t j = 0; j < CHUNK; j++)
            if (j >= n || j0 + j > pos || j0 + j < lo) sr[j] = -INFINITY;
    __m256 vmax = _mm256_loadu_ps(sr);
    for (int64_t j = 8; j < CHUNK; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sr + j));
    const float mx = hmax(vmax);
    const float m_new = mx > *m ? mx : *m;
    const float alpha = expf(*m - m_new);  // 0 on the first visible chunk
    const __m256 mv = _mm256_set1_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < CHUNK; j += 8) {
        const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mv));
        _mm256_storeu_ps(sr + j, p);
        sum = _mm256_add_ps(sum, p);
    }
    *l = *l * alpha + hsum(sum);
    *m = m_new;
    if (alpha != 1.0f) {
        const __m256 av = _mm256_set1_ps(alpha);
        for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(acc + d, _mm256_mul_ps(av, _mm256_loadu_ps(acc + d)));
    }
    accumulate_pv(acc, sr, vp, seen, D);
}

// Keys [key_lo, key_hi) (key_lo a multiple of CHUNK) for the task's rows: leaves per row its
// running max m, sum l and unnormalised acc [D].
static void attend_split(const Problem* P, const Task* t, const float* const* qrow,
                         const int64_t* pos, int64_t rows, int64_t key_lo, int64_t key_hi,
                         float* m, float* l, float* acc) {
    const int64_t D = P->D;
    const int32_t* table = P->tables + t->seq * P->max_blocks;
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    memset(acc, 0, sizeof(float) * rows * D);
    float kbuf[P->esize == 2 ? CHUNK * D : 1], vbuf[P->esize == 2 ? CHUNK * D : 1];
    const float* kp[CHUNK];
    const float* vp[CHUNK];
    const __m256 scale = _mm256_set1_ps(P->scale);
    for (int64_t j0 = key_lo; j0 < key_hi; j0 += CHUNK) {
        const int64_t n = key_hi - j0 < CHUNK ? key_hi - j0 : CHUNK;
        load_chunk(P, table, t->kvh, j0, n, kbuf, vbuf, kp, vp);
        for (int64_t r = 0; r < rows; r++) {
            const int64_t lo = P->window > 0 ? pos[r] - P->window + 1 : 0;
            if (j0 > pos[r] || j0 + n <= lo) continue;  // hidden from this row
            update_row(qrow[r], pos[r], lo, j0, n, kp, vp, D, scale, m + r, l + r, acc + r * D);
        }
    }
}

// The first key a row at position `first` may see, rounded down to a chunk.
static inline int64_t key_floor(int64_t first, int64_t window) {
    const int64_t lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0;
    return lo / CHUNK * CHUNK;
}

// Writes the task's rows from their per-split (m, l, acc), split s at rows s * rows ...
static void merge_rows(const Problem* P, const Task* t, int64_t splits, const float* m,
                       const float* l, const float* acc, float* out) {
    const int64_t G = P->H / P->Hkv, D = P->D, rows = G * (t->i_hi - t->i_lo);
    for (int64_t r = 0; r < rows; r++) {
        float mx = -INFINITY;
        for (int64_t s = 0; s < splits; s++) mx = m[s * rows + r] > mx ? m[s * rows + r] : mx;
        float total = 0.0f, w[splits];
        for (int64_t s = 0; s < splits; s++) {
            w[s] = m[s * rows + r] == -INFINITY ? 0.0f : expf(m[s * rows + r] - mx);
            total += w[s] * l[s * rows + r];
        }
        const int64_t i = t->i_lo + r / G, g = r % G;
        float* o = out + ((t->q_start + i) * P->H + t->kvh * G + g) * D;
        for (int64_t d = 0; d < D; d++) {
            float x = 0.0f;
            for (int64_t s = 0; s < splits; s++) x += w[s] * acc[(s * rows + r) * D + d];
            o[d] = total > 0.0f ? x / total : 0.0f;
        }
    }
}

// Runs a task's splits into m, l, acc [splits][rows] (its partial results); with `out`, which
// needs them freshly allocated, merges them into its rows there. -1 when memory runs out.
static int run_task(const Problem* P, const Task* t, float* m, float* l, float* acc, float* out) {
    const int64_t G = P->H / P->Hkv, D = P->D, rows = G * (t->i_hi - t->i_lo);
    const int64_t first = t->ctx - t->q_len + t->i_lo, last = t->ctx - t->q_len + t->i_hi - 1;
    const float* qrow[rows];
    int64_t pos[rows];
    for (int64_t r = 0; r < rows; r++) {
        qrow[r] = P->q + (t->q_start + t->i_lo + r / G) * P->q_stride + (t->kvh * G + r % G) * D;
        pos[r] = first + r / G;
    }
    const int64_t splits = t->s_hi - t->s_lo, floor = key_floor(first, P->window);
    if (out) {
        m = malloc(sizeof(float) * splits * rows), l = malloc(sizeof(float) * splits * rows);
        acc = malloc(sizeof(float) * splits * rows * D);
    }
    if (m && l && acc) {
        for (int64_t s = t->s_lo; s < t->s_hi; s++) {
            // Keys before `floor` or past `last` are hidden from every row: skipping them changes nothing.
            const int64_t lo = s * SPLIT_KEYS > floor ? s * SPLIT_KEYS : floor;
            const int64_t hi = (s + 1) * SPLIT_KEYS < last + 1 ? (s + 1) * SPLIT_KEYS : last + 1;
            const int64_t at = (s - t->s_lo) * rows;
            attend_split(P, t, qrow, pos, rows, lo, hi, m + at, l + at, acc + at * D);
        }
        if (out) merge_rows(P, t, splits, m, l, acc, out);
    }
    const int ok = m && l && acc;
    if (out) free(m), free(l), free(acc);
    return ok ? 0 : -1;
}

// Whether sequence b reads only what it was given: its rows after row 0 and no more of them
// than its context, its context within its table, every block of the table it reads (from its
// first visible key's chunk) within the pool of `slots` slots. One check per sequence, so that a
// caller's inconsistent metadata is refused instead of read past the cache.
static int sequence_in_range(const Problem* P, const int64_t* info, int64_t b) {
    const int64_t q_start = info[3 * b], q_len = info[3 * b + 1], ctx = info[3 * b + 2];
    if (q_len < 1) return q_len == 0;  // nothing to attend
    if (q_start < 0 || q_len > ctx || ctx > P->max_blocks * P->bs) return 0;
    const int32_t* table = P->tables + b * P->max_blocks;
    const int64_t pool_blocks = P->slots / P->bs;
    for (int64_t blk = key_floor(ctx - q_len, P->window) / P->bs; blk < (ctx + P->bs - 1) / P->bs;
         blk++)
        if (table[blk] < 0 || table[blk] >= pool_blocks) return 0;
    return 1;
}

// Tasks of sequence b into `tasks` (when not NULL), starting at index i; returns the next index.
// Split tasks get their partial rows' offset in `offset` (advancing *off); query-block tasks -1.
static int64_t plan_sequence(const Problem* P, const int64_t* info, int64_t b, Task* tasks,
                             int64_t* offset, int64_t i, int64_t* off) {
    const int64_t q_start = info[3 * b], q_len = info[3 * b + 1], ctx = info[3 * b + 2];
    const int64_t G = P->H / P->Hkv;
    if (q_len < 1) return i;
    if (q_len <= SPLIT_QUERY) {
        const int64_t s_lo = key_floor(ctx - q_len, P->window) / SPLIT_KEYS;
        const int64_t s_hi = (ctx + SPLIT_KEYS - 1) / SPLIT_KEYS;
        for (int64_t h = 0; h < P->Hkv; h++)
            for (int64_t s = s_lo; s < s_hi; s++, i++, *off += G * q_len)
                if (tasks) {
                    tasks[i] = (Task){b, h, 0, q_len, s, s + 1, q_start, q_len, ctx};
                    offset[i] = *off;
                }
        return i;
    }
    // Query blocks from the last (the most keys) down: the longest tasks are handed out first.
    for (int64_t i_lo = (q_len - 1) / QBLOCK * QBLOCK; i_lo >= 0; i_lo -= QBLOCK)
        for (int64_t h = 0; h < P->Hkv; h++, i++) {
            if (!tasks) continue;
            const int64_t i_hi = i_lo + QBLOCK < q_len ? i_lo + QBLOCK : q_len;
            const int64_t first = ctx - q_len + i_lo, last = ctx - q_len + i_hi - 1;
            const int64_t s_lo = key_floor(first, P->window) / SPLIT_KEYS;
            tasks[i] = (Task){b, h, i_lo, i_hi, s_lo, last / SPLIT_KEYS + 1, q_start, q_len, ctx};
            offset[i] = -1;
        }
    return i;
}

int paged_attention(const float* q, int64_t q_stride, const void* k_cache, const void* v_cache,
                    int64_t esize, float* out, const int64_t* seq_info, const int32_t* tables,
                    int64_t max_blocks, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                    int64_t block_size, float scale, int64_t window, int64_t num_slots,
                    int threads) {
    if (D % 8 || D > MAX_D || Hkv < 1 || H % Hkv || B < 1 || (esize != 2 && esize != 4)) return -1;
    if (block_size < 1 || max_blocks < 0 || num_slots < 0) return -1;
    const Problem P = {q, k_cache, v_cache, tables, q_stride, max_blocks, H, Hkv, D, block_size,
                       window, num_slots, esize, scale};
    for (int64_t b = 0; b < B; b++)
        if (!sequence_in_range(&P, seq_info, b)) return -1;
    int64_t n_tasks = 0, n_partial = 0;
    for (int64_t b = 0; b < B; b++)
        n_tasks = plan_sequence(&P, seq_info, b, NULL, NULL, n_tasks, &n_partial);
    Task* tasks = malloc(sizeof(Task) * n_tasks);
    int64_t* offset = malloc(sizeof(int64_t) * n_tasks);  // a split task's first partial row
    int rc = tasks && offset ? 0 : -1;
    for (int64_t b = 0, i = 0, off = 0; rc == 0 && b < B; b++)
        i = plan_sequence(&P, seq_info, b, tasks, offset, i, &off);
    float* pm = malloc(sizeof(float) * (n_partial + 1));
    float* pl = malloc(sizeof(float) * (n_partial + 1));
    float* pacc = malloc(sizeof(float) * (n_partial + 1) * D);
    if (!pm || !pl || !pacc) rc = -1;
    const int64_t n_run = rc == 0 ? n_tasks : 0;  // nothing runs after a failed allocation
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_run; i++) {
            const int64_t o = offset[i];
            const int r = o < 0 ? run_task(&P, &tasks[i], NULL, NULL, NULL, out)
                                : run_task(&P, &tasks[i], pm + o, pl + o, pacc + o * D, NULL);
            if (r != 0) {
#pragma omp atomic write
                rc = r;
            }
        }
        // The first split task of a (sequence, KV head) merges its splits.
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_run; i++) {
            const Task* t = &tasks[i];
            if (offset[i] >= 0 && t->s_lo == key_floor(t->ctx - t->q_len, P.window) / SPLIT_KEYS) {
                const int64_t splits = (t->ctx + SPLIT_KEYS - 1) / SPLIT_KEYS - t->s_lo;
                merge_rows(&P, t, splits, pm + offset[i], pl + offset[i], pacc + offset[i] * D, out);
            }
        }
    }
    free(tasks), free(offset), free(pm), free(pl), free(pacc);
    return rc;
}
