"""Which decoder serves a config.json: every family we serve (models/hf_config.py) is one
`DecoderLM` reading its description; what we cannot serve is refused here, from the config."""

from __future__ import annotations

from typing import Any

from specserve.models.hf_config import FAMILIES, arch_from_hf
from specserve.models.llama import DecoderLM

ARCHITECTURES: dict[str, type[DecoderLM]] = {name: DecoderLM for name in FAMILIES}


def model_class(cfg: dict[str, Any]) -> type[DecoderLM]:
    """The decoder class for config.json `cfg`, once its whole description reads (ValueError
    naming what is supported otherwise: an architecture, a RoPE type, an activation, ...)."""
    arch_from_hf(cfg)
    return DecoderLM
