// The q8 matmul (see q8_dot.h for the arithmetic): which path runs, quantising activation rows,
// and who computes which output (chunks of rows, groups of weight rows, tiles, threads) --
// never how: each output is dot_q8_scalar's sequence of operations whatever M is.
// Included once, by ggml_blocks.c, after q8_dot.h and store().

#pragma once

// 1: the AVX2 kernels (chosen at load when the CPU has AVX2 + FMA); 0: the scalar reference.
static int q8_avx2 = 0;

__attribute__((constructor)) static void pick_q8_path(void) {
    q8_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The q8 path in use (1 AVX2, 0 scalar) after applying `force`: 1 forces the scalar reference,
// 0 picks by CPUID again, -1 changes nothing. Not thread-safe: for tests and benchmarks.
int ggml_q8_path(int force) {
    if (force == 1) q8_avx2 = 0;
    else if (force == 0) pick_q8_path();
    return q8_avx2;
}

// a [M, K/32] = the Q8A blocks of x [M, K]; every block on its own, so rows never interact.
void ggml_quantize_q8(const float* x, block_q8a* a, int64_t M, int64_t K, int threads) {
    const int64_t blocks = M * (K / QK);
    const int avx2 = q8_avx2;
#pragma omp parallel for schedule(static) num_threads(threads) if (blocks >= 1024)
    for (int64_t i = 0; i < blocks; i++) {
        if (avx2) quantize_block_avx2(x + i * QK, a + i);
        else quantize_block_scalar(x + i * QK, a + i);
    }
}

// Up to Q8_MAX_TILE_ROWS outputs of one weight row, for activation rows a[0 .. left); how many.
static int q8_tile(int kind, int64_t left, const uint8_t* row, const block_q8a* a, int64_t nb,
                   float* out) {
    if (!q8_avx2) {
        out[0] = dot_q8_scalar(kind, row, a, nb);
        return 1;
    }
    const int rows = left < Q8_MAX_TILE_ROWS ? (int)left : Q8_MAX_TILE_ROWS;
#define Q8_ROWS(KIND)                                              \
    switch (rows) {                                                \
        case 1: dot_q8_avx2(KIND, 1, row, a, nb, out); break;      \
        case 2: dot_q8_avx2(KIND, 2, row, a, nb, out); break;      \
        case 3: dot_q8_avx2(KIND, 3, row, a, nb, out); break;      \
        case 4: dot_q8_avx2(KIND, 4, row, a, nb, out); break;      \
        case 5: dot_q8_avx2(KIND, 5, row, a, nb, out); break;      \
        default: dot_q8_avx2(KIND, 6, row, a, nb, out); break;     \
    }
    if (kind == KIND_Q4_1) Q8_ROWS(KIND_Q4_1) else Q8_ROWS(KIND_Q8_0)
#undef Q8_ROWS
    return rows;
}

// The last activation row of a chunk (M = 1 in decode) against `cols` weight rows at once.
static void q8_cols(int kind, int cols, const uint8_t* w, int64_t row_bytes, const block_q8a* a,
                    int64_t nb, float* out) {
#define Q8_COLS(KIND)                                                      \
    switch (cols) {                                                        \
        case 1: dot_q8_avx2_cols(KIND, 1, w, row_bytes, a, nb, out); break; \
        case 2: dot_q8_avx2_cols(KIND, 2, w, row_bytes, a, nb, out); break; \
        case 3: dot_q8_avx2_cols(KIND, 3, w, row_bytes, a, nb, out); break; \
        default: dot_q8_avx2_cols(KIND, 4, w, row_bytes, a, nb, out); break; \
    }
    if (kind == KIND_Q4_1) Q8_COLS(KIND_Q4_1) else Q8_COLS(KIND_Q8_0)
#undef Q8_COLS
}

// y[m .. m + rows)[n0 .. n0 + cols) for activation rows a[m ..] (left of them in the chunk);
// returns rows. A lone row takes the weight rows together, more rows take them one by one.
static int64_t q8_group(int kind, int64_t n0, int cols, int64_t m, int64_t left,
                        const uint8_t* w, int64_t rb, const block_q8a* a, int64_t nb, float* y,
                        int64_t N, const float* bias, const float* res) {
    float dots[Q8_MAX_TILE_COLS * Q8_MAX_TILE_ROWS];
    int rows = 1;
    if (q8_avx2 && left == 1) {
        q8_cols(kind, cols, w + n0 * rb, rb, a + m * nb, nb, dots);
        for (int c = 0; c < cols; c++) store(y, bias, res, m * N + n0 + c, n0 + c, dots[c]);
        return 1;
    }
    for (int c = 0; c < cols; c++) {
        float* out = dots + c * Q8_MAX_TILE_ROWS;
        rows = q8_tile(kind, left, w + (n0 + c) * rb, a + m * nb, nb, out);
        for (int r = 0; r < rows; r++) store(y, bias, res, (m + r) * N + n0 + c, n0 + c, out[r]);
    }
    return rows;
}

// Activation rows per pass over W: their Q8A blocks stay in cache while W streams once per
// chunk. Chunks, tiles, groups and threads only decide who computes an output, never how.
#define Q8_CHUNK_ROWS 64

// y [M, N] = a @ W^T (+ bias) (+ res), a the Q8A rows of the activations.
static void matmul_q8(int kind, const block_q8a* a, const uint8_t* w, float* y, int64_t M,
                      int64_t N, int64_t K, int threads, const float* bias, const float* res) {
    const int64_t nb = K / QK, rb = nb * block_bytes(kind);
    const int64_t groups = (N + Q8_MAX_TILE_COLS - 1) / Q8_MAX_TILE_COLS;
#pragma omp parallel num_threads(threads)
    for (int64_t m0 = 0; m0 < M; m0 += Q8_CHUNK_ROWS) {
        const int64_t m1 = M - m0 < Q8_CHUNK_ROWS ? M : m0 + Q8_CHUNK_ROWS;
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t n0 = g * Q8_MAX_TILE_COLS;
            const int cols = N - n0 < Q8_MAX_TILE_COLS ? (int)(N - n0) : Q8_MAX_TILE_COLS;
            for (int64_t m = m0; m < m1;)
                m += q8_group(kind, n0, cols, m, m1 - m, w, rb, a, nb, y, N, bias, res);
        }
    }
}
