// The GGUF block kinds the block library reads (the values of `block_kinds.py`'s BlockKind) and
// their geometry. Every helper is static inline and a switch rather than a table: a kernel
// inlined for one kind (EACH_PLAIN_KIND) folds them to constants.
#pragma once

#include <stdint.h>

// *_X8: the same blocks with rows interleaved eight at a time (x8_layout.h), for the q8
// numerics only.
enum {
    KIND_Q4_1 = 0, KIND_Q8_0 = 1, KIND_Q4_1_X8 = 2, KIND_Q8_0_X8 = 3,
    KIND_Q4_0 = 4, KIND_Q5_0 = 5, KIND_Q5_1 = 6, KIND_Q4_K = 7, KIND_Q5_K = 8, KIND_Q6_K = 9,
    KIND_Q4_K_X8 = 10, KIND_Q6_K_X8 = 11, KIND_Q5_K_X8 = 12, KIND_Q5_1_X8 = 13,
    KIND_COUNT
};
#define QK 32     // values per block (and per sub-block of a K-quant, and per Q8A block)
#define QK_K 256  // values of a K-quant super-block
// Bytes ahead of the block being read to prefetch: the weights are streamed once per product,
// and without it the loop waits on memory (3x slower once W leaves the cache).
#define PREFETCH_AHEAD 2048

// The GGUF kind an interleaved kind's blocks hold (a plain kind: itself).
static inline int plain_kind(int kind) {
    switch (kind) {
        case KIND_Q4_1_X8: return KIND_Q4_1;
        case KIND_Q8_0_X8: return KIND_Q8_0;
        case KIND_Q4_K_X8: return KIND_Q4_K;
        case KIND_Q6_K_X8: return KIND_Q6_K;
        case KIND_Q5_K_X8: return KIND_Q5_K;
        case KIND_Q5_1_X8: return KIND_Q5_1;
        default: return kind;
    }
}
static inline int is_x8(int kind) { return plain_kind(kind) != kind; }
static inline int valid_kind(int kind) { return kind >= 0 && kind < KIND_COUNT; }

// Bytes and values of one block (x8 kinds: the per-row share of an interleaved block, the same).
static inline int64_t block_bytes(int kind) {
    switch (plain_kind(kind)) {
        case KIND_Q4_1: return 20;
        case KIND_Q8_0: return 34;
        case KIND_Q4_0: return 18;
        case KIND_Q5_0: return 22;
        case KIND_Q5_1: return 24;
        case KIND_Q4_K: return 144;
        case KIND_Q5_K: return 176;
        default: return 210;  // Q6_K
    }
}
static inline int64_t block_values(int kind) {
    kind = plain_kind(kind);
    return kind == KIND_Q4_K || kind == KIND_Q5_K || kind == KIND_Q6_K ? QK_K : QK;
}
static inline int64_t row_bytes(int kind, int64_t K) {
    return K / block_values(kind) * block_bytes(kind);
}

// Whether W's rows of K values can be read as `kind`: a known kind whose blocks divide K.
static inline int fits(int kind, int64_t K) {
    return valid_kind(kind) && K % block_values(kind) == 0;
}

// FN(kind, ...) for a plain kind, with the kind a constant in each call: every kind gets its
// own inlined kernel.
#define EACH_PLAIN_KIND(kind, FN, ...)                          \
    switch (kind) {                                             \
        case KIND_Q4_1: FN(KIND_Q4_1, __VA_ARGS__); break;      \
        case KIND_Q8_0: FN(KIND_Q8_0, __VA_ARGS__); break;      \
        case KIND_Q4_0: FN(KIND_Q4_0, __VA_ARGS__); break;      \
        case KIND_Q5_0: FN(KIND_Q5_0, __VA_ARGS__); break;      \
        case KIND_Q5_1: FN(KIND_Q5_1, __VA_ARGS__); break;      \
        case KIND_Q4_K: FN(KIND_Q4_K, __VA_ARGS__); break;      \
        case KIND_Q5_K: FN(KIND_Q5_K, __VA_ARGS__); break;      \
        case KIND_Q6_K: FN(KIND_Q6_K, __VA_ARGS__); break;      \
        default: break;                                         \
    }

// y[i] = dot (+ bias[n]) (+ res[i]), rounded in that order, as x @ W^T + b then r + y would
// be: every matmul's output store (inline: it runs once per output).
static inline void store(float* y, const float* bias, const float* res, int64_t i, int64_t n,
                         float dot) {
    if (bias) dot += bias[n];
    y[i] = res ? res[i] + dot : dot;
}
