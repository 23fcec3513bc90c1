"""Whether proposing pays for its own time, per batch size, measured live.

The adaptive policy's J (policy.py) weighs each extra verified row against the forward pass it
lengthens. Proposing costs time outside that pass: the proposer's lookups or head run for every
sequence that proposes, whether or not any of its draft is kept (at 16 at once, 0.7-1.7 ms of a
20-40 ms step in benchmarks.md's ledger), and so does the policy's own choice. After each step
in which adaptive sequences proposed, the policy records what the step predicts with its drafts
(expected emitted tokens E(k), forward seconds c(k), plus the seconds d of proposing and
choosing) and without them (E(0), c(0), no d); a step whose proposer found nothing records the
same tokens and forward with d added. Per batch-size class (1, 2-3, 4-7, 8-15, ...) the payoff
keeps running sums (exponentially weighted, `alpha`) of the four and compares the rates,

    paid = (sum E(k) / sum (c(k) + d)) / (sum E(0) / sum c(0)),

a ratio of sums, as throughput is: a few steps whose drafts pay much outweigh many that found
little, as they do in tokens. Where paid is below 1 - `margin` after `min_steps` records, the
policy does not propose for adaptive sequences of that class, except on an exploring step now
and then, which proposes so that the sums follow the traffic (copying text arriving at a batch
size where free text had closed it). The margin keeps a cheap lookup open on text where it finds
little: closing it would save a fraction of a percent and miss the start of every copied span
for up to `explore` steps. Only speed changes: outputs never depend on what was drafted.

How often a closed class explores: every `explore`-th step, or less often where an exploring
step costs more than `explore_budget` of the steps it stands for (`explore_every`): an EAGLE
head's exploring step first catches the head up on every sequence's pending features (tens of
milliseconds beside a ~30 ms step at 16 at once here), where a lookup's costs a fraction of a
millisecond. The interval at most doubles from one exploring step to the next, so one exploring
step caught by a busy machine (a lookup that took 50 ms once) does not push the next one
hundreds of steps away; a proposer whose exploring steps are dear reaches its interval in a few.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol


class Prediction(Protocol):
    """What a step's choice predicts (policy.Rated)."""

    @property
    def emitted(self) -> float: ...  # expected tokens with the chosen drafts
    @property
    def seconds(self) -> float: ...  # forward seconds with them
    @property
    def base_emitted(self) -> float: ...  # expected tokens with no drafts
    @property
    def base_seconds(self) -> float: ...  # forward seconds with none


def size_class(num_decode: int) -> int:
    """1 -> 1, 2-3 -> 2, 4-7 -> 3, 8-15 -> 4, 16-31 -> 5, ..."""
    return max(num_decode, 1).bit_length()


@dataclass
class _Sums:
    """Exponentially weighted sums (weight `alpha`, plain means until 1/alpha records)."""

    n: int = 0
    with_tokens: float = 0.0
    with_seconds: float = 0.0
    base_tokens: float = 0.0
    base_seconds: float = 0.0
    closed_steps: int = 0  # steps not proposed since the last exploring one
    exploring: bool = False  # the step `allows` just opened explores (its cost is kept)
    every: int = 0  # steps between exploring ones (0: `explore`)

    def add(self, p: Prediction, proposing_seconds: float, alpha: float) -> None:
        self.n += 1
        a = max(alpha, 1.0 / self.n)
        self.with_tokens += a * (p.emitted - self.with_tokens)
        self.with_seconds += a * (p.seconds + proposing_seconds - self.with_seconds)
        self.base_tokens += a * (p.base_emitted - self.base_tokens)
        self.base_seconds += a * (p.base_seconds - self.base_seconds)

    @property
    def paid(self) -> float:
        with_rate = self.with_tokens / self.with_seconds
        return with_rate / (self.base_tokens / self.base_seconds)


@dataclass
class Payoff:
    alpha: float = 0.05
    min_steps: int = 16  # records before a class may close
    margin: float = 0.02  # a class closes when proposing costs more than this of its rate
    explore: int = 16  # a closed class proposes on every explore-th step, at the most often
    explore_budget: float = 0.01  # ... and at most this share of its steps' time on exploring
    classes: dict[int, _Sums] = field(default_factory=dict)

    def allows(self, num_decode: int) -> bool:
        """Whether adaptive sequences propose this step (counts a closed class's steps)."""
        c = self.classes.get(size_class(num_decode))
        if c is None or c.n < self.min_steps or c.paid >= 1.0 - self.margin:
            return True
        c.closed_steps += 1
        if c.closed_steps < max(c.every, self.explore):
            return False
        c.closed_steps, c.exploring = 0, True
        return True

    def record(self, num_decode: int, proposing: int, seconds: float, p: Prediction) -> None:
        """One step in which `proposing` adaptive sequences proposed, and the policy chose, in
        `seconds`; `p`: the choice's predictions."""
        if proposing <= 0:
            return
        c = self.classes.setdefault(size_class(num_decode), _Sums())
        c.add(p, max(seconds, 0.0), self.alpha)
        if c.exploring:
            c.exploring = False  # its proposing and choice took `seconds`
            floor, budget = self.explore, self.explore_budget
            wanted = explore_every(max(seconds, 0.0), c.base_seconds, floor, budget)
            c.every = min(wanted, 2 * max(c.every, floor))

    def table(self) -> list[tuple[int, int, float]]:
        """(smallest batch size of the class, steps recorded, paid) per class."""
        return [(1 << (k - 1), c.n, c.paid) for k, c in sorted(self.classes.items())]


def explore_every(explore_seconds: float, step_seconds: float, floor: int, budget: float) -> int:
    """Steps between exploring ones: `floor`, or as many as it takes for an exploring step's
    `explore_seconds` to be `budget` of the steps' time (`step_seconds` each)."""
    if step_seconds <= 0.0 or explore_seconds <= 0.0:
        return floor
    return max(floor, math.ceil(explore_seconds / (budget * step_seconds)))
