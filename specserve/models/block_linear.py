"""Projections and embeddings whose weights stay GGUF blocks, and the swap into a decoder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from specserve.config import Numerics
from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models.huge_pages import pack_blocks
from specserve.models.llama import DecoderLM, RMSNorm

# Exact numerics only: above this many rows (a prefill chunk, a large batch) decoding the weights
# once and calling the dense GEMM beats re-expanding every block per group of rows:
# benchmarks/bench_blocks.py, whose results are in docs/benchmarks.md (on 2 AVX2 cores the blocks
# were 1.7x faster at 64 rows and 1.1x slower at 128 on 2026-12-02; they met between 32 and 64 on
# 2026-12-01). The GEMM sums in another order, so a row's exact result can change when its
# step holds more than this many rows. q8 runs the block kernel for every M.
DIRECT_MAX_ROWS = 64


_interleave = True  # see plain_rows()


@contextmanager
def plain_rows() -> Iterator[None]:
    """BlockLinears built inside the block keep the GGUF row layout in the q8 numerics too
    (benchmarks: the kernel before interleaving, side by side; not thread-safe)."""
    global _interleave
    _interleave = False
    try:
        yield
    finally:
        _interleave = True


class BlockLinear(nn.Module):
    """y = x @ W^T (+ bias) with W held as GGUF blocks [out_features, row_bytes] (CPU, float32),
    in `numerics` (config.Numerics): q8 or exact."""

    blocks: torch.Tensor

    def __init__(
        self,
        blocks: torch.Tensor,
        kind: BlockKind,
        in_features: int,
        bias: torch.Tensor | None,
        numerics: Numerics = "q8",
    ) -> None:
        super().__init__()
        ggml.check_blocks(blocks, kind, in_features)
        eight = blocks.shape[0] % ggml.X8_ROWS == 0
        if numerics == "q8" and _interleave and kind.has_x8 and not kind.interleaved and eight:
            # every activation row after the first (verify, batches, prefill) costs far fewer
            # instructions on rows interleaved eight at a time (kernels/x8.c)
            blocks, kind = ggml.repack_x8(blocks, kind, in_features), kind.x8
        self.kind, self.in_features, self.out_features = kind, in_features, blocks.shape[0]
        self.numerics = numerics
        self.register_buffer("blocks", blocks)
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        )

    @property
    def weight(self) -> torch.Tensor:
        """The float32 weights, decoded on each access (for one-off uses such as gathering rows)."""
        return ggml.dequantize(self.blocks, self.kind, self.in_features)

    @property
    def q8(self) -> bool:
        return self.numerics == "q8"

    def on_blocks(self, rows: int) -> bool:
        """Whether `rows` rows run the block kernel (always in q8; else the decode + GEMM)."""
        return self.q8 or rows <= DIRECT_MAX_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.on_blocks(rows.shape[0]):
            y = ggml.matmul_checked(rows, self.blocks, self.kind, q8=self.q8)
        else:
            y = F.linear(rows, self.weight)
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def fused(
        self,
        x: torch.Tensor,  # [M, in] (or [M, 2 in] with glu)
        norm: RMSNorm | None,
        glu: str | None,  # the gate on [gate, up] input: "silu", "gelu_tanh" or None
        residual: torch.Tensor | None,  # [M, out]
    ) -> torch.Tensor | None:
        """`project`'s one-call form; None where the block kernel does not run (`on_blocks`)."""
        if x.dim() != 2 or not self.on_blocks(x.shape[0]):
            return None
        return ggml.matmul_fused(
            x, self.blocks, self.kind, self.in_features,
            norm=(norm.kernel_weight(), norm.eps) if norm is not None else None, glu=glu,
            bias=self.bias, residual=residual.contiguous() if residual is not None else None,
            q8=self.q8,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"{self.kind.name}, {self.numerics}, in_features={self.in_features}, "
            f"out_features={self.out_features}"
        )


def block_numerics(model: nn.Module) -> Numerics | None:
    """The numerics `model`'s block projections run in; None when it has none."""
    found = {m.numerics for m in model.modules() if isinstance(m, BlockLinear)}
    return found.pop() if len(found) == 1 else None


def block_kinds(model: nn.Module) -> list[str]:
    """The GGUF block formats `model`'s weights run as, sorted; empty for plain weights."""
    kinds = {
        m.kind.plain.name for m in model.modules() if isinstance(m, BlockLinear | BlockEmbedding)
    }
    return sorted(kinds)


def quantise_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """A float weight [N, K] (K a multiple of 32) as GGUF Q8_0 blocks [N, K / 32 * 34], rounded
    as ggml's quantize_row_q8_0: per 32 values d = max|x| / 127 (stored fp16), q = round(x / d)."""
    n, k = weight.shape
    if k % ggml.QK:
        raise ValueError(f"Q8_0 needs rows of a multiple of {ggml.QK} values, got {k}")
    w = weight.detach().float().reshape(n, k // ggml.QK, ggml.QK)
    d = w.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = (w * inv).round().clamp(-127, 127).to(torch.int8)
    scale = d.to(torch.float16).view(torch.uint8)  # [N, blocks, 2]
    return torch.cat([scale, q.view(torch.uint8)], dim=-1).reshape(n, -1).contiguous()


def q8_linear(layer: nn.Linear) -> BlockLinear:
    """`layer` as a Q8_0 BlockLinear in the q8 numerics (a quarter of the bytes per product)."""
    bias = layer.bias.detach() if layer.bias is not None else None
    return BlockLinear(quantise_q8_0(layer.weight), BlockKind.Q8_0, layer.in_features, bias)


def linear_weight(layer: nn.Module) -> torch.Tensor:
    """The float32 weight [out, in] of an nn.Linear or a BlockLinear (decoded)."""
    weight = layer.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{type(layer).__name__} has no weight tensor")
    return weight


class BlockEmbedding(nn.Module):
    """Token embeddings looked up from GGUF blocks: only the rows asked for are decoded."""

    blocks: torch.Tensor

    def __init__(self, blocks: torch.Tensor, kind: BlockKind, embedding_dim: int) -> None:
        super().__init__()
        ggml.check_blocks(blocks, kind, embedding_dim)
        self.kind, self.embedding_dim = kind, embedding_dim
        self.register_buffer("blocks", blocks)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, dim]
        rows = ggml.gather_rows(self.blocks, self.kind, ids, self.embedding_dim)
        return ggml.dequantize(rows, self.kind.plain, self.embedding_dim).view(*ids.shape, -1)


class PartsLinear(nn.Module):
    """A fused projection (q/k/v, gate/up) whose parts are blocks of different kinds, as a
    Q4_K_M file mixes Q4_K and Q6_K: each part its own BlockLinear on the same input, the
    outputs side by side, then the bias. Every output is its part's, so rows stay
    batch-invariant."""

    def __init__(self, parts: list[BlockLinear], bias: torch.Tensor | None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features: int = parts[0].in_features
        self.out_features: int = sum(p.out_features for p in parts)
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        )

    def each(self) -> list[BlockLinear]:
        return [cast(BlockLinear, p) for p in self.parts]

    def _biased(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias

    @property
    def weight(self) -> torch.Tensor:
        return torch.cat([p.weight for p in self.each()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._biased(torch.cat([p(x) for p in self.each()], dim=-1))

    def fused(
        self,
        x: torch.Tensor,  # [M, in] (or [M, 2 in] with glu)
        norm: RMSNorm | None,
        glu: str | None,
        residual: torch.Tensor | None,  # [M, out]
    ) -> torch.Tensor | None:
        outs, start = [], 0
        for part in self.each():
            end = start + part.out_features
            res = None if residual is None else residual[:, start:end]
            y = part.fused(x, norm, glu, res)
            if y is None:
                return None
            outs.append(y)
            start = end
        return self._biased(torch.cat(outs, dim=-1))


def _parts(
    blocks: dict[str, tuple[BlockKind, torch.Tensor]], names: list[str]
) -> list[tuple[BlockKind, torch.Tensor]] | None:
    """The blocks of `names` (one projection's parts), or of their fused name where the file
    holds them fused (Phi-3's qkv_proj, gate_up_proj); None unless all are there."""
    fused_name = _FUSED_NAMES.get(tuple(n.rsplit(".", 2)[-2] for n in names))
    if fused_name is not None:
        whole = names[0].rsplit(".", 2)[0] + f".{fused_name}.weight"
        if whole in blocks:
            names[:] = [whole]
    parts = [blocks[n] for n in names if n in blocks]
    return parts if len(parts) == len(names) else None


_FUSED_NAMES = {
    ("q_proj", "k_proj", "v_proj"): "qkv_proj",
    ("gate_proj", "up_proj"): "gate_up_proj",
}


def attach_blocks(
    model: DecoderLM,
    blocks: dict[str, tuple[BlockKind, torch.Tensor]],
    numerics: Numerics = "q8",
) -> set[str]:
    """Swap in block layers (multiplying in `numerics`) wherever all of a layer's weights have
    blocks (`PartsLinear` where they are of several kinds), all of them then in one allocation
    (`huge_pages`). Called before the float32 weights load; returns the checkpoint names
    covered, which the loader then skips."""
    covered: set[str] = set()

    def swap(owner: nn.Module, attr: str, names: list[str]) -> None:
        found = _parts(blocks, names)
        linear = getattr(owner, attr)
        if found is None or not isinstance(linear, nn.Linear):
            return
        if len({kind for kind, _ in found}) == 1:  # one kind: one layer over all the rows
            kind = found[0][0]
            found = [
                (kind, torch.cat([rows for _, rows in found]) if len(found) > 1 else found[0][1])
            ]
        layers, start = [], 0
        bias = linear.bias if len(found) == 1 else None  # else the PartsLinear's own
        for kind, rows in found:
            start += rows.shape[0]
            if rows.shape[1] != kind.row_bytes(linear.in_features) or start > linear.out_features:
                raise ValueError(f"GGUF blocks for {names[0]} do not match the layer's shape")
            layers.append(BlockLinear(rows, kind, linear.in_features, bias, numerics))
        if start != linear.out_features:
            raise ValueError(f"GGUF blocks for {names[0]} do not match the layer's shape")
        parts = layers[0] if len(layers) == 1 else PartsLinear(layers, linear.bias)
        setattr(owner, attr, parts)
        covered.update(names)

    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}"
        swap(layer, "qkv_proj", [f"{p}.self_attn.{n}_proj.weight" for n in ("q", "k", "v")])
        swap(layer, "o_proj", [f"{p}.self_attn.o_proj.weight"])
        swap(layer, "gate_up_proj", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"])
        swap(layer, "down_proj", [f"{p}.mlp.down_proj.weight"])
    tied = model.arch.tie_word_embeddings
    swap(model, "lm_head", ["model.embed_tokens.weight" if tied else "lm_head.weight"])
    embedding = blocks.get("model.embed_tokens.weight")
    if embedding is not None:
        kind, rows = embedding
        if tied and isinstance(model.lm_head, BlockLinear):
            # one copy serves both, as the tied weight did (interleaved or not)
            kind, rows = model.lm_head.kind, model.lm_head.blocks
        model.embed_tokens = BlockEmbedding(rows, kind, model.arch.hidden_size)
        covered.add("model.embed_tokens.weight")
    pack_blocks(model.modules())  # one mapping on huge pages (models/huge_pages.py)
    return covered
