// decoder_layers (decoder.h): a layer's kernel calls in the Python layer's order, over the stack.

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "ggml_blocks.h"
#include "norms.h"
#include "paged_attention.h"
#include "rope.h"

// K/V of the T new rows (columns [H D, (H + Hkv) D) and [(H + Hkv) D, (H + 2 Hkv) D) of qkv)
// into their slots of the head-major cache.
static void write_kv(const float* qkv, int64_t T, int64_t width, const DecoderShape* s,
                     const DecoderBatch* b, void* k_cache, void* v_cache) {
    const int64_t D = s->D, q_size = s->H * D, kv_size = s->Hkv * D;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < s->Hkv; h++) {
            const int64_t at = (h * b->num_slots + b->slots[t]) * D;
            const float* k = qkv + t * width + q_size + h * D;
            const float* v = k + kv_size;
            if (b->esize == 4) {
                memcpy((float*)k_cache + at, k, sizeof(float) * D);
                memcpy((float*)v_cache + at, v, sizeof(float) * D);
                continue;
            }
            uint16_t* kd = (uint16_t*)k_cache + at;
            uint16_t* vd = (uint16_t*)v_cache + at;
            for (int64_t i = 0; i < D; i += 8) {
                const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
                _mm_storeu_si128((__m128i*)(kd + i), _mm256_cvtps_ph(_mm256_loadu_ps(k + i), round));
                _mm_storeu_si128((__m128i*)(vd + i), _mm256_cvtps_ph(_mm256_loadu_ps(v + i), round));
            }
        }
    }
}

// Whether every layer names a batch and a table it was given, and every new row's slot is in
// its batch's pool (write_kv writes there before attention checks its tables).
static int layers_fit(const DecoderLayer* layers, int64_t L, const DecoderBatch* batches,
                      int64_t T, const DecoderRopes* ropes) {
    int used[2] = {1, 0};  // the first batch is always given
    for (int64_t l = 0; l < L; l++) {
        const DecoderLayer* y = &layers[l];
        if (y->kind < 0 || y->kind > 1 || y->rope < 0 || y->rope > 1) return 0;
        if (!ropes->cos[y->rope] || !ropes->sin[y->rope]) return 0;
        used[y->kind] = 1;
    }
    for (int kind = 0; kind < 2; kind++)
        for (int64_t t = 0; used[kind] && t < T; t++)
            if (batches[kind].slots[t] < 0 || batches[kind].slots[t] >= batches[kind].num_slots)
                return 0;
    return 1;
}

// x = x + (the sublayer's output y, normed where the layer has that norm): with no norm, the
// projection adds the residual itself (fused); with one, it writes y and the norm adds.
static int project_add(int kind, const float* in, const uint8_t* w, float* x, float* y,
                       int64_t T, int64_t N, int64_t K, int threads, int glu, const float* out_norm,
                       const DecoderShape* s) {
    if (!out_norm)
        return ggml_matmul_fused(kind, in, w, x, T, N, K, threads, 0, 0.0f, glu, 0, x, s->q8);
    const int r = ggml_matmul_fused(kind, in, w, y, T, N, K, threads, 0, 0.0f, glu, 0, 0, s->q8);
    if (r == 0) rms_norm_add(y, x, x, T, N, out_norm, s->eps);
    return r;
}

int decoder_layers(const DecoderLayer* layers, int64_t L, const DecoderShape* s,
                   const DecoderBatch batches[2], float* x, int64_t T, const DecoderRopes* ropes,
                   int threads) {
    const int64_t D = s->D, width = (s->H + 2 * s->Hkv) * D, hidden = s->hidden;
    if (!layers_fit(layers, L, batches, T, ropes)) return -2;
    float* qkv = malloc(sizeof(float) * T * width);
    float* attn = malloc(sizeof(float) * T * s->H * D);
    float* gate_up = malloc(sizeof(float) * T * 2 * s->inter);
    float* y_out = malloc(sizeof(float) * T * hidden);
    int rc = qkv && attn && gate_up && y_out ? 0 : -1;
    for (int64_t l = 0; rc == 0 && l < L; l++) {
        const DecoderLayer* y = &layers[l];
        const DecoderBatch* b = &batches[y->kind];
        const int glu = y->glu ? y->glu : GLU_SILU;
        int r = ggml_matmul_fused(y->qkv_kind, x, y->qkv, qkv, T, width, hidden, threads,
                                  y->norm1, s->eps, 0, y->qkv_bias, 0, s->q8);
        if (r == 0) {
            if (y->q_norm) rms_norm_heads(qkv, width, T, 0, s->H, D, y->q_norm, s->eps);
            if (y->k_norm) rms_norm_heads(qkv, width, T, s->H, s->Hkv, D, y->k_norm, s->eps);
            rope_rotate_half(qkv, width, T, s->H + s->Hkv, D, s->rotary ? s->rotary : D,
                             ropes->cos[y->rope], ropes->sin[y->rope]);
            write_kv(qkv, T, width, s, b, y->k_cache, y->v_cache);
            r = paged_attention(qkv, width, y->k_cache, y->v_cache, b->esize, attn, b->seq_info,
                                b->tables, b->max_blocks, b->B, s->H, s->Hkv, D, b->block_size,
                                s->scale, b->window, b->num_slots, threads);
        }
        if (r == 0)
            r = project_add(y->o_kind, attn, y->o, x, y_out, T, hidden, s->H * D, threads,
                            GLU_NONE, y->attn_out_norm, s);
        if (r == 0)
            r = ggml_matmul_fused(y->gate_up_kind, x, y->gate_up, gate_up, T, 2 * s->inter,
                                  hidden, threads, y->norm2, s->eps, 0, 0, 0, s->q8);
        if (r == 0)
            r = project_add(y->down_kind, gate_up, y->down, x, y_out, T, hidden, s->inter,
                            threads, glu, y->mlp_out_norm, s);
        if (r != 0) rc = (int)(-2 - l);
    }
    free(qkv), free(attn), free(gate_up), free(y_out);
    return rc;
}
