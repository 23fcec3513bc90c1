// eagle_chain (eagle_chain.h): the catch-up rows, then the greedy chain, for B sequences.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "eagle_chain.h"
#include "ggml_blocks.h"
#include "simd.h"

static inline int stopped(int64_t count, int64_t k, float reach, float continue_above) {
    return count >= k || reach < continue_above;
}

// The first place of a row's largest score; *total = sum_i e^(s_i - max) (exp256, within 2 ulp
// of expf), so that the pick's softmax probability is 1 / *total. A NaN or infinite score gives
// a NaN total and the pick 0, as torch's softmax (NaN throughout) and max give the torch path.
static int64_t pick_row(const float* row, int64_t K, float* total) {
    int64_t i = 0;
    __m256 vmax = _mm256_set1_ps(row[0]), nan = _mm256_setzero_ps();
    for (; i + 8 <= K; i += 8) {
        const __m256 v = _mm256_loadu_ps(row + i);
        vmax = _mm256_max_ps(vmax, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float mx = hmax(vmax);
    int bad = _mm256_movemask_ps(nan);
    for (; i < K; i++) bad |= row[i] != row[i], mx = row[i] > mx ? row[i] : mx;
    if (bad || isinf(mx)) {  // (no score would equal a NaN max: the search would run off the row)
        *total = NAN;
        return 0;
    }
    int64_t best = 0;
    while (row[best] != mx) best++;
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= K; i += 8) sum = _mm256_add_ps(sum, exp256(_mm256_sub_ps(_mm256_loadu_ps(row + i), m)));
    float t = hsum(sum);
    for (; i < K; i++) t += expf(row[i] - mx);
    *total = t;
    return best;
}

// Rows of B sequences through the head: cat [T, 2 hidden] (a feature and an embedding a row)
// -> the fused input projection -> the layer (sequence b's n[b] consecutive rows, its first at
// cache slot slot[b], lane position at[b] and output position pos[b]) -> the final norm, into
// out [T, hidden]. x [T, hidden], rope [2 T, D] and index [T + 3 B] are scratch.
static int head_rows(const DecoderLayer* layer, const DecoderShape* s, const EagleChain* c,
                     const DecoderBatch* lanes, const float* cat, int64_t T, const int64_t* n,
                     const int64_t* slot, const int64_t* at, const int64_t* pos, float* x,
                     float* rope, int64_t* index, float* out, int threads) {
    const int64_t B = lanes->B, H = s->hidden, D = s->D;
    if (ggml_matmul_fused(c->fc_kind, cat, c->fc, x, T, H, 2 * H, threads, 0, 0.0f, 0, 0, 0,
                          c->q8) != 0)
        return -2;
    for (int64_t b = 0, row = 0; b < B; b++) {
        index[T + 3 * b] = row, index[T + 3 * b + 1] = n[b], index[T + 3 * b + 2] = at[b] + n[b];
        for (int64_t i = 0; i < n[b]; i++, row++) {
            index[row] = slot[b] + i;
            memcpy(rope + row * D, c->cos + (pos[b] + i) * D, sizeof(float) * D);
            memcpy(rope + (T + row) * D, c->sin + (pos[b] + i) * D, sizeof(float) * D);
        }
    }
    DecoderBatch step = *lanes;
    step.slots = index, step.seq_info = index + T;
    const DecoderRopes ropes = {{rope, 0}, {rope + T * D, 0}};
    if (decoder_layers(layer, 1, s, &step, x, T, &ropes, threads) != 0) return -2;
    for (int64_t t = 0; t < T; t++) prepare_row(x + t * H, out + t * H, H, c->norm, c->eps, 0);
    return 0;
}

int eagle_chain(const DecoderLayer* layer, const DecoderShape* s, const EagleChain* c,
                const DecoderBatch* lanes, const int64_t* seqs, const float* feats,
                const float* embeds, int64_t T, float* g, float* last, int32_t* places,
                float* probs, int64_t* counts, int threads) {
    const int64_t B = lanes->B, H = s->hidden, K = c->K, rows = T > B ? T : B;
    const int64_t *ks = seqs + 3 * B, *pending = seqs + 4 * B;
    int64_t kmax = 0, total_pending = 0;
    for (int64_t b = 0; b < B; b++)
        kmax = ks[b] > kmax ? ks[b] : kmax, counts[b] = 0, total_pending += pending[b];
    // Every row runs while any chain drafts on: each needs RoPE rows and lane slots for kmax.
    for (int64_t b = 0; b < B; b++)
        if (seqs[2 * B + b] < 0 || seqs[2 * B + b] + pending[b] + kmax > c->rope_rows ||
            seqs[B + b] < 0 || seqs[B + b] + pending[b] + kmax > lanes->max_blocks * lanes->block_size ||
            pending[b] < 0)
            return -2;
    if (total_pending != T) return -2;
    float* scores = malloc(sizeof(float) * B * K);
    float* cat = malloc(sizeof(float) * rows * 2 * H);
    float* x = malloc(sizeof(float) * rows * H);
    float* out = malloc(sizeof(float) * rows * H);
    float* rope = malloc(sizeof(float) * 2 * rows * s->D);
    float* reach = malloc(sizeof(float) * 2 * B);  // then each row's softmax sum
    float* total = reach ? reach + B : 0;
    // index [rows + 3 B] for head_rows, then picks, ones, slot, at, pos [B] each
    int64_t* index = malloc(sizeof(int64_t) * (rows + 8 * B));
    int rc = scores && cat && x && out && rope && reach && index ? 0 : -1;
    int64_t* pick = rc == 0 ? index + rows + 3 * B : 0;
    int64_t *ones = pick + B, *slot = ones + B, *at = slot + B, *pos = at + B;
    if (rc == 0 && T > 0) {  // the pending pairs first: their keys join the lanes
        for (int64_t t = 0; t < T; t++) {
            memcpy(cat + t * 2 * H, feats + t * H, sizeof(float) * H);
            memcpy(cat + t * 2 * H + H, embeds + t * H, sizeof(float) * H);
        }
        rc = head_rows(layer, s, c, lanes, cat, T, pending, seqs, seqs + B, seqs + 2 * B, x, rope,
                       index, out, threads);
        for (int64_t b = 0, end = 0; rc == 0 && b < B; b++)
            if (pending[b] > 0) end += pending[b], memcpy(g + b * H, out + (end - 1) * H, sizeof(float) * H);
    }
    if (rc == 0) memcpy(last, g, sizeof(float) * B * H);
    for (int64_t b = 0; rc == 0 && b < B; b++) {
        reach[b] = 1.0f, ones[b] = 1;
        slot[b] = seqs[b] + pending[b], at[b] = seqs[B + b] + pending[b];
        pos[b] = seqs[2 * B + b] + pending[b];
    }
    for (int64_t j = 0; rc == 0 && j < kmax; j++) {
        if (ggml_matmul_fused(c->vocab_kind, g, c->vocab_rows, scores, B, K, H, threads, 0, 0.0f,
                              0, 0, 0, c->q8) != 0) {
            rc = -2;
            break;
        }
#pragma omp parallel for schedule(static) num_threads(threads) if (B > 1)
        for (int64_t b = 0; b < B; b++) pick[b] = pick_row(scores + b * K, K, total + b);
        int live = 0;
        for (int64_t b = 0; b < B; b++) {
            const int64_t best = pick[b];
            if (!stopped(counts[b], ks[b], reach[b], c->continue_above)) {
                const float p = 1.0f / total[b];
                places[b * kmax + counts[b]] = (int32_t)best;
                probs[b * kmax + counts[b]] = p;
                counts[b]++;
                reach[b] *= p;
                live |= !stopped(counts[b], ks[b], reach[b], c->continue_above);
            }
            memcpy(cat + b * 2 * H, g + b * H, sizeof(float) * H);
            memcpy(cat + b * 2 * H + H, c->vocab_embed + best * H, sizeof(float) * H);
        }
        if (!live) break;  // every chain has stopped: nothing more to run
        rc = head_rows(layer, s, c, lanes, cat, B, ones, slot, at, pos, x, rope, index, g, threads);
        for (int64_t b = 0; b < B; b++) slot[b]++, at[b]++, pos[b]++;
    }
    free(scores), free(cat), free(x), free(out), free(rope), free(reach), free(index);
    return rc;
}
