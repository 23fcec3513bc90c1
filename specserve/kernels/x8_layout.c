// The interleaved ("x8") layout's moves (x8_layout.h describes where each byte goes): repacking
// plain rows and gathering them back. Both only move bytes.

#include <stdint.h>

#include "block_kinds.h"
#include "x8_layout.h"

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

void x8_row_block(int kind, const uint8_t* o, int i, uint8_t* plain) {
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

int ggml_repack_x8(int kind, const uint8_t* src, uint8_t* dst, int64_t N, int64_t K) {
    if (!is_x8(kind) || N % X8_ROWS) return -1;
    const int64_t nb = K / block_values(kind), rb = row_bytes(kind, K);
    for (int64_t n = 0; n < N; n++)
        EACH_X8_KIND(kind, x8_move_row, dst + n / X8_ROWS * X8_ROWS * rb, (int)(n % X8_ROWS),
                     (uint8_t*)src + n * rb, nb, 1)
    return 0;
}

void x8_plain_row(int kind, const uint8_t* w, int64_t n, int64_t K, uint8_t* plain) {
    const int64_t nb = K / block_values(kind), rb = row_bytes(kind, K);
    uint8_t* g = (uint8_t*)w + n / X8_ROWS * X8_ROWS * rb;
    EACH_X8_KIND(kind, x8_move_row, g, (int)(n % X8_ROWS), plain, nb, 0)
}

int ggml_gather_rows(int kind, const uint8_t* w, int64_t N, const int64_t* ids, int64_t n,
                     uint8_t* out, int64_t K) {
    const int64_t rb = row_bytes(kind, K);
    for (int64_t r = 0; r < n; r++) {
        if (ids[r] < 0 || ids[r] >= N) return -1;
        uint8_t* o = out + r * rb;
        if (!is_x8(kind)) {
            __builtin_memcpy(o, w + ids[r] * rb, rb);
            continue;
        }
        x8_plain_row(kind, w, ids[r], K, o);
    }
    return 0;
}
