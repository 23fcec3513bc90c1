"""GET /info: model, limits, speculation (policy, gates, cost curve), the applied profile, the
artifacts' fingerprints and the memory budget. Read under the engine lock, like /metrics."""

from __future__ import annotations

import asyncio
import os

import torch

from specserve import __version__
from specserve.engine.engine import Engine
from specserve.engine.facts import WindowPool
from specserve.kernels import ggml
from specserve.models.block_linear import block_kinds, block_numerics
from specserve.models.weight_report import WeightReport
from specserve.runner.cost import LiveCost
from specserve.server.context import Ctx
from specserve.server.info_schemas import (
    CalibrationBucket,
    CostCurveInfo,
    CostFit,
    FingerprintsInfo,
    Info,
    LiveCostCell,
    LiveCostInfo,
    MemoryInfo,
    ModelWeightsInfo,
    PayoffClass,
    ProfileInfo,
    SpeculationInfo,
    SuffixCacheInfo,
    WindowPoolInfo,
)
from specserve.server.provenance import Provenance
from specserve.server.settings import Limits, ServerSettings
from specserve.speculation.proposer import Proposer


async def reset_prefix_cache(ctx: Ctx) -> dict[str, int]:
    """Forget every cached prompt prefix (benchmarks reset it between cells, so no cell reuses
    another's prompts); how many blocks held one."""

    def reset(engine: Engine) -> int:
        return engine.reset_prefix_cache()

    return {"blocks": await asyncio.to_thread(ctx.async_engine.run_locked, reset)}


async def reset_suffix_cache(ctx: Ctx) -> dict[str, bool]:
    """Forget recent requests' outputs in the proposer's cross-request index, and what the
    EAGLE head's gates learned from them (benchmarks reset it between cells so no cell drafts
    from a replay of another's prompts, or starts from another workload's outcomes)."""

    def reset(engine: Engine) -> bool:
        return engine.reset_proposer_cache()

    return {"reset": await asyncio.to_thread(ctx.async_engine.run_locked, reset)}


async def info(ctx: Ctx) -> Info:
    """Model, dtype, speculation config, proposer, profile and memory budget."""

    def read(engine: Engine) -> Info:
        return engine_info(engine, ctx.settings, ctx.limits, ctx.provenance)

    return await asyncio.to_thread(ctx.async_engine.run_locked, read)


def weights_info(report: WeightReport | None) -> ModelWeightsInfo | None:
    if report is None:
        return None
    return ModelWeightsInfo(
        bytes_by_type=report.bytes_by_type,
        block_tensors=report.block_tensors,
        float32_tensors=report.float32_tensors,
        expanded_types=report.expanded,
    )


def engine_info(
    engine: Engine, s: ServerSettings, limits: Limits, provenance: Provenance | None
) -> Info:
    """Call under the engine lock. A fleet pool's replica answers with the same record."""
    facts, cfg, model, kv = engine.facts, engine.config, engine.model, engine.kv_pool()
    numerics = block_numerics(model)
    return Info(
        model_id=s.model_id,
        model_dtype=cfg.dtype,
        model_weight_blocks=block_kinds(model),
        model_numerics=numerics,
        model_q8_kernels=ggml.q8_path() if numerics == "q8" else None,
        model_block_kernel_fallback=model.block_kernel_fallback,
        model_native_refusal=None if model.native_stack else model.native_refusal,
        model_weights=weights_info(model.weight_report),
        attention=facts.attention,
        model_device_type=facts.device.type,
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
            weights_bytes=facts.weight_bytes,
            kv_cache_bytes=kv.kv_bytes,
            kv_cache_dtype=kv.dtype,
            kv_cache_tokens=kv.tokens,
            kv_block_size=kv.block_size,
            kv_blocks=kv.num_blocks,
            prefix_caching=kv.prefix_caching,
            kv_blocks_cached=kv.cached,
            kv_window_pool=window_pool_info(kv.window),
            budget=dict(facts.budget.as_dict()) if facts.budget is not None else None,
            available_bytes=available_memory(facts.device),
        ),
    )


def window_pool_info(pool: WindowPool | None) -> WindowPoolInfo | None:
    if pool is None:
        return None
    return WindowPoolInfo(
        window=pool.window,
        layers=pool.layers,
        blocks=pool.num_blocks,
        bytes=pool.kv_bytes,
        blocks_used=pool.used,
        blocks_peak=pool.peak_used,
        blocks_attached=pool.attached,
    )


def speculation_info(engine: Engine) -> SpeculationInfo:
    spec, policy, proposer = engine.config.spec, engine.policy, engine.proposer
    live = policy.cost if policy is not None else None
    return SpeculationInfo(
        speculate=spec.speculate,
        proposer=proposer.name if proposer is not None else None,
        configured_proposer=spec.proposer,
        draft_model=spec.draft_model,
        policy=spec.policy,
        max_batch=spec.max_batch,
        max_tokens=spec.max_tokens,
        cost_curve=cost_curve_info(live) if live is not None else None,
        live_cost=live_cost_info(live) if live is not None else None,
        calibration=[CalibrationBucket(**vars(row)) for row in policy.calibration.table()]
        if policy is not None
        else [],
        suffix_cache=suffix_cache_info(proposer),
        proposed_tokens=engine.stats.proposer.proposed_tokens,
        trimmed_tokens=policy.stats.trimmed_tokens if policy is not None else 0,
        skipped_steps=policy.stats.skipped_steps if policy is not None else 0,
        unpaid_steps=policy.stats.unpaid_steps if policy is not None else 0,
        payoff=[PayoffClass(min_batch=b, steps=n, paid=p) for b, n, p in policy.payoff.table()]
        if policy is not None
        else [],
        paused_sequence_steps=policy.stats.paused if policy is not None else 0,
        proposer_call_ms=1e3 * policy.proposing.value
        if policy is not None and policy.proposing.n
        else None,
    )


def suffix_cache_info(proposer: Proposer | None) -> SuffixCacheInfo | None:
    stats = proposer.index_stats() if proposer is not None else None
    return SuffixCacheInfo(**vars(stats)) if stats is not None else None


def cost_curve_info(live: LiveCost) -> CostCurveInfo:
    model = live.model
    intercept, slope = model.curve.linear_fit()
    return CostCurveInfo(
        tokens=list(model.curve.tokens),
        seconds=list(model.curve.seconds),
        fit=CostFit(intercept_s=intercept, per_token_s=slope),
        context=model.context,
        per_seq_key_s=model.per_seq_key,
        per_row_key_s=model.per_row_key,
        per_prefill_token_s=model.per_prefill_token,
        profile_s=model.profile_seconds,
    )


def live_cost_info(live: LiveCost, max_cells: int = 64) -> LiveCostInfo:
    busiest = sorted(live.cells.items(), key=lambda kv: -kv[1].n)[:max_cells]
    cells = [
        LiveCostCell(
            batch=b,
            rows=t,
            steps=r.n,
            observed_s=r.observed,
            profiled_s=r.predicted,
            ratio=r.ratio,
        )
        for (b, t), r in sorted(busiest)
    ]
    return LiveCostInfo(
        decode_ratio=live.decode.ratio,
        decode_steps=live.decode.n,
        prefill_ratio=live.prefill.ratio,
        prefill_steps=live.prefill.n,
        cells=cells,
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


def available_memory(device: torch.device) -> int | None:
    """Free bytes on the device (CUDA) or in the host (CPU), where the platform tells."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
