// Attention of a ragged batch's decode/verify rows over a paged float32 KV cache, read in place.
//
// Cache layout (one layer): K and V are [Hkv, num_slots, D], slot = block * block_size + offset,
// block = block_table[position / block_size]. Sequence b feeds q_len[b] query rows at positions
// ctx_len[b] - q_len[b] .. ctx_len[b] - 1 (their own K/V are already in the cache); row i may see
// keys j with lo(i) <= j <= pos(i), lo(i) = pos(i) - window + 1 (window 0 = no window, lo = 0).
// Query head h reads KV head h / (H / Hkv), as a repeat-interleaved GQA does.
//
// One task is (sequence, KV head, key split): its G * q_len query rows share every K/V row it
// loads. Softmax is the online, numerically stable form: per chunk of keys, with m the running
// max and l the running sum of exp(s - m),
//     m' = max(m, max_j s_j),  l' = l * e^(m - m') + sum_j e^(s_j - m'),
//     acc' = acc * e^(m - m') + sum_j e^(s_j - m') v_j,     out = acc / l.
// Keys are split at fixed positions (every SPLIT_KEYS) so long contexts give every thread work;
// the splits' (m, l, acc) merge with the same rescaling. The result equals
// softmax(q k^T * scale) v up to float32 summation order and exp rounding (within 2 ulp of
// expf), and a row's result depends only on its own query and visible keys: chunks and splits
// sit at absolute key positions, and keys a row may not see add exact zeros. So a row verified
// beside k others, in any batch, on any thread count, equals the same row decoded alone, bit for
// bit.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define CHUNK 32          // keys per online-softmax update
#define SPLIT_KEYS 256  // keys per split (a multiple of CHUNK)
#define MAX_D 256

// Eight partial-sum vectors -> their eight totals, in order.
static inline __m256 sum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                          __m256 a6, __m256 a7) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

typedef struct {
    const float* q;   // [T, H, D], rows q_stride floats apart
    const float* k;   // [Hkv, slots, D]
    const float* v;
    const int32_t* tables;
    int64_t q_stride, max_blocks, H, Hkv, D, bs, window, slots;
    float scale;
} Problem;

typedef struct {
    int64_t seq, kvh, key_lo, key_hi;  // keys [key_lo, key_hi) of this split
    int64_t q_start, q_len, ctx;
} Task;

// Scores of one query row against 8 keys (pointers ks[0..8)), scaled.
static inline __m256 dot8(const float* q, const float* const* ks, int64_t D, __m256 scale) {
    __m256 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(ks[j] + d), a[j]);
    }
    return _mm256_mul_ps(sum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), scale);
}

// acc [D] += sum_{j<n} p[j] v_j. Sixty-four dimensions at a time in eight registers, so the
// FMA chains run side by side; each p[j] is broadcast once per 64 dimensions.
static inline void accumulate_pv(float* acc, const float* p, const float* const* vp, int64_t n,
                                 int64_t D) {
    int64_t d = 0;
    for (; d + 64 <= D; d += 64) {
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_loadu_ps(acc + d + 8 * u);
        for (int64_t j = 0; j < n; j++) {
            const __m256 pj = _mm256_broadcast_ss(p + j);
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vp[j] + d + 8 * u), a[u]);
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(acc + d + 8 * u, a[u]);
    }
    for (; d < D; d += 8) {
        __m256 a = _mm256_loadu_ps(acc + d);
        for (int64_t j = 0; j < n; j++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(vp[j] + d), a);
        _mm256_storeu_ps(acc + d, a);
    }
}

// Rows of keys j0 .. j0+n-1 for one KV head, walking the block table; slots past n repeat
// the first key (their scores are masked).
static inline void chunk_rows(const Problem* P, const int32_t* table, int64_t kvh, int64_t j0,
                              int64_t n, const float** kp, const float** vp) {
    const int64_t bs = P->bs, D = P->D;
    for (int64_t j = 0, blk = j0 / bs, off = j0 % bs; j < CHUNK; j++) {
        if (j < n) {
            const int64_t slot = (int64_t)table[blk] * bs + off;
            kp[j] = P->k + (kvh * P->slots + slot) * D;
            vp[j] = P->v + (kvh * P->slots + slot) * D;
            if (++off == bs) off = 0, blk++;
        } else {
            kp[j] = kp[0], vp[j] = vp[0];
        }
    }
}

// Runs one task; leaves per row its running max m, sum l and unnormalised acc [D].
static void run_task(const Problem* P, const Task* t, float* m, float* l, float* acc) {
    const int64_t G = P->H / P->Hkv, D = P->D, rows = G * t->q_len;
    const int32_t* table = P->tables + t->seq * P->max_blocks;
    const float* qrow[rows];
    int64_t pos[rows];
    for (int64_t i = 0; i < t->q_len; i++)
        for (int64_t g = 0; g < G; g++) {
            qrow[i * G + g] = P->q + (t->q_start + i) * P->q_stride + (t->kvh * G + g) * D;
            pos[i * G + g] = t->ctx - t->q_len + i;
        }
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    memset(acc, 0, sizeof(float) * rows * D);
    const __m256 scale = _mm256_set1_ps(P->scale);
    const float* kp[CHUNK];
    const float* vp[CHUNK];
    for (int64_t j0 = t->key_lo; j0 < t->key_hi; j0 += CHUNK) {
        const int64_t n = t->key_hi - j0 < CHUNK ? t->key_hi - j0 : CHUNK;
        chunk_rows(P, table, t->kvh, j0, n, kp, vp);
        for (int64_t r = 0; r < rows; r++) {
            float sr[CHUNK];
            for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(sr + j, dot8(qrow[r], kp + j, D, scale));
            // Keys this row may not see: ahead of it, behind its window, or past the chunk's end.
            const int64_t lo = P->window > 0 ? pos[r] - P->window + 1 : 0;
            if (n < CHUNK || j0 + CHUNK - 1 > pos[r] || j0 < lo)
                for (int64_t j = 0; j < CHUNK; j++)
                    if (j >= n || j0 + j > pos[r] || j0 + j < lo) sr[j] = -INFINITY;
            __m256 vmax = _mm256_loadu_ps(sr);
            for (int64_t j = 8; j < CHUNK; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sr + j));
            float mx = hmax(vmax);
            const float m_new = mx > m[r] ? mx : m[r];
            if (m_new == -INFINITY) {  // nothing visible yet
                memset(sr, 0, sizeof(float) * CHUNK);
                continue;
            }
            const float alpha = expf(m[r] - m_new);  // 0 on the first visible chunk
            const __m256 mv = _mm256_set1_ps(m_new);
            __m256 sum = _mm256_setzero_ps();
            for (int64_t j = 0; j < CHUNK; j += 8) {
                const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mv));
                _mm256_storeu_ps(sr + j, p);
                sum = _mm256_add_ps(sum, p);
            }
            l[r] = l[r] * alpha + hsum(sum);
            m[r] = m_new;
            if (alpha != 1.0f) {
                const __m256 av = _mm256_set1_ps(alpha);
                for (int64_t d = 0; d < D; d += 8)
                    _mm256_storeu_ps(acc + r * D + d, _mm256_mul_ps(av, _mm256_loadu_ps(acc + r * D + d)));
            }
            accumulate_pv(acc + r * D, sr, vp, n, D);
        }
    }
}

// The first key any row of a sequence whose earliest query sits at `first` may see, rounded down
// to a chunk: chunks start at absolute multiples of CHUNK whatever the window.
static inline int64_t key_floor(int64_t first, int64_t window) {
    const int64_t lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0;
    return lo / CHUNK * CHUNK;
}

// Writes out rows of a task from its split results (m, l, acc per split, splits consecutive).
static void finish_rows(const Problem* P, const Task* t, int64_t splits, const float* m,
                        const float* l, const float* acc, float* out) {
    const int64_t G = P->H / P->Hkv, D = P->D, rows = G * t->q_len;
    for (int64_t r = 0; r < rows; r++) {
        float mx = -INFINITY;
        for (int64_t s = 0; s < splits; s++) mx = m[s * rows + r] > mx ? m[s * rows + r] : mx;
        float total = 0.0f, w[splits];
        for (int64_t s = 0; s < splits; s++) {
            w[s] = m[s * rows + r] == -INFINITY ? 0.0f : expf(m[s * rows + r] - mx);
            total += w[s] * l[s * rows + r];
        }
        const int64_t i = r / G, g = r % G;
        float* o = out + ((t->q_start + i) * P->H + t->kvh * G + g) * D;
        for (int64_t d = 0; d < D; d++) {
            float x = 0.0f;
            for (int64_t s = 0; s < splits; s++) x += w[s] * acc[(s * rows + r) * D + d];
            o[d] = total > 0.0f ? x / total : 0.0f;
        }
    }
}

// q rows are q_stride floats apart (heads contiguous within a row).
// seq_info [B, 3] = (first query row in q/out, q_len, ctx_len); tables [B, max_blocks] int32.
// out [T, H, D] receives the rows of these sequences only. Returns 0, or -1 when the shapes are
// outside what the kernel handles (D not a multiple of 8 or above MAX_D, H not a multiple of
// Hkv) or memory runs out; the caller then uses the reference path.
int paged_attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
                    const int64_t* seq_info, const int32_t* tables, int64_t max_blocks, int64_t B,
                    int64_t H, int64_t Hkv, int64_t D, int64_t block_size, float scale,
                    int64_t window, int64_t num_slots, int threads) {
    if (D % 8 || D > MAX_D || Hkv < 1 || H % Hkv || B < 1) return -1;
    const Problem P = {q, k_cache, v_cache, tables, q_stride, max_blocks, H, Hkv, D, block_size, window, num_slots, scale};
    int64_t n_tasks = 0, n_partial = 0;
    int64_t* splits = malloc(sizeof(int64_t) * B);
    if (!splits) return -1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t q_len = seq_info[3 * b + 1], ctx = seq_info[3 * b + 2];
        splits[b] = (ctx + SPLIT_KEYS - 1) / SPLIT_KEYS - key_floor(ctx - q_len, window) / SPLIT_KEYS;
        n_tasks += Hkv * splits[b];
        n_partial += Hkv * splits[b] * (H / Hkv) * q_len;
    }
    Task* tasks = malloc(sizeof(Task) * n_tasks);
    int64_t* first_task = malloc(sizeof(int64_t) * B * Hkv);
    float* pm = malloc(sizeof(float) * n_partial);
    float* pl = malloc(sizeof(float) * n_partial);
    float* pacc = malloc(sizeof(float) * n_partial * D);
    int64_t* offset = malloc(sizeof(int64_t) * n_tasks);  // task's first partial row
    int rc = 0;
    if (!tasks || !first_task || !pm || !pl || !pacc || !offset) {
        rc = -1;
        goto done;
    }
    for (int64_t b = 0, i = 0, off = 0; b < B; b++) {
        const int64_t q_start = seq_info[3 * b], q_len = seq_info[3 * b + 1], ctx = seq_info[3 * b + 2];
        const int64_t rows = (H / Hkv) * q_len;
        const int64_t floor = key_floor(ctx - q_len, window);
        const int64_t start = floor / SPLIT_KEYS * SPLIT_KEYS;
        for (int64_t h = 0; h < Hkv; h++) {
            first_task[b * Hkv + h] = i;
            for (int64_t s = 0; s < splits[b]; s++, i++) {
                const int64_t lo = start + s * SPLIT_KEYS, hi = lo + SPLIT_KEYS;
                // Keys before `floor` are hidden from every row: skipping them changes nothing.
                tasks[i] = (Task){b, h, lo > floor ? lo : floor, hi < ctx ? hi : ctx, q_start,
                                  q_len, ctx};
                offset[i] = off;
                off += rows;
            }
        }
    }
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_tasks; i++)
            run_task(&P, &tasks[i], pm + offset[i], pl + offset[i], pacc + offset[i] * D);
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * Hkv; bh++) {
            const int64_t i = first_task[bh];
            finish_rows(&P, &tasks[i], splits[bh / Hkv], pm + offset[i], pl + offset[i],
                        pacc + offset[i] * D, out);
        }
    }
done:
    free(splits), free(tasks), free(first_task), free(pm), free(pl), free(pacc), free(offset);
    return rc;
}

// Rotate-half RoPE in place on the first n_heads heads (D floats each) of T rows `stride` floats
// apart, with per-row tables cos/sin [T, D]:
//     lo' = lo * cos_lo - hi * sin_lo,   hi' = hi * cos_hi + lo * sin_hi,
// each product and sum rounded on its own (no FMA), as x * cos + rotate_half(x) * sin rounds.
void rope_rotate_half(float* x, int64_t stride, int64_t T, int64_t n_heads, int64_t D,
                      const float* cos, const float* sin) {
    const int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float* c = cos + t * D;
        const float* s = sin + t * D;
        for (int64_t h = 0; h < n_heads; h++) {
            float* lo = x + t * stride + h * D;
            float* hi = lo + half;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                const __m256 a = _mm256_loadu_ps(lo + i), b = _mm256_loadu_ps(hi + i);
                const __m256 a2 = _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)),
                                                _mm256_mul_ps(b, _mm256_loadu_ps(s + i)));
                const __m256 b2 = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + half + i)),
                                                _mm256_mul_ps(a, _mm256_loadu_ps(s + half + i)));
                _mm256_storeu_ps(lo + i, a2);
                _mm256_storeu_ps(hi + i, b2);
            }
            for (; i < half; i++) {
                const float a = lo[i], b = hi[i];
                lo[i] = a * c[i] - b * s[i];
                hi[i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}
