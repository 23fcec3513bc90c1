"""What a scored row reads of the tokens before it, without copying them: `History` (the
sequence's prompt and output, then the row's drafts) and the per-sequence records kept as the
output grows, so that a row's penalty work does not grow with the context: `SeenTokens` (the
distinct tokens, for the repetition penalty) and `OutputCounts` (each output token's count,
for the presence and frequency penalties)."""

from __future__ import annotations

from collections import abc
from typing import Protocol, overload

import numpy as np


class TokenSource(Protocol):
    """What a `History` reads of a sequence (`specserve.request.Sequence`)."""

    prompt_ids: list[int]
    output_ids: list[int]
    seen: SeenTokens
    counts: OutputCounts

    @property
    def num_tokens(self) -> int: ...
    @property
    def token_ids(self) -> list[int]: ...
    def token_slice(self, start: int, end: int) -> list[int]: ...


class SeenTokens:
    """The distinct tokens of a sequence's prompt and output, kept as the output grows
    (amortised O(1) a token): what a repetition penalty reads, without a set of the whole
    history built for every row. The output only ever grows (tokens are appended)."""

    def __init__(self) -> None:
        self._ids = np.empty(64, dtype=np.int64)  # [capacity]; the first `_n` are distinct
        self._n = 0
        self._set: set[int] = set()
        self._counted = 0  # tokens of prompt + output taken in so far

    def ids(self, seq: TokenSource) -> np.ndarray:  # [distinct] int64, a view
        """The distinct tokens of `seq`'s prompt and output, in first-seen order."""
        n = len(seq.prompt_ids)
        if self._counted < n:
            self._take(seq.prompt_ids[self._counted :])
            self._counted = n
        if self._counted < seq.num_tokens:
            self._take(seq.output_ids[self._counted - n :])
            self._counted = seq.num_tokens
        return self._ids[: self._n]

    def has(self, token: int) -> bool:
        return token in self._set

    def _take(self, tokens: list[int]) -> None:
        new = [t for t in dict.fromkeys(tokens) if t not in self._set]
        if not new:
            return
        self._set.update(new)
        if self._n + len(new) > len(self._ids):
            grown = np.empty(max(2 * len(self._ids), self._n + len(new)), dtype=np.int64)
            grown[: self._n] = self._ids[: self._n]
            self._ids = grown
        self._ids[self._n : self._n + len(new)] = new
        self._n += len(new)


class OutputCounts:
    """How often each distinct token occurs in a sequence's output, kept as the output grows
    (amortised O(1) a token): what the presence and frequency penalties read. The output only
    ever grows."""

    def __init__(self) -> None:
        self._ids = np.empty(16, dtype=np.int64)  # [capacity]; the first `_n` are distinct
        self._counts = np.zeros(16, dtype=np.int64)  # [capacity]; aligned with `_ids`
        self._slot: dict[int, int] = {}
        self._n = 0
        self._counted = 0  # output tokens taken in so far

    def of(
        self, output: list[int], drafts: abc.Sequence[int] = ()
    ) -> tuple[np.ndarray, np.ndarray]:  # ([distinct] int64, [distinct] int64)
        """The distinct tokens of `output` then `drafts`, and their counts. `output` is the
        sequence's output, the one list this record has watched grow; the arrays are views
        when there are no drafts (read them before the output grows)."""
        for t in output[self._counted :]:
            self._add(t)
        self._counted = len(output)
        ids, counts = self._ids[: self._n], self._counts[: self._n]
        if not drafts:
            return ids, counts
        counts = counts.copy()
        extra: dict[int, int] = {}
        for t in drafts:
            slot = self._slot.get(t)
            if slot is None:
                extra[t] = extra.get(t, 0) + 1
            else:
                counts[slot] += 1
        if not extra:
            return ids, counts
        more = np.array(list(extra.items()), dtype=np.int64)  # [new, 2]: (token, count)
        return np.concatenate([ids, more[:, 0]]), np.concatenate([counts, more[:, 1]])

    def _add(self, token: int) -> None:
        slot = self._slot.get(token)
        if slot is not None:
            self._counts[slot] += 1
            return
        if self._n == len(self._ids):
            self._ids = np.concatenate([self._ids, np.empty_like(self._ids)])
            self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
        self._slot[token] = self._n
        self._ids[self._n], self._counts[self._n] = token, 1
        self._n += 1


class History(abc.Sequence[int]):
    """The tokens before a scored row without copying them: `seq`'s prompt and output, then
    `drafts` (the row's drafted tokens before it). What the engine hands a row's penalties and
    logits processors; readers that know it (the grammar, the penalties) take only what changed
    since their last row, so a row's work does not grow with the context."""

    __slots__ = ("drafts", "seq")

    def __init__(self, seq: TokenSource, drafts: list[int]) -> None:
        self.seq = seq
        self.drafts = drafts

    def __len__(self) -> int:
        return self.seq.num_tokens + len(self.drafts)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        n = self.seq.num_tokens
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return self.tokens()[i]
            return (
                self.seq.token_slice(start, min(stop, n))
                + self.drafts[max(0, start - n) : max(0, stop - n)]
            )
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("history index out of range")
        if i >= n:
            return self.drafts[i - n]
        prompt = self.seq.prompt_ids
        return prompt[i] if i < len(prompt) else self.seq.output_ids[i - len(prompt)]

    def tokens(self) -> list[int]:
        """All of it as a list (a copy: O(context))."""
        return self.seq.token_ids + self.drafts

    def seen_ids(self) -> np.ndarray:  # [distinct] int64
        """Its distinct tokens (drafts included), without a pass over the context."""
        ids = self.seq.seen.ids(self.seq)
        extra = [t for t in dict.fromkeys(self.drafts) if not self.seq.seen.has(t)]
        return np.concatenate([ids, np.array(extra, dtype=np.int64)]) if extra else ids

    def output_counts(self) -> tuple[np.ndarray, np.ndarray]:  # ([distinct], [distinct]) int64
        """The distinct generated tokens before the row (output, then drafts) and their
        counts, without a pass over the output."""
        return self.seq.counts.of(self.seq.output_ids, self.drafts)
