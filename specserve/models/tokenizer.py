"""Load a model directory's tokenizer (the target's, and a draft model's to pair with it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
