"""Verify cost of the embedded model as the engine runs it, in process, side by side.

One sequence with ~256 tokens of context scores k + 1 rows in one step (`verify_cost`'s
measurement: `ModelRunner.run`, fp16 KV cache, the native layer stack), on each side: a
numerics (q8, exact) or PLAIN_ROWS (q8 on the GGUF row layout, before rows were interleaved
eight at a time). Used by `bench_llamacpp`'s verify part.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from contextlib import nullcontext

import torch

from benchmarks.verify_cost import Point, measure_verify_cost
from specserve.config import Numerics
from specserve.models.block_linear import plain_rows
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner
from specserve.scheduler.kv_blocks import BlockAllocator

PLAIN_ROWS = "q8, plain rows"  # a side of engine_verify_costs: the kernel before interleaving


def engine_verify_costs(
    sides: Sequence[str], ks: list[int], context: int = 256, rounds: int = 3
) -> dict[str, list[Point]]:
    """In process, batch 1: ms of a step scoring k + 1 rows, as the engine runs it, for each
    side (a numerics, or PLAIN_ROWS: q8 on the GGUF row layout). Every side's model is loaded
    first, then `rounds` passes over the sides in turn; each cell is the median of its rounds'
    medians, so a slow spell on the machine does not land on one side only."""
    blocks = (context + max(ks) + 1) // 16 + 2
    runners = {}
    for side in sides:
        numerics: Numerics = "q8" if side == PLAIN_ROWS else side  # type: ignore[assignment]
        with plain_rows() if side == PLAIN_ROWS else nullcontext():
            model = build_model(resolve_model_dir(None), torch.device("cpu"), numerics=numerics)
        runners[side] = ModelRunner(model, blocks, 16, torch.device("cpu"), kv_dtype="float16")
    passes: dict[str, list[list[Point]]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, runner in runners.items():
            allocator = BlockAllocator(blocks, 16)
            passes[side].append(
                measure_verify_cost(runner, allocator, [1], ks, context, repeats=15)
            )
    out = {}
    for side, runs in passes.items():
        ms = [statistics.median(run[i].ms_step for run in runs) for i in range(len(ks))]
        base = ms[ks.index(0)] if 0 in ks else None
        out[side] = [
            Point(1, k, k + 1, m, min(run[i].ms_min for run in runs),
                  max(run[i].ms_max for run in runs), m, m / base if base else None)
            for i, (k, m) in enumerate(zip(ks, ms, strict=True))
        ]  # fmt: skip
    return out
