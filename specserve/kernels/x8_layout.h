// Where each byte of an interleaved ("x8") block lives: GGUF weight rows interleaved eight at a
// time, for the q8 numerics (x8.c: Q4_1_X8, Q8_0_X8; x8_kquants.c: the K-quants' and Q5_1_X8).
// Repacking and gathering rows back only move bytes: every row's block is the same bytes in
// another place.
// The moves are in x8_layout.c.
//
// For each group of eight weight rows (n = 8g .. 8g+7) and each block (32 values; K-quants: 256)
// the eight rows' plain blocks become one block of eight times the bytes. A plain block is cut
// into fields, and each field into units of 1, 2 or 4 bytes; unit c of row i's field goes to
//   to + (8 c + i) * unit
// of the interleaved block. So
//   unit 2 (fp16 scales): the eight rows' d side by side, 16 bytes, one cvtph for all eight;
//   unit 4 (quants): 32-byte vectors, vector c holding bytes 4c .. 4c+3 of each row: byte
//     4i + k is byte 4c + k of row i, one maddubs against four broadcast activation bytes
//     yields products for eight outputs;
//   unit 1 (K-quants' scale bytes): byte c of rows 0..7 in 8 consecutive bytes, one load and
//     one widening for eight rows' codes.
// Fields (plain offset, length, unit -> interleaved offset), per kind:
//   Q4_1_X8 (160 B):  d 0,2,2 -> 0; m 2,2,2 -> 16; nibbles 4,16,4 -> 32
//   Q8_0_X8 (272 B):  d 0,2,2 -> 0; int8 2,32,4 -> 16
//   Q4_K_X8 (1152 B): d 0,2,2 -> 0; dmin 2,2,2 -> 16; scales 4,12,1 -> 32; nibbles 16,128,4 -> 128
//   Q5_1_X8 (192 B):  d 0,2,2 -> 0; m 2,2,2 -> 16; qh 4,4,4 -> 32; nibbles 8,16,4 -> 64
//   Q5_K_X8 (1408 B): as Q4_K_X8, and qh 16,32,4 -> 128; nibbles 48,128,4 -> 384
//   Q6_K_X8 (1680 B): ql 0,128,4 -> 0; qh 128,64,4 -> 1024; scales 192,16,1 -> 1536;
//     d 208,2,2 -> 1664


#pragma once

#include <immintrin.h>
#include <stdint.h>

#include "block_kinds.h"
#include "export.h"

#define X8_ROWS 8
#define X8_MAX_BLOCK_BYTES 210  // the largest plain block (Q6_K)

// Bytes of one block of a group of eight rows.
static inline int64_t x8_block_bytes(int kind) { return X8_ROWS * block_bytes(kind); }

// Four activation bytes (one lane) in every 32-bit lane: what one maddubs multiplies against an
// interleaved vector's four quants of each of eight rows (static inline: the x8 kernels' inner
// loops).
static inline __m256i x8_broadcast4(const int8_t* q) {
    int32_t v;
    __builtin_memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

// Row i of an interleaved block o (an x8 kind's), as GGUF stores it, into plain.
void x8_row_block(int kind, const uint8_t* o, int i, uint8_t* plain);

// Row n of the interleaved weights w [N, K] (an x8 kind's), as GGUF stores it, into plain
// [row bytes]: a whole row's moves with the kind a constant (faster than block by block).
void x8_plain_row(int kind, const uint8_t* w, int64_t n, int64_t K, uint8_t* plain);

// dst = src [N, K / block_values plain blocks] interleaved as `kind` (an x8 kind); N a multiple
// of 8.
KERNEL_API int ggml_repack_x8(int kind, const uint8_t* src, uint8_t* dst, int64_t N, int64_t K);

// Rows ids[0 .. n) of W [N rows, any kind] as plain GGUF rows: out [n, row bytes];
// -1 (out untouched past the bad id) when an id is outside [0, N).
KERNEL_API int ggml_gather_rows(int kind, const uint8_t* w, int64_t N, const int64_t* ids,
                                int64_t n, uint8_t* out, int64_t K);
