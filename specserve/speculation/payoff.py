"""Whether proposing pays for its own time, per batch size, measured live.

The adaptive policy's J (policy.py) weighs each extra verified row against the forward pass it
lengthens. Proposing costs time outside that pass: the proposer's lookups or head run for every
sequence that proposes, whether or not any of its draft is kept (at 16 at once, 0.7-1.7 ms of a
20-40 ms step in benchmarks.md's ledger). After each step in which adaptive sequences
proposed, the policy records what proposing did to the step's predicted rate,

    paid = J(chosen k, the seconds d of proposing and choosing added) / J(no drafts, no d)
         = speedup * c(k) / (c(k) + d),

with speedup = J(k) / J(0) from `choose_k_rated` and c the live forward cost; a step whose
proposer found nothing records c(0) / (c(0) + d). A running mean of log(paid) is kept per
batch-size class (1, 2-3, 4-7, 8-15, ...). Where it is below log(1 - `margin`) after
`min_steps` records (proposing cost more than `margin` of the step's rate), the policy does not
propose for adaptive sequences of that class, except on every `explore`-th
step, which proposes so that the mean follows the traffic (copying text arriving at a batch
size where free text had closed it). Only speed changes: outputs never depend on what
was drafted. The margin keeps a cheap lookup open on text where it finds little: closing it
would save a fraction of a percent and miss the start of every copied span for up to
`explore` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def size_class(num_decode: int) -> int:
    """1 -> 1, 2-3 -> 2, 4-7 -> 3, 8-15 -> 4, 16-31 -> 5, ..."""
    return max(num_decode, 1).bit_length()


@dataclass
class _Mean:
    """Running mean, exponential (weight `alpha`) once it has 1/alpha samples."""

    n: int = 0
    value: float = 0.0

    def add(self, x: float, alpha: float) -> None:
        self.n += 1
        self.value += max(alpha, 1.0 / self.n) * (x - self.value)


@dataclass
class _Class:
    log_paid: _Mean = field(default_factory=_Mean)
    closed_steps: int = 0  # steps not proposed since the last exploring one


@dataclass
class Payoff:
    alpha: float = 0.1
    min_steps: int = 8  # records before a class may close
    margin: float = 0.02  # a class closes when proposing costs more than this of its rate
    explore: int = 16  # a closed class proposes on every explore-th step
    per_seq: _Mean = field(default_factory=_Mean)  # proposing seconds per proposing sequence
    # (for /info and benchmarks; the decision uses each step's own seconds)
    classes: dict[int, _Class] = field(default_factory=dict)

    def allows(self, num_decode: int) -> bool:
        """Whether adaptive sequences propose this step (counts a closed class's steps)."""
        c = self.classes.get(size_class(num_decode))
        if c is None or c.log_paid.n < self.min_steps or c.log_paid.value >= self._floor:
            return True
        c.closed_steps += 1
        if c.closed_steps < self.explore:
            return False
        c.closed_steps = 0
        return True

    @property
    def _floor(self) -> float:
        return math.log1p(-self.margin)

    def record(
        self, num_decode: int, proposing: int, seconds: float, speedup: float, cost: float
    ) -> None:
        """One step in which `proposing` adaptive sequences proposed for `seconds`; `speedup`:
        J(chosen k) / J(0) of the forward pass alone, `cost`: its predicted seconds at k."""
        if proposing <= 0 or cost <= 0.0 or speedup <= 0.0:
            return
        self.per_seq.add(seconds / proposing, self.alpha)
        paid = speedup * cost / (cost + max(seconds, 0.0))
        c = self.classes.setdefault(size_class(num_decode), _Class())
        c.log_paid.add(math.log(paid), self.alpha)

    def table(self) -> list[tuple[int, int, float]]:
        """(smallest batch size of the class, steps recorded, mean paid ratio) per class."""
        return [
            (1 << (k - 1), c.log_paid.n, math.exp(c.log_paid.value))
            for k, c in sorted(self.classes.items())
        ]
