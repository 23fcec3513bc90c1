"""GET /info: model, limits, speculation (policy, gates, cost curve), the applied profile, the
artifacts' fingerprints and the memory budget. Read under the engine lock, like /metrics."""

from __future__ import annotations

import asyncio
import os

import torch

from specserve import __version__
from specserve.engine.engine import Engine
from specserve.models.block_linear import block_kinds
from specserve.runner.cost import CostCurve
from specserve.server.context import Ctx
from specserve.server.provenance import Provenance
from specserve.server.schemas import (
    CostCurveInfo,
    CostFit,
    FingerprintsInfo,
    Info,
    MemoryInfo,
    ProfileInfo,
    SpeculationInfo,
)
from specserve.server.settings import Limits, ServerSettings


async def info(ctx: Ctx) -> Info:
    """Model, dtype, speculation config, proposer, profile and memory budget."""

    def read(engine: Engine) -> Info:
        return engine_info(engine, ctx.settings, ctx.limits, ctx.provenance)

    return await asyncio.to_thread(ctx.async_engine.run_locked, read)


def engine_info(
    engine: Engine, s: ServerSettings, limits: Limits, provenance: Provenance | None
) -> Info:
    """Call under the engine lock. A fleet pool's replica answers with the same record."""
    res, cfg = engine.res, engine.config
    alloc = res.allocator
    return Info(
        model_id=s.model_id,
        model_dtype=cfg.dtype,
        model_weight_blocks=block_kinds(res.model),
        model_block_kernel_fallback=res.model.block_kernel_fallback,
        attention="ragged" if res.runner.ragged else "reference",
        model_device_type=res.device.type,
        max_concurrent_requests=s.max_concurrent_requests,
        max_running_requests=cfg.scheduler.max_running_requests,
        max_stop_sequences=limits.max_stop_sequences,
        max_input_tokens=limits.max_input_tokens,
        max_total_tokens=limits.max_request_tokens,
        max_batch_total_tokens=limits.kv_capacity_tokens,
        max_batch_prefill_tokens=cfg.scheduler.max_batch_tokens,
        version=__version__,
        speculation=speculation_info(engine),
        speculation_profile=profile_info(provenance),
        fingerprints=fingerprints_info(provenance),
        memory=MemoryInfo(
            weights_bytes=res.weight_bytes,
            kv_cache_bytes=res.runner.kv_bytes,
            kv_cache_tokens=alloc.num_blocks * alloc.block_size,
            kv_block_size=alloc.block_size,
            kv_blocks=alloc.num_blocks,
            prefix_caching=alloc.caching,
            kv_blocks_cached=alloc.num_cached,
            budget=_budget(res),
            available_bytes=available_memory(res.device),
        ),
    )


def speculation_info(engine: Engine) -> SpeculationInfo:
    spec, res = engine.config.spec, engine.res
    cost = res.policy.cost if res.policy is not None else None
    curve = None
    if isinstance(cost, CostCurve):  # the profiled curve (adaptive policy)
        intercept, slope = cost.linear_fit()
        curve = CostCurveInfo(
            tokens=list(cost.tokens),
            seconds=list(cost.seconds),
            fit=CostFit(intercept_s=intercept, per_token_s=slope),
        )
    return SpeculationInfo(
        speculate=spec.speculate,
        proposer=res.proposer.name if res.proposer is not None else None,
        configured_proposer=spec.proposer,
        draft_model=spec.draft_model,
        policy=spec.policy,
        max_batch=spec.max_batch,
        max_tokens=spec.max_tokens,
        cost_curve=curve,
    )


def profile_info(provenance: Provenance | None) -> ProfileInfo | None:
    p = provenance.profile if provenance is not None else None
    if p is None:
        return None
    return ProfileInfo(
        path=p.path,
        workload=p.workload,
        speculate=p.speculate,
        speculate_max_batch=p.speculate_max_batch,
        stale=p.stale,
        problems=list(p.problems),
    )


def fingerprints_info(provenance: Provenance | None) -> FingerprintsInfo | None:
    fps = provenance.fingerprints if provenance is not None else None
    if fps is None:
        return None
    return FingerprintsInfo(target=fps.target, proposer=fps.proposer)


def _budget(res: object) -> dict[str, int] | None:
    plan = getattr(res, "memory", None)  # present when the engine planned memory itself
    return dict(plan.as_dict()) if plan is not None else None


def available_memory(device: torch.device) -> int | None:
    """Free bytes on the device (CUDA) or in the host (CPU), where the platform tells."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
