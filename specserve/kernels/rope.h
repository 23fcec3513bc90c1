// Rotate-half RoPE in place, built into the paged attention library (rope.c; the model
// calls it through `kernels/attention.py`, the native decoder from decoder.c).
#pragma once

#include <stdint.h>

#include "export.h"

// Rotate-half RoPE in place on the first R dims (R even, <= D; the rest pass through) of the
// first n_heads heads (D floats each) of T rows `stride` floats apart, with per-row tables
// cos/sin [T, R]:
//     lo' = lo * cos_lo - hi * sin_lo,   hi' = hi * cos_hi + lo * sin_hi,
// each product and sum rounded on its own (no FMA), as x * cos + rotate_half(x) * sin rounds.
KERNEL_API void rope_rotate_half(float* x, int64_t stride, int64_t T, int64_t n_heads,
                                 int64_t D, int64_t R, const float* cos, const float* sin);
