// The decoder stack's layers in one native call, built into the GGUF block library with the
// paged attention unit (decoder.c; `models/native_stack.py` calls it).
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

#include <stdint.h>

#include "export.h"

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

// A step's ragged batch (see paged_attention.h for seq_info and tables).
typedef struct {
    const int64_t* slots;     // [T] cache slot of each new row
    const int64_t* seq_info;  // [B, 3] first row, q_len, ctx_len
    const int32_t* tables;    // [B, max_blocks]
    int64_t B, max_blocks, block_size, window, num_slots, esize;
} DecoderBatch;

// x [T, hidden] (the residual stream, updated in place) through layers[0 .. L), with the RoPE
// tables cos/sin [T, D] of the rows' positions. 0 on success; -1 when the buffers could not be
// allocated, -2 - l when layer l failed (an allocation, or shapes or indices the attention kernel
// refuses); -2 too, before any layer, when a new row's slot is outside the pool.
KERNEL_API int decoder_layers(const DecoderLayer* layers, int64_t L, const DecoderShape* s,
                              const DecoderBatch* b, float* x, int64_t T, const float* cos,
                              const float* sin, int threads);
