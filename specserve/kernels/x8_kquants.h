// The q8 numerics on interleaved Q4_K, Q5_K, Q6_K and Q5_1 rows (x8_kquants.c: bit for bit the
// plain kind's kernel, eight outputs per vector; a scalar reference and AVX2).
#pragma once

#include <stdint.h>

#include "q8_dot.h"

#define X8K_CHUNK 64  // activation rows one x8k_tile call multiplies at most

// Up to X8K_CHUNK activation rows a[0 .. left) against the group at g: out[8 r + i]; how many.
// path: Q8_SCALAR, else AVX2 (a VNNI machine's too).
int x8k_tile(int kind, int64_t left, const uint8_t* g, const block_q8a* a, int64_t nb, int path,
             float* out);
