"""How many drafted tokens each sequence verifies this step: draft first, then decide.

Before proposing, gates (both policies) may switch drafting off: no drafts when the running batch
exceeds `max_batch`, or when the step with every cap would score more than `max_tokens`. The
adaptive policy (the default) also skips proposing when even drafts as good as the best
calibration bucket could not raise the step's rate once the proposer's own calls are paid (their
measured seconds per sequence; see `_cannot_pay`): a proposer that could only lose costs
nothing.

After proposing, the static policy verifies every draft whole (up to its cap). The adaptive
policy keeps the prefix k_s of each draft that maximises expected emitted tokens per second, J
(speculation/objective.py), from each draft token's calibrated acceptance
(speculation/calibration.py) and c, the live step cost (runner/cost.py) of this step's decode
rows and the extra rows. Beside a prefill chunk of P tokens the chunk's seconds stay out of c
(they are spent whatever the drafts; counted in, they lowered the bar for a draft to the slower
rate of a step carrying a prompt), while an extra row costs what the curve adds past the chunk's
tokens, f(T+P+m) - f(T+P): the chunk has already taken the flat, weight-bound part of the curve,
so a row beside it costs its arithmetic. The chunk's tokens do not count as emitted work (that
set the bar so high that n-gram drafts accepted 0.75 of the time were dropped where they had
saved a third of the steps; docs/benchmarks.md). Sequences that asked for the static policy
verify their whole draft and count as fixed rows. Under saturation c grows as fast as the tokens
do and k goes to 0 by itself; at low load the tokens likely to land are kept.

The calibration is shared by every request, so it predicts a request like the traffic before it:
after copy-heavy requests, a free-text one's drafts were verified at the copy-heavy rate and
mostly rejected (one request 0.86x of speculation off, three pairs alike; benchmarks/spec_pairs.py).
So each sequence also keeps its own verified drafts' accepted tokens against what the calibration
expected of them (`DraftOdds`, both sums decayed by SEQ_DECAY a draft), and its drafts'
probabilities are scaled by `sequence_factor`, (accepted + SEQ_PRIOR) / (expected + SEQ_PRIOR),
capped at 1: a sequence whose drafts keep failing verifies only the tokens likely enough even
then, and one whose drafts land is scaled back up. Only speed changes.

What proposing itself costs (outside the forward pass) is weighed per batch size by
speculation/payoff.py: where it has not paid for its own time, adaptive sequences of that size
do not propose, but for an exploring step now and then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from specserve.request import DraftOdds
from specserve.runner.cost import LiveCost, StepShape
from specserve.speculation.calibration import Calibration
from specserve.speculation.objective import Rated, RowCost, choose_k_rated, expected_emitted
from specserve.speculation.payoff import Payoff, explore_every
from specserve.speculation.proposer import Draft

# The per-sequence factor (module docstring): the tokens of evidence it starts from (at 1), and
# the weight of its earlier drafts at each new one (a memory of about twenty drafts). Drafts whose
# first token the calibration gives 0.5 and verification rejects take the factor to 0.67 after
# two, 0.33 after ten, and no lower than 0.17: what one sequence shows moves it quickly, but a
# long copied span (calibrated at 0.9 and more) is still verified in a sequence that failed.
SEQ_PRIOR = 2.0
SEQ_DECAY = 0.95


def sequence_factor(odds: DraftOdds) -> float:
    """What a sequence's drafts have done against the shared calibration's expectation: the
    scale of its drafts' probabilities, at most 1."""
    return min(1.0, (odds.accepted + SEQ_PRIOR) / (odds.expected + SEQ_PRIOR))


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


@dataclass(frozen=True)
class DecodeSeq:
    """What the policy sees of one decode sequence in a step."""

    context: int  # tokens whose K/V its rows read (its length)
    static: bool  # verifies its whole draft (static policy, or the request asked for it)
    cap: int = 0  # most drafts it may propose (before proposing)
    draft: Draft | None = None  # what it proposed (after proposing)
    # under a grammar: its forced text (near-free, accepted) drafts whatever the payoff or the
    # pre-check says of the proposer; only a gate stops it
    grammar: bool = False
    factor: float = 1.0  # its drafts' probabilities scaled by this (`sequence_factor`)


@dataclass
class PolicyStats:
    k_chosen: dict[int, int] = field(default_factory=dict)  # k -> sequence-steps verifying k
    gated: dict[str, int] = field(default_factory=dict)  # reason -> steps a gate switched off
    skipped_steps: int = 0  # adaptive: steps not proposed, since no draft could pay
    unpaid_steps: int = 0  # adaptive: steps not proposed, since proposing has not paid (payoff)
    paused: int = 0  # adaptive: sequence-steps not proposed, in a pause (engine/drafting.py)
    trimmed_tokens: int = 0  # proposed tokens the adaptive policy did not verify
    predicted_speedup: float = 1.0  # J(chosen k) / J(0) at the last decision


class SpeculationPolicy:
    """Gates and pre-check before proposing; the verified prefix of each draft after."""

    def __init__(
        self,
        adaptive: bool,
        gate: Gate,
        cost: LiveCost | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        if adaptive and cost is None:
            raise ValueError("the adaptive policy needs a step cost model")
        self.adaptive, self.gate, self.cost = adaptive, gate, cost
        self.calibration = calibration or Calibration()
        self.payoff = Payoff()
        self.stats = PolicyStats()
        # seconds proposing took per adaptive sequence that proposed: a running mean (plain
        # for the first 10 steps), the pre-check's price of a proposer call
        self.proposing = _Mean()
        self._priced_out = 0  # steps the calls' price alone closed since one explored

    def open(self, seqs: list[DecodeSeq], num_running: int, scheduled_tokens: int) -> list[int]:
        """Caps for this step's proposer: each sequence's cap unless a gate closed or, for
        adaptive sequences, proposing has not paid at this batch size (`Payoff.allows`) or no
        draft could pay (`_cannot_pay`)."""
        caps = [s.cap for s in seqs]
        if not any(caps):
            return caps
        reason = self.gate.closed_by(num_running, scheduled_tokens + sum(caps))
        if reason is not None:
            self.stats.gated[reason] = self.stats.gated.get(reason, 0) + 1
            return [0] * len(caps)
        if not self.adaptive or not any(s.cap and not s.static for s in seqs):
            return caps
        if not self.payoff.allows(len(seqs)):
            self.stats.unpaid_steps += 1
        elif self._cannot_pay(seqs, scheduled_tokens - len(seqs)):
            self.stats.skipped_steps += 1
        else:
            return caps
        return [s.cap if s.static or s.grammar else 0 for s in seqs]  # no proposer drafts

    def choose(
        self, seqs: list[DecodeSeq], prefill: int = 0, proposing: int = 0, seconds: float = 0.0
    ) -> list[int]:
        """Drafted tokens each sequence verifies (a prefix of its draft), beside `prefill`
        prompt-chunk tokens in the same step. `proposing`: the
        adaptive sequences that proposed this step, in `seconds`; the payoff weighs those
        seconds and this choice's own."""
        started = time.perf_counter()
        if self.adaptive and proposing:
            self.proposing.add(seconds / proposing)
        ks = [len(s.draft.tokens) if s.draft is not None else 0 for s in seqs]
        if self.adaptive and any(k and not s.static for k, s in zip(ks, seqs, strict=True)):
            ks, rated = self._optimise(seqs, prefill)
            seconds += time.perf_counter() - started
            self.payoff.record(len(seqs), proposing, seconds, rated)
        elif self.adaptive and proposing:  # nothing found: proposing bought nothing
            cost = float(self._row_cost(seqs, prefill, 0.0)(np.zeros(1))[0])
            base = float(len(seqs))  # (static drafts would count here: none found)
            self.payoff.record(len(seqs), proposing, seconds, Rated([], base, cost, base, cost))
        for k in ks:
            self.stats.k_chosen[k] = self.stats.k_chosen.get(k, 0) + 1
        return ks

    def record(self, draft: Draft, num_accepted: int, odds: DraftOdds | None = None) -> None:
        """A verified draft's outcome, for the calibration and the sequence's `odds`."""
        if odds is not None:
            tested = draft.scores[: num_accepted + 1]
            expected = sum(self.calibration.probabilities(tested))
            odds.expected = SEQ_DECAY * odds.expected + expected
            odds.accepted = SEQ_DECAY * odds.accepted + num_accepted
        self.calibration.record(draft.scores, num_accepted)

    def observe(self, shape: StepShape, seconds: float) -> None:
        """A step's measured forward-pass time, for the live cost."""
        if self.cost is not None:
            self.cost.observe(shape, seconds)

    # ------------------------------------------------------------------ internals
    def _optimise(self, seqs: list[DecodeSeq], prefill: int) -> tuple[list[int], Rated]:
        """The chosen k per sequence, and the choice of the free ones with its predictions."""
        probs = self.calibration.probabilities
        drafts = [s.draft for s in seqs]
        free = [i for i, (s, d) in enumerate(zip(seqs, drafts, strict=True)) if d and not s.static]
        accept = [
            [p * seqs[i].factor for p in probs(d.scores)]
            for i in free
            if (d := drafts[i]) is not None
        ]
        base_emitted = len(seqs) + sum(
            expected_emitted(probs(d.scores), len(d.tokens)) - 1.0
            for s, d in zip(seqs, drafts, strict=True)
            if d is not None and s.static
        )
        keys = sum(seqs[i].context for i in free) / len(free)
        cost = self._row_cost(seqs, prefill, keys)
        rated = choose_k_rated(accept, cost, base_emitted)
        ks = [
            len(d.tokens) if d is not None and s.static else 0
            for s, d in zip(seqs, drafts, strict=True)
        ]
        for i, k, a in zip(free, rated.ks, accept, strict=True):
            ks[i] = k
            self.stats.trimmed_tokens += len(a) - k
        self.stats.predicted_speedup = rated.speedup
        return ks, rated

    def _row_cost(self, seqs: list[DecodeSeq], prefill: int, keys_per_row: float) -> RowCost:
        """m -> live seconds of this step's decode rows with m extra rows, each reading
        `keys_per_row` keys; beside a `prefill`-token chunk, the extra rows cost what the curve
        adds past the chunk's tokens (see the module docstring)."""
        assert self.cost is not None
        fixed_rows = [1 + (len(s.draft.tokens) if s.static and s.draft else 0) for s in seqs]
        base = StepShape.of(
            [(r, s.context) for r, s in zip(fixed_rows, seqs, strict=True)], prefill=0
        )
        cost = self.cost

        def row_cost(m: np.ndarray) -> np.ndarray:
            rows = base.rows + prefill + m
            return cost.predict_rows(base, rows, base.attention + m * keys_per_row)

        if not prefill:
            return row_cost
        offset = cost.predict(base) - float(row_cost(np.zeros(1))[0])
        return lambda m: row_cost(m) + offset

    def _cannot_pay(self, seqs: list[DecodeSeq], prefill: int) -> bool:
        """True when no number m of extra rows, each adding the best calibrated acceptance
        seen (an upper bound on any real draft's gain), beats m = 0 once the proposer's calls
        (their measured mean per sequence) are paid too; where only the calls' price closes
        it, an exploring step proposes now and then (`explore_every`), so that the price is
        measured again. (The payoff weighs what proposing did buy, per batch size.)"""
        free = [s for s in seqs if not s.static and s.cap]
        if not free:
            return False
        best = self._best_probability() * max(s.factor for s in free)
        keys = sum(s.context for s in free) / len(free)  # (np.mean: ~20 us a step)
        cost = self._row_cost([replace_cap(s) for s in seqs], max(prefill, 0), keys)
        m = np.arange(sum(s.cap for s in free) + 1)
        static_rows = sum(s.cap for s in seqs if s.static)
        gain = len(seqs) + static_rows * best + m * best
        rows_only = gain / cost(m)
        if rows_only[1:].max() <= rows_only[0]:
            return True
        calls = self.proposing.value * len(free) * (m > 0)  # no draft: no call
        rate = gain / (cost(m) + calls)
        if rate[1:].max() > rate[0]:
            return False
        self._priced_out += 1  # only the calls' price closes it: re-measured now and then
        p = self.payoff
        every = explore_every(float(calls[-1]), float(cost(m[:1])[0]), p.explore, p.explore_budget)
        if self._priced_out < every:
            return True
        self._priced_out = 0
        return False

    def _best_probability(self) -> float:
        best = self.calibration.best_tested()
        return 1.0 if best is None else best


def replace_cap(seq: DecodeSeq) -> DecodeSeq:
    """`seq` as the cost sees it before proposing: a static one verifies its whole cap."""
    if not seq.static or not seq.cap:
        return seq
    return DecodeSeq(seq.context, True, seq.cap, Draft(tokens=[0] * seq.cap))


@dataclass
class _Mean:
    """A running mean: plain over the first 1/alpha values, then exponential."""

    alpha: float = 0.1
    n: int = 0
    value: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.value += max(self.alpha, 1.0 / self.n) * (x - self.value)
