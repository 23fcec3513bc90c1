"""Prompt text and chat messages -> token ids, as every caller of the engine must encode them
(the engine itself, and a fleet ingress that holds only the pool's tokenizer)."""

from __future__ import annotations

from typing import Any


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Prompt text -> token ids, without special tokens (templates add their own)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Chat messages -> token ids through the tokenizer's chat template."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return encode_text(tokenizer, text)
