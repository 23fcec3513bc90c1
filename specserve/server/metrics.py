"""Prometheus metrics on a per-app registry (several apps may live in one process).

Request-side series (counts, latencies, lengths) are observed as requests run. Engine-side series
(batch size, KV blocks, speculation counters, the policy's chosen k, gated steps and predicted
speedup) are read from the engine at scrape time, under the engine lock, so they are never stale
and cost nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from specserve.engine.engine import Engine
from specserve.engine.request import RequestOutput
from specserve.spec.policy import SpeculationPolicy

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
GATE_REASONS = ("max_batch", "max_tokens")  # spec/policy.py Gate.closed_by


@dataclass(frozen=True)
class PolicySnapshot:
    """The speculation policy's counters at one instant."""

    adaptive: bool
    k_chosen: tuple[int, ...]  # [k] for k in 0..N: sequence-steps given k drafts
    gated: dict[str, int]  # reason -> steps whose drafts a gate switched off
    predicted_speedup: float  # adaptive: J(chosen k) / J(0) at the last decision
    skipped_steps: int  # adaptive: steps not proposed since no draft could pay
    trimmed_tokens: int  # proposed tokens the adaptive policy did not verify
    calibration: tuple[tuple[str, int, int, float], ...]  # (bucket, tested, accepted, calibrated)


def policy_snapshot(policy: SpeculationPolicy, max_k: int) -> PolicySnapshot:
    stats = policy.stats
    return PolicySnapshot(
        adaptive=policy.adaptive,
        k_chosen=tuple(stats.k_chosen.get(k, 0) for k in range(max_k + 1)),
        gated=dict(stats.gated),
        predicted_speedup=stats.predicted_speedup,
        skipped_steps=stats.skipped_steps,
        trimmed_tokens=stats.trimmed_tokens,
        calibration=tuple(
            (f"{r.low:.1f}-{r.high:.1f}", r.tested, r.accepted, r.calibrated)
            for r in policy.calibration.table()
        ),
    )


@dataclass(frozen=True)
class EngineSnapshot:
    """Engine counters and gauges read at one instant."""

    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions: int
    spec_steps: int
    nonspec_steps: int
    tokens_emitted: int
    proposer: str | None
    drafts: int
    drafted_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]  # [i]: steps whose draft at position i was accepted
    policy: PolicySnapshot | None  # None when speculation is off


def snapshot(engine: Engine) -> EngineSnapshot:
    """Call under the engine lock."""
    stats, alloc, sched = engine.stats, engine.res.allocator, engine.scheduler
    prop = engine.res.proposer
    return EngineSnapshot(
        running=len(sched.running),
        waiting=len(sched.waiting),
        kv_blocks_used=alloc.num_used,
        kv_blocks_total=alloc.num_blocks,
        preemptions=sched.num_preemptions,
        spec_steps=stats.spec_steps,
        nonspec_steps=stats.nonspec_steps,
        tokens_emitted=stats.tokens_emitted,
        proposer=prop.name if prop is not None else None,
        drafts=stats.proposer.drafts,
        drafted_tokens=stats.proposer.drafted_tokens,
        accepted_tokens=stats.proposer.accepted_tokens,
        accepted_per_position=tuple(stats.proposer.accepted_per_position),
        policy=(
            policy_snapshot(engine.res.policy, engine.config.spec.speculate)
            if engine.res.policy is not None
            else None
        ),
    )


class EngineCollector(Collector):
    def __init__(self, read: Callable[[], EngineSnapshot]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        s = self._read()
        yield _gauge("specserve_batch_size", "Sequences in the running batch", s.running)
        yield _gauge("specserve_queue_size", "Requests waiting to be scheduled", s.waiting)
        yield _gauge("specserve_kv_cache_blocks_used", "KV cache blocks in use", s.kv_blocks_used)
        yield _gauge("specserve_kv_cache_blocks", "KV cache blocks in the pool", s.kv_blocks_total)
        yield _counter("specserve_preemptions", "Sequences preempted for KV blocks", s.preemptions)
        yield _counter(
            "specserve_generated_tokens", "Tokens emitted by the engine", s.tokens_emitted
        )
        steps = CounterMetricFamily(
            "specserve_engine_steps",
            "Engine steps, by whether any sequence verified drafts",
            labels=["speculation"],
        )
        steps.add_metric(["on"], s.spec_steps)
        steps.add_metric(["off"], s.nonspec_steps)
        yield steps
        yield from _spec_families(s)
        if s.policy is not None:
            yield from _policy_families(s.policy)


def _spec_families(s: EngineSnapshot) -> Iterator[Metric]:
    drafts = CounterMetricFamily(
        "specserve_spec_drafts", "Sequence-steps that proposed drafts", labels=["proposer"]
    )
    drafted = CounterMetricFamily(
        "specserve_spec_drafted_tokens", "Tokens proposed by the proposer", labels=["proposer"]
    )
    accepted = CounterMetricFamily(
        "specserve_spec_accepted_tokens",
        "Proposed tokens accepted by the target",
        labels=["proposer"],
    )
    by_pos = CounterMetricFamily(
        "specserve_spec_accepted_tokens_by_position",
        "Steps whose draft token at this position (0 = first) was accepted",
        labels=["proposer", "position"],
    )
    if s.proposer is not None:
        drafts.add_metric([s.proposer], s.drafts)
        drafted.add_metric([s.proposer], s.drafted_tokens)
        accepted.add_metric([s.proposer], s.accepted_tokens)
        for i, n in enumerate(s.accepted_per_position):
            by_pos.add_metric([s.proposer, str(i)], n)
    yield from (drafts, drafted, accepted, by_pos)


def _policy_families(p: PolicySnapshot) -> Iterator[Metric]:
    # A histogram over k in 0..N: bucket le="k" counts sequence-steps given at most k drafts.
    cumulative, total = 0, 0
    buckets: list[tuple[str, float]] = []
    for k, n in enumerate(p.k_chosen):
        cumulative, total = cumulative + n, total + k * n
        buckets.append((str(k), cumulative))
    buckets.append(("+Inf", cumulative))
    yield HistogramMetricFamily(
        "specserve_spec_k_chosen",
        "Drafts the policy allowed one sequence in one decode step (after the gates)",
        buckets=buckets,
        sum_value=total,
    )
    gated = CounterMetricFamily(
        "specserve_spec_gated_steps",
        "Steps whose speculation a gate switched off (--speculate-max-batch/-max-tokens)",
        labels=["reason"],
    )
    for reason in GATE_REASONS:
        gated.add_metric([reason], p.gated.get(reason, 0))
    yield gated
    yield from _calibration_families(p)
    if p.adaptive:
        yield _gauge(
            "specserve_spec_predicted_speedup",
            "Adaptive policy: expected tokens/s of the chosen k over k=0, at its last decision",
            p.predicted_speedup,
        )


def _calibration_families(p: PolicySnapshot) -> Iterator[Metric]:
    doc = "Draft tokens verification reached, by the proposer's confidence bucket"
    tested = CounterMetricFamily("specserve_spec_calibration_tested", doc, labels=["bucket"])
    accepted = CounterMetricFamily(
        "specserve_spec_calibration_accepted", "Of those, accepted", labels=["bucket"]
    )
    calibrated = GaugeMetricFamily(
        "specserve_spec_calibration_probability",
        "Acceptance probability the policy uses for a confidence in this bucket",
        labels=["bucket"],
    )
    for bucket, n, acc, prob in p.calibration:
        tested.add_metric([bucket], n)
        accepted.add_metric([bucket], acc)
        calibrated.add_metric([bucket], prob)
    yield from (tested, accepted, calibrated)
    yield _counter(
        "specserve_spec_trimmed_tokens",
        "Proposed tokens the policy did not verify",
        p.trimmed_tokens,
    )
    yield _counter(
        "specserve_spec_skipped_steps", "Steps not proposed: no draft could pay", p.skipped_steps
    )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class ServerMetrics:
    def __init__(self, read_engine: Callable[[], EngineSnapshot]) -> None:
        disable_created_metrics()  # process-wide: drop the `_created` twin of every series
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "specserve_requests",
            "Generation requests by route and outcome",
            ["route", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge(
            "specserve_requests_in_flight",
            "Generation requests admitted and not finished",
            registry=r,
        )
        lat, tok = LATENCY_BUCKETS, TOKEN_BUCKETS
        self.queue = _hist(
            r, "specserve_request_queue_seconds", "Time from arrival to first scheduling", lat
        )
        self.ttft = _hist(
            r,
            "specserve_time_to_first_token_seconds",
            "Time from arrival to the first generated token",
            lat,
        )
        self.itl = _hist(
            r,
            "specserve_inter_token_latency_seconds",
            "Time between generated tokens (a multi-token step spreads its gap)",
            lat,
        )
        self.e2e = _hist(
            r,
            "specserve_request_duration_seconds",
            "Time from arrival to the last token of a completed request",
            lat,
        )
        self.input_tokens = _hist(
            r, "specserve_request_input_tokens", "Prompt length of completed requests", tok
        )
        self.output_tokens = _hist(
            r, "specserve_request_output_tokens", "Generated length of completed requests", tok
        )
        r.register(EngineCollector(read_engine))

    def show_profile(self, stale: bool) -> None:
        """Export whether the applied speculation profile is stale (only when one is applied)."""
        Gauge(
            "specserve_speculation_profile_stale",
            "1 when the speculation profile was measured on other artifacts: re-measure it",
            registry=self.registry,
        ).set(int(stale))

    def count(self, route: str, outcome: str) -> None:
        self.requests.labels(route=route, outcome=outcome).inc()

    def render(self) -> bytes:
        """Exposition text; reads the engine, so call it off the event loop."""
        return generate_latest(self.registry)


def _hist(
    registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...]
) -> Histogram:
    return Histogram(name, doc, buckets=buckets, registry=registry)


def queue_seconds(out: RequestOutput) -> float | None:
    """Engine-reported wait before first scheduling, when the engine reports it."""
    value = getattr(out, "queue_seconds", None)
    return float(value) if value is not None else None
