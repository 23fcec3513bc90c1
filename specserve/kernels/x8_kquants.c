// Interleaved K-quant and Q5_1 rows (Q4_K_X8, Q5_K_X8, Q6_K_X8, Q5_1_X8; layout in
// x8_layout.h) in the q8 numerics, bit for bit what the plain rows' kernel (q8_dot.c) gives for
// the same kind, on every path and every M.
//
// Arithmetic of one output (weight row n, activation row a), q8_dot.c's, unchanged: per 32-value
// sub-block s, the eight exact int32 lane sums lane[t] = sum_{j in [4t, 4t+4)} q_w[j] q_a[j],
//   acc[t] = fma(dv_s * d_a, lane[t], acc[t])      dv_s = d * sc_s as read_block_scales forms it
//   summ   = fma(m_s, s_a, summ)                    m_s = -(dmin * mn_s), Q5_1 its m; Q6_K none
//   out    = hsum8(acc) + summ                      (Q6_K: summ = +0, added all the same)
// Only which register holds what differs. On plain rows a vector holds the eight lanes of one
// output; here it holds lane t of eight outputs (the sub-block's interleaved vector t, four
// quants of each row, by one maddubs + madd against four broadcast activation bytes). So the
// per-sub-block scale product, summ's FMA and the final hsum8 are one vector op per eight
// outputs instead of eight, the eight outputs' chains run side by side, and the conversions
// and lane FMAs stay one per eight lanes as before. Lanes and float ops are the same numbers in
// the same order, so the result is the plain kernel's bit for bit (whatever layout the model
// holds, a row's outputs are the same). Signed Q6_K multiplies as on plain rows: |q| against
// the activations with q's sign.
// Eight accumulators per activation row fill half the registers, so rows go one at a time:
// decoding (one row) unpacks the quants where they are used; several rows share each
// super-block's quants, unpacked once (dot_x8k_rows_avx2).
// No VNNI form: every vector path takes AVX2 here.

#include <stdint.h>

#include "block_kinds.h"
#include "q8_dot.h"
#include "subblocks.h"
#include "x8_kquants.h"
#include "x8_layout.h"

// Scalar reference: row i of the group at g . one activation row of nb sub-blocks: the row's
// plain blocks put back, then q8_dot.h's scalar steps on them.
static float dot_x8k_scalar(int kind, const uint8_t* g, int i, const block_q8a* a, int64_t nb) {
    const int plain = plain_kind(kind), per = (int)(block_values(kind) / QK);
    float acc[8] = {0}, summ = 0.0f;
    for (int64_t blk0 = 0; blk0 < nb; blk0 += per) {
        uint8_t b[X8_MAX_BLOCK_BYTES];
        x8_row_block(kind, g + blk0 / per * x8_block_bytes(kind), i, b);
        for (int s = 0; s < per; s++) {
            subblock w;
            unpack_scalar(plain, b, s, &w);
            q8_sub_scalar(plain, &w, a + blk0 + s, acc, &summ);
        }
    }
    return hsum8(acc) + summ;
}

// The kernels below take eight sub-blocks at a time, a span: a K-quant super-block, or eight
// Q5_1 blocks (fewer at the end of a row). The span of sub-blocks blk0 .. blk0+7 of the group
// at g, and how many it holds.
#define X8K_SPAN 8
static inline const uint8_t* x8k_span(int kind, const uint8_t* g, int64_t blk0) {
    const int64_t gb = x8_block_bytes(kind);
    return kind == KIND_Q5_1_X8 ? g + blk0 * gb : g + blk0 / X8K_SPAN * gb;
}
static inline int x8k_span_len(int kind, int64_t blk0, int64_t nb) {
    return kind == KIND_Q5_1_X8 && nb - blk0 < X8K_SPAN ? (int)(nb - blk0) : X8K_SPAN;
}

// A group's super-block scales as vectors over its eight rows, read_block_scales's products
// row by row: dv[s] = d * sc_s and m[s] = -(dmin * mn_s); Q6_K: dv[j] = d * sc_j per 16 values;
// Q5_1 (a span of n blocks): dv[s] = d and m[s] = m of block s.
typedef struct {
    __m256 dv[16], m[8];
} x8k_scales;

// Bytes at..at+7 (byte c of each row's scales, x8_layout.h) as eight int32.
static inline __m256i x8k_bytes(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
}

static inline __attribute__((always_inline)) void x8k_read_scales(int kind, const uint8_t* o,
                                                                  int n, x8k_scales* sc) {
    if (kind == KIND_Q5_1_X8) {
        for (int s = 0; s < n; s++) {
            sc->dv[s] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 192 * s)));
            sc->m[s] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 192 * s + 16)));
        }
        return;
    }
    if (kind == KIND_Q6_K_X8) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 1664)));
        for (int j = 0; j < 16; j++) {
            const __m128i code = _mm_loadl_epi64((const __m128i*)(o + 1536 + 8 * j));
            sc->dv[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(code)));
        }
        return;
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)o));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(o + 16)));
    const __m256i low6 = _mm256_set1_epi32(63), low4 = _mm256_set1_epi32(15);
    __m256i b[12];
    for (int c = 0; c < 12; c++) b[c] = x8k_bytes(o + 32 + 8 * c);
    for (int s = 0; s < 8; s++) {  // kscale_min, eight rows at once
        __m256i code, mn;
        if (s < 4) {
            code = _mm256_and_si256(b[s], low6);
            mn = _mm256_and_si256(b[s + 4], low6);
        } else {
            code = _mm256_or_si256(_mm256_and_si256(b[s + 4], low4),
                                   _mm256_slli_epi32(_mm256_srli_epi32(b[s - 4], 6), 4));
            mn = _mm256_or_si256(_mm256_srli_epi32(b[s + 4], 4),
                                 _mm256_slli_epi32(_mm256_srli_epi32(b[s], 6), 4));
        }
        sc->dv[s] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(code));
        const __m256 minus = _mm256_set1_ps(-0.0f);
        sc->m[s] = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)), minus);
    }
}

// Q5_1's fifth bits of lane t: byte 4i + k is 0x10 where bit 4t + k of row i's qh (the 32 bits
// at p + 4i) is set, else 0 (fifth_bits, eight rows at once).
static inline __m256i x8k_qh_bits(const uint8_t* p, int t) {
    const __m256i qh = _mm256_loadu_si256((const __m256i*)p);
    const int h = (t >> 1) * 0x01010101;  // byte t / 2 of each row's qh into all its four bytes
    const __m256i spread = _mm256_shuffle_epi8(
        qh, _mm256_setr_epi32(h, 0x04040404 + h, 0x08080808 + h, 0x0C0C0C0C + h,
                              h, 0x04040404 + h, 0x08080808 + h, 0x0C0C0C0C + h));
    const __m256i bit = _mm256_set1_epi32(t & 1 ? (int)0x80402010 : 0x08040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                            _mm256_set1_epi8(0x10));
}

// Lane t of sub-block s of the span at o: byte 4i + k is q_i[4t + k] (sub_quants_avx2's
// bits, from the interleaved vectors: vector c of a field holds its bytes 4c .. 4c+3).
static inline __attribute__((always_inline)) __m256i x8k_quants(int kind, const uint8_t* o,
                                                                int s, int t) {
    if (kind == KIND_Q5_1_X8) {  // block s: nibbles, low ones for t < 4; fifth bit j of qh
        const uint8_t* b = o + 192 * s;
        const __m256i nibbles = bits32(b + 64 + 32 * (t & 3), 4 * (t >> 2), 15);
        return _mm256_or_si256(nibbles, x8k_qh_bits(b + 32, t));
    }
    if (kind == KIND_Q4_K_X8) return bits32(o + 128 + 32 * (8 * (s / 2) + t), 4 * (s & 1), 15);
    if (kind == KIND_Q5_K_X8)  // the fifth bits: bit s of qh
        return _mm256_or_si256(bits32(o + 384 + 32 * (8 * (s / 2) + t), 4 * (s & 1), 15),
                               _mm256_slli_epi16(bits32(o + 128 + 32 * t, s, 1), 4));
    const int c = s / 4, u = s % 4;  // Q6_K: 128 values per 64 bytes of ql and 32 of qh
    // the top two bits (2u, 2u + 1 of qh) moved to bits 4, 5 by one shift, then masked
    const __m256i h = _mm256_loadu_si256((const __m256i*)(o + 1024 + 32 * (8 * c + t)));
    const __m256i at4 = u < 2    ? _mm256_slli_epi16(h, 4 - 2 * u)
                        : u == 3 ? _mm256_srli_epi16(h, 2)
                                 : h;
    const __m256i low = bits32(o + 32 * (16 * c + 8 * (u & 1) + t), 4 * (u >> 1), 15);
    const __m256i q = _mm256_or_si256(low, _mm256_and_si256(at4, _mm256_set1_epi8(0x30)));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
}

// Sub-block s of one activation row ab against the eight rows' quants w (signed q) and wu
// (maddubs' unsigned operand: |q| for Q6_K, else q), or where w is NULL, against those of the
// super-block at o unpacked where used: v[t] = fma(dv_s * d_a, lane t, v[t]) for the eight
// lanes (Q6_K: dv of values 0-15 for lanes 0-3, of 16-31 after), v[8] = fma(m_s, s_a, v[8])
// (Q6_K: none).
static inline __attribute__((always_inline)) void x8k_step(int kind, const x8k_scales* sc, int s,
                                                           const uint8_t* o, const __m256i* w,
                                                           const __m256i* wu, const block_q8a* ab,
                                                           __m256 v[9]) {
    const int q6 = kind == KIND_Q6_K_X8;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 da = _mm256_broadcast_ss(&ab->d);
    const __m256 d_lo = _mm256_mul_ps(sc->dv[q6 ? 2 * s : s], da);
    const __m256 d_hi = q6 ? _mm256_mul_ps(sc->dv[2 * s + 1], da) : d_lo;
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) {
        const __m256i q = w ? w[t] : x8k_quants(kind, o, s, t);
        const __m256i qu = w ? wu[t] : q6 ? _mm256_sign_epi8(q, q) : q;
        __m256i aq = x8_broadcast4(ab->qs + 4 * t);
        if (q6) aq = _mm256_sign_epi8(aq, q);  // |q| (sign(q) a) = q a
        const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(qu, aq), ones);
        const __m256 lane = _mm256_cvtepi32_ps(lanes);
        v[t] = _mm256_fmadd_ps(t < 4 ? d_lo : d_hi, lane, v[t]);
    }
    if (!q6) v[8] = _mm256_fmadd_ps(sc->m[s], _mm256_broadcast_ss(&ab->s), v[8]);
}

// The eight outputs from a row's accumulators: hsum8's order on each, then + summ (+0 for Q6_K,
// added all the same, as dot_q8_scalar adds it).
static inline void x8k_store(const __m256 v[9], float* out) {
    const __m256 even = _mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6]));
    const __m256 odd = _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7]));
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(even, odd), v[8]));
}

// The quants of sub-block s for the eight rows: w (signed) and wu (maddubs' operand).
static inline __attribute__((always_inline)) void x8k_unpack(int kind, const uint8_t* o, int s,
                                                             __m256i w[8], __m256i wu[8]) {
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) {
        w[t] = x8k_quants(kind, o, s, t);
        wu[t] = kind == KIND_Q6_K_X8 ? _mm256_sign_epi8(w[t], w[t]) : w[t];
    }
}

// AVX2, one activation row (decoding): the eight rows of the group at g . a; out[i] as
// dot_x8k_scalar(kind, g, i, a, nb) computes it. Accumulators in registers, quants unpacked
// where used.
static inline __attribute__((always_inline)) void dot_x8k_avx2(int kind, const uint8_t* g,
                                                               const block_q8a* a, int64_t nb,
                                                               float* out) {
    __m256 v[9];
    for (int t = 0; t < 9; t++) v[t] = _mm256_setzero_ps();
    for (int64_t blk0 = 0; blk0 < nb; blk0 += X8K_SPAN) {
        const uint8_t* o = x8k_span(kind, g, blk0);
        const int n = x8k_span_len(kind, blk0, nb);
        const int64_t bytes = x8_block_bytes(kind) * (kind == KIND_Q5_1_X8 ? n : 1);
        for (int64_t ahead = 0; ahead < bytes; ahead += 64) __builtin_prefetch(o + PREFETCH_AHEAD + ahead);
        x8k_scales sc;
        x8k_read_scales(kind, o, n, &sc);
#pragma GCC unroll 8
        for (int s = 0; s < n; s++) x8k_step(kind, &sc, s, o, NULL, NULL, a + blk0 + s, v);
    }
    x8k_store(v, out);
}

// AVX2, `rows` activation rows (up to X8K_CHUNK; a[r * nb + blk]): out[8 r + i]. Each
// super-block's quants are unpacked once for all the rows, which then pass over them one at a
// time with their accumulators in registers (kept in acc between super-blocks): unpacking
// per row (tiles of two) cost Q6_K 1.7x this at M = 16.
static inline __attribute__((always_inline)) void dot_x8k_rows_avx2(
    int kind, int rows, const uint8_t* g, const block_q8a* a, int64_t nb, float* out) {
    __m256 acc[X8K_CHUNK][9];
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < 9; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t blk0 = 0; blk0 < nb; blk0 += X8K_SPAN) {
        const uint8_t* o = x8k_span(kind, g, blk0);
        const int n = x8k_span_len(kind, blk0, nb);
        const int64_t bytes = x8_block_bytes(kind) * (kind == KIND_Q5_1_X8 ? n : 1);
        for (int64_t ahead = 0; ahead < bytes; ahead += 64) __builtin_prefetch(o + PREFETCH_AHEAD + ahead);
        x8k_scales sc;
        x8k_read_scales(kind, o, n, &sc);
        __m256i w[8][8], wu[8][8];
#pragma GCC unroll 8
        for (int s = 0; s < n; s++) x8k_unpack(kind, o, s, w[s], wu[s]);
        for (int r = 0; r < rows; r++) {
            __m256 v[9];
#pragma GCC unroll 9
            for (int t = 0; t < 9; t++) v[t] = acc[r][t];
#pragma GCC unroll 8
            for (int s = 0; s < n; s++)
                x8k_step(kind, &sc, s, o, w[s], wu[s], a + r * nb + blk0 + s, v);
#pragma GCC unroll 9
            for (int t = 0; t < 9; t++) acc[r][t] = v[t];
        }
    }
    for (int r = 0; r < rows; r++) x8k_store(acc[r], out + 8 * r);
}

int x8k_tile(int kind, int64_t left, const uint8_t* g, const block_q8a* a, int64_t nb, int path,
             float* out) {
    if (path == Q8_SCALAR) {
        for (int i = 0; i < X8_ROWS; i++) out[i] = dot_x8k_scalar(kind, g, i, a, nb);
        return 1;
    }
    const int rows = left < X8K_CHUNK ? (int)left : X8K_CHUNK;
#define X8K_ROWS(KIND)                                  \
    if (rows == 1) dot_x8k_avx2(KIND, g, a, nb, out);   \
    else dot_x8k_rows_avx2(KIND, rows, g, a, nb, out);
    switch (kind) {
        case KIND_Q4_K_X8: X8K_ROWS(KIND_Q4_K_X8) break;
        case KIND_Q5_K_X8: X8K_ROWS(KIND_Q5_K_X8) break;
        case KIND_Q5_1_X8: X8K_ROWS(KIND_Q5_1_X8) break;
        case KIND_Q6_K_X8: X8K_ROWS(KIND_Q6_K_X8) break;
        default: break;
    }
#undef X8K_ROWS
    return rows;
}
