from __future__ import annotations

import numpy as np
import pytest

from specserve.speculation.ngram import match_confidence, ngram_lookup, ngram_propose


def propose(
    tokens: list[int], k: int, ngram_min: int = 1, ngram_max: int = 4, window: int | None = None
) -> list[int]:
    out = ngram_propose(np.array(tokens, dtype=np.int64), k, ngram_min, ngram_max, window)
    assert out.dtype == np.int64 and out.ndim == 1
    return [int(x) for x in out]


def reference_propose(
    tokens: list[int], k: int, ngram_min: int, ngram_max: int, window: int | None
) -> list[int]:
    """The obvious quadratic search, straight from the specification."""
    t = tokens[-window:] if window is not None else tokens
    n_tokens = len(t)
    if k == 0:
        return []
    for n in range(ngram_max, ngram_min - 1, -1):
        if n > n_tokens - 1:
            continue
        suffix = t[n_tokens - n :]
        for start in range(n_tokens - n - 1, -1, -1):  # most recent first, never the suffix
            if t[start : start + n] == suffix:
                return t[start + n : start + n + k]
    return []


def test_basic_match_and_continuation() -> None:
    # suffix [1, 2] occurred at 0..1, followed by 3 4 5
    assert propose([1, 2, 3, 4, 5, 1, 2], k=3) == [3, 4, 5]


def test_longest_ngram_preferred_over_shorter() -> None:
    # suffix 3-gram [7, 8, 9] occurs at 0..2 (-> 1); the 1-gram [9] also occurs later at 5 (-> 2)
    tokens = [7, 8, 9, 1, 0, 9, 2, 7, 8, 9]
    assert propose(tokens, k=1) == [1]
    # with ngram_max=1 only the single token counts and its latest occurrence wins
    assert propose(tokens, k=1, ngram_max=1) == [2]


def test_most_recent_occurrence_preferred() -> None:
    # [5, 6] occurs at 0 (-> 1) and at 3 (-> 2); take the later one
    assert propose([5, 6, 1, 5, 6, 2, 5, 6], k=1) == [2]


def test_no_match_returns_empty() -> None:
    assert propose([1, 2, 3, 4, 5], k=4) == []


def test_k_truncates() -> None:
    assert propose([1, 2, 3, 4, 5, 6, 1, 2], k=2) == [3, 4]


def test_continuation_clipped_at_context_end() -> None:
    # [4] occurs at 2 and only 3 4 follow before the context ends (overlap into the suffix is ok)
    assert propose([9, 9, 4, 3, 4], k=5) == [3, 4]
    # a run: the 3-gram [1, 1, 1] occurs at 0..2 overlapping the suffix; what follows is one 1
    assert propose([1, 1, 1, 1], k=5) == [1]


def test_ngram_min_rejects_single_token_match() -> None:
    tokens = [3, 1, 2, 4, 2]  # only the 1-gram [2] recurs
    assert propose(tokens, k=2) == [4, 2]
    assert propose(tokens, k=2, ngram_min=2) == []


def test_k_zero_is_empty() -> None:
    assert propose([1, 2, 1, 2], k=0) == []


@pytest.mark.parametrize("tokens", [[], [7], [7, 7]])
def test_context_shorter_than_needed(tokens: list[int]) -> None:
    # a length-n match needs an earlier start, so at least n + 1 tokens
    assert propose(tokens, k=3, ngram_min=2) == []


def test_single_repeat_pair() -> None:
    assert propose([7, 7], k=3) == [7]


def test_window_limits_search() -> None:
    tokens = [1, 2, 3, 9, 9, 9, 9, 1, 2]
    assert propose(tokens, k=1) == [3]
    assert propose(tokens, k=1, window=len(tokens)) == [3]
    assert propose(tokens, k=1, window=4) == []  # [9, 9, 1, 2]: the old [1, 2] is out of view
    assert propose(tokens, k=1, window=100) == [3]


def test_accepts_other_int_dtypes_and_does_not_alias() -> None:
    tokens = np.array([1, 2, 3, 1, 2], dtype=np.int32)
    out = ngram_propose(tokens, 2)
    assert out.dtype == np.int64 and out.tolist() == [3, 1]
    out[0] = 42
    assert tokens.tolist() == [1, 2, 3, 1, 2]


@pytest.mark.parametrize(
    ("k", "ngram_min", "ngram_max", "window"),
    [(-1, 1, 4, None), (2, 0, 4, None), (2, 3, 2, None), (2, 1, 4, 0)],
)
def test_invalid_arguments(k: int, ngram_min: int, ngram_max: int, window: int | None) -> None:
    with pytest.raises(ValueError):
        ngram_propose(np.array([1, 2, 1]), k, ngram_min, ngram_max, window)


def test_matches_reference_on_random_contexts() -> None:
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(2000):
        alphabet = int(rng.integers(3, 7))
        length = int(rng.integers(1, 41))
        tokens = rng.integers(0, alphabet, size=length).tolist()
        k = int(rng.integers(0, 7))
        ngram_min = int(rng.integers(1, 4))
        ngram_max = ngram_min + int(rng.integers(0, 4))
        window = None if rng.random() < 0.5 else int(rng.integers(1, 45))
        want = reference_propose(tokens, k, ngram_min, ngram_max, window)
        got = propose(tokens, k, ngram_min=ngram_min, ngram_max=ngram_max, window=window)
        assert got == want, (tokens, k, ngram_min, ngram_max, window)
        hits += bool(want)
    assert hits > 500  # the random cases exercise matches, not only the empty answer


def test_lookup_counts_the_evidence_along_the_draft() -> None:
    # [1, 2] occurs at 0..1 (-> 3 4) and 4..5 (-> 3 9); the latest one is copied: 3 9.
    found = ngram_lookup(np.array([1, 2, 3, 4, 1, 2, 3, 9, 1, 2]), k=2)
    assert found.tokens.tolist() == [3, 9] and found.match_len == 2
    assert found.support.tolist() == [2, 2] and found.agree.tolist() == [2, 1]
    assert found.confidence == pytest.approx([1.0 * (1 - 0.75**2), 0.5 * (1 - 0.75**3)])
    assert ngram_lookup(np.array([1, 2, 3]), k=2).confidence == []


def test_confidence_grows_with_the_matched_length_and_the_agreeing_share() -> None:
    one, many = (
        match_confidence(np.array([1]), np.array([1]), 1),
        match_confidence(np.array([1]), np.array([1]), 8),
    )
    assert one[0] < many[0] < 1.0
    split = match_confidence(np.array([1]), np.array([2]), 8)
    assert split[0] == pytest.approx(many[0] / 2)
