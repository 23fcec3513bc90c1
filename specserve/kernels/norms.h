// RMSNorms outside a projection (norms.c, in the block library): the q/k norm of each head and
// the norm on a sublayer's output before the residual add (Gemma 3's sandwich norms). The Python
// layer calls them on the rows its block projections computed and the native decoder calls them
// in its layer loop, so the two give the same bits. Each row's norm rounds as prepare_row's.
#pragma once

#include <stdint.h>

#include "export.h"

// In place, heads [first, first + n) of T rows `stride` floats apart, D floats each:
// x = x * rms_scale(x) * w (w [D]).
KERNEL_API void rms_norm_heads(float* x, int64_t stride, int64_t T, int64_t first, int64_t n,
                               int64_t D, const float* w, float eps);

// out [T, K] = x + y * rms_scale(y) * w per row (w [K]); out may be x.
KERNEL_API void rms_norm_add(const float* y, const float* x, float* out, int64_t T, int64_t K,
                             const float* w, float eps);
