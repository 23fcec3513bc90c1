// The block library's exact numerics and its fused projection (ggml_blocks.c); the rest of the
// library's entry points are declared by q8_matmul.h, x8_layout.h, decoder.h and eagle_chain.h.
#pragma once

#include <stdint.h>

#include "export.h"

enum { GLU_NONE = 0, GLU_SILU = 1, GLU_GELU_TANH = 2 };  // a fused projection's gate

// y [M, N] = x [M, K] @ W^T. K must be a multiple of the kind's block (32 or 256 values); x
// and y are contiguous float32; W plain rows.
KERNEL_API void ggml_matmul(int kind, const float* x, const uint8_t* w, float* y, int64_t M,
                            int64_t N, int64_t K, int threads);

// A decoder's projection with what surrounds it fused in, so one call replaces the several
// framework calls of the unfused form:
//   input  x [M, K]:  norm_w given: x * (1 / sqrt(mean(x^2) + eps)) * norm_w  (RMSNorm)
//          x [M, 2K]: glu GLU_SILU: silu(x[:, :K]) * x[:, K:]               (gated MLP)
//                     glu GLU_GELU_TANH: gelu_tanh(x[:, :K]) * x[:, K:]     (Gemma's)
//   output y [M, N] = input @ W^T (+ bias[n]) (+ res[M, N]); res may be y itself.
// q8: the input rows are quantised to Q8A and multiplied in integers; else float32.
// Elementwise steps round as the unfused float32 forms do; the RMSNorm mean and the products
// are summed in another order (float32 summation-order differences only).
// Returns 0; -1 when a buffer could not be allocated, -2 for interleaved rows in the exact
// numerics, -3 for an unknown kind or a K that is not whole blocks of it.
KERNEL_API int ggml_matmul_fused(int kind, const float* x, const uint8_t* w, float* y,
                                 int64_t M, int64_t N, int64_t K, int threads,
                                 const float* norm_w, float eps, int glu, const float* bias,
                                 const float* res, int q8);

// out [N, K] = the float32 weights of W (any kind, interleaved ones too).
KERNEL_API void ggml_dequantize(int kind, const uint8_t* w, float* out, int64_t N, int64_t K,
                                int threads);

// One input row of a fused projection: o [K] = x RMSNorm'd with norm_w and eps, or with glu,
// act(x[:K]) * x[K:] (x [2K]); the rounding ggml_matmul_fused describes. o may be x (a norm).
void prepare_row(const float* x, float* o, int64_t K, const float* norm_w, float eps, int glu);
// 1 / sqrt(mean(x[:K]^2) + eps), summed as prepare_row's RMSNorm sums.
float rms_scale(const float* x, int64_t K, float eps);
