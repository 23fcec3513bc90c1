"""Live speculation changes (`Engine.set_speculation`, a fleet pool's reconfigure): the
proposer and policy a new `SpecConfig` asks for, from what the engine has already loaded."""

from __future__ import annotations

from dataclasses import replace

from specserve.config import EngineConfig, SpecConfig
from specserve.engine.resources import EngineResources, make_policy
from specserve.runner.cost import LiveCost
from specserve.speculation.ngram import NgramProposer
from specserve.speculation.policy import SpeculationPolicy
from specserve.speculation.proposer import Proposer
from specserve.speculation.suffix import SuffixProposer


def respeculate(
    res: EngineResources, config: EngineConfig, spec: SpecConfig
) -> tuple[Proposer | None, SpeculationPolicy | None]:
    """The proposer and policy for `spec`, from what `res` has loaded (see
    `Engine.set_speculation`). The loaded proposer is kept while its artifacts stay the same;
    n-gram needs none. ValueError when `spec` would load a draft model or Medusa heads. The
    policy keeps its counters and its profiled step cost (extrapolated past its largest T)."""
    if spec.speculate == 0:
        return None, None
    proposer = _reusable_proposer(res.proposer, config.spec, spec)
    old = res.policy
    cost = old.cost if old is not None and isinstance(old.cost, LiveCost) else None
    adaptive_cost = cost if spec.policy == "adaptive" else None
    policy = make_policy(replace(config, spec=spec), res.runner, res.allocator, adaptive_cost)
    if old is not None and policy is not None:
        policy.stats = old.stats
    return proposer, policy


def _reusable_proposer(current: Proposer | None, old: SpecConfig, new: SpecConfig) -> Proposer:
    if new.proposer == "suffix":  # no artifacts: kept while its token bound stays the same
        same_bound = old.suffix_cache_tokens == new.suffix_cache_tokens
        if isinstance(current, SuffixProposer) and same_bound:
            return current
        return SuffixProposer(new.suffix_cache_tokens)
    if new.proposer == "ngram" or (
        isinstance(current, NgramProposer) and _same_artifacts(old, new)
    ):
        if isinstance(current, NgramProposer) and (current.ngram_min, current.ngram_max) == (
            new.ngram_min,
            new.ngram_max,
        ):
            return current
        return NgramProposer(new.ngram_min, new.ngram_max)
    if current is None or not _same_artifacts(old, new):
        raise ValueError(
            f"proposer {new.proposer!r} needs artifacts this engine has not loaded "
            "(a draft model or Medusa heads): restart it with the new setting"
        )
    heads = getattr(current, "num_heads", None)
    if heads is not None and new.speculate > heads:
        raise ValueError(f"speculate {new.speculate} is more than the {heads} Medusa heads")
    return current


def _same_artifacts(old: SpecConfig, new: SpecConfig) -> bool:
    def key(s: SpecConfig) -> tuple[object, ...]:
        return (s.proposer, s.draft_model, s.medusa, s.force_medusa)

    return key(old) == key(new)
