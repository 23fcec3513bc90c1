"""N-gram (prompt lookup) proposal: copy what followed the latest earlier occurrence of the suffix.

Pure numpy, no state: the proposer calls it once per sequence per step with the request's
prompt+output tokens, so its cost must stay in the microseconds next to a ~20 ms forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specserve.request import Sequence
from specserve.speculation.proposer import Draft, Loaded, Proposer, Registration


@dataclass(frozen=True)
class ScoredLookup:
    """A lookup's draft with the evidence behind each token."""

    tokens: np.ndarray  # [k] int64 draft
    match_len: int  # n*: length of the matched suffix (0 = no match)
    support: np.ndarray  # [k] int: occurrences whose continuation agreed with tokens[:i]
    agree: np.ndarray  # [k] int: of those, how many continued with tokens[i]

    @property
    def confidence(self) -> list[float]:
        return match_confidence(self.agree, self.support, self.match_len)


def match_confidence(agree: np.ndarray, support: np.ndarray, match_len: int) -> list[float]:
    """The lookup's own estimate that draft token i is accepted given tokens before it were.

        conf_i = (agree_i / support_i) * (1 - 0.75^(match_len + i))

    The second factor grows with the context already matched (the suffix, plus the i drafts
    before token i if they are accepted): on the embedded model, with the static policy
    verifying every draft, acceptance rises from about 0.2 after a one-token match to above 0.9
    after eight, while the number of occurrences alone predicts little (many occurrences mostly
    mean a short, common match). The first is the share of those occurrences that continue
    with this token. A score, not a probability: the online calibration (speculation/calibration.py)
    maps it to the acceptance actually observed.
    """
    i = np.arange(len(agree))
    share = np.asarray(agree, dtype=np.float64) / np.maximum(np.asarray(support), 1)
    return (share * (1.0 - 0.75 ** (match_len + i).astype(np.float64))).tolist()


def ngram_match(
    tokens: np.ndarray,  # [L] int
    ngram_min: int = 1,
    ngram_max: int = 4,
) -> tuple[int, np.ndarray]:  # (n*, ends [m] ascending)
    """Longest suffix length n* in [ngram_min, ngram_max] that occurred earlier, and the end
    positions of all its earlier occurrences (see `ngram_propose` for the definitions).
    (0, empty) when there is none."""
    t = tokens
    length = t.shape[0]
    if length - 1 < ngram_min:
        return 0, np.empty(0, dtype=np.int64)
    ends = np.flatnonzero(t[: length - 1] == t[length - 1])  # S_0, ascending
    best_n, best = (1, ends) if ends.size else (0, ends)
    for j in range(1, min(ngram_max, length - 1)):
        ends = ends[ends >= j]
        ends = ends[t[ends - j] == t[length - 1 - j]]  # S_j
        if ends.size == 0:
            break
        best_n, best = j + 1, ends
    if best_n < ngram_min:
        return 0, np.empty(0, dtype=np.int64)
    return best_n, best


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
    return ngram_lookup(tokens, k, ngram_min, ngram_max, window).tokens


def ngram_lookup(
    tokens: np.ndarray,  # [L] int
    k: int,
    ngram_min: int = 1,
    ngram_max: int = 4,
    window: int | None = None,
) -> ScoredLookup:
    """`ngram_propose`'s draft with its evidence: for draft token i, `support` counts the
    occurrences of the matched suffix whose continuation agreed with the draft's first i tokens
    (and had an i-th one), `agree` those whose i-th continuation token is the draft's."""
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
    none = np.empty(0, dtype=np.int64)
    n, ends = ngram_match(t, ngram_min, ngram_max) if k else (0, none)
    if n == 0:
        return ScoredLookup(none, 0, none, none)
    start = int(ends[-1]) + 1
    draft = t[start : start + k].copy()
    support, agree = _path_support(t, ends, draft)
    return ScoredLookup(draft, n, support, agree)


def _path_support(
    t: np.ndarray, ends: np.ndarray, draft: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:  # ([k], [k])
    """Per draft position: occurrences still on the draft's path, and how many continue it."""
    support = np.zeros(len(draft), dtype=np.int64)
    agree = np.zeros(len(draft), dtype=np.int64)
    cur = ends
    for i, d in enumerate(draft):
        cur = cur + 1
        cur = cur[cur < t.shape[0]]
        support[i] = cur.size
        cur = cur[t[cur] == d]
        agree[i] = cur.size
    return support, agree


class NgramProposer(Proposer):
    """Context lookup: continue the latest earlier occurrence of the context's suffix."""

    name = "ngram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        out = []
        for seq, k in zip(seqs, ks, strict=True):
            tokens = np.asarray(seq.token_ids, dtype=np.int64)
            found = ngram_lookup(tokens, k, self.ngram_min, self.ngram_max)
            out.append(Draft(tokens=found.tokens.tolist(), confidence=found.confidence))
        return out

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        del seq, hidden

    def release(self, seq: Sequence) -> None:
        del seq


def _build(loaded: Loaded) -> NgramProposer:
    spec = loaded.config.spec
    return NgramProposer(spec.ngram_min, spec.ngram_max)


REGISTRATION = Registration(
    "ngram",
    _build,
    settings=("ngram_min", "ngram_max"),
    auto=True,
    summary="lookup of the request's own context",
)
