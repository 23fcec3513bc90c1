"""Incremental detokenization with stop strings.

Text is released as soon as it is stable: a token that ends in the middle of a UTF-8 character
(decoded as U+FFFD) waits for the next one, and a text tail that could still grow into a stop
string is held back until it cannot. When a stop string appears the text is cut before it.
"""

from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def find_stop(text: str, stops: tuple[str, ...], search_from: int) -> int | None:
    """Index of the earliest stop string occurrence starting at or after `search_from`."""
    hits = [i for s in stops if (i := text.find(s, max(0, search_from))) >= 0]
    return min(hits) if hits else None


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string.

    Only the last len(s) - 1 characters can be such a tail, and it must start with s[0]; each
    candidate start is one `startswith`. Cost: O(len(s)) per stop (worst case O(len(s)^2)
    compared in C), whatever the length of `text`."""
    best = 0
    for s in stops:
        if len(s) < 2:
            continue
        tail = text[-(len(s) - 1) :]
        i = tail.find(s[0])
        while i >= 0 and len(tail) - i > best:
            if s.startswith(tail[i:]):
                best = len(tail) - i
                break
            i = tail.find(s[0], i + 1)
    return best


class IncrementalDetokenizer:
    """Only text not yet released is kept (`text`): a stop string never starts in released text
    (a tail that could begin one is held back), so every scan for stops covers at most the
    longest stop's length plus the new token's text, however long the output grows."""

    # Tokens decoded before the new ones, so that merges and leading spaces decode correctly.
    CONTEXT = 4

    def __init__(self, tokenizer: Decoder, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.longest = max((len(s) for s in stops), default=0)
        self.ids: list[int] = []
        self.text = ""  # stable output text not yet released (before any stop string)
        self._prefix = 0  # ids[_prefix:_read] decode to the text before the new tokens
        self._read = 0
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; return newly released text. Sets `stopped` on a stop string."""
        self.ids.append(token_id)
        prev = self.tokenizer.decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        full = self.tokenizer.decode(self.ids[self._prefix :], skip_special_tokens=True)
        if full.endswith("\ufffd") or len(full) <= len(prev):
            return self._release(final=False)
        old_len = len(self.text)
        self.text += full[len(prev) :]
        self._prefix = max(0, len(self.ids) - self.CONTEXT)
        self._read = len(self.ids)
        if self.stops:
            hit = find_stop(self.text, self.stops, old_len - self.longest + 1)
            if hit is not None:
                self.text = self.text[:hit]
                self.stopped = True
                return self._release(final=True)
        return self._release(final=False)

    def flush(self) -> str:
        """Release any held-back text (the sequence finished for another reason), including
        a trailing partial character, as a one-shot decode of all tokens would show it."""
        if not self.stopped and self._read < len(self.ids):
            prev = self.tokenizer.decode(
                self.ids[self._prefix : self._read], skip_special_tokens=True
            )
            full = self.tokenizer.decode(self.ids[self._prefix :], skip_special_tokens=True)
            self.text += full[len(prev) :]
            self._read = len(self.ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else len(self.text) - held_back(self.text, self.stops)
        out, self.text = self.text[:end], self.text[end:]
        return out
