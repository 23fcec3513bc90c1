// Attention of a ragged batch's query rows over a paged float32 or fp16 KV cache, read in place
// (paged_attention.c: the layout, the online softmax and why every row is batch-invariant).
// Built into the attention library and, for the native decoder, into the block library.
#pragma once

#include <stdint.h>

#include "export.h"

// q rows are q_stride floats apart (heads contiguous within a row); K/V elements are esize bytes
// (4: float32, 2: fp16). seq_info [B, 3] = (first query row in q/out, q_len, ctx_len); tables
// [B, max_blocks] int32. out [T, H, D] receives the rows of these sequences only. Returns 0, or -1
// when the shapes are outside what the kernel handles (D not a multiple of 8 or above 256, H not
// a multiple of Hkv), a sequence's indices are out of range (`sequence_in_range`) or memory runs
// out.
KERNEL_API int paged_attention(const float* q, int64_t q_stride, const void* k_cache,
                               const void* v_cache, int64_t esize, float* out,
                               const int64_t* seq_info, const int32_t* tables, int64_t max_blocks,
                               int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t block_size,
                               float scale, int64_t window, int64_t num_slots, int threads);
