// Every plain GGUF block kind, one 32-value sub-block at a time, in the form both numerics
// share (after ggml's dequantize_row_* in ggml-quants.c and its block structs):
//
//   w[j] = dv[j / 4] * q[j] (+ m)        j = 0..31, integer quants q, 8 lane scales dv
//
// so one arithmetic core serves every kind: the exact numerics expands w to float32 (dv * q
// is exact in float32, so fma(dv, q, m) rounds once, as gguf-py's d * q + m does), and the q8
// one sums q[j] * a[j] over each lane of four values in int32 (q8_dot.h). Per kind:
//   Q4_1  (20 B / 32):  fp16 d, m; 16 B nibbles            q = nibble              dv = d
//   Q8_0  (34 B / 32):  fp16 d; 32 int8                    q = int8                dv = d
//   Q4_0  (18 B / 32):  fp16 d; 16 B nibbles               q = nibble - 8          dv = d
//   Q5_0  (22 B / 32):  fp16 d; qh u32; 16 B nibbles       q = nibble | h << 4, -16
//   Q5_1  (24 B / 32):  fp16 d, m; qh u32; 16 B nibbles    q = nibble | h << 4     + m
//     (32-value kinds: value j < 16 is the low nibble of byte j, j >= 16 the high one of
//     byte j - 16; its fifth bit is bit j of qh)
//   Q4_K (144 B / 256): fp16 d, dmin; 12 B of 6-bit scales and mins; 128 B nibbles: 64 values
//     per 32 bytes (sub-block 2p the low nibbles of bytes 32p.., 2p+1 the high ones);
//     dv = d * sc_s, m = -(dmin * mn_s), q = nibble
//   Q5_K (176 B / 256): as Q4_K, with qh[32] before the nibbles: bit s of qh[l] is the fifth
//     bit of value l of sub-block s
//   Q6_K (210 B / 256): ql[128], qh[64], int8 scales[16], fp16 d; q = 6 bits - 32, one scale
//     per 16 values: dv[0..3] = d * sc[2s], dv[4..7] = d * sc[2s + 1]
// d * sc is exact in float32 (an fp16 significand times an integer of at most 8 bits).
// The readers are static inline (always_inline where it matters): the vector kernels of every
// unit inline them with the kind a constant. The scalar reference, unpack_scalar, is in
// subblocks.c.

#pragma once

#include <stdint.h>

#include "block_kinds.h"
#include "simd.h"

// Every fp16 bit pattern as float32 (subblocks.c fills it at load), so a block's scales are
// read by a plain load rather than by conversion and shuffle instructions, which compete with
// the nibble unpacking. Hidden: the kernels reach it directly, not through the GOT.
extern float half_table[1 << 16] __attribute__((visibility("hidden")));

static inline float sub_half(const uint8_t* p) {
    uint16_t h;
    __builtin_memcpy(&h, p, 2);
    return half_table[h];
}

// Whether w has the offset m (else m is absent, not 0: no term is added), and whether q is
// signed (the AVX2 form then keeps |q| and moves the sign onto the activations).
static inline int has_offset(int kind) {
    return kind == KIND_Q4_1 || kind == KIND_Q5_1 || kind == KIND_Q4_K || kind == KIND_Q5_K;
}
static inline int signed_quants(int kind) {
    return kind == KIND_Q8_0 || kind == KIND_Q4_0 || kind == KIND_Q5_0 || kind == KIND_Q6_K;
}
static inline int is_kquant(int kind) {
    return kind == KIND_Q4_K || kind == KIND_Q5_K || kind == KIND_Q6_K;
}

// The block holding sub-block sb of a row, and sb's index in it (0 for 32-value kinds).
static inline __attribute__((always_inline)) const uint8_t* sub_block(int kind, const uint8_t* row,
                                                                      int64_t sb, int* s) {
    const int per = is_kquant(kind) ? QK_K / QK : 1;
    *s = (int)(sb % per);
    return row + (sb / per) * block_bytes(kind);
}

// Scale and min j (0..7) of a Q4_K/Q5_K super-block's 12 bytes (ggml's get_scale_min_k4):
// bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3; 8-11 the low 4 bits of scales and mins
// 4-7, whose top 2 bits are the top bits of bytes 0-3 (scales) and 4-7 (mins).
static inline void kscale_min(const uint8_t* q, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// The lane scales and offset of sub-block s of block b (all kinds).
static inline __attribute__((always_inline)) void sub_scales(int kind, const uint8_t* b, int s,
                                                             float dv[8], float* m) {
    *m = 0.0f;
    if (kind == KIND_Q6_K) {
        const float d = sub_half(b + 208);
        for (int l = 0; l < 8; l++) dv[l] = d * (float)(int8_t)b[192 + 2 * s + l / 4];
        return;
    }
    if (kind == KIND_Q4_K || kind == KIND_Q5_K) {
        int sc, mn;
        kscale_min(b + 4, s, &sc, &mn);
        for (int l = 0; l < 8; l++) dv[l] = sub_half(b) * (float)sc;
        *m = -(sub_half(b + 2) * (float)mn);
        return;
    }
    for (int l = 0; l < 8; l++) dv[l] = sub_half(b);
    if (kind == KIND_Q4_1 || kind == KIND_Q5_1) *m = sub_half(b + 2);
}

// A sub-block in the common form (the scalar reference's).
typedef struct {
    float dv[8];
    float m;
    int8_t q[QK];
} subblock;

// Sub-block sb of a row in the common form (the scalar reference of both numerics).
void unpack_scalar(int kind, const uint8_t* row, int64_t sb, subblock* o);

// AVX2: a sub-block's quants as vectors (its scales: block_scales below). ws: q as signed
// bytes; wu: the unsigned operand of maddubs, |q| for signed kinds, else q itself.
typedef struct {
    __m256i wu, ws;
} subblock_avx2;

// Bytes j of the result: 0x10 where bit j of the 32 bits at p is set, else 0.
static inline __m256i fifth_bits(const uint8_t* p) {
    uint32_t x;
    __builtin_memcpy(&x, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(  // byte j <- byte j / 8 of x
        _mm256_set1_epi32((int)x),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);  // byte j: 1 << (j % 8)
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                            _mm256_set1_epi8(0x10));
}

// 32 nibbles of a 32-value block: the low ones of 16 bytes, then their high ones.
static inline __m256i nibbles16(const uint8_t* p) {
    const __m128i q = _mm_loadu_si128((const __m128i*)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

// Bits [shift, shift + width) of 32 bytes.
static inline __m256i bits32(const uint8_t* p, int shift, int mask) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)p);
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8((char)mask));
}

// The quants of sub-block s of block b into o->ws (signed kinds' q) and o->wu (|q|, or q).
static inline __attribute__((always_inline)) void sub_quants_avx2(int kind, const uint8_t* b,
                                                                  int s, subblock_avx2* o) {
    __m256i q;
    switch (kind) {
        case KIND_Q8_0: q = _mm256_loadu_si256((const __m256i*)(b + 2)); break;
        case KIND_Q4_1: q = nibbles16(b + 4); break;
        case KIND_Q4_0: q = _mm256_sub_epi8(nibbles16(b + 2), _mm256_set1_epi8(8)); break;
        case KIND_Q5_0:
            q = _mm256_or_si256(nibbles16(b + 6), fifth_bits(b + 2));
            q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
            break;
        case KIND_Q5_1: q = _mm256_or_si256(nibbles16(b + 8), fifth_bits(b + 4)); break;
        case KIND_Q4_K: q = bits32(b + 16 + 32 * (s / 2), 4 * (s & 1), 15); break;
        case KIND_Q5_K:
            q = _mm256_or_si256(bits32(b + 48 + 32 * (s / 2), 4 * (s & 1), 15),
                                _mm256_slli_epi16(bits32(b + 16, s, 1), 4));
            break;
        default: {  // Q6_K
            const int c = s / 4, t = s % 4;
            q = _mm256_or_si256(bits32(b + 64 * c + 32 * (t & 1), 4 * (t >> 1), 15),
                                _mm256_slli_epi16(bits32(b + 128 + 32 * c, 2 * t, 3), 4));
            q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
        }
    }
    o->ws = q;
    o->wu = signed_quants(kind) ? _mm256_sign_epi8(q, q) : q;  // |q|: -128 reads as 128
}

// The vector kernels read a block's scales once for all its sub-blocks (a K-quant's packed
// 6-bit scales once per 256 values): dv, one per sub-block (Q6_K: one per 16 values), and m,
// one per sub-block; the same float products as sub_scales.
typedef struct {
    float dv[16];
    float m[8];
} block_scales;

static inline __attribute__((always_inline)) void read_block_scales(int kind, const uint8_t* b,
                                                                    block_scales* o) {
    if (kind == KIND_Q6_K) {
        const __m256 d = _mm256_set1_ps(sub_half(b + 208));
        const __m128i sc = _mm_loadu_si128((const __m128i*)(b + 192));
        _mm256_storeu_ps(o->dv, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(o->dv + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                         _mm_srli_si128(sc, 8)))));
    } else if (kind == KIND_Q4_K || kind == KIND_Q5_K) {
        // kscale_min for all eight at once (ggml's utmp shuffle): u[0..1] the scales' bytes,
        // u[2..3] the mins'
        uint32_t u[4];
        __builtin_memcpy(u, b + 4, 12);
        const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
        u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & top2) << 4);
        const uint32_t mins_0_3 = u[1] & low6;
        u[1] = (u[2] & low4) | (((u[0] >> 6) & top2) << 4);
        u[2] = mins_0_3;
        u[0] &= low6;
        const __m128i codes = _mm_loadu_si128((const __m128i*)u);
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8)));
        const __m256 d = _mm256_set1_ps(sub_half(b));
        const __m256 dmin = _mm256_set1_ps(sub_half(b + 2));
        _mm256_storeu_ps(o->dv, _mm256_mul_ps(d, sc));
        _mm256_storeu_ps(o->m, _mm256_xor_ps(_mm256_mul_ps(dmin, mn), _mm256_set1_ps(-0.0f)));
    } else {
        o->dv[0] = sub_half(b);
        o->m[0] = kind == KIND_Q4_1 || kind == KIND_Q5_1 ? sub_half(b + 2) : 0.0f;
    }
}

// The lane scales of sub-block s from its block's scales.
static inline __attribute__((always_inline)) __m256 sub_dv(int kind, const block_scales* sc,
                                                           int s) {
    if (kind != KIND_Q6_K) return _mm256_broadcast_ss(&sc->dv[s]);
    return _mm256_set_m128(_mm_broadcast_ss(&sc->dv[2 * s + 1]), _mm_broadcast_ss(&sc->dv[2 * s]));
}
