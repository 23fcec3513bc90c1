"""Medusa heads on the block kernels: the heads' forward in the q8 numerics, for a proposal that
costs a small fraction of a target step (issue 56 item 5).

The float32 heads read 4 x their bytes and pay a framework call per head and layer: on the
embedded model at batch 1 their proposal took half a target step (benchmarks/bench_medusa.py).
Here every weight is Q8_0 blocks (`quantise_q8_0`, once at load) multiplied by the q8 kernel:

    layer 0, all heads at once:  y = [W_0,0; W_1,0; ...] h + [b_0,0; b_1,0; ...]   (one call)
                                 s_i = h + silu(y_i)
    layer j > 0, per head:       s_i <- s_i + silu(W_i,j s_i + b_i,j)
    scores, all heads at once:   logits = s V^T, V the vocabulary rows (one call over B x n rows)

with V the shared lm_head's rows of the draft vocabulary (gathered from the target's blocks
where it has them), or each head's own lm_head. Drafts differ from the float heads' where the
q8 rounding moves an argmax; they are only proposals, so outputs do not change.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from specserve.kernels import ggml
from specserve.models.block_linear import BlockLinear, linear_weight, q8_linear, quantise_q8_0
from specserve.speculation.medusa import MedusaHeads, ResBlock


def _q8(weight: torch.Tensor, bias: torch.Tensor | None) -> BlockLinear:
    """[out, in] float weights as a Q8_0 `BlockLinear` in the q8 numerics."""
    return BlockLinear(quantise_q8_0(weight), ggml.BlockKind.Q8_0, weight.shape[1], bias)


def _vocab_rows(lm_head: nn.Module, vocab: torch.Tensor) -> BlockLinear:
    """The lm_head's rows `vocab` [K] as blocks, padded by repeating the last id to a multiple
    of 8 rows (the interleaved kernel's unit); callers keep the first K columns."""
    pad = -len(vocab) % ggml.X8_ROWS
    ids = torch.cat([vocab, vocab[-1:].expand(pad)]) if pad else vocab
    if isinstance(lm_head, BlockLinear):  # the target's own rows, in its GGUF type
        rows = ggml.gather_rows(lm_head.blocks, lm_head.kind, ids, lm_head.in_features)
        return BlockLinear(rows, lm_head.kind.plain, lm_head.in_features, None)
    return _q8(linear_weight(lm_head).detach()[ids], None)


class BlockHeads:
    """`MedusaHeads.logits` (over the draft vocabulary where the heads have one) in the q8
    numerics. `supports` says where it runs."""

    def __init__(self, heads: MedusaHeads, base_lm_head: nn.Module) -> None:
        sequences = cast(list[nn.Sequential], list(heads))
        blocks = [[b.linear for b in head if isinstance(b, ResBlock)] for head in sequences]
        self.hidden, self.num_layers = heads.hidden_size, heads.num_layers
        self.first: BlockLinear | None = None  # layer 0 of every head, stacked
        if self.num_layers:
            weight = torch.cat([b[0].weight for b in blocks]).detach().float()
            self.first = _q8(weight, torch.cat([b[0].bias for b in blocks]).detach().float())
        self.rest = [[q8_linear(b) for b in bs[1:]] for bs in blocks]  # per head, layers 1..
        self.shared: nn.Module | None = None  # [.., H] -> [.., K + padding], every head's
        self.own: list[BlockLinear] = []  # each head's own, in head order
        vocab = heads.draft_vocab
        if vocab is not None:
            self.num_vocab = len(vocab)
            lm_heads = [base_lm_head] if heads.shares_lm_head else [h[-1] for h in sequences]
            rows = [_vocab_rows(h, vocab) for h in lm_heads]
            self.shared, self.own = (rows[0], []) if heads.shares_lm_head else (None, rows)
        elif heads.shares_lm_head:
            self.shared = base_lm_head  # the target's projection as it runs
            self.num_vocab = cast(int, base_lm_head.out_features)
        else:
            self.own = [q8_linear(cast(nn.Linear, h[-1])) for h in sequences]
            self.num_vocab = self.own[0].out_features

    @staticmethod
    def supports(heads: MedusaHeads, device: torch.device) -> bool:
        """Whether the block kernels can run these heads: on the CPU, kernels built, whole
        32-value blocks per row."""
        return (
            device.type == "cpu" and ggml.library() is not None and heads.hidden_size % ggml.QK == 0
        )

    def states(self, hidden: torch.Tensor, n: int) -> torch.Tensor:
        """hidden [B, H] -> the first n heads' residual stacks [B, n, H]."""
        h = hidden.float().contiguous()
        if self.first is None:
            return h.unsqueeze(1).expand(-1, n, -1)
        y = self.first.fused(h, None, None, None)  # [B, all heads x H], the bias added
        assert y is not None  # q8: the block kernel runs for every number of rows
        y = y[:, : n * self.hidden]
        s = (h.repeat(1, n) + F.silu(y)).view(-1, n, self.hidden)  # [B, n, H]
        for i, layers in enumerate(self.rest[:n]):
            x = s[:, i].contiguous()  # [B, H]
            for layer in layers:
                y = layer.fused(x, None, None, None)
                assert y is not None
                x = x + F.silu(y)
            s[:, i] = x
        return s

    def logits(self, hidden: torch.Tensor, n: int) -> torch.Tensor:
        """hidden [B, H] -> [B, n, K]: the first n heads' scores over the draft vocabulary
        (K of them; the full vocabulary without one)."""
        s = self.states(hidden, n)  # [B, n, H]
        b = s.shape[0]
        if self.shared is not None:
            out = self.shared(s.reshape(b * n, self.hidden)).view(b, n, -1)
        else:
            out = torch.stack([self.own[i](s[:, i].contiguous()) for i in range(n)], dim=1)
        return out[..., : self.num_vocab]
