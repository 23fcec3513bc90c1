"""The EAGLE head's layer as torch operations over padded tensors, on any device (a CUDA target
among them): the path `EagleProposer` takes where the head's projections are not GGUF blocks for
the native call (eagle_native.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specserve.request import Sequence
from specserve.speculation.eagle_head import NO_POSITION, EagleHead
from specserve.speculation.eagle_state import Chain, HeadState
from specserve.speculation.proposer import Draft

# `padded_catch_up` runs each sequence's pending (feature, token) pairs against its cached keys
# and keeps the last `window - 1` of them; `padded_draft` then extends every chain one token a
# step from the head's own previous output, the chain's keys living only for that call.
PAD_QUERY = 1 << 40  # the position of a padded query row (sees every key; its output is unused)

Embed = Callable[[torch.Tensor], torch.Tensor]  # token ids [...] -> float32 embeddings [..., H]
# outputs [B, H] -> each chain's next token, as its place in the draft vocabulary [B]
Pick = Callable[[torch.Tensor, list[Chain], int], torch.Tensor]


def padded_cache(
    head: EagleHead, states: list[HeadState], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The states' caches right-padded to one length: keys, values [B, kv_heads, P, D] and
    positions [B, P] (NO_POSITION where empty)."""
    kv_heads, head_dim = head.shape.num_kv_heads, head.shape.head_dim
    length = max((len(s.positions) for s in states if s.positions is not None), default=0)
    keys = torch.zeros(len(states), kv_heads, length, head_dim, device=device)
    values = torch.zeros_like(keys)
    positions = torch.full((len(states), length), NO_POSITION, dtype=torch.long, device=device)
    for b, s in enumerate(states):
        if s.keys is not None and s.values is not None and s.positions is not None:
            n = len(s.positions)
            keys[b, :, :n], values[b, :, :n], positions[b, :n] = s.keys, s.values, s.positions
    return keys, values, positions


def padded_catch_up(
    head: EagleHead, embed: Embed, todo: list[HeadState], device: torch.device
) -> None:
    """Run every pending pair of `todo`: keys into the caches, each state's `last` output."""
    t = max(len(s.tokens) for s in todo)
    feats = torch.zeros(len(todo), t, head.shape.hidden_size, device=device)
    ids = torch.zeros(len(todo), t, dtype=torch.long, device=device)
    q_pos = torch.full((len(todo), t), PAD_QUERY, dtype=torch.long, device=device)
    for b, s in enumerate(todo):
        n = len(s.tokens)
        feats[b, :n] = torch.cat(s.features)
        ids[b, :n] = torch.tensor(s.tokens, device=device)
        q_pos[b, :n] = torch.arange(s.next_pos, s.next_pos + n, device=device)
    x = head.fuse(feats, embed(ids))
    q, k, v = head.qkv_at(x, q_pos)
    k_pos = torch.where(q_pos == PAD_QUERY, NO_POSITION, q_pos)
    past_k, past_v, past_pos = padded_cache(head, todo, device)
    keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    allowed = head.window_mask(q_pos, torch.cat([past_pos, k_pos], dim=1))
    allowed |= (q_pos == PAD_QUERY).unsqueeze(2)
    out = head.finish(x, head.attend(q, keys, values, allowed))
    keep = head.shape.window - 1
    for b, s in enumerate(todo):
        n = len(s.tokens)
        valid = past_pos[b] != NO_POSITION
        s.keys = torch.cat([past_k[b][:, valid], k[b, :, :n]], dim=1)[:, -keep:]
        s.values = torch.cat([past_v[b][:, valid], v[b, :, :n]], dim=1)[:, -keep:]
        s.positions = torch.cat([past_pos[b][valid], q_pos[b, :n]])[-keep:]
        s.last = out[b, n - 1]
        s.next_pos += n
        s.features, s.tokens = [], []


def padded_draft(
    head: EagleHead,
    vocab_embed: torch.Tensor,
    pick: Pick,
    seqs: list[Sequence],
    ks: list[int],
    states: list[HeadState],
    device: torch.device,
) -> list[Draft]:
    """Up to ks[i] tokens per sequence, each drafted from the head's output at the one before;
    `vocab_embed` [K, H]: the draft vocabulary's embeddings, by place."""
    g = torch.stack([s.last for s in states if s.last is not None]).unsqueeze(1)  # [B, 1, H]
    past_k, past_v, past_pos = padded_cache(head, states, device)
    pos = torch.tensor([s.next_pos for s in states], device=device).unsqueeze(1)  # [B, 1]
    picks = [Chain(seq, k) for seq, k in zip(seqs, ks, strict=True)]
    for j in range(max(ks)):
        places = pick(g[:, 0], picks, j)  # [B]
        if all(c.done() for c in picks):
            break
        x = head.fuse(g, vocab_embed[places].unsqueeze(1))
        q, k, v = head.qkv_at(x, pos)
        past_k, past_v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        past_pos = torch.cat([past_pos, pos], dim=1)
        g = head.finish(x, head.attend(q, past_k, past_v, head.window_mask(pos, past_pos)))
        pos = pos + 1
    return [c.draft() for c in picks]
