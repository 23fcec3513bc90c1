"""Caps on work a request causes outside the engine: characters of a prompt (checked before it
is tokenised) and the per-token formatting of a non-streaming reply (built in one go on the
event loop: every token and every alternative is one tokenizer decode)."""

from __future__ import annotations

from specserve.server.errors import invalid
from specserve.server.settings import Limits

# Tokens a non-streaming reply may format: choices x max tokens x (1 + alternatives per token).
# About a decode each, on the event loop: ~0.3 s at the cap.
MAX_REPLY_TOKEN_ENTRIES = 100_000


def check_prompt_chars(chars: int, limits: Limits, field: str) -> None:
    """A prompt longer than any the context window takes, refused before it is tokenised."""
    cap = limits.max_prompt_chars
    if cap is not None and chars > cap:
        raise invalid(
            field,
            f"has {chars} characters; the limit is {cap} (the context window, "
            f"{limits.max_total_tokens} tokens, of at most {cap // limits.max_total_tokens} "
            "characters each)",
        )


def check_reply_work(n: int, max_new: int, alternatives: int, field: str) -> None:
    """n x max tokens x (1 + alternatives) within MAX_REPLY_TOKEN_ENTRIES (non-streaming)."""
    entries = n * max_new * (1 + alternatives)
    if entries > MAX_REPLY_TOKEN_ENTRIES:
        raise invalid(
            field,
            f"n ({n}) x max tokens ({max_new}) x (1 + alternatives) ({1 + alternatives}) = "
            f"{entries} log-probability entries; a non-streaming reply holds at most "
            f"{MAX_REPLY_TOKEN_ENTRIES}: stream it, or ask for fewer",
        )
