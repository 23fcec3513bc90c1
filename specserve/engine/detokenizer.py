"""Incremental detokenization with stop strings.

Text is released as soon as it is stable: a token that ends in the middle of a UTF-8 character
(decoded as U+FFFD) waits for the next one, and a text tail that could still grow into a stop
string is held back until it cannot. When a stop string appears the text is cut before it.
"""

from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def failure(s: str) -> list[int]:
    """KMP failure function: f[i] = length of the longest proper prefix of s[: i + 1] that is
    also a suffix of it."""
    f = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = f[k - 1]
        if s[i] == s[k]:
            k += 1
        f[i] = k
    return f


class StopMatcher:
    """Knuth-Morris-Pratt over every stop string at once, fed one character at a time.

    state[k] is the length of the longest suffix of the text fed so far that is a prefix of
    stop k. Each character moves it up by at most one and each failure step down by at least
    one, so feeding n characters costs O(n x stops) amortised, however long the text before.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.fail = [failure(s) for s in stops]
        self.state = [0] * len(stops)

    def feed(self, text: str) -> int | None:
        """Consume `text`. The first stop to complete (the longest of those completing at the
        same character): where it starts, as an index into `text` (negative: it began in
        text fed before), or None. After a hit the rest of `text` is not consumed."""
        for i, c in enumerate(text):
            hit = None
            for k, s in enumerate(self.stops):
                q = self.state[k]
                while q and s[q] != c:
                    q = self.fail[k][q - 1]
                if s[q] == c:
                    q += 1
                if q == len(s):
                    hit = min(hit, i + 1 - q) if hit is not None else i + 1 - q
                    q = self.fail[k][q - 1]
                self.state[k] = q
            if hit is not None:
                return hit
        return None

    @property
    def held(self) -> int:
        """Length of the longest tail fed so far that is a proper prefix of some stop."""
        return max(self.state, default=0)


class IncrementalDetokenizer:
    """Only text not yet released is kept (`text`): a stop string never starts in released text
    (a tail that could begin one is held back), and stops are matched character by character
    (`StopMatcher`), so a token costs the same at any output length."""

    # Tokens decoded before the new ones, so that merges and leading spaces decode correctly.
    CONTEXT = 4

    def __init__(self, tokenizer: Decoder, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.matcher = StopMatcher(stops)
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
        new = full[len(prev) :]
        self.text += new
        self._prefix = max(0, len(self.ids) - self.CONTEXT)
        self._read = len(self.ids)
        hit = self.matcher.feed(new)
        if hit is not None:
            self.text = self.text[: old_len + hit]
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
        end = len(self.text) if final else max(0, len(self.text) - self.matcher.held)
        out, self.text = self.text[:end], self.text[end:]
        return out
