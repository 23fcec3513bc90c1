// A grammar's token mask applied to a row of logits, built into the paged attention library
// (mask.c; `grammar.py` calls it through `kernels/attention.py`). torch's masked_fill takes
// ~80 us on a 49k row; this takes a few.
#pragma once

#include <stdint.h>

#include "export.h"

// logits[i] = -inf wherever bit i of `bits` is clear (bit i % 32 of word i / 32, llguidance's
// layout), for i < n, and returns how many of the n tokens are allowed. If none is, the row is
// left as it was (the caller decides what may follow). The values kept are not touched.
KERNEL_API int64_t mask_logits(float* logits, const uint32_t* bits, int64_t n);
