"""Which decoder serves a config.json: its `architectures` (or `model_type`) looked up."""

from __future__ import annotations

from typing import Any

from specserve.models.llama import LlamaForCausalLM
from specserve.models.mistral import MistralForCausalLM
from specserve.models.qwen2 import Qwen2ForCausalLM

ARCHITECTURES: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
}


def model_class(cfg: dict[str, Any]) -> type[LlamaForCausalLM]:
    archs = cfg.get("architectures") or []
    for name in archs:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    by_type = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "mistral": MistralForCausalLM}
    if not archs and cfg.get("model_type") in by_type:
        return by_type[cfg["model_type"]]
    raise ValueError(
        f"unsupported architecture {archs or cfg.get('model_type')!r}; "
        f"supported: {sorted(ARCHITECTURES)}"
    )
