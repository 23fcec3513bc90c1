// The EAGLE head's drafting chain in one native call (`speculation/eagle_native.py` calls it),
// built into the GGUF block library (eagle_chain.c). One chain step is, for B sequences at once:
//   scores = g @ V^T                        V: the draft vocabulary's rows of the target's lm_head
//   place  = argmax scores, p = its softmax probability (1 / sum_j e^(s_j - max))
//   x      = [g, E[place]] @ Wfc^T           E: the draft vocabulary's embeddings (float32)
//   x      = the head's decoder layer over x (decoder_layers: keys into the lanes' slots)
//   g      = RMSNorm(x) * w_norm
// the same kernel calls, with the same arguments, that the Python loop makes (BlockLinear in the
// q8 numerics, then NativeHead.forward), so scores, places and the layer's outputs equal that
// loop's bit for bit; p and the final norm (the RMSNorm the fused projections apply) round in
// another float32 summation order than torch's: within float tolerance. Before the chain, the same call runs the pairs
// (feature, token) verified since the last one (the catch-up: fused input, layer, norm), whose
// keys join the lanes. What goes away is the ~15 framework calls a chain step and the ~10 a
// catch-up cost in Python, each several times its warm cost right after the target's forward.
//
// A chain stops when it holds k tokens or the product of its probabilities falls below
// `continue_above` (eagle_proposer.Chain.done); a stopped chain's rows still run while any other
// drafts on (its token only feeds the next step, as in Python), and the call ends when all
// have stopped. Greedy chains only: sampled ones need the engine's sampler (Python).

#pragma once

#include <stdint.h>

#include "decoder.h"
#include "export.h"

typedef struct {
    const uint8_t* vocab_rows;  // [K] block rows of hidden (the draft vocabulary's lm_head rows)
    const float* vocab_embed;   // [K, hidden]
    const uint8_t* fc;          // [hidden] block rows of 2 hidden
    const float* norm;          // [hidden] the head's final RMSNorm weight
    const float* cos;           // [rope_rows, D] RoPE tables by output position
    const float* sin;
    int64_t K, rope_rows;
    int32_t vocab_kind, fc_kind, q8;
    float eps, continue_above;
} EagleChain;

// seqs [5, B]: per sequence b (its lane is DecoderBatch's tables row b) the cache slot, lane
// position and output position of its first row, the most tokens to draft, and how many of the
// T pending rows are its own (feats and embeds [T, hidden], in sequence order: verified pairs
// whose keys join the lane first, as NativeHead.forward + commit would). g [B, hidden]: the
// head's outputs at the newest verified positions of the sequences without pending rows
// (scratch). Writes last [B, hidden] (every sequence's newest verified output, after its pending
// rows), places [B, kmax] (rows of the draft vocabulary), probs [B, kmax] and counts [B]. 0 on
// success, -1 when buffers could not be allocated, -2 on a failed kernel call, or (nothing run)
// where a sequence's pending and kmax chain rows would leave its lane or the RoPE tables.
KERNEL_API int eagle_chain(const DecoderLayer* layer, const DecoderShape* s, const EagleChain* c,
                           const DecoderBatch* lanes, const int64_t* seqs, const float* feats,
                           const float* embeds, int64_t T, float* g, float* last,
                           int32_t* places, float* probs, int64_t* counts, int threads);
