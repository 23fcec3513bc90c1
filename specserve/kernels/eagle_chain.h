// The EAGLE head's drafting chain in one native call (`speculation/eagle_native.py` calls it),
// built into the GGUF block library after decoder.h. One chain step is, for B sequences at once:
//   scores = g @ V^T                        V: the draft vocabulary's rows of the target's lm_head
//   place  = argmax scores, p = its softmax probability (1 / sum_j e^(s_j - max))
//   x      = [g, E[place]] @ Wfc^T           E: the draft vocabulary's embeddings (float32)
//   x      = the head's decoder layer over x (decoder_layers: keys into the lanes' slots)
//   g      = RMSNorm(x) * w_norm
// the same kernel calls, with the same arguments, that the Python loop makes (BlockLinear in the
// q8 numerics, then NativeHead.forward), so scores, places and the layer's outputs equal that
// loop's bit for bit; p and the final norm round as this file does (float32 sums in another
// order than torch's: within float tolerance). What goes away is the ~15 framework calls a
// step costs in Python, each several times its warm cost right after the target's forward.
//
// A chain stops when it holds k tokens or the product of its probabilities falls below
// `continue_above` (eagle_state.Chain.done); a stopped chain's rows still run while any other
// drafts on (its token only feeds the next step, as in Python), and the call ends when all
// have stopped. Greedy chains only: sampled ones need the engine's sampler (Python).

#pragma once

typedef struct {
    const uint8_t* vocab_rows;  // [K] block rows of hidden (the draft vocabulary's lm_head rows)
    const float* vocab_embed;   // [K, hidden]
    const uint8_t* fc;          // [hidden] block rows of 2 hidden
    const float* norm;          // [hidden] the head's final RMSNorm weight
    const float* cos;           // [rope_rows, D] RoPE tables by output position
    const float* sin;
    int64_t K, rope_rows;
    int32_t vocab_kind, fc_kind, q8;
    float eps, continue_above;
} EagleChain;

static inline int stopped(int64_t count, int64_t k, float reach, float continue_above) {
    return count >= k || reach < continue_above;
}

// The first place of a row's largest score; *total = sum_i e^(s_i - max) (exp256, within 2 ulp
// of expf), so that the pick's softmax probability is 1 / *total.
static int64_t pick_row(const float* row, int64_t K, float* total) {
    int64_t i = 0;
    __m256 vmax = _mm256_set1_ps(row[0]);
    for (; i + 8 <= K; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(row + i));
    float mx = hmax(vmax);
    for (; i < K; i++) mx = row[i] > mx ? row[i] : mx;
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

// Per sequence b (its lane as DecoderBatch's tables row b): slot0[b] the cache slot, at0[b] the
// lane-logical position and pos0[b] the output position of its first chain row; ks[b] the most
// tokens to draft. g [B, hidden]: the head's outputs at the newest verified positions (used as
// scratch). Writes places [B, kmax] (rows of the draft vocabulary), probs [B, kmax] and counts
// [B]. 0 on success, -1 when buffers could not be allocated, -2 on a failed kernel call, or
// (nothing run) where kmax rows from a sequence's first would leave its lane or the RoPE tables.
int eagle_chain(const DecoderLayer* layer, const DecoderShape* s, const EagleChain* c,
                const DecoderBatch* lanes, const int64_t* slot0, const int64_t* at0,
                const int64_t* pos0, const int64_t* ks, float* g, int32_t* places, float* probs,
                int64_t* counts, int threads) {
    const int64_t B = lanes->B, H = s->hidden, D = s->D, K = c->K;
    int64_t kmax = 0;
    for (int64_t b = 0; b < B; b++) kmax = ks[b] > kmax ? ks[b] : kmax, counts[b] = 0;
    // Every row runs while any chain drafts on: each needs RoPE rows and lane slots for kmax.
    for (int64_t b = 0; b < B; b++)
        if (pos0[b] < 0 || pos0[b] + kmax > c->rope_rows || at0[b] < 0 ||
            at0[b] + kmax > lanes->max_blocks * lanes->block_size)
            return -2;
    float* scores = malloc(sizeof(float) * B * K);
    float* cat = malloc(sizeof(float) * B * 2 * H);
    float* x = malloc(sizeof(float) * B * H);
    float* rope = malloc(sizeof(float) * 2 * B * D);
    float* reach = malloc(sizeof(float) * 2 * B);  // then each row's softmax sum
    float* total = reach ? reach + B : 0;
    int64_t* index = malloc(sizeof(int64_t) * 5 * B);  // slots [B], seq_info [B, 3], picks [B]
    int64_t* pick = index ? index + 4 * B : 0;
    int rc = scores && cat && x && rope && reach && index ? 0 : -1;
    for (int64_t b = 0; rc == 0 && b < B; b++) reach[b] = 1.0f;
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
        if (ggml_matmul_fused(c->fc_kind, cat, c->fc, x, B, H, 2 * H, threads, 0, 0.0f, 0, 0, 0,
                              c->q8) != 0) {
            rc = -2;
            break;
        }
        for (int64_t b = 0; b < B; b++) {
            index[b] = slot0[b] + j;
            index[B + 3 * b] = b, index[B + 3 * b + 1] = 1, index[B + 3 * b + 2] = at0[b] + j + 1;
            memcpy(rope + b * D, c->cos + (pos0[b] + j) * D, sizeof(float) * D);
            memcpy(rope + (B + b) * D, c->sin + (pos0[b] + j) * D, sizeof(float) * D);
        }
        DecoderBatch step = *lanes;
        step.slots = index, step.seq_info = index + B;
        if (decoder_layers(layer, 1, s, &step, x, B, rope, rope + B * D, threads) != 0) {
            rc = -2;
            break;
        }
        for (int64_t b = 0; b < B; b++) {
            const float* xr = x + b * H;
            float sq = 0.0f;
            for (int64_t i = 0; i < H; i++) sq += xr[i] * xr[i];
            const float inv = 1.0f / sqrtf(sq / (float)H + c->eps);
            for (int64_t i = 0; i < H; i++) g[b * H + i] = (xr[i] * inv) * c->norm[i];
        }
    }
    free(scores), free(cat), free(x), free(rope), free(reach), free(index);
    return rc;
}
