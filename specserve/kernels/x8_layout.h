// Where each byte of an interleaved ("x8") block lives: GGUF weight rows interleaved eight at a
// time, for the q8 numerics (x8.h: Q4_1_X8, Q8_0_X8; x8_kquants.h: the K-quants' and Q5_1_X8).
// Repacking and gathering rows back only move bytes: every row's block is the same bytes in
// another place.
// Included once, by ggml_blocks.c, before x8.h and x8_kquants.h.
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

#define X8_ROWS 8
#define X8_MAX_BLOCK_BYTES 210  // the largest plain block (Q6_K)

typedef struct {
    int at, len, unit, to;
} x8_field;

// A kind's fields, in the order above; their count.
static inline int x8_fields(int kind, const x8_field** f) {
    static const x8_field q4_1[] = {{0, 2, 2, 0}, {2, 2, 2, 16}, {4, 16, 4, 32}};
    static const x8_field q8_0[] = {{0, 2, 2, 0}, {2, 32, 4, 16}};
    static const x8_field q4_k[] = {{0, 2, 2, 0}, {2, 2, 2, 16}, {4, 12, 1, 32}, {16, 128, 4, 128}};
    static const x8_field q5_1[] = {{0, 2, 2, 0}, {2, 2, 2, 16}, {4, 4, 4, 32}, {8, 16, 4, 64}};
    static const x8_field q5_k[] = {{0, 2, 2, 0}, {2, 2, 2, 16}, {4, 12, 1, 32}, {16, 32, 4, 128},
                                    {48, 128, 4, 384}};
    static const x8_field q6_k[] = {{0, 128, 4, 0}, {128, 64, 4, 1024}, {192, 16, 1, 1536},
                                    {208, 2, 2, 1664}};
    switch (kind) {
        case KIND_Q4_1_X8: *f = q4_1; return 3;
        case KIND_Q8_0_X8: *f = q8_0; return 2;
        case KIND_Q4_K_X8: *f = q4_k; return 4;
        case KIND_Q5_1_X8: *f = q5_1; return 4;
        case KIND_Q5_K_X8: *f = q5_k; return 5;
        case KIND_Q6_K_X8: *f = q6_k; return 4;
        default: *f = 0; return 0;
    }
}

// Bytes of one block of a group of eight rows.
static inline int64_t x8_block_bytes(int kind) { return X8_ROWS * block_bytes(kind); }

// Row i's bytes of one block, between an interleaved block `o` and its plain GGUF block.
// to_x8: plain -> o; else o -> plain.
static inline __attribute__((always_inline)) void x8_move(int kind, uint8_t* o, int i,
                                                          uint8_t* plain, int to_x8) {
    const x8_field* f;
    const int fields = x8_fields(kind, &f);
#define X8_COPY(UNIT)                                                      \
    for (int c = 0; c < f[k].len / UNIT; c++) {                            \
        uint8_t* x = o + f[k].to + (X8_ROWS * c + i) * UNIT;               \
        uint8_t* p = plain + f[k].at + c * UNIT;                           \
        __builtin_memcpy(to_x8 ? x : p, to_x8 ? p : x, UNIT);              \
    }
#pragma GCC unroll 8
    for (int k = 0; k < fields; k++) {
        if (f[k].unit == 1) X8_COPY(1)
        else if (f[k].unit == 2) X8_COPY(2)
        else X8_COPY(4)
    }
#undef X8_COPY
}

// Row i of an interleaved block, as GGUF stores it.
static inline void x8_row_block(int kind, const uint8_t* o, int i, uint8_t* plain) {
    x8_move(kind, (uint8_t*)o, i, plain, 0);
}

// Row i of the interleaved group at g and the plain row p, nb blocks each, moved as x8_move
// does. Called with the kind a constant (EACH_X8_KIND), so that its field table folds into
// copies of constant sizes (as fast as the hand-written Q4_1/Q8_0 copies before the table).
static inline __attribute__((always_inline)) void x8_move_row(int kind, uint8_t* g, int i,
                                                              uint8_t* p, int64_t nb, int to_x8) {
    const int64_t bb = block_bytes(kind), gb = x8_block_bytes(kind);
    for (int64_t blk = 0; blk < nb; blk++) x8_move(kind, g + blk * gb, i, p + blk * bb, to_x8);
}

#define EACH_X8_KIND(kind, FN, ...)                                  \
    switch (kind) {                                                  \
        case KIND_Q4_1_X8: FN(KIND_Q4_1_X8, __VA_ARGS__); break;     \
        case KIND_Q8_0_X8: FN(KIND_Q8_0_X8, __VA_ARGS__); break;     \
        case KIND_Q4_K_X8: FN(KIND_Q4_K_X8, __VA_ARGS__); break;     \
        case KIND_Q5_1_X8: FN(KIND_Q5_1_X8, __VA_ARGS__); break;     \
        case KIND_Q5_K_X8: FN(KIND_Q5_K_X8, __VA_ARGS__); break;     \
        case KIND_Q6_K_X8: FN(KIND_Q6_K_X8, __VA_ARGS__); break;     \
        default: break;                                              \
    }

// dst = src [N, K / block_values plain blocks] interleaved as `kind` (an x8 kind); N a multiple
// of 8.
int ggml_repack_x8(int kind, const uint8_t* src, uint8_t* dst, int64_t N, int64_t K) {
    if (!is_x8(kind) || N % X8_ROWS) return -1;
    const int64_t nb = K / block_values(kind), rb = row_bytes(kind, K);
    for (int64_t n = 0; n < N; n++)
        EACH_X8_KIND(kind, x8_move_row, dst + n / X8_ROWS * X8_ROWS * rb, (int)(n % X8_ROWS),
                     (uint8_t*)src + n * rb, nb, 1)
    return 0;
}

// Rows ids[0 .. n) of W [N rows, any kind] as plain GGUF rows: out [n, row bytes];
// -1 (out untouched past the bad id) when an id is outside [0, N).
int ggml_gather_rows(int kind, const uint8_t* w, int64_t N, const int64_t* ids, int64_t n,
                     uint8_t* out, int64_t K) {
    const int64_t nb = K / block_values(kind), rb = row_bytes(kind, K);
    for (int64_t r = 0; r < n; r++) {
        if (ids[r] < 0 || ids[r] >= N) return -1;
        uint8_t* o = out + r * rb;
        if (!is_x8(kind)) {
            __builtin_memcpy(o, w + ids[r] * rb, rb);
            continue;
        }
        uint8_t* g = (uint8_t*)w + ids[r] / X8_ROWS * X8_ROWS * rb;
        EACH_X8_KIND(kind, x8_move_row, g, (int)(ids[r] % X8_ROWS), o, nb, 0)
    }
    return 0;
}
