// The q8 matmul (see q8_dot.c for the arithmetic): which path runs, quantising activation rows,
// and who computes which output (chunks of rows, tiles of rows, threads) -- never how: each
// output is its tile kernel's sequence of operations (q8_dot.c, x8.c, x8_kquants.c) whatever M is.

#include <stdint.h>

#include "block_kinds.h"
#include "q8_dot.h"
#include "q8_matmul.h"
#include "x8.h"
#include "x8_kquants.h"
#include "x8_layout.h"

// The path in use (q8_dot.h): the widest the CPU has, chosen at load.
static int q8_path = Q8_SCALAR;

static int q8_best_path(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Q8_SCALAR;
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? Q8_VNNI
                                                                                     : Q8_AVX2;
}

__attribute__((constructor)) static void pick_q8_path(void) { q8_path = q8_best_path(); }

int ggml_q8_path(int force) {
    if (force == 0) pick_q8_path();
    else if (force == 1) q8_path = Q8_SCALAR;
    else if (force == 2 && q8_best_path() != Q8_SCALAR) q8_path = Q8_AVX2;
    return q8_path;
}

void ggml_quantize_q8(const float* x, block_q8a* a, int64_t M, int64_t K, int threads) {
    q8_quantize(x, a, M, K, threads, q8_path);
}

// Activation rows per pass over W: their Q8A blocks stay in cache while W streams once per
// chunk. Chunks, tiles and threads only decide who computes an output, never how. Weight rows
// go one at a time: each streams from memory as one sequence (with its prefetch), which beats
// taking several at once to overlap their FMA chains (measured on the whole model, M = 1).
#define Q8_CHUNK_ROWS 64

// matmul_q8 on interleaved weights (x8.c, x8_kquants.c): threads split the groups of eight
// weight rows.
static void matmul_x8(int kind, const block_q8a* a, const uint8_t* w, float* y, int64_t M,
                      int64_t N, int64_t K, int threads, const float* bias, const float* res) {
    const int64_t nb = K / QK, gb = X8_ROWS * row_bytes(kind, K);
    const int lanes = kind != KIND_Q4_1_X8 && kind != KIND_Q8_0_X8;  // x8_kquants.c's kinds
    const int path = q8_path;
#pragma omp parallel num_threads(threads)
    for (int64_t m0 = 0; m0 < M; m0 += Q8_CHUNK_ROWS) {
        const int64_t m1 = M - m0 < Q8_CHUNK_ROWS ? M : m0 + Q8_CHUNK_ROWS;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < N / X8_ROWS; g++) {
            for (int64_t m = m0; m < m1;) {
                float dots[Q8_CHUNK_ROWS * X8_ROWS];  // x8k_tile: a whole chunk at once
                const int rows = (lanes ? x8k_tile : x8_tile)(kind, m1 - m, w + g * gb,
                                                               a + m * nb, nb, path, dots);
                for (int r = 0; r < rows; r++)
                    for (int i = 0; i < X8_ROWS; i++)
                        store(y, bias, res, (m + r) * N + g * X8_ROWS + i, g * X8_ROWS + i,
                              dots[X8_ROWS * r + i]);
                m += rows;
            }
        }
    }
}

void matmul_q8(int kind, const block_q8a* a, const uint8_t* w, float* y, int64_t M, int64_t N,
               int64_t K, int threads, const float* bias, const float* res) {
    if (is_x8(kind)) {
        matmul_x8(kind, a, w, y, M, N, K, threads, bias, res);
        return;
    }
    const int64_t nb = K / QK, rb = row_bytes(kind, K);
    const int path = q8_path;
#pragma omp parallel num_threads(threads)
    for (int64_t m0 = 0; m0 < M; m0 += Q8_CHUNK_ROWS) {
        const int64_t m1 = M - m0 < Q8_CHUNK_ROWS ? M : m0 + Q8_CHUNK_ROWS;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            for (int64_t m = m0; m < m1;) {
                float dots[Q8_MAX_TILE_ROWS];
                const int rows = q8_tile(kind, m1 - m, w + n * rb, a + m * nb, nb, path, dots);
                for (int r = 0; r < rows; r++) store(y, bias, res, (m + r) * N + n, n, dots[r]);
                m += rows;
            }
        }
    }
}
