"""N-gram (prompt lookup) proposal: copy what followed the latest earlier occurrence of the suffix.

Pure numpy, no state: the proposer calls it once per sequence per step with the request's
prompt+output tokens, so its cost must stay in the microseconds next to a ~20 ms forward pass.
"""

from __future__ import annotations

import numpy as np


def ngram_propose(
    tokens: np.ndarray,  # [L] int, prompt + output so far
    k: int,
    ngram_min: int = 1,
    ngram_max: int = 4,
    window: int | None = None,
) -> np.ndarray:  # [<= k] int64
    """Propose up to ``k`` draft tokens by looking the context's suffix up in the context itself.

    Let t = tokens (after ``window``: t = tokens[-window:]) and L = len(t). An *occurrence* of
    the suffix of length n ending at position e means t[e-n+1 : e+1] == t[L-n : L] with
    n-1 <= e <= L-2, i.e. any earlier start, overlap with the suffix allowed, but never the suffix
    itself (e = L-1). The result is

        n* = max{n in [ngram_min, ngram_max] : some occurrence of length n exists}
        e* = max{e : an occurrence of length n* ends at e}            (the most recent one)
        return t[e*+1 : e*+1+k]

    and an empty array when no such n exists or k == 0. Because e* <= L-2 the continuation is never
    empty once a match exists; it is shorter than k only where the context ends. Never padded.

    Method: let m(e) be the length of the common run t[..e] / t[..L-1], read backwards. The
    occurrence ends of length >= j+1 form nested sets S_0 ⊇ S_1 ⊇ ... where
    S_0 = {e <= L-2 : t[e] == t[L-1]} (one O(L) vectorised compare) and
    S_j = {e in S_{j-1} : e >= j and t[e-j] == t[L-1-j]} (a compare over the survivors only).
    n* is the deepest non-empty level (capped at ngram_max) and e* its largest (last) element,
    since every S_j stays sorted ascending. Total cost: O(L) plus O(|S_0| * ngram_max).
    """
    if k < 0 or ngram_min < 1 or ngram_max < ngram_min:
        raise ValueError(
            f"need k >= 0 and 1 <= ngram_min <= ngram_max, got {k=}, {ngram_min=}, {ngram_max=}"
        )
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    t = np.asarray(tokens, dtype=np.int64)
    if t.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {t.shape}")
    if window is not None:
        t = t[-window:]
    length = t.shape[0]
    # An occurrence of length n must start at or after 0 and end before L-1, so n <= L-1.
    if k == 0 or length - 1 < ngram_min:
        return np.empty(0, dtype=np.int64)

    ends = np.flatnonzero(t[: length - 1] == t[length - 1])  # S_0, ascending
    best_n, best_end = (1, int(ends[-1])) if ends.size else (0, -1)
    for j in range(1, min(ngram_max, length - 1)):
        ends = ends[ends >= j]
        ends = ends[t[ends - j] == t[length - 1 - j]]  # S_j
        if ends.size == 0:
            break
        best_n, best_end = j + 1, int(ends[-1])

    if best_n < ngram_min:
        return np.empty(0, dtype=np.int64)
    return t[best_end + 1 : best_end + 1 + k].copy()
