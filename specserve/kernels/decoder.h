// The decoder stack's layers in one native call, built into the GGUF block library
// (`ggml_blocks.c` includes this file last; `models/native_stack.py` calls it).
//
// A layer is the same sequence of kernel calls the Python layer makes, with the same arguments:
//   qkv  = ggml_matmul_fused(RMSNorm(x) @ Wqkv^T + b)        (norm fused in)
//   RoPE on the q and k heads of qkv                          (rope_rotate_half)
//   K/V of the new rows into their cache slots                (float32 copied, fp16 rounded to
//                                                              nearest even, as torch's .to())
//   attn = paged_attention(q, cache)
//   x    = x + attn @ Wo^T                                    (residual fused, in place)
//   gu   = RMSNorm(x) @ Wgu^T
//   x    = x + (silu(gu[:, :I]) * gu[:, I:]) @ Wdown^T        (gate and residual fused)
// so its outputs equal the Python layer's bit for bit: what goes away is the framework's
// per-operation work between the calls (argument checks, tensor allocation, dispatch), which is
// a third of a batch-1 decode step on a small model.

#pragma once

#include "paged_attention.c"  // paged_attention, rope_rotate_half: compiled into this library too

// One layer's weights, as block rows of their kind (KIND_Q4_1 / KIND_Q8_0), and its KV cache.
typedef struct {
    const float* norm1;     // [hidden] input RMSNorm weight
    const uint8_t* qkv;     // [(H + 2 Hkv) D] rows
    const float* qkv_bias;  // [(H + 2 Hkv) D] or NULL
    const uint8_t* o;       // [hidden] rows of H D
    const float* norm2;     // [hidden] post-attention RMSNorm weight
    const uint8_t* gate_up; // [2 I] rows of hidden
    const uint8_t* down;    // [hidden] rows of I
    void* k_cache;          // [Hkv, num_slots, D], esize bytes per element
    void* v_cache;
    int32_t qkv_kind, o_kind, gate_up_kind, down_kind;
} DecoderLayer;

typedef struct {
    int64_t hidden, inter, H, Hkv, D;
    float eps, scale;
    int32_t q8;
} DecoderShape;

// A step's ragged batch (see paged_attention.c for seq_info and tables).
typedef struct {
    const int64_t* slots;     // [T] cache slot of each new row
    const int64_t* seq_info;  // [B, 3] first row, q_len, ctx_len
    const int32_t* tables;    // [B, max_blocks]
    int64_t B, max_blocks, block_size, window, num_slots, esize;
} DecoderBatch;

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

// x [T, hidden] (the residual stream, updated in place) through layers[0 .. L), with the RoPE
// tables cos/sin [T, D] of the rows' positions. 0 on success; -1 when the buffers could not be
// allocated, -2 - l when layer l failed (an allocation, or shapes or indices the attention kernel
// refuses); -2 too, before any layer, when a new row's slot is outside the pool.
int decoder_layers(const DecoderLayer* layers, int64_t L, const DecoderShape* s,
                   const DecoderBatch* b, float* x, int64_t T, const float* cos, const float* sin,
                   int threads) {
    const int64_t D = s->D, width = (s->H + 2 * s->Hkv) * D, hidden = s->hidden;
    for (int64_t t = 0; t < T; t++)  // write_kv writes there, before attention checks its tables
        if (b->slots[t] < 0 || b->slots[t] >= b->num_slots) return -2;
    float* qkv = malloc(sizeof(float) * T * width);
    float* attn = malloc(sizeof(float) * T * s->H * D);
    float* gate_up = malloc(sizeof(float) * T * 2 * s->inter);
    int rc = qkv && attn && gate_up ? 0 : -1;
    for (int64_t l = 0; rc == 0 && l < L; l++) {
        const DecoderLayer* y = &layers[l];
        int r = ggml_matmul_fused(y->qkv_kind, x, y->qkv, qkv, T, width, hidden, threads,
                                  y->norm1, s->eps, 0, y->qkv_bias, 0, s->q8);
        if (r == 0) {
            rope_rotate_half(qkv, width, T, s->H + s->Hkv, D, cos, sin);
            write_kv(qkv, T, width, s, b, y->k_cache, y->v_cache);
            r = paged_attention(qkv, width, y->k_cache, y->v_cache, b->esize, attn, b->seq_info,
                                b->tables, b->max_blocks, b->B, s->H, s->Hkv, D, b->block_size,
                                s->scale, b->window, b->num_slots, threads);
        }
        if (r == 0)
            r = ggml_matmul_fused(y->o_kind, attn, y->o, x, T, hidden, s->H * D, threads, 0, 0.0f,
                                  0, 0, x, s->q8);
        if (r == 0)
            r = ggml_matmul_fused(y->gate_up_kind, x, y->gate_up, gate_up, T, 2 * s->inter,
                                  hidden, threads, y->norm2, s->eps, 0, 0, 0, s->q8);
        if (r == 0)
            r = ggml_matmul_fused(y->down_kind, gate_up, y->down, x, T, hidden, s->inter,
                                  threads, 0, 0.0f, 1, 0, x, s->q8);
        if (r != 0) rc = (int)(-2 - l);
    }
    free(qkv), free(attn), free(gate_up);
    return rc;
}
