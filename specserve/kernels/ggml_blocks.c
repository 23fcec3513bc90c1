// Matrix products on GGUF block-quantised weights (AVX2 + FMA + F16C), in two numerics:
// "exact" (this unit: blocks expanded to float32, float32 products) and "q8" (q8_dot.c:
// activations quantised to 8 bits per 32 values, integer dot products; q8_matmul.c: the
// driver); and the projection with its neighbours fused in, in either (ggml_matmul_fused).
//
// A weight matrix W [N, K] is stored as llama.cpp stores it: each row is K/32 blocks of 32
// values (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or K/256 super-blocks of 256 (Q4_K, Q5_K, Q6_K);
// subblocks.h gives every kind's layout and reads any of them 32 values at a time as
// w[j] = dv[j / 4] * q[j] (+ m). E.g.
//   Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles; w[j] = d * q[j] + m, where q[j] is
//                    the low nibble of byte j for j < 16 and the high nibble of byte j-16 after.
//   Q8_0 (34 bytes): fp16 d, 32 int8; w[j] = d * q[j].
// A block is expanded to float32 exactly as gguf-py's dequantisation does it (dv * q is exact
// in float32, so fma(dv, q, m) rounds once, like (d * q) + m), then multiplied with float32
// activations. The results equal a float32 matmul on the dequantised weights up to the order
// of summation; the gain is that 4.5 (Q4_1) or 8.5 (Q8_0) bits per weight cross the memory
// bus instead of 32.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "block_kinds.h"
#include "ggml_blocks.h"
#include "q8_dot.h"
#include "q8_matmul.h"
#include "simd.h"
#include "subblocks.h"
#include "x8_layout.h"

// A block's fp16 scale broadcast from half_table (subblocks.h).
static inline __attribute__((always_inline)) __m256 half_to_ps(const uint8_t* p) {
    uint16_t h;
    __builtin_memcpy(&h, p, 2);
    return _mm256_broadcast_ss(&half_table[h]);
}

// Sub-block blk of a row (32 values) expanded into 4 x 8 floats: Q4_1 and Q8_0 straight from
// their bytes, the other kinds through subblocks.h's form, each value dv * q (+ m). sc: the
// scales of blk's block (K-quants: read once per 256 values by the caller), else unused.
static inline __attribute__((always_inline)) void expand(int kind, const uint8_t* row,
                                                         int64_t blk, const block_scales* sc,
                                                         __m256 w[4]) {
    const uint8_t* b = row + blk * block_bytes(kind);  // 32-value kinds: one block per blk
    if (kind == KIND_Q4_1) {
        const __m256 d = half_to_ps(b), m = half_to_ps(b + 2);
        const __m128i q = _mm_loadu_si128((const __m128i*)(b + 4));
        const __m128i mask = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_and_si128(q, mask);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        w[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m);
        w[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m);
        w[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m);
        w[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m);
        return;
    }
    if (kind == KIND_Q8_0) {
        const __m256 d = half_to_ps(b);
        for (int i = 0; i < 4; i++) {
            const __m128i q8 = _mm_loadl_epi64((const __m128i*)(b + 2 + 8 * i));
            w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
        }
        return;
    }
    int s = 0;
    __m256 d_lo, d_hi, m;  // the scale of values 0-15 and 16-31 (they differ in Q6_K only)
    if (is_kquant(kind)) {
        s = (int)(blk % (QK_K / QK));
        b = row + blk / (QK_K / QK) * block_bytes(kind);
        const int lo = kind == KIND_Q6_K ? 2 * s : s, hi = kind == KIND_Q6_K ? 2 * s + 1 : s;
        d_lo = _mm256_set1_ps(sc->dv[lo]);
        d_hi = _mm256_set1_ps(sc->dv[hi]);
        m = _mm256_set1_ps(kind == KIND_Q6_K ? 0.0f : sc->m[s]);
    } else {
        d_lo = d_hi = half_to_ps(b);
        m = has_offset(kind) ? half_to_ps(b + 2) : _mm256_setzero_ps();
    }
    subblock_avx2 sub;
    sub_quants_avx2(kind, b, s, &sub);
    const __m128i q[2] = {_mm256_castsi256_si128(sub.ws), _mm256_extracti128_si256(sub.ws, 1)};
    for (int i = 0; i < 4; i++) {  // values 8i .. 8i+7
        const __m128i q8 = i & 1 ? _mm_srli_si128(q[i / 2], 8) : q[i / 2];
        const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d = i < 2 ? d_lo : d_hi;
        w[i] = has_offset(kind) ? _mm256_fmadd_ps(d, qf, m) : _mm256_mul_ps(d, qf);
    }
}

// The scales of blk's block, read when blk starts a K-quant block (see expand).
static inline __attribute__((always_inline)) void next_scales(int kind, const uint8_t* row,
                                                              int64_t blk, block_scales* sc) {
    if (is_kquant(kind) && blk % (QK_K / QK) == 0)
        read_block_scales(kind, row + blk / (QK_K / QK) * block_bytes(kind), sc);
}

// ROWS activation rows against one weight row. Each product y[m][n] sums in one fixed order,
// whatever the tile: two accumulators (lanes of w0 and w2 of each block into one, w1 and w3
// into the other), block after block, then their sum, then one horizontal sum. So a row's
// result never depends on how many rows were scored with it: a verify step's rows equal what
// decoding them one at a time gives, bit for bit. Up to 6 rows share an expanded block (12
// accumulators and 4 expanded vectors fill the 16 registers).
#define MAX_TILE_ROWS 6
#define TILE(ROWS)                                                                         \
    do {                                                                                   \
        __m256 acc[ROWS][2];                                                               \
        for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();        \
        block_scales sc;                                                                   \
        for (int64_t blk = 0; blk < nb; blk++) {                                           \
            __m256 v[4];                                                                   \
            __builtin_prefetch(row + blk * step + PREFETCH_AHEAD);                         \
            next_scales(kind, row, blk, &sc);                                              \
            expand(kind, row, blk, &sc, v);                                                \
            for (int r = 0; r < ROWS; r++) {                                               \
                const float* xr = x + (m + r) * K + blk * QK;                              \
                acc[r][0] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xr), acc[r][0]);         \
                acc[r][1] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xr + 8), acc[r][1]);     \
                acc[r][0] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xr + 16), acc[r][0]);    \
                acc[r][1] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xr + 24), acc[r][1]);    \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < ROWS; r++)                                                     \
            store(y, bias, res, (m + r) * N + n, n, hsum(_mm256_add_ps(acc[r][0], acc[r][1]))); \
    } while (0)

static inline __attribute__((always_inline)) void matmul_impl(
    int kind, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K,
    int threads, const float* bias, const float* res) {
    const int64_t nb = K / QK, step = block_bytes(kind) / (block_values(kind) / QK);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t* row = w + n * row_bytes(kind, K);
        for (int64_t m = 0; m < M;) {
            const int64_t rows = M - m < MAX_TILE_ROWS ? M - m : MAX_TILE_ROWS;
            switch (rows) {
                case 1: TILE(1); break;
                case 2: TILE(2); break;
                case 3: TILE(3); break;
                case 4: TILE(4); break;
                case 5: TILE(5); break;
                default: TILE(6); break;
            }
            m += rows;
        }
    }
}

// One plain row of `kind` (K values) expanded to float32 into o [K].
static inline __attribute__((always_inline)) void dequantize_row(int kind, const uint8_t* row,
                                                                 float* o, int64_t K) {
    block_scales sc;
    for (int64_t blk = 0; blk < K / QK; blk++) {
        __m256 v[4];
        next_scales(kind, row, blk, &sc);
        expand(kind, row, blk, &sc, v);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(o + blk * QK + 8 * i, v[i]);
    }
}

static inline __attribute__((always_inline)) void dequantize_impl(
    int kind, const uint8_t* w, float* out, int64_t N, int64_t K, int threads) {
    const int64_t rb = row_bytes(kind, K);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) dequantize_row(kind, w + n * rb, out + n * K, K);
}

// dequantize_impl for interleaved weights: each row's blocks put back in GGUF's layout
// (x8_plain_row), then expanded as the plain kind's.
static void dequantize_x8(int kind, const uint8_t* w, float* out, int64_t N, int64_t K,
                          int threads) {
    const int plain = plain_kind(kind);
    const int64_t rb = row_bytes(kind, K);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        uint8_t row[rb];
        x8_plain_row(kind, w, n, K, row);
        EACH_PLAIN_KIND(plain, dequantize_row, row, out + n * K, K)
    }
}

void ggml_matmul(int kind, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N,
                 int64_t K, int threads) {
    if (fits(kind, K)) EACH_PLAIN_KIND(kind, matmul_impl, x, w, y, M, N, K, threads, 0, 0)
}

// gelu_tanh(a) = a / 2 * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 a^3))), tanh(z) as
// 1 - 2 / (e^2z + 1) with exp256 (saturating to -1 and 1 where e^2z under- or overflows).
static inline __m256 gelu_tanh256(__m256 a) {
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    const __m256 a3 = _mm256_mul_ps(_mm256_mul_ps(a, a), a);
    const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                       _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(0.044715f), a3)));
    const __m256 e = exp256(_mm256_add_ps(inner, inner));
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    return _mm256_mul_ps(_mm256_mul_ps(half, a), _mm256_add_ps(one, t));
}

float rms_scale(const float* x, int64_t K, float eps) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {
        const __m256 v = _mm256_loadu_ps(x + k);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    return 1.0f / sqrtf(hsum(acc) / (float)K + eps);
}

void prepare_row(const float* x, float* o, int64_t K, const float* norm_w, float eps, int glu) {
    if (glu) {
        // silu(a) = a / (1 + e^-a), e^x by simd.h's polynomial (within 2 ulp of expf)
        const __m256 one = _mm256_set1_ps(1.0f);
        for (int64_t k = 0; k < K; k += 8) {
            const __m256 a = _mm256_loadu_ps(x + k);
            __m256 gate;
            if (glu == GLU_GELU_TANH) {
                gate = gelu_tanh256(a);
            } else {
                const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), a));
                gate = _mm256_div_ps(a, _mm256_add_ps(one, e));
            }
            _mm256_storeu_ps(o + k, _mm256_mul_ps(gate, _mm256_loadu_ps(x + K + k)));
        }
        return;
    }
    const float inv = rms_scale(x, K, eps);
    for (int64_t k = 0; k < K; k++) o[k] = (x[k] * inv) * norm_w[k];
}

int ggml_matmul_fused(int kind, const float* x, const uint8_t* w, float* y, int64_t M,
                      int64_t N, int64_t K, int threads, const float* norm_w, float eps,
                      int glu, const float* bias, const float* res, int q8) {
    if (!fits(kind, K)) return -3;
    if (is_x8(kind) && !q8) return -2;  // interleaved rows run in the q8 numerics only
    float* in = (glu || norm_w) ? malloc(sizeof(float) * M * K) : 0;
    block_q8a* a = q8 ? malloc(sizeof(block_q8a) * M * (K / QK)) : 0;
    if ((!in && (glu || norm_w)) || (!a && q8)) {
        free(in);
        free(a);
        return -1;
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (in && M >= 16)
    for (int64_t m = 0; m < (in ? M : 0); m++)
        prepare_row(x + m * (glu ? 2 * K : K), in + m * K, K, norm_w, eps, glu);
    const float* src = in ? in : x;
    if (q8) {
        ggml_quantize_q8(src, a, M, K, threads);
        matmul_q8(kind, a, w, y, M, N, K, threads, bias, res);
    } else {
        EACH_PLAIN_KIND(kind, matmul_impl, src, w, y, M, N, K, threads, bias, res)
    }
    free(in);
    free(a);
    return 0;
}

void ggml_dequantize(int kind, const uint8_t* w, float* out, int64_t N, int64_t K, int threads) {
    if (!fits(kind, K)) return;
    if (is_x8(kind)) dequantize_x8(kind, w, out, N, K, threads);
    else EACH_PLAIN_KIND(kind, dequantize_impl, w, out, N, K, threads)
}
