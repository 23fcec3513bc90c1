"""The EAGLE head's drafting on the native layer (eagle_native.py), each sequence's keys in a
lane of the head's own cache: the path `EagleProposer` takes where the head's projections are
GGUF blocks; eagle_padded.py is the same as torch operations.

`lanes_run` runs every state's pending (feature, token) pairs and, for greedy requests, the
whole chain in one native call; `lanes_draft` drafts the chains that sample, one native call a
token, the token picked in Python.
"""

from __future__ import annotations

import torch

from specserve.models.block_linear import BlockLinear
from specserve.request import Sequence
from specserve.speculation import eagle_state
from specserve.speculation.eagle_head import EagleHead
from specserve.speculation.eagle_native import NativeHead, Rows
from specserve.speculation.eagle_padded import Pick
from specserve.speculation.eagle_state import Chain, HeadState
from specserve.speculation.proposer import Draft


def lanes_run(
    native: NativeHead,
    states: list[HeadState],
    ks: list[int],
    pending_embeds: torch.Tensor | None,
    vocab_logits: BlockLinear,
    vocab_embed: torch.Tensor,
) -> list[tuple[list[int], list[float]]]:
    """One native call (NativeHead.chain): every state's pending pairs (their keys kept,
    `last` updated), then greedy chains of up to ks tokens (none where all are 0).
    `pending_embeds` [T, H]: the embeddings of the states' pending tokens, in order (None where
    none are pending); returns each chain's draft places and probabilities."""
    rows = Rows([], [s.next_pos for s in states], [len(s.tokens) for s in states])
    for s, count in zip(states, rows.counts, strict=True):
        s.lane = s.lane or native.lane(s.next_pos)
        # every row runs while any chain drafts on: room for the longest chain in each lane
        native.make_room(s.lane, s.next_pos, count + max(ks))
        rows.lanes.append(s.lane)
    pending = None
    if pending_embeds is not None:
        pending = (torch.cat([f for s in states for f in s.features]), pending_embeds)
    blank = torch.zeros(vocab_embed.shape[1], device=vocab_embed.device)
    g = torch.stack([blank if s.last is None else s.last for s in states])  # new: scratch
    above = eagle_state.CONTINUE_ABOVE  # (read here: tests and bench_eagle set it)
    last, found = native.chain(g, rows, pending, ks, vocab_logits, vocab_embed, above)
    for b, (s, count) in enumerate(zip(states, rows.counts, strict=True)):
        if count:
            s.last, s.next_pos, s.features, s.tokens = last[b], s.next_pos + count, [], []
    return found


def lanes_draft(
    native: NativeHead,
    head: EagleHead,
    vocab_embed: torch.Tensor,
    pick: Pick,
    seqs: list[Sequence],
    ks: list[int],
    states: list[HeadState],
) -> list[Draft]:
    """Up to ks[i] tokens per caught-up sequence, each drafted from the head's output at the
    one before; `vocab_embed` [K, H]: the draft vocabulary's embeddings, by place."""
    ks = [min(k, native.max_chain) for k in ks]
    lanes = []
    for s in states:
        assert s.lane is not None  # caught up at least once: `last` is there
        # every row runs while any chain drafts on: room for the longest chain in each lane
        native.make_room(s.lane, s.next_pos, max(ks))
        lanes.append(s.lane)
    g = torch.stack([s.last for s in states if s.last is not None])  # [B, H]
    picks = [Chain(seq, k) for seq, k in zip(seqs, ks, strict=True)]
    for j in range(max(ks)):
        places = pick(g, picks, j)  # [B]
        if all(c.done() for c in picks):
            break
        x = head.fuse(g, vocab_embed[places])
        g = native.forward(x, Rows(lanes, [s.next_pos + j for s in states], [1] * len(lanes)))
    return [c.draft() for c in picks]
