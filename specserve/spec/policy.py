"""How many drafts each sequence proposes this step.

Static policy: every sequence gets its cap (the server's N, lowered by the request).
Adaptive policy: choose k_s in 0..cap_s to maximise expected emitted tokens per second,

    J(k) = sum_s E[emitted_s(k_s)] / c(T0 + sum_s k_s),

where T0 is the tokens the step scores anyway (one per decode sequence plus prefill chunks) and
c(T) the profiled step time. With a_{s,i} the probability that draft i+1 is accepted given drafts
1..i were, E[emitted_s(k)] = 1 + sum_{j=1..k} prod_{i<j} a_{s,i}: each step emits the accepted
prefix plus one token. When c is flat (bandwidth-bound) extra drafts are free and k goes to the
cap; when c grows linearly with T (compute-bound) and the batch is large, the marginal token is
worth less than its cost and k goes to 0 with no threshold configured.

Gates apply to both policies: no drafts when the running batch exceeds `max_batch`, or when the
step's tokens with drafts would exceed `max_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


def expected_emitted(accept: Sequence[float], k: int) -> float:
    """1 + sum_{j=1..k} prod_{i<j} accept[i] (accept[i]: P(draft i+1 accepted | 1..i accepted))."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= accept[i]
        total += reach
    return total


def choose_k(
    accept: Sequence[Sequence[float]],  # [S][cap_s] per-position acceptance per sequence
    caps: Sequence[int],  # [S]
    base_tokens: int,
    cost: Callable[[int], float],  # c(T) in seconds, increasing
) -> list[int]:
    """Greedy marginal allocation of draft slots maximising J(k) (see module docstring).

    Each added slot for sequence s adds prod_{i<=k_s} a_{s,i} to the numerator, which never
    grows as k_s grows, so the best next slot is the one with the largest such gain; stop when
    adding it lowers J. Tests check this against brute force on small cases.
    """
    ks = [0] * len(caps)
    gains = [_next_gain(a, 0, c) for a, c in zip(accept, caps, strict=True)]
    emitted = float(len(caps))
    tokens = base_tokens
    best = emitted / cost(tokens)
    while True:
        s = max(range(len(ks)), key=lambda i: gains[i], default=None)
        if s is None or gains[s] <= 0:
            return ks
        value = (emitted + gains[s]) / cost(tokens + 1)
        if value <= best:
            return ks
        emitted, tokens, best = emitted + gains[s], tokens + 1, value
        ks[s] += 1
        gains[s] = _next_gain(accept[s], ks[s], caps[s]) if ks[s] < caps[s] else 0.0


def _next_gain(accept: Sequence[float], k: int, cap: int) -> float:
    """Expected extra tokens from the (k+1)-th draft: prod_{i<=k} accept[i]."""
    if k >= cap:
        return 0.0
    reach = 1.0
    for i in range(k + 1):
        reach *= accept[i]
    return reach


@dataclass(frozen=True)
class Gate:
    max_batch: int | None = None  # no speculation when more sequences run than this
    max_tokens: int | None = None  # no speculation when the step would score more tokens

    def closed_by(self, num_running: int, step_tokens: int) -> str | None:
        """The reason speculation is off this step, or None."""
        if self.max_batch is not None and num_running > self.max_batch:
            return "max_batch"
        if self.max_tokens is not None and step_tokens > self.max_tokens:
            return "max_tokens"
        return None


class AcceptanceTracker:
    """Per-sequence acceptance per position: Beta counts around the proposer's global rates.

    Estimate for sequence s at position i: (prior_i * w + acc_{s,i}) / (w + tried_{s,i}), with
    prior_i = global accepted_i / tried_i (smoothed), w = prior weight in pseudo-trials.
    """

    def __init__(self, max_positions: int, prior_weight: float = 4.0) -> None:
        self.w = prior_weight
        self.tried = [0] * max_positions
        self.accepted = [0] * max_positions
        self._seq: dict[int, tuple[list[int], list[int]]] = {}

    def record(self, seq_id: int, num_drafted: int, num_accepted: int) -> None:
        tried, acc = self._seq.setdefault(seq_id, ([0] * len(self.tried), [0] * len(self.tried)))
        # Draft i was tested iff all before it were accepted: i <= num_accepted.
        for i in range(min(num_drafted, num_accepted + 1, len(self.tried))):
            tried[i] += 1
            self.tried[i] += 1
            if i < num_accepted:
                acc[i] += 1
                self.accepted[i] += 1

    def prior(self, i: int) -> float:
        # Optimistic start (0.5 on 1 pseudo-trial) so an untested proposer gets tried.
        return (self.accepted[i] + 0.5) / (self.tried[i] + 1.0)

    def estimate(self, seq_id: int, k: int) -> list[float]:
        tried, acc = self._seq.get(seq_id, ([0] * len(self.tried), [0] * len(self.tried)))
        return [
            (self.prior(i) * self.w + acc[i]) / (self.w + tried[i])
            for i in range(min(k, len(self.tried)))
        ]

    def forget(self, seq_id: int) -> None:
        self._seq.pop(seq_id, None)


@dataclass
class PolicyStats:
    k_chosen: dict[int, int]  # k -> sequences given that k (over all decode steps)
    gated: dict[str, int]  # reason -> steps with speculation switched off by a gate
    predicted_speedup: float = 1.0  # J(chosen k) / J(0) at the last decision


class SpeculationPolicy:
    """Turns per-sequence caps into this step's k, through the gates and, if adaptive, the
    acceptance-and-cost optimisation."""

    def __init__(
        self,
        adaptive: bool,
        gate: Gate,
        max_k: int,
        cost: Callable[[int], float] | None = None,
    ) -> None:
        if adaptive and cost is None:
            raise ValueError("the adaptive policy needs a profiled cost curve")
        self.adaptive, self.gate, self.cost = adaptive, gate, cost
        self.tracker = AcceptanceTracker(max(1, max_k))
        self.stats = PolicyStats(k_chosen={}, gated={})

    def decide(
        self, seq_ids: list[int], caps: list[int], num_running: int, scheduled_tokens: int
    ) -> list[int]:
        reason = self.gate.closed_by(num_running, scheduled_tokens + sum(caps))
        if reason is not None and any(caps):
            self.stats.gated[reason] = self.stats.gated.get(reason, 0) + 1
            ks = [0] * len(caps)
        elif self.adaptive and self.cost is not None:
            accept = [self.tracker.estimate(s, c) for s, c in zip(seq_ids, caps, strict=True)]
            ks = choose_k(accept, caps, scheduled_tokens, self.cost)
            self.stats.predicted_speedup = _speedup(accept, ks, scheduled_tokens, self.cost)
        else:
            ks = list(caps)
        for k in ks:
            self.stats.k_chosen[k] = self.stats.k_chosen.get(k, 0) + 1
        return ks

    def record(self, seq_id: int, num_drafted: int, num_accepted: int) -> None:
        self.tracker.record(seq_id, num_drafted, num_accepted)

    def forget(self, seq_id: int) -> None:
        self.tracker.forget(seq_id)


def _speedup(
    accept: list[list[float]], ks: list[int], base: int, cost: Callable[[int], float]
) -> float:
    emitted = sum(expected_emitted(a, k) for a, k in zip(accept, ks, strict=True))
    return (emitted / cost(base + sum(ks))) / (len(ks) / cost(base))
