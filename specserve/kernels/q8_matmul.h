// The q8 matmul (see q8_dot.h for the arithmetic): which path runs, quantising activation rows,
// and who computes which output (chunks of rows, tiles of rows, threads) --
// never how: each output is dot_q8_scalar's sequence of operations whatever M is.
// Included once, by ggml_blocks.c, after q8_dot.h and store().

#pragma once

// The path in use (q8_dot.h): the widest the CPU has, chosen at load.
static int q8_path = Q8_SCALAR;

static int q8_best_path(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Q8_SCALAR;
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") ? Q8_VNNI
                                                                                     : Q8_AVX2;
}

__attribute__((constructor)) static void pick_q8_path(void) { q8_path = q8_best_path(); }

// The q8 path in use after applying `force`: -1 changes nothing, 0 picks the widest again,
// 1 forces the scalar reference, 2 AVX2 (where the CPU has it: the narrower path of a VNNI
// machine). Returns Q8_SCALAR, Q8_AVX2 or Q8_VNNI. Not thread-safe: for tests and benchmarks.
int ggml_q8_path(int force) {
    if (force == 0) pick_q8_path();
    else if (force == 1) q8_path = Q8_SCALAR;
    else if (force == 2 && q8_best_path() != Q8_SCALAR) q8_path = Q8_AVX2;
    return q8_path;
}

// a [M, K/32] = the Q8A blocks of x [M, K]; every block on its own, so rows never interact.
void ggml_quantize_q8(const float* x, block_q8a* a, int64_t M, int64_t K, int threads) {
    const int64_t blocks = M * (K / QK);
    const int avx2 = q8_path != Q8_SCALAR;
#pragma omp parallel for schedule(static) num_threads(threads) if (blocks >= 1024)
    for (int64_t i = 0; i < blocks; i++) {
        if (avx2) quantize_block_avx2(x + i * QK, a + i);
        else quantize_block_scalar(x + i * QK, a + i);
    }
}

// Up to Q8_MAX_TILE_ROWS outputs of one weight row, for activation rows a[0 .. left); how many.
static int q8_tile(int kind, int64_t left, const uint8_t* row, const block_q8a* a, int64_t nb,
                   float* out) {
    if (q8_path == Q8_SCALAR) {
        out[0] = dot_q8_scalar(kind, row, a, nb);
        return 1;
    }
    const int rows = left < Q8_MAX_TILE_ROWS ? (int)left : Q8_MAX_TILE_ROWS;
#define Q8_ROWS(KIND, _)                                           \
    switch (rows) {                                                \
        case 1: dot_q8_avx2(KIND, 1, row, a, nb, out); break;      \
        case 2: dot_q8_avx2(KIND, 2, row, a, nb, out); break;      \
        case 3: dot_q8_avx2(KIND, 3, row, a, nb, out); break;      \
        case 4: dot_q8_avx2(KIND, 4, row, a, nb, out); break;      \
        case 5: dot_q8_avx2(KIND, 5, row, a, nb, out); break;      \
        default: dot_q8_avx2(KIND, 6, row, a, nb, out); break;     \
    }
    EACH_PLAIN_KIND(kind, Q8_ROWS, 0)
#undef Q8_ROWS
    return rows;
}

// Activation rows per pass over W: their Q8A blocks stay in cache while W streams once per
// chunk. Chunks, tiles and threads only decide who computes an output, never how. Weight rows
// go one at a time: each streams from memory as one sequence (with its prefetch), which beats
// taking several at once to overlap their FMA chains (measured on the whole model, M = 1).
#define Q8_CHUNK_ROWS 64

// matmul_q8 on interleaved weights (x8.h, x8_kquants.h): threads split the groups of eight
// weight rows.
static void matmul_x8(int kind, const block_q8a* a, const uint8_t* w, float* y, int64_t M,
                      int64_t N, int64_t K, int threads, const float* bias, const float* res) {
    const int64_t nb = K / QK, gb = X8_ROWS * row_bytes(kind, K);
    const int lanes = kind != KIND_Q4_1_X8 && kind != KIND_Q8_0_X8;  // x8_kquants.h's kinds
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

// y [M, N] = a @ W^T (+ bias) (+ res), a the Q8A rows of the activations.
static void matmul_q8(int kind, const block_q8a* a, const uint8_t* w, float* y, int64_t M,
                      int64_t N, int64_t K, int threads, const float* bias, const float* res) {
    if (is_x8(kind)) {
        matmul_x8(kind, a, w, y, M, N, K, threads, bias, res);
        return;
    }
    const int64_t nb = K / QK, rb = row_bytes(kind, K);
#pragma omp parallel num_threads(threads)
    for (int64_t m0 = 0; m0 < M; m0 += Q8_CHUNK_ROWS) {
        const int64_t m1 = M - m0 < Q8_CHUNK_ROWS ? M : m0 + Q8_CHUNK_ROWS;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            for (int64_t m = m0; m < m1;) {
                float dots[Q8_MAX_TILE_ROWS];
                const int rows = q8_tile(kind, m1 - m, w + n * rb, a + m * nb, nb, dots);
                for (int r = 0; r < rows; r++) store(y, bias, res, (m + r) * N + n, n, dots[r]);
                m += rows;
            }
        }
    }
}
