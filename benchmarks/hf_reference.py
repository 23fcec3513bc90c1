"""HF transformers' own float32 model of a GGUF, the reference our numbers are checked against
(a GGUF's cached description holds no weights: transformers dequantises the file itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def hf_gguf_model(gguf: Path, **kwargs: Any) -> Any:
    """`AutoModelForCausalLM.from_pretrained(gguf_file=...)` in float32, eval mode."""
    import transformers
    import transformers.modeling_utils

    # from_pretrained(gguf_file=...) asks for accelerate but does not use it on the CPU; the
    # gate is lifted for this call only (saving a model believes it too)
    utils = transformers.modeling_utils
    gate = utils.is_accelerate_available
    utils.is_accelerate_available = lambda: True
    try:
        load = transformers.AutoModelForCausalLM.from_pretrained
        return load(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, **kwargs).eval()
    finally:
        utils.is_accelerate_available = gate
