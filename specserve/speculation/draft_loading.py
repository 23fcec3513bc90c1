"""Loading a draft model and pairing it with the target: the checks that the draft proposes
ids the target reads the same way (vocabulary size, tokenizer vocabulary, eos/bos), apart from
the proposer (draft.py) that runs the loaded model.
"""

from __future__ import annotations

from typing import Any

import torch

from specserve.config import Numerics
from specserve.models.llama import DecoderLM
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model, model_class, read_config
from specserve.models.tokenizer import load_tokenizer


def load_draft_model(
    draft_path: str,
    target_vocab_size: int,
    target_tokenizer: Any,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    numerics: Numerics = "q8",
) -> DecoderLM:
    """Resolve, check against the target, then build the draft model (GGUF blocks multiplying
    in the target's `numerics`)."""
    draft_dir = resolve_model_dir(draft_path)
    cfg = read_config(draft_dir)
    arch = model_class(cfg).arch_from_hf(cfg)
    draft_tokenizer = load_tokenizer(draft_dir)
    check_compatible(arch.vocab_size, target_vocab_size, draft_tokenizer, target_tokenizer)
    return build_model(draft_dir, device, dtype, numerics=numerics)


def check_compatible(
    draft_vocab_size: int, target_vocab_size: int, draft_tokenizer: Any, target_tokenizer: Any
) -> None:
    """Raise ValueError naming what differs between the draft and the target vocabularies."""
    if draft_vocab_size != target_vocab_size:
        raise ValueError(
            f"draft model is incompatible with the target: draft vocab_size {draft_vocab_size} "
            f"!= target vocab_size {target_vocab_size}"
        )
    problem = tokenizer_difference(draft_tokenizer, target_tokenizer)
    if problem is not None:
        raise ValueError(
            f"draft model is incompatible with the target: tokenizers differ: {problem}"
        )


def tokenizer_difference(draft: Any, target: Any) -> str | None:
    """None when both map the same strings to the same ids with the same eos/bos, else what
    differs, each kind counted with its first example (by target id)."""
    d, t = draft.get_vocab(), target.get_vocab()
    parts = []
    moved = sorted((tok for tok in d.keys() & t.keys() if d[tok] != t[tok]), key=t.__getitem__)
    if moved:
        tok = moved[0]
        parts.append(
            f"{len(moved)} tokens map to different ids (first: {tok!r} -> {d[tok]} in the draft "
            f"vs {t[tok]} in the target)"
        )
    for side, have, lack in (("draft", d, t), ("target", t, d)):
        only = sorted(have.keys() - lack.keys(), key=have.__getitem__)
        if only:
            parts.append(f"{len(only)} tokens only in the {side} (first: {only[0]!r})")
    for special in ("eos", "bos"):
        d_id, t_id = getattr(draft, f"{special}_token_id"), getattr(target, f"{special}_token_id")
        if d_id != t_id:
            parts.append(f"{special} token id {d_id} in the draft vs {t_id} in the target")
    return "; ".join(parts) or None
