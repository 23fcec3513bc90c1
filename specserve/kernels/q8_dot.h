// The q8 numerics on plain GGUF rows (q8_dot.c, where the arithmetic and its bit-identity
// argument are written out): activations quantised per 32 values to Q8A blocks, integer dot
// products against every plain kind, on a scalar reference and an AVX2 path.
#pragma once

#include <math.h>
#include <stdint.h>

#include "block_kinds.h"
#include "subblocks.h"

// The q8 kernels' paths: the scalar reference, AVX2, and AVX512-VNNI for interleaved rows
// (x8.c; plain rows and quantising take AVX2's there). q8_matmul.c picks one at load.
enum { Q8_SCALAR = 0, Q8_AVX2 = 1, Q8_VNNI = 2 };

// A Q8A block (40 bytes): a[j] ~ d * qs[j], s = d * sum_j qs[j].
typedef struct { float d, s; int8_t qs[QK]; } block_q8a;

#define Q8_MAX_TILE_ROWS 6  // activation rows one q8_tile call multiplies at most

// The scalar reference's steps (dot_q8_scalar in q8_dot.c), shared with the interleaved rows'
// reference (x8_kquants.c); static inline: they run once per 32 values.

// hsum's order (simd.h) on 8 floats held in memory.
static inline float hsum8(const float a[8]) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// One sub-block's lane sums, lane FMAs and offset FMA (see dot_q8_scalar).
static inline void q8_sub_scalar(int kind, const subblock* w, const block_q8a* a, float acc[8],
                                 float* summ) {
    int32_t lane[8] = {0};
    for (int j = 0; j < QK; j++) lane[j / 4] += w->q[j] * a->qs[j];
    for (int l = 0; l < 8; l++) acc[l] = fmaf(w->dv[l] * a->d, (float)lane[l], acc[l]);
    if (has_offset(kind)) *summ = fmaf(w->m, a->s, *summ);
}

// a [M, K/32] = the Q8A blocks of x [M, K] on `path` (bit-identical on each); every block on its
// own, so rows never interact.
void q8_quantize(const float* x, block_q8a* a, int64_t M, int64_t K, int threads, int path);

// Up to Q8_MAX_TILE_ROWS outputs of one plain weight row of `kind` (nb 32-value sub-blocks), for
// activation rows a[0 .. left) (a[r * nb + blk]): out[r]; how many. path: Q8_SCALAR, else AVX2.
int q8_tile(int kind, int64_t left, const uint8_t* row, const block_q8a* a, int64_t nb,
            int path, float* out);
