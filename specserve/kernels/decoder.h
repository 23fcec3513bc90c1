// The decoder stack's layers in one native call, built into the GGUF block library with the
// paged attention unit (decoder.c; `models/native_stack.py` calls it).
//
// A layer is the same sequence of kernel calls the Python layer makes, with the same arguments:
//   qkv  = ggml_matmul_fused(RMSNorm(x) @ Wqkv^T + b)        (norm fused in)
//   RMSNorm on each q and k head                              (q_norm/k_norm given: Qwen3, Gemma 3)
//   RoPE on the q and k heads of qkv, by the layer's table    (rope_rotate_half)
//   K/V of the new rows into their cache slots                (float32 copied, fp16 rounded to
//                                                              nearest even, as torch's .to())
//   attn = paged_attention(q, cache), through the batch of the layer's kind (full or sliding)
//   x    = x + attn @ Wo^T                                    (residual fused, in place)
//          or x + RMSNorm(attn @ Wo^T) where attn_out_norm is given (Gemma 3's sandwich)
//   gu   = RMSNorm(x) @ Wgu^T
//   x    = x + (act(gu[:, :I]) * gu[:, I:]) @ Wdown^T        (gate and residual fused; SiLU or
//          GELU-tanh), or its mlp_out_norm'd form
// so its outputs equal the Python layer's bit for bit: what goes away is the framework's
// per-operation work between the calls (argument checks, tensor allocation, dispatch), which is
// a third of a batch-1 decode step on a small model. Norm weights are the ones the kernels
// multiply by: Gemma's (1 + w) is added by the caller, as the Python layer adds it.

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
    const float* q_norm;         // [D] each q head's RMSNorm weight, or NULL (no q/k norm)
    const float* k_norm;         // [D] each k head's, or NULL
    const float* attn_out_norm;  // [hidden] the attention output's norm, or NULL (no sandwich)
    const float* mlp_out_norm;   // [hidden] the MLP output's norm, or NULL
    int32_t glu;                 // the MLP's gate: GLU_SILU (0 is taken as it too) or GLU_GELU_TANH
    int32_t kind;                // which batch (and window) it attends through: 0 full, 1 sliding
    int32_t rope;                // which RoPE table it rotates by (0 or 1)
} DecoderLayer;

typedef struct {
    int64_t hidden, inter, H, Hkv, D;
    float eps, scale;
    int32_t q8;
    int64_t rotary;  // RoPE over each head's first `rotary` dims (0: all D); tables [T, rotary]
} DecoderShape;

// A step's ragged batch (see paged_attention.h for seq_info and tables), as one layer kind's
// pool holds it; window 0 attends to the whole context.
typedef struct {
    const int64_t* slots;     // [T] cache slot of each new row
    const int64_t* seq_info;  // [B, 3] first row, q_len, ctx_len
    const int32_t* tables;    // [B, max_blocks]
    int64_t B, max_blocks, block_size, window, num_slots, esize;
} DecoderBatch;

// The RoPE tables [T, rotary] of the rows' positions, per table a layer names.
typedef struct {
    const float* cos[2];
    const float* sin[2];
} DecoderRopes;

// x [T, hidden] (the residual stream, updated in place) through layers[0 .. L); batches[kind] is
// the step's batch for the layers of that kind (the two may be the same tables with another
// window). 0 on success; -1 when the buffers could not be allocated, -2 - l when layer l failed
// (an allocation, or shapes or indices the attention kernel refuses); -2 too, before any layer,
// when a new row's slot is outside its pool or a layer names a table it was not given.
KERNEL_API int decoder_layers(const DecoderLayer* layers, int64_t L, const DecoderShape* s,
                              const DecoderBatch batches[2], float* x, int64_t T,
                              const DecoderRopes* ropes, int threads);
