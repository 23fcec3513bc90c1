"""The decoder of every Llama-like family we serve, as its `ModelArch` describes it.

Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Gemma 3 (text), Phi-3/Phi-4-mini: one module
tree (`models/layer.py` for a layer), the differences read from the description, none in
subclasses. The forward pass takes a flat ragged batch and returns hidden states; logits are
computed only for the rows the caller asks for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

from specserve.models.arch import ModelArch, RopeSpec
from specserve.models.attention import AttentionMetadata
from specserve.models.hf_config import arch_from_hf, checkpoint_name
from specserve.models.layer import (  # noqa: F401 (re-exported)
    ROPE_KERNEL_WIDTH,
    DecoderLayer,
    RMSNorm,
    apply_rope,
    project,
)
from specserve.models.rope import Rope
from specserve.models.weight_report import WeightReport


class LayerStack(Protocol):
    """Runs a model's whole layer loop some other way (models/native_stack.py)."""

    def run(
        self,
        x: torch.Tensor,
        rotations: list[tuple[torch.Tensor, torch.Tensor]],  # per RoPE table: cos, sin
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> bool:
        """x through every layer, in place; False (x untouched) where it cannot."""
        ...


class DecoderLM(nn.Module):
    """Decoder stack. `forward` returns final-normed hidden states; `logits` projects rows."""

    # nn.Embedding / nn.Linear, or their GGUF-block counterparts (models/block_linear.py)
    embed_tokens: nn.Module
    lm_head: nn.Module
    # Why the GGUF blocks this model has are not used (their start-up check failed); else None.
    block_kernel_fallback: str | None = None
    # A GGUF's tensors by type and how they run (models/gguf_weights.py); None for a checkpoint.
    weight_report: WeightReport | None = None
    # The layers in one native call where the weights allow it (set by the loader); else None.
    native_stack: LayerStack | None = None
    # Why the native decoder does not run this model (`NativeStack.supports`); else None.
    native_refusal: str | None = None

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, arch.norm)
        specs: list[RopeSpec] = []
        for i in range(arch.num_layers):
            if arch.layer_rope(i) not in specs:
                specs.append(arch.layer_rope(i))
        self.ropes = [Rope(s) for s in specs]  # plain tensors: they survive to_empty
        self.rope_of_layer = [specs.index(arch.layer_rope(i)) for i in range(arch.num_layers)]
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @classmethod
    def arch_from_hf(cls, cfg: dict[str, Any], context: int | None = None) -> ModelArch:
        """`context`: the context to serve, where it decides the description (LongRoPE's
        factors); None: the model's own."""
        return arch_from_hf(cfg, context)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer, 2 x [Hkv, slots, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        x = self.embed_tokens(input_ids)
        if self.arch.embed_scale != 1.0:
            x = x * torch.tensor(self.arch.embed_scale, dtype=x.dtype)
        tables = [rope(positions) for rope in self.ropes]  # float32: cast to x's dtype
        rotations = [(cos.to(x.dtype), sin.to(x.dtype)) for cos, sin in tables]
        native = self.native_stack
        if native is not None and native.run(x, rotations, kv_caches, meta):
            return self.norm(x)
        for layer, kv, r in zip(self.layers, kv_caches, self.rope_of_layer, strict=True):
            x = layer(x, *rotations[r], kv, meta)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        logits: torch.Tensor = self.lm_head(hidden)
        cap = self.arch.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_hf_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up. Missing tensors are an error."""
        params = dict(self.named_parameters())
        expected = {f"{n}:{s}" for n in params for s in self._shards_of(n)}
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            served = checkpoint_name(self.arch, hf_name)
            if served is None:
                continue
            name = served.removeprefix("model.").replace(".self_attn.", ".").replace(".mlp.", ".")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.arch.tie_word_embeddings):
                continue
            prefix, proj, kind = ([*name.rsplit(".", 2), "", ""])[:3]
            if proj in _FUSED:
                fused_name, index = _FUSED[proj]
                target = f"{prefix}.{fused_name}.{kind}"
                sizes = self._shard_sizes(fused_name)
                offset = sum(sizes[:index])
                params[target].data[offset : offset + sizes[index]].copy_(tensor)
                loaded.add(f"{target}:{proj}")
            elif name in params:  # fused in the checkpoint too (Phi-3), or not fused at all
                params[name].data.copy_(tensor)
                loaded.update(f"{name}:{shard}" for shard in self._shards_of(name))
            else:
                raise ValueError(f"unexpected tensor {hf_name!r} in checkpoint")
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:6]}")

    def _shard_sizes(self, fused_name: str) -> list[int]:
        a = self.arch
        if fused_name == "gate_up_proj":
            return [a.intermediate_size, a.intermediate_size]
        return [a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.head_dim]

    @staticmethod
    def _shards_of(param_name: str) -> list[str]:
        module = param_name.split(".")[-2]
        return [p for p, (f, _) in _FUSED.items() if f == module] or [""]


# HF projection name -> (our fused module, index of its shard along the output dim)
_FUSED: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


LlamaForCausalLM = DecoderLM  # the name 14 modules import; every family is this class
