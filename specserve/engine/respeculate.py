"""Live speculation changes (`Engine.set_speculation`, a fleet pool's reconfigure): the
proposer and policy a new `SpecConfig` asks for, from what the engine has already loaded."""

from __future__ import annotations

from dataclasses import replace

from specserve.config import EngineConfig, SpecConfig
from specserve.engine.resources import DTYPES, EngineResources, make_policy
from specserve.runner.cost import LiveCost
from specserve.speculation.policy import SpeculationPolicy
from specserve.speculation.proposer import Loaded, Proposer, Target
from specserve.speculation.registry import REGISTRY, Registry


def respeculate(
    res: EngineResources, config: EngineConfig, spec: SpecConfig, registry: Registry = REGISTRY
) -> tuple[Proposer | None, SpeculationPolicy | None]:
    """The proposer and policy for `spec`, from what `res` has loaded (see
    `Engine.set_speculation`). The loaded proposer is kept while its artifacts and settings
    stay the same (`Registry.live_proposer`). ValueError when `spec` would load an artifact (a
    draft model, Medusa heads). The policy keeps its counters and its profiled step cost
    (extrapolated past its largest T)."""
    if spec.speculate == 0:
        return None, None
    new_config = replace(config, spec=spec)
    dtype = DTYPES[config.dtype]
    target = Target(res.model, res.model_dir, res.tokenizer, res.device, dtype)
    loaded = Loaded(new_config, target, num_blocks=res.allocator.num_blocks)
    proposer = registry.live_proposer(res.proposer, config.spec, loaded)
    old = res.policy
    cost = res.cost or (old.cost if old is not None and isinstance(old.cost, LiveCost) else None)
    adaptive_cost = cost if spec.policy == "adaptive" else None
    policy = make_policy(new_config, res.runner, res.allocator, adaptive_cost, res.window)
    if old is not None and policy is not None:
        policy.stats = old.stats
    return proposer, policy
