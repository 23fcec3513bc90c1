"""The adaptive policy's objective and its exact maximisation (speculation/policy.py says what
the policy feeds it): the verified prefix k_s of each draft that maximises

    J(k) = sum_s E[emitted_s(k_s)] / c(step with sum_s k_s extra rows),

E[emitted_s(k)] = 1 + sum_{j=1..k} prod_{i<j} a_{s,i}, with a_{s,i} the calibrated probability
that draft token i+1 is accepted given tokens 1..i were. Pure functions: no engine state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# extra rows m -> live seconds of the step with them (vectorised over m)
RowCost = Callable[[np.ndarray], np.ndarray]


def expected_emitted(accept: Sequence[float], k: int) -> float:
    """1 + sum_{j=1..k} prod_{i<j} accept[i] (accept[i]: P(draft i+1 accepted | 1..i accepted))."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= accept[i]
        total += reach
    return total


def choose_k(
    accept: Sequence[Sequence[float]],  # [S][len(draft_s)] calibrated per-token probabilities
    cost: RowCost,
    base_emitted: float,
) -> list[int]:
    """The k_s <= len(accept[s]) maximising (base_emitted + sum of gains kept) / cost(sum k_s);
    see `choose_k_rated`."""
    return choose_k_rated(accept, cost, base_emitted).ks


@dataclass(frozen=True)
class Rated:
    """A step's choice with what it predicts: expected emitted tokens and forward seconds at
    the chosen k and at no drafts."""

    ks: list[int]
    emitted: float
    seconds: float
    base_emitted: float
    base_seconds: float

    @property
    def speedup(self) -> float:
        """J(chosen k) / J(0)."""
        return (self.emitted / self.seconds) / (self.base_emitted / self.base_seconds)


def choose_k_rated(accept: Sequence[Sequence[float]], cost: RowCost, base_emitted: float) -> Rated:
    """`choose_k`'s k_s, with the expected tokens and cost at them and at no drafts (their
    rates' ratio is the predicted speedup).

    Keeping draft token i of s adds gain prod_{j<=i} a_{s,j}, which never grows with i, so for
    any total m the best choice is the m largest gains (stable order keeps each sequence's
    tokens a prefix). J is then a function of m alone, evaluated for every m; the first argmax
    wins, so ties keep fewer rows. Exact for any cost curve, convex or not.
    """
    gains = [np.cumprod(np.asarray(a, dtype=np.float64)) for a in accept]
    owner = np.repeat(np.arange(len(gains)), [len(g) for g in gains])  # [M] sequence of each
    flat = np.concatenate([np.empty(0), *gains])  # [M] gains, sequence by sequence
    order = np.argsort(-flat, kind="stable")
    emitted = base_emitted + np.concatenate([[0.0], np.cumsum(flat[order])])
    seconds = cost(np.arange(len(flat) + 1))
    rate = emitted / seconds
    m = int(np.argmax(rate))
    ks = np.bincount(owner[order[:m]], minlength=len(accept))
    return Rated(
        [int(k) for k in ks],
        float(emitted[m]),
        float(seconds[m]),
        float(emitted[0]),
        float(seconds[0]),
    )
