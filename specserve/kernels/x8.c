// GGUF weight rows interleaved eight at a time ("x8": Q4_1_X8, Q8_0_X8), for the q8 numerics:
// a verify or batch step's extra activation rows cost far fewer instructions than on plain rows.
//
// Why: on plain rows each (weight row, activation row, block) ends in a float multiply, a
// conversion and an FMA on eight int32 lanes (q8_dot.h), and those float ops, not the integer
// products, bound a step of several rows. Here the 32 quants of eight weight rows sit side by
// side, four of each row per 32 bytes, so one maddubs against four broadcast activation bytes
// gives products for eight outputs at once, and the float work is one multiply, one conversion
// and one FMA (two with Q4_1's m) per eight outputs and block.
//
// Layout: x8_layout.h (for each group of eight rows and block, the eight rows' scales side by
// side, then the quants four bytes of each row at a time).
//
// Arithmetic of one output (weight row n, activation row a), block after block, the same
// whatever else is multiplied alongside (batch invariance) and in the scalar reference:
//   s = sum_j q_w[j] q_a[j]                        exact in int32
//   acc = fma(d_w * d_a, (float)s, acc)
//   acc = fma(m_w, s_a, acc)                       Q4_1 only
// and the output is acc (then + bias, + residual, as store() adds them).
// Integer ranges: Q4_1's eight maddubs of a block are summed in int16 (each at most
// 2 * 15 * 127 = 3810, eight under 32767), then widened once; Q8_0's each widen at once
// (2 * 128 * 127 = 32512 fits int16, two would not).

#include <math.h>
#include <stdint.h>

#include "block_kinds.h"
#include "q8_dot.h"
#include "subblocks.h"
#include "x8.h"
#include "x8_layout.h"

// Loops on 32-byte boundaries in this unit: where its Q8_0 tile loops fell after the split into
// units cost a Q8_0_X8 product of 16 rows 3% (the same instructions; measured against the
// single-unit build, benchmarks in #57). -falign-loops=32 for every unit moved other kernels
// by as much the other way, so it is this unit's alone.
#pragma GCC optimize("align-loops=32")

#define X8_MAX_TILE 16  // activation rows per pass over a group's blocks (Q4_1)
#define X8_Q8_0_TILE 4  // the same for Q8_0 (its rows' sums live in registers)

// Scalar reference: row i of the group at g . one activation row of nb blocks.
static float dot_x8_scalar(int kind, const uint8_t* g, int i, const block_q8a* a, int64_t nb) {
    const int64_t gb = x8_block_bytes(kind);
    float acc = 0.0f;
    for (int64_t blk = 0; blk < nb; blk++) {
        uint8_t b[X8_MAX_BLOCK_BYTES];
        x8_row_block(kind, g + blk * gb, i, b);
        int32_t s = 0;
        for (int j = 0; j < QK; j++) {
            const int32_t w = kind == KIND_Q4_1_X8 ? (j < 16 ? b[4 + j] & 0x0F : b[4 + j - 16] >> 4)
                                                   : (int8_t)b[2 + j];
            s += w * a[blk].qs[j];
        }
        acc = fmaf(sub_half(b) * a[blk].d, (float)s, acc);
        if (kind == KIND_Q4_1_X8) acc = fmaf(sub_half(b + 2), a[blk].s, acc);
    }
    return acc;
}

// A Q4_1_X8 block's eight vectors: w[t] = q[4t .. 4t+3] of each row (low nibbles t < 4, high
// after).
static inline __attribute__((always_inline)) void x8_unpack_q4_1(const uint8_t* o, __m256i* w) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(o + 32 + 32 * t));
        w[t] = _mm256_and_si256(v, nibble);
        w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    }
}

// One activation row's float work on a block, given its eight exact integer sums s:
// acc = fma(d_w * d_a, s, acc), then for Q4_1 (mw not NULL) fma(m_w, s_a, acc).
static inline __attribute__((always_inline)) __m256 x8_scale(__m256 acc, __m256 dw,
                                                             const __m256* mw,
                                                             const block_q8a* ab, __m256i s) {
    acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(&ab->d)), _mm256_cvtepi32_ps(s), acc);
    return mw ? _mm256_fmadd_ps(*mw, _mm256_broadcast_ss(&ab->s), acc) : acc;
}

// AVX2: the eight rows of the group at g . ROWS activation rows (a[r * nb + blk]);
// out[8 r + i] as dot_x8_scalar(kind, g, i, a + r * nb, nb) computes it.
// Q4_1: a block's eight unpacked vectors stay in registers while every activation row passes
// over them (one pass over the weights for up to X8_MAX_TILE rows; a second pass cost more
// than the rows themselves). Q8_0 needs each vector twice (|w| and its sign), so it goes a
// vector at a time with the rows' sums in registers, X8_Q8_0_TILE rows a pass.
static inline __attribute__((always_inline)) void dot_x8_avx2(
    int kind, int rows, const uint8_t* g, const block_q8a* a, int64_t nb, float* out) {
    const int64_t gb = x8_block_bytes(kind);
    __m256 acc[X8_MAX_TILE];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t blk = 0; blk < nb; blk++) {
        const uint8_t* o = g + blk * gb;
        for (int64_t ahead = 0; ahead < gb; ahead += 64) __builtin_prefetch(o + PREFETCH_AHEAD + ahead);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)o));
        if (kind == KIND_Q4_1_X8) {
            __m256i w[8];
            x8_unpack_q4_1(o, w);
            const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 16)));
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {
                const block_q8a* ab = a + r * nb + blk;
                __m256i sum = _mm256_maddubs_epi16(w[0], x8_broadcast4(ab->qs));
#pragma GCC unroll 7
                for (int t = 1; t < 8; t++)
                    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(w[t], x8_broadcast4(ab->qs + 4 * t)));
                acc[r] = x8_scale(acc[r], dw, &mw, ab, _mm256_madd_epi16(sum, ones));
            }
        } else {
            __m256i sum[X8_Q8_0_TILE];
#pragma GCC unroll 4
            for (int r = 0; r < rows; r++) sum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i*)(o + 16 + 32 * t));
                const __m256i av = _mm256_sign_epi8(v, v);  // |w|; the sign moves to a
#pragma GCC unroll 4
                for (int r = 0; r < rows; r++) {
                    const __m256i q = _mm256_sign_epi8(x8_broadcast4(a[r * nb + blk].qs + 4 * t), v);
                    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(av, q), ones);
                    sum[r] = _mm256_add_epi32(sum[r], p);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < rows; r++) acc[r] = x8_scale(acc[r], dw, NULL, a + r * nb + blk, sum[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) _mm256_storeu_ps(out + 8 * r, acc[r]);
}

// AVX512-VNNI on 256-bit registers (AVX512VL): vpdpbusd adds the four u8 x s8 products of each
// 32-bit lane into an int32 in one instruction, where AVX2 takes a maddubs, an int16 add and a
// madd. Every lane's sum is exact on both paths, so out[] is dot_x8_avx2's, bit for bit (and
// the scalar reference's); only the instruction count per activation row and block differs
// (about 20 against 28 for Q4_1). Q4_1 splits a row's eight products over two sums (low and
// high nibbles) so that one row's chain is half as long; the integer total is the same.
// Chosen at load where the CPU has AVX512-VNNI and AVX512VL (q8_matmul.c).
#define X8_VNNI_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define X8_VNNI_Q8_0_TILE 8  // AVX512VL's 32 registers hold twice AVX2's row sums

static inline X8_VNNI_TARGET __attribute__((always_inline)) void dot_x8_vnni(
    int kind, int rows, const uint8_t* g, const block_q8a* a, int64_t nb, float* out) {
    const int64_t gb = x8_block_bytes(kind);
    __m256 acc[X8_MAX_TILE];
#pragma GCC unroll 16
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    const __m256i zero = _mm256_setzero_si256();
    for (int64_t blk = 0; blk < nb; blk++) {
        const uint8_t* o = g + blk * gb;
        for (int64_t ahead = 0; ahead < gb; ahead += 64) __builtin_prefetch(o + PREFETCH_AHEAD + ahead);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)o));
        if (kind == KIND_Q4_1_X8) {
            __m256i w[8];
            x8_unpack_q4_1(o, w);
            const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 16)));
#pragma GCC unroll 16
            for (int r = 0; r < rows; r++) {
                const block_q8a* ab = a + r * nb + blk;
                __m256i lo = _mm256_dpbusd_epi32(zero, w[0], x8_broadcast4(ab->qs));
                __m256i hi = _mm256_dpbusd_epi32(zero, w[4], x8_broadcast4(ab->qs + 16));
#pragma GCC unroll 3
                for (int t = 1; t < 4; t++) {
                    lo = _mm256_dpbusd_epi32(lo, w[t], x8_broadcast4(ab->qs + 4 * t));
                    hi = _mm256_dpbusd_epi32(hi, w[t + 4], x8_broadcast4(ab->qs + 16 + 4 * t));
                }
                acc[r] = x8_scale(acc[r], dw, &mw, ab, _mm256_add_epi32(lo, hi));
            }
        } else {
            __m256i sum[X8_VNNI_Q8_0_TILE];
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) sum[r] = zero;
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i*)(o + 16 + 32 * t));
                const __m256i av = _mm256_sign_epi8(v, v);  // |w|; the sign moves to a
#pragma GCC unroll 8
                for (int r = 0; r < rows; r++) {
                    const __m256i q = _mm256_sign_epi8(x8_broadcast4(a[r * nb + blk].qs + 4 * t), v);
                    sum[r] = _mm256_dpbusd_epi32(sum[r], av, q);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) acc[r] = x8_scale(acc[r], dw, NULL, a + r * nb + blk, sum[r]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < rows; r++) _mm256_storeu_ps(out + 8 * r, acc[r]);
}

// A tile of `rows` activation rows through DOT with the count a constant in each case up to 8:
// the rows' accumulators then live in registers (a count known only at run time keeps them in
// memory, a load and a store per row and block). Every case computes each row the same way.
#define X8_CASE(DOT, KIND, n) case n: DOT(KIND, n, g, a, nb, out); break;
#define X8_TILES(DOT, KIND, rows)                                                   \
    switch (rows) {                                                                 \
        X8_CASE(DOT, KIND, 1) X8_CASE(DOT, KIND, 2) X8_CASE(DOT, KIND, 3)           \
        X8_CASE(DOT, KIND, 4) X8_CASE(DOT, KIND, 5) X8_CASE(DOT, KIND, 6)           \
        X8_CASE(DOT, KIND, 7) X8_CASE(DOT, KIND, 8)                                 \
        default: DOT(KIND, rows, g, a, nb, out); break;                             \
    }

// x8_tile's VNNI path: the row counts the switch names compile to unrolled tiles.
static X8_VNNI_TARGET int x8_tile_vnni(int kind, int64_t left, const uint8_t* g,
                                       const block_q8a* a, int64_t nb, float* out) {
    if (kind == KIND_Q8_0_X8) {
        const int rows = left < X8_VNNI_Q8_0_TILE ? (int)left : X8_VNNI_Q8_0_TILE;
        X8_TILES(dot_x8_vnni, KIND_Q8_0_X8, rows)
        return rows;
    }
    const int rows = left < X8_MAX_TILE ? (int)left : X8_MAX_TILE;
    X8_TILES(dot_x8_vnni, KIND_Q4_1_X8, rows)
    return rows;
}

int x8_tile(int kind, int64_t left, const uint8_t* g, const block_q8a* a, int64_t nb, int path,
            float* out) {
    if (path == Q8_SCALAR) {
        for (int i = 0; i < X8_ROWS; i++) out[i] = dot_x8_scalar(kind, g, i, a, nb);
        return 1;
    }
    if (path == Q8_VNNI) return x8_tile_vnni(kind, left, g, a, nb, out);
    if (kind == KIND_Q8_0_X8) {
        const int rows = left < X8_Q8_0_TILE ? (int)left : X8_Q8_0_TILE;
        switch (rows) {
            case 1: dot_x8_avx2(KIND_Q8_0_X8, 1, g, a, nb, out); break;
            case 2: dot_x8_avx2(KIND_Q8_0_X8, 2, g, a, nb, out); break;
            case 3: dot_x8_avx2(KIND_Q8_0_X8, 3, g, a, nb, out); break;
            default: dot_x8_avx2(KIND_Q8_0_X8, 4, g, a, nb, out); break;
        }
        return rows;
    }
    const int rows = left < X8_MAX_TILE ? (int)left : X8_MAX_TILE;
    X8_TILES(dot_x8_avx2, KIND_Q4_1_X8, rows)
    return rows;
}
