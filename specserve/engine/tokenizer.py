"""One tokenizer shared by two threads, behind a lock.

The event loop encodes prompts, renders chat templates and splits output text over tokens while
the engine's step thread detokenizes. A transformers tokenizer is not documented as safe to call
from two threads at once: an encode may reconfigure truncation or padding on the shared Rust
tokenizer (a concurrent borrow then fails with "Already borrowed"). So every call goes through
one lock; the calls are short (microseconds to decode a few tokens, about a millisecond to encode
a long prompt), so neither side waits long.

Decoding, twice per generated token on the step thread, goes straight to the Rust tokenizer where
that is what transformers would return (`_direct_decoder`): 1.8 us against 5.1 us through
transformers' argument handling for five ids, measured hot.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedTokenizerFast
from transformers.tokenization_utils_base import PreTrainedTokenizerBase


class LockedTokenizer:
    """Wraps a tokenizer so that each method call holds one re-entrant lock. Attributes that are
    not callable (`eos_token_id`, `all_special_ids`, `chat_template`) are read through as is."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.RLock()
        self._decode = _direct_decoder(inner) or inner.decode

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        """Pickled (a fleet replica sends its tokenizer to the ingress) without the lock: the
        copy gets a lock of its own."""
        return LockedTokenizer, (self.inner,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.inner(*args, **kwargs)

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        with self.lock:
            return list(self.inner.encode(text, **kwargs))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        with self.lock:
            text: str = self._decode(ids, skip_special_tokens=skip_special_tokens)
            return text

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.inner.apply_chat_template(messages, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickle): no recursion through getattr
            raise AttributeError(name)
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return attr(*args, **kwargs)

        return locked


def _direct_decoder(inner: Any) -> Callable[..., str] | None:
    """The Rust tokenizer's `decode` when transformers' `decode(ids, skip_special_tokens=...)`
    returns exactly it: a fast (tokenizers-backed) class overriding neither `decode` nor
    `_decode`, that cleans up no spaces. Else None."""
    cls = type(inner)
    if (
        not isinstance(inner, PreTrainedTokenizerFast)
        or getattr(inner, "clean_up_tokenization_spaces", True)
        or cls.decode is not PreTrainedTokenizerBase.decode
        or cls._decode is not PreTrainedTokenizerFast._decode
    ):
        return None
    decode: Callable[..., str] = inner.backend_tokenizer.decode
    return decode


def locked(tokenizer: Any) -> LockedTokenizer:
    """`tokenizer` behind a lock (itself if it already is)."""
    return tokenizer if isinstance(tokenizer, LockedTokenizer) else LockedTokenizer(tokenizer)


def private_copy(tokenizer: Any) -> LockedTokenizer:
    """A deep copy behind a lock of its own: for work (encoding a long prompt in a worker
    thread) that must neither wait for nor hold the lock the engine's detokenizer takes."""
    inner = tokenizer.inner if isinstance(tokenizer, LockedTokenizer) else tokenizer
    return LockedTokenizer(copy.deepcopy(inner))
