"""Linear layers whose weights stay GGUF blocks, and the swap that puts them into a decoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models.llama import LlamaForCausalLM

# Above this many rows (a prefill chunk, a large batch) decoding the weights once and calling the
# dense GEMM beats re-expanding every block per group of rows. Measured: docs/benchmarks.md.
DIRECT_MAX_ROWS = 24


class BlockLinear(nn.Module):
    """y = x @ W^T (+ bias) with W held as GGUF blocks [out_features, row_bytes] (CPU, float32)."""

    blocks: torch.Tensor

    def __init__(
        self, blocks: torch.Tensor, kind: BlockKind, in_features: int, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.kind, self.in_features, self.out_features = kind, in_features, blocks.shape[0]
        self.register_buffer("blocks", blocks.contiguous())
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        )

    @property
    def weight(self) -> torch.Tensor:
        """The float32 weights, decoded on each access (for one-off uses such as gathering rows)."""
        return ggml.dequantize(self.blocks, self.kind, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] <= DIRECT_MAX_ROWS:
            y = ggml.matmul(rows, self.blocks, self.kind)
        else:
            y = F.linear(rows, self.weight)
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.kind.name}, in_features={self.in_features}, out_features={self.out_features}"


def _fused(
    blocks: dict[str, tuple[BlockKind, torch.Tensor]], names: list[str]
) -> tuple[BlockKind, torch.Tensor] | None:
    parts = [blocks.get(n) for n in names]
    if any(p is None for p in parts) or len({p[0] for p in parts if p is not None}) != 1:
        return None
    kind = parts[0][0] if parts[0] is not None else BlockKind.Q4_1
    return kind, torch.cat([p[1] for p in parts if p is not None])


def attach_blocks(
    model: LlamaForCausalLM, blocks: dict[str, tuple[BlockKind, torch.Tensor]]
) -> int:
    """Replace the model's linear layers that have blocks of one kind; returns how many."""
    replaced = 0

    def swap(owner: nn.Module, attr: str, names: list[str]) -> None:
        nonlocal replaced
        found = _fused(blocks, names)
        linear = getattr(owner, attr)
        if found is None or not isinstance(linear, nn.Linear):
            return
        kind, rows = found
        if rows.shape[0] != linear.out_features or rows.shape[1] != kind.row_bytes(
            linear.in_features
        ):
            raise ValueError(f"GGUF blocks for {names[0]} do not match the layer's shape")
        setattr(owner, attr, BlockLinear(rows, kind, linear.in_features, linear.bias))
        replaced += 1

    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}"
        swap(layer, "qkv_proj", [f"{p}.self_attn.{n}_proj.weight" for n in ("q", "k", "v")])
        swap(layer, "o_proj", [f"{p}.self_attn.o_proj.weight"])
        swap(layer, "gate_up_proj", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"])
        swap(layer, "down_proj", [f"{p}.mlp.down_proj.weight"])
    tied = model.arch.tie_word_embeddings
    swap(model, "lm_head", ["model.embed_tokens.weight" if tied else "lm_head.weight"])
    return replaced
