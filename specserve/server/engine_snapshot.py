"""What the engine-side Prometheus series need, copied from the engine at one instant.

`snapshot` (called under the engine lock) reads the batch, KV blocks, the prefix cache,
speculation and policy counters, and calibration into an `EngineSnapshot`, which
`server/engine_metrics.py` turns into metric families.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.engine.engine import Engine
from specserve.scheduler.kv_blocks import CacheStats
from specserve.speculation.policy import SpeculationPolicy


@dataclass(frozen=True)
class PolicySnapshot:
    """The speculation policy's counters at one instant."""

    adaptive: bool
    k_chosen: tuple[int, ...]  # [k] for k in 0..N: sequence-steps given k drafts
    gated: dict[str, int]  # reason -> steps whose drafts a gate switched off
    predicted_speedup: float  # adaptive: J(chosen k) / J(0) at the last decision
    skipped_steps: int  # adaptive: steps not proposed since no draft could pay
    unpaid_steps: int  # adaptive: steps not proposed since proposing has not paid at that size
    paused: int  # adaptive: sequence-steps not proposed, in a pause after unverified drafts
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
        unpaid_steps=stats.unpaid_steps,
        paused=stats.paused,
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
    draft_kv_blocks_used: int  # the draft model's own pool (0 without a draft model)
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
    cache: CacheStats | None = None  # None without prefix caching
    kv_blocks_cached: int = 0
    forced_drafted_tokens: int = 0  # drafts of text a grammar forced (any proposer)
    forced_accepted_tokens: int = 0


def snapshot(engine: Engine) -> EngineSnapshot:
    """Call under the engine lock."""
    stats, kv, sched = engine.stats, engine.kv_pool(), engine.scheduler
    prop, policy = engine.proposer, engine.policy
    return EngineSnapshot(
        running=len(sched.running),
        waiting=len(sched.waiting),
        kv_blocks_used=kv.used,
        kv_blocks_total=kv.num_blocks,
        draft_kv_blocks_used=prop.kv_blocks_in_use() if prop is not None else 0,
        preemptions=sched.num_preemptions,
        cache=kv.cache,
        kv_blocks_cached=kv.cached,
        spec_steps=stats.spec_steps,
        nonspec_steps=stats.nonspec_steps,
        tokens_emitted=stats.tokens_emitted,
        proposer=prop.name if prop is not None else None,
        drafts=stats.proposer.drafts,
        drafted_tokens=stats.proposer.drafted_tokens,
        accepted_tokens=stats.proposer.accepted_tokens,
        accepted_per_position=tuple(stats.proposer.accepted_per_position),
        forced_drafted_tokens=stats.forced.drafted_tokens,
        forced_accepted_tokens=stats.forced.accepted_tokens,
        policy=(
            policy_snapshot(policy, engine.config.spec.speculate) if policy is not None else None
        ),
    )
