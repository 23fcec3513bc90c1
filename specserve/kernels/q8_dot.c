// Integer dot products of GGUF weight blocks with activations quantised to 8 bits (the "q8"
// numerics), after llama.cpp's Q8_0/Q8_1 activation formats and its AVX2 vec_dot kernels.
//
// Weight blocks, as GGUF stores them, each 32 values read as subblocks.h's form
//   w[j] = dv[j / 4] * q[j] (+ m)     (Q4_1: dv = d, m = m; Q8_0: dv = d, no m; etc.)
// Activation block, Q8A (our own, float32 scales; llama.cpp keeps them in fp16):
//   a[j] ~ d * q[j], d = amax / 127, q[j] = round_half_even(a[j] * (127 / amax)) in [-127, 127],
//   s = d * sum_j q[j]  (llama.cpp's Q8_1 s: what a Q4_1 block's m multiplies).
// Block product (exact in int32 per lane of four values, then scaled):
//   W . Q8A = sum_l (dv[l] * d_a) * sum_{j in lane l} q_w[j] q_a[j]  (+ m * s_a)
// Every kind uses Q8A per 32 values, K-quants too: our choice, not llama.cpp's Q8_K per 256
// with block sums. A K-quant's 32-value sub-blocks then multiply exactly like the 32-value
// kinds (one activation scale per sub-block, one float FMA per lane), and a row's arithmetic
// is the same whatever the weight kind around it; the cost is the 8 activation scales per
// 256 values instead of one.
//
// Bit-identity of the AVX2 path with the scalar reference, by construction:
// - quantising uses the same float ops (|x| max, one multiply, round-half-even) in both;
// - the integer sum of a block is kept as 8 int32 lanes, lane l = sum over j in [4l, 4l+4)
//   (what maddubs + madd leave); each lane is exact (|lane| < 2^17), so both paths hold the
//   same 8 integers, converted exactly to float;
// - float work per row is fixed: acc[l] = fma(d_w * d_a, lane[l], acc[l]) block after block,
//   then hsum's order ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), then + sum_blk fma(m, s_a, .)
//   block after block (kinds with an offset m; 0 for the others).
// maddubs needs an unsigned operand: unsigned quants (Q4_1, Q5_1, Q4_K, Q5_K) go as they are,
// signed ones (Q8_0, Q4_0, Q5_0, Q6_K) as |q| with q's sign moved onto the activations.
// No int16 saturation: maddubs pairs at most 2 * |q|max * 127: 2*15*127 (Q4_1, Q4_K),
// 2*31*127 (Q5_1, Q5_K), 2*8*127 (Q4_0), 2*16*127 (Q5_0), 2*32*127 (Q6_K), 2*128*127 (Q8_0,
// |-128| = 128), all under 32767 (|q_a| <= 127).
// Nothing depends on which other rows are multiplied alongside, so a row's result is the same
// for every M and every tiling (batch invariance).

#include <math.h>
#include <stdint.h>

#include "block_kinds.h"
#include "q8_dot.h"
#include "simd.h"
#include "subblocks.h"

// The scales of one block from its amax: d = amax / 127, and the multiplier 127 / amax.
static inline void q8_scales(float amax, float* d, float* id) {
    *d = amax / 127.0f;
    *id = amax != 0.0f ? 127.0f / amax : 0.0f;
}

static void quantize_block_scalar(const float* x, block_q8a* b) {
    float amax = 0.0f, d, id;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    q8_scales(amax, &d, &id);
    int32_t sum = 0;
    for (int j = 0; j < QK; j++) {
        b->qs[j] = (int8_t)__builtin_roundevenf(x[j] * id);  // whatever the rounding mode
        sum += b->qs[j];
    }
    b->d = d;
    b->s = d * (float)sum;
}

static void quantize_block_avx2(const float* x, block_q8a* b) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    float d, id;
    q8_scales(hmax(amax), &d, &id);
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q[i] = _mm256_cvtps_epi32(r);  // already integral: exact
    }
    const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    const __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
    const __m128i s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0x4E));
    const int32_t sum = _mm_cvtsi128_si32(_mm_add_epi32(s1, _mm_shuffle_epi32(s1, 0xB1)));
    // packs interleave the 128-bit halves; the permutation puts q back in order j = 0..31
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i*)b->qs, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    b->d = d;
    b->s = d * (float)sum;
}

// Scalar reference: one weight row . one activation row of nb blocks (subblocks.h's form):
//   lane[l] = sum_{j in [4l, 4l+4)} q_w[j] q_a[j]          exact in int32
//   acc[l]  = fma(dv[l] * d_a, lane[l], acc[l])           block after block
//   summ    = fma(m, s_a, summ)                           block after block (kinds with m)
//   out     = hsum8(acc) + summ
// (Interleaved rows' scalar reference, x8_kquants.c, runs the same steps on each row's blocks.)
static float dot_q8_scalar(int kind, const uint8_t* wrow, const block_q8a* a, int64_t nb) {
    float acc[8] = {0}, summ = 0.0f;
    for (int64_t blk = 0; blk < nb; blk++) {
        subblock w;
        unpack_scalar(kind, wrow, blk, &w);
        q8_sub_scalar(kind, &w, a + blk, acc, &summ);
    }
    return hsum8(acc) + summ;
}

// AVX2: one weight row . ROWS activation rows (a[r * nb + blk]); each weight sub-block is
// unpacked once for all of them, a K-quant's packed scales once per 256 values (decoding them
// per sub-block cost Q4_K 1.6x Q4_0's time at M = 1). out[r] as dot_q8_scalar computes it
// (the same dv, m and order; read_block_scales forms d * sc as sub_scales does). The row
// loops are unrolled so the accumulators stay in registers (6 rows: 6 ymm + 6 xmm of the 16).
static inline __attribute__((always_inline)) void dot_q8_avx2(
    int kind, int rows, const uint8_t* wrow, const block_q8a* a, int64_t nb, float* out) {
    __m256 acc[Q8_MAX_TILE_ROWS];
    float summ[Q8_MAX_TILE_ROWS];  // the offsets' sums
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps(), summ[r] = 0.0f;
    const __m256i ones = _mm256_set1_epi16(1);
    const int per = (int)(block_values(kind) / QK);  // sub-blocks per block: 1 or 8
    const int64_t bb = block_bytes(kind);
    for (int64_t blk0 = 0; blk0 < nb; blk0 += per) {
        const uint8_t* b = wrow + blk0 / per * bb;
        for (int64_t ahead = 0; ahead < bb; ahead += 64) __builtin_prefetch(b + PREFETCH_AHEAD + ahead);
        block_scales sc;  // K-quants; a 32-value block's two scales are read in place
        if (per > 1) read_block_scales(kind, b, &sc);
#pragma GCC unroll 8
        for (int s = 0; s < per; s++) {
            const int64_t blk = blk0 + s;
            subblock_avx2 w;
            sub_quants_avx2(kind, b, s, &w);
            const __m256 dv = per > 1 ? sub_dv(kind, &sc, s) : _mm256_set1_ps(sub_half(b));
            const float m = per > 1 ? sc.m[s] : has_offset(kind) ? sub_half(b + 2) : 0.0f;
#pragma GCC unroll 6
            for (int r = 0; r < rows; r++) {
                const block_q8a* ab = a + r * nb + blk;
                __m256i aq = _mm256_loadu_si256((const __m256i*)ab->qs);
                if (signed_quants(kind)) aq = _mm256_sign_epi8(aq, w.ws);  // |w| (sign(w) a) = w a
                const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(w.wu, aq), ones);
                const __m256 d = _mm256_mul_ps(dv, _mm256_broadcast_ss(&ab->d));
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[r]);
                if (has_offset(kind)) summ[r] = fmaf(m, ab->s, summ[r]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) out[r] = hsum(acc[r]) + summ[r];
}

void q8_quantize(const float* x, block_q8a* a, int64_t M, int64_t K, int threads, int path) {
    const int64_t blocks = M * (K / QK);
    const int avx2 = path != Q8_SCALAR;
#pragma omp parallel for schedule(static) num_threads(threads) if (blocks >= 1024)
    for (int64_t i = 0; i < blocks; i++) {
        if (avx2) quantize_block_avx2(x + i * QK, a + i);
        else quantize_block_scalar(x + i * QK, a + i);
    }
}

int q8_tile(int kind, int64_t left, const uint8_t* row, const block_q8a* a, int64_t nb,
            int path, float* out) {
    if (path == Q8_SCALAR) {
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
