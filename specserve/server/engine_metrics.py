"""Engine-side Prometheus series, read from the engine at scrape time under its lock.

`snapshot` (`server/engine_snapshot.py`) copies what the series need (batch, KV blocks, the
prefix cache, speculation and policy counters, calibration); `EngineCollector` turns one or more
labelled snapshots (a fleet pool's replicas) into metric families.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from specserve.scheduler.kv_blocks import CacheStats
from specserve.server.engine_snapshot import EngineSnapshot, PolicySnapshot

F = TypeVar("F", GaugeMetricFamily, CounterMetricFamily, HistogramMetricFamily)
GATE_REASONS = ("max_batch", "max_tokens")  # speculation/policy.py Gate.closed_by


# One engine's snapshot with the labels that tell it apart from the others on the same
# exposition: none for `serve`, {"replica": id} for a fleet pool's replicas.
Labelled = list[tuple[dict[str, str], EngineSnapshot]]


class EngineCollector(Collector):
    def __init__(self, read: Callable[[], Labelled]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        engines = self._read()
        if not engines:
            return
        keys = sorted(engines[0][0])
        fam = _Families(keys)
        for labels, s in engines:
            at = [labels[k] for k in keys]
            fam.gauge("specserve_batch_size", "Sequences in the running batch", at, s.running)
            fam.gauge("specserve_queue_size", "Requests waiting to be scheduled", at, s.waiting)
            fam.gauge(
                "specserve_kv_cache_blocks_used", "KV cache blocks in use", at, s.kv_blocks_used
            )
            fam.gauge(
                "specserve_kv_cache_blocks", "KV cache blocks in the pool", at, s.kv_blocks_total
            )
            fam.gauge(
                "specserve_draft_kv_cache_blocks_used",
                "Draft model KV cache blocks in use (0 without a draft model)",
                at,
                s.draft_kv_blocks_used,
            )
            fam.counter(
                "specserve_preemptions", "Sequences preempted for KV blocks", at, s.preemptions
            )
            fam.counter(
                "specserve_generated_tokens", "Tokens emitted by the engine", at, s.tokens_emitted
            )
            steps = "Engine steps, by whether any sequence verified drafts"
            fam.counter("specserve_engine_steps", steps, at, s.spec_steps, speculation="on")
            fam.counter("specserve_engine_steps", steps, at, s.nonspec_steps, speculation="off")
            _spec_samples(fam, at, s)
            if s.cache is not None:
                _cache_samples(fam, at, s.cache, s.kv_blocks_cached)
            if s.policy is not None:
                _policy_samples(fam, at, s.policy)
        yield from fam.all()


class _Families:
    """Metric families keyed by name, each labelled with `keys` before its own labels."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self._families: dict[str, Metric] = {}

    def _family(self, cls: type[F], name: str, doc: str, own: list[str]) -> F:
        if name not in self._families:
            self._families[name] = cls(name, doc, labels=[*self.keys, *own])
        family = self._families[name]
        assert isinstance(family, cls)
        return family

    def gauge(self, name: str, doc: str, at: list[str], value: float, **own: str) -> None:
        fam = self._family(GaugeMetricFamily, name, doc, list(own))
        fam.add_metric([*at, *own.values()], value)

    def counter(self, name: str, doc: str, at: list[str], value: float, **own: str) -> None:
        fam = self._family(CounterMetricFamily, name, doc, list(own))
        fam.add_metric([*at, *own.values()], value)

    def histogram(
        self, name: str, doc: str, at: list[str], buckets: list[tuple[str, float]], total: float
    ) -> None:
        fam = self._family(HistogramMetricFamily, name, doc, [])
        fam.add_metric(at, buckets, total)

    def declare(self, cls: type[F], name: str, doc: str, own: list[str]) -> None:
        """A family that is exported even when no engine has samples for it."""
        self._family(cls, name, doc, own)

    def all(self) -> list[Metric]:
        return list(self._families.values())


def _cache_samples(fam: _Families, at: list[str], c: CacheStats, cached: int) -> None:
    fam.counter(
        "specserve_prefix_cache_queried_tokens",
        "Prompt tokens of admitted sequences looked up in the prefix cache",
        at,
        c.queried_tokens,
    )
    fam.counter(
        "specserve_prefix_cache_hit_tokens",
        "Prompt tokens found in the prefix cache (not recomputed)",
        at,
        c.hit_tokens,
    )
    fam.counter(
        "specserve_prefix_cache_evicted_blocks",
        "Cached KV blocks evicted to make room",
        at,
        c.evicted_blocks,
    )
    fam.gauge("specserve_kv_cache_blocks_cached", "KV blocks holding reusable prefixes", at, cached)


def _spec_samples(fam: _Families, at: list[str], s: EngineSnapshot) -> None:
    specs = (
        ("specserve_spec_drafts", "Sequence-steps that proposed drafts", s.drafts),
        ("specserve_spec_drafted_tokens", "Tokens proposed by the proposer", s.drafted_tokens),
        (
            "specserve_spec_accepted_tokens",
            "Proposed tokens accepted by the target",
            s.accepted_tokens,
        ),
    )
    by_pos = (
        "specserve_spec_accepted_tokens_by_position",
        "Steps whose draft token at this position (0 = first) was accepted",
    )
    for name, doc, _ in specs:
        fam.declare(CounterMetricFamily, name, doc, ["proposer"])
    fam.declare(CounterMetricFamily, *by_pos, ["proposer", "position"])
    forced = (
        ("specserve_spec_forced_drafted_tokens", "Drafted tokens of text a grammar forced"),
        ("specserve_spec_forced_accepted_tokens", "Forced-text draft tokens accepted"),
    )
    for (name, doc), value in zip(
        forced, (s.forced_drafted_tokens, s.forced_accepted_tokens), strict=True
    ):
        fam.counter(name, doc, at, value)
    if s.proposer is None:
        return
    for name, doc, value in specs:
        fam.counter(name, doc, at, value, proposer=s.proposer)
    for i, n in enumerate(s.accepted_per_position):
        fam.counter(*by_pos, at, n, proposer=s.proposer, position=str(i))


def _policy_samples(fam: _Families, at: list[str], p: PolicySnapshot) -> None:
    # A histogram over k in 0..N: bucket le="k" counts sequence-steps given at most k drafts.
    cumulative, total = 0, 0
    buckets: list[tuple[str, float]] = []
    for k, n in enumerate(p.k_chosen):
        cumulative, total = cumulative + n, total + k * n
        buckets.append((str(k), cumulative))
    buckets.append(("+Inf", cumulative))
    fam.histogram(
        "specserve_spec_k_chosen",
        "Drafts the policy allowed one sequence in one decode step (after the gates)",
        at,
        buckets,
        total,
    )
    gated = "Steps whose speculation a gate switched off (--speculate-max-batch/-max-tokens)"
    for reason in GATE_REASONS:
        fam.counter("specserve_spec_gated_steps", gated, at, p.gated.get(reason, 0), reason=reason)
    _calibration_samples(fam, at, p)
    if p.adaptive:
        fam.gauge(
            "specserve_spec_predicted_speedup",
            "Adaptive policy: expected tokens/s of the chosen k over k=0, at its last decision",
            at,
            p.predicted_speedup,
        )


def _calibration_samples(fam: _Families, at: list[str], p: PolicySnapshot) -> None:
    for bucket, n, acc, prob in p.calibration:
        fam.counter(
            "specserve_spec_calibration_tested",
            "Draft tokens verification reached, by the proposer's confidence bucket",
            at, n, bucket=bucket,
        )  # fmt: skip
        fam.counter(
            "specserve_spec_calibration_accepted", "Of those, accepted", at, acc, bucket=bucket
        )
        fam.gauge(
            "specserve_spec_calibration_probability",
            "Acceptance probability the policy uses for a confidence in this bucket",
            at, prob, bucket=bucket,
        )  # fmt: skip
    fam.counter(
        "specserve_spec_trimmed_tokens", "Proposed tokens the policy did not verify", at,
        p.trimmed_tokens,
    )  # fmt: skip
    fam.counter(
        "specserve_spec_skipped_steps", "Steps not proposed: no draft could pay", at,
        p.skipped_steps,
    )  # fmt: skip
    fam.counter(
        "specserve_spec_unpaid_steps",
        "Steps not proposed: proposing has not paid for its time at this batch size", at,
        p.unpaid_steps,
    )  # fmt: skip
    fam.counter(
        "specserve_spec_paused_sequence_steps",
        "Sequence-steps not proposed: paused after drafts the policy verified none of", at,
        p.paused,
    )  # fmt: skip
