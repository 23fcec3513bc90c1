"""The decoder's layers in one native call per step, where every projection is GGUF blocks.

A decode step of the embedded model spends about a third of its time between kernel calls:
six Python-level calls per layer, each checking arguments, allocating its output and crossing
ctypes. `NativeStack` hands the whole layer loop to `kernels/decoder.c`, which makes the same
kernel calls with the same arguments, so every output is bit-identical to the Python loop's
(tests/models/test_native_stack.py holds it to that). Where it cannot run (a projection that is
not blocks, exact numerics on more rows than the block kernel takes, the padded reference
attention, a non-float32 model, no kernel library) `run` returns False and the Python loop runs.
A model whose description asks for what the C layer does not do (`refusal`: output or MLP
biases) is refused when the loader asks `supports`.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from specserve.kernels import decoder, ggml
from specserve.models.arch import ModelArch
from specserve.models.attention import AttentionMetadata, ByLayerKind, RaggedMetadata
from specserve.models.block_linear import BlockLinear
from specserve.models.llama import ROPE_KERNEL_WIDTH, DecoderLayer, DecoderLM, RMSNorm

_python_layers = threading.local()


@contextmanager
def python_layers() -> Iterator[None]:
    """Run the Python layer loop inside the block, in this thread (tests and benchmarks)."""
    _python_layers.on = True
    try:
        yield
    finally:
        _python_layers.on = False


def _projections(layer: DecoderLayer) -> list[BlockLinear] | None:
    found: list[nn.Module] = [layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj]
    blocks = [p for p in found if isinstance(p, BlockLinear)]
    return blocks if len(blocks) == len(found) else None


def refusal(arch: ModelArch) -> str | None:
    """What in `arch` the native decoder does not implement; None where it runs it all.

    It runs Llama-like layers: RMSNorms, plain or (1 + w) (the weights it multiplies by come
    from Python), the post-attention / post-MLP norms where a family has them, fused q/k/v with
    or without their biases, q/k norm per head, RoPE over each head's first rotary dims (all of
    them, or Phi-3's part) from up to two tables (any scaling: the tables come from Python)
    picked per layer, each layer attending in full
    or within the window of its kind, any attention scale, a SiLU- or GELU-tanh-gated MLP. The
    embedding scale, the final norm and the logits (soft-cap included) stay in Python."""
    missing = [
        what
        for what, differs in (
            (
                "RoPE over other dims in each layer kind",
                arch.local_rope is not None
                and arch.local_rope.rotary_dim != arch.full_rope.rotary_dim,
            ),
            ("output projection or MLP biases", arch.o_bias or arch.mlp_bias),
            ("q/k norm over a head dim not a multiple of 8", arch.qk_norm and arch.head_dim % 8),
        )
        if differs
    ]
    if not missing:
        return None
    return f"{arch.architecture}: the native decoder does not implement {', '.join(missing)}"


def _weights_refusal(model: DecoderLM) -> str | None:
    layers = [_projections(layer) for layer in model.layers]  # type: ignore[arg-type]
    if any(p is None for p in layers) or layers[0] is None:
        return "not every projection runs as GGUF blocks"
    if layers[0][0].out_features % ROPE_KERNEL_WIDTH:
        return f"q/k/v width {layers[0][0].out_features} is not a multiple of {ROPE_KERNEL_WIDTH}"
    if len({p.numerics for ps in layers for p in ps or ()}) != 1:
        return "projections in more than one numerics"
    return None


class NativeStack:
    """Runs `model`'s layers through `decoder_layers` (see the module docstring)."""

    def __init__(self, model: DecoderLM) -> None:
        self.model = model
        self._key: tuple[int, ...] = ()
        self._layers: ctypes.Array[decoder.Layer] | None = None
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @staticmethod
    def supports(model: DecoderLM) -> bool:
        """Whether this runs `model`: its description is one `refusal` accepts, and every
        layer's projections are blocks of one numerics, in a shape whose RoPE the Python layer
        also runs in place (`ROPE_KERNEL_WIDTH`). Why not is kept in `model.native_refusal`."""
        model.native_refusal = refusal(model.arch) or _weights_refusal(model)
        return model.native_refusal is None

    def run(
        self,
        x: torch.Tensor,  # [T, hidden]: updated in place
        rotations: list[tuple[torch.Tensor, torch.Tensor]],  # per RoPE table, cos/sin [T, 1, D]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> bool:
        """The layers over x in one call; False (x untouched) where this cannot run them."""
        if getattr(_python_layers, "on", False) or len(rotations) > 2:
            return False
        kinds = _kind_metadata(meta)
        if kinds is None:
            return False
        first = self.model.layers[0]
        assert isinstance(first, DecoderLayer)
        proj = first.qkv_proj
        if not isinstance(proj, BlockLinear) or not proj.on_blocks(x.shape[0]):
            return False
        if x.dtype != torch.float32 or not x.is_contiguous():
            return False
        layers = self._layers_for(kv_caches)
        if layers is None:
            return False
        batches = [self._batch(kind, m, kv_caches) for kind, m in enumerate(kinds)]
        R = first.rotary_dim  # each table [T, R]
        tables = [
            (c.reshape(-1, R).contiguous(), s.reshape(-1, R).contiguous()) for c, s in rotations
        ]
        decoder.run_layers(layers, self._shape, decoder.batches(*batches), x, tables)
        return True

    def _batch(
        self, kind: int, meta: RaggedMetadata, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> decoder.Batch:
        """The step's batch for the layers of `kind` (the window only for the sliding ones)."""
        k_cache = kv_caches[self._cache_of_kind[kind]][0]
        window = (meta.window or 0) if kind == SLIDING else 0
        return decoder.Batch(
            meta.slot_mapping.data_ptr(), meta.seqs.data_ptr(), meta.tables.data_ptr(),
            meta.seqs.shape[0], meta.tables.shape[1], meta.block_size, window,
            k_cache.shape[1], k_cache.element_size(),
        )  # fmt: skip

    def _layers_for(
        self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> ctypes.Array[decoder.Layer] | None:
        """The layer structures for this cache, rebuilt when the cache or the weights moved."""
        first = self.model.layers[0]
        assert isinstance(first, DecoderLayer)
        key = (id(kv_caches), kv_caches[0][0].data_ptr(), first.input_layernorm.weight.data_ptr())
        if key != self._key:
            self._layers = self._build(kv_caches)
            self._kv, self._key = kv_caches, key  # the list is kept: its id stays its own
        return self._layers

    def _build(
        self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> ctypes.Array[decoder.Layer] | None:
        arch, model = self.model.arch, self.model
        structs, q8 = [], False
        self._weights: list[torch.Tensor] = []  # the (1 + w) norms the structs point into
        self._cache_of_kind = [0, 0]  # a layer of each kind, whose cache gives its pool's size
        for index, (layer, (k, v)) in enumerate(zip(model.layers, kv_caches, strict=True)):
            assert isinstance(layer, DecoderLayer)
            projections = _projections(layer)
            norms = [self._norm(n) for n in _norms(layer)]
            if projections is None or not _cpu_contiguous(
                [n for n in norms if n is not None], (torch.float32,)
            ):
                return None
            if not _cpu_contiguous([k, v], (k.dtype,), (torch.float32, torch.float16)):
                return None
            qkv, o, gate_up, down = projections
            if qkv.bias is not None and not _cpu_contiguous([qkv.bias], (torch.float32,)):
                return None
            q8 = qkv.q8
            bias = None if qkv.bias is None else qkv.bias.data_ptr()
            norm1, norm2, q_norm, k_norm, attn_out, mlp_out = (ggml.pointer(n) for n in norms)
            kind = FULL if layer.window is None else SLIDING
            self._cache_of_kind[kind] = index
            struct = decoder.Layer(
                norm1, qkv.blocks.data_ptr(), bias, o.blocks.data_ptr(), norm2,
                gate_up.blocks.data_ptr(), down.blocks.data_ptr(), k.data_ptr(), v.data_ptr(),
                qkv.kind, o.kind, gate_up.kind, down.kind, q_norm, k_norm, attn_out, mlp_out,
                ggml.GLU_CODES[layer.activation], kind, model.rope_of_layer[index],
            )  # fmt: skip
            structs.append(struct)
        first = model.layers[0]
        assert isinstance(first, DecoderLayer)
        self._shape = decoder.Shape(
            arch.hidden_size, arch.intermediate_size, arch.num_heads, arch.num_kv_heads,
            arch.head_dim, first.input_layernorm.eps, first.scale, int(q8), first.rotary_dim,
        )  # fmt: skip
        return (decoder.Layer * len(structs))(*structs)

    def _norm(self, norm: RMSNorm | None) -> torch.Tensor | None:
        """The weights the kernels multiply by for `norm`, kept alive while the structs are: the
        norm's own tensor, or (Gemma) a 1 + w copy taken when the structs are built."""
        if norm is None:
            return None
        weight = norm.kernel_weight().detach()
        self._weights.append(weight)
        return weight


FULL, SLIDING = 0, 1  # the batch a layer attends through (decoder.h's DecoderLayer.kind)


def _kind_metadata(meta: AttentionMetadata) -> tuple[RaggedMetadata, RaggedMetadata] | None:
    """The step's metadata for the full and the sliding layers; None where it is not ragged."""
    if isinstance(meta, RaggedMetadata):
        return meta, meta
    if isinstance(meta, ByLayerKind):
        full, sliding = meta.full, meta.sliding
        if isinstance(full, RaggedMetadata) and isinstance(sliding, RaggedMetadata):
            return full, sliding
    return None


def _norms(layer: DecoderLayer) -> list[RMSNorm | None]:
    """The layer's norms in decoder.h's order: before attention, before the MLP, q, k, after
    attention and after the MLP (the last four where the family has them)."""
    sandwich = layer.pre_feedforward_layernorm is not None
    pre_mlp = layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm
    return [
        layer.input_layernorm, pre_mlp, layer.q_norm, layer.k_norm,
        layer.post_attention_layernorm if sandwich else None, layer.post_feedforward_layernorm,
    ]  # fmt: skip


def _cpu_contiguous(
    tensors: Sequence[torch.Tensor],
    dtypes: tuple[torch.dtype, ...],
    allowed: tuple[torch.dtype, ...] = (torch.float32,),
) -> bool:
    """Contiguous CPU tensors of one of `dtypes`, which must also be `allowed`."""
    return all(
        t.device.type == "cpu" and t.is_contiguous() and t.dtype in dtypes and t.dtype in allowed
        for t in tensors
    )
