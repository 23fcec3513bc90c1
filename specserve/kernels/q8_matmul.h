// The q8 matmul's driver and its path (q8_matmul.c): quantising activation rows, then the tile
// kernels of plain (q8_dot.c) and interleaved rows (x8.c, x8_kquants.c) over chunks of rows and
// threads.
#pragma once

#include <stdint.h>

#include "export.h"
#include "q8_dot.h"

// The q8 path in use after applying `force`: -1 changes nothing, 0 picks the widest again,
// 1 forces the scalar reference, 2 AVX2 (where the CPU has it: the narrower path of a VNNI
// machine). Returns Q8_SCALAR, Q8_AVX2 or Q8_VNNI. Not thread-safe: for tests and benchmarks.
KERNEL_API int ggml_q8_path(int force);

// a [M, K/32] = the Q8A blocks of x [M, K]; every block on its own, so rows never interact.
KERNEL_API void ggml_quantize_q8(const float* x, block_q8a* a, int64_t M, int64_t K,
                                 int threads);

// y [M, N] = a @ W^T (+ bias) (+ res), a the Q8A rows of the activations.
void matmul_q8(int kind, const block_q8a* a, const uint8_t* w, float* y, int64_t M, int64_t N,
               int64_t K, int threads, const float* bias, const float* res);
