// The q8 numerics on Q4_1 and Q8_0 rows interleaved eight at a time (x8.c: the arithmetic, a
// scalar reference, AVX2 and AVX512-VNNI paths, bit-identical).
#pragma once

#include <stdint.h>

#include "q8_dot.h"

// Up to 16 (Q8_0: 4, on VNNI 8) activation rows a[0 .. left) against the group of eight
// Q4_1_X8 or Q8_0_X8 rows at g: out[8 r + i]; how many. path: Q8_SCALAR, Q8_AVX2 or Q8_VNNI.
int x8_tile(int kind, int64_t left, const uint8_t* g, const block_q8a* a, int64_t nb, int path,
            float* out);
