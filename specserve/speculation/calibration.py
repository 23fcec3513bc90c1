"""Online calibration: a proposer's per-token confidence -> the acceptance actually observed.

Confidences c in [0, 1] fall into equal-width buckets. Bucket b counts the draft tokens that
were *tested* (verification reached them: token i is tested iff tokens 1..i-1 were accepted)
and how many of those were accepted. The calibrated probability of a token with confidence c in
bucket b is the Beta-smoothed rate

    P(c) = (prior(c) * w + accepted_b) / (w + tested_b),   prior(c) = (1 + c) / 2,

an optimistic start (a never-tested confidence is given at least an even chance, so a policy
that trusts the calibration still tries drafts while verification is cheap) that the observed
rate replaces after a few dozen tests. The table is what `/info` and `/metrics` show. A NaN
confidence (a head fed NaN features) counts as 0: one would otherwise stay in its bucket's mean
for good, in a calibration every request shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CalibrationRow:
    """One confidence bucket."""

    low: float  # bucket covers [low, high) (the last one includes 1.0)
    high: float
    tested: int  # draft tokens in this bucket that verification reached
    accepted: int
    mean_confidence: float  # the proposer's own prediction, averaged over tested tokens
    observed: float | None  # accepted / tested; None before any test
    calibrated: float  # P(c) at the bucket's mean (or middle, untested)


class Calibration:
    """Per-proposer confidence buckets; see the module docstring."""

    def __init__(self, num_buckets: int = 10, prior_weight: float = 4.0) -> None:
        if num_buckets < 1 or prior_weight <= 0:
            raise ValueError(
                f"need num_buckets >= 1, prior_weight > 0, got {num_buckets}, {prior_weight}"
            )
        self.num_buckets, self.w = num_buckets, prior_weight
        self.tested = [0] * num_buckets
        self.accepted = [0] * num_buckets
        self.confidence_sum = [0.0] * num_buckets

    def bucket(self, confidence: float) -> int:
        c = _number(confidence)
        return min(max(int(c * self.num_buckets), 0), self.num_buckets - 1)

    def probability(self, confidence: float) -> float:
        confidence = _number(confidence)
        b = self.bucket(confidence)
        prior = (1.0 + min(max(confidence, 0.0), 1.0)) / 2.0
        return (prior * self.w + self.accepted[b]) / (self.w + self.tested[b])

    def probabilities(self, confidences: Sequence[float]) -> list[float]:
        return [self.probability(c) for c in confidences]

    def record(self, confidences: Sequence[float], num_accepted: int) -> None:
        """A verified draft with these confidences had its first `num_accepted` tokens accepted:
        those were tested and accepted, the next one tested and rejected, the rest untested."""
        for i, c in enumerate(map(_number, confidences[: num_accepted + 1])):
            b = self.bucket(c)
            self.tested[b] += 1
            self.confidence_sum[b] += c
            if i < num_accepted:
                self.accepted[b] += 1

    def best_tested(self) -> float | None:
        """The highest calibrated probability of a tested bucket (at its mean confidence, as
        `table` gives it); None before any test. Cheap enough for every step."""
        best = None
        for b, n in enumerate(self.tested):
            if n:
                p = self.probability(self.confidence_sum[b] / n)
                best = p if best is None else max(best, p)
        return best

    def table(self) -> list[CalibrationRow]:
        rows = []
        width = 1.0 / self.num_buckets
        for b in range(self.num_buckets):
            n = self.tested[b]
            mean = self.confidence_sum[b] / n if n else (b + 0.5) * width
            rows.append(
                CalibrationRow(
                    low=b * width,
                    high=(b + 1) * width,
                    tested=n,
                    accepted=self.accepted[b],
                    mean_confidence=mean,
                    observed=self.accepted[b] / n if n else None,
                    calibrated=self.probability(mean),
                )
            )
        return rows


class PerSequenceMean:
    """Per sequence, a running mean of the tokens a source's drafts gained. A new sequence starts
    from what the source has gained lately over every sequence (a slower running mean of every
    outcome, from an optimistic `prior`), but not below `explore`: where the source has stopped
    paying, a new sequence still tries it a little (where nothing else drafts), so the source
    is found again when the traffic changes."""

    def __init__(
        self, prior: float, rate: float, explore: float = 0.0, shared_rate: float = 0.0
    ) -> None:
        self.rate, self.explore, self.shared_rate = rate, explore, shared_rate
        self.prior = self.shared = prior
        self._means: dict[int, float] = {}

    def forget(self) -> None:
        """Back to the prior for every sequence, as if no outcome had been seen."""
        self.shared = self.prior
        self._means.clear()

    def mean(self, seq_id: int) -> float:
        return self._means.get(seq_id, max(self.shared, self.explore))

    def record(self, seq_id: int, value: float) -> None:
        mean = self.mean(seq_id)
        self._means[seq_id] = mean + self.rate * (value - mean)
        self.shared += self.shared_rate * (value - self.shared)

    def release(self, seq_id: int) -> None:
        self._means.pop(seq_id, None)

    def __len__(self) -> int:
        return len(self._means)


def _number(confidence: float) -> float:
    return 0.0 if confidence != confidence else confidence  # NaN -> 0
