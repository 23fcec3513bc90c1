"""Stall-free prefill: a step's prefill chunks are sized from the live step cost so that the
step stays within the ITL target (Sarathi-Serve), and decode rows are served first whatever
the running order. Costs are injected: nothing here reads a clock."""

from __future__ import annotations

from specserve.config import SchedulerConfig
from specserve.request import SamplingParams, Sequence
from specserve.runner.cost import CostCurve, LiveCost, StepCostModel, StepShape
from specserve.scheduler.batch import ScheduledBatch
from specserve.scheduler.chunking import MIN_PREFILL_TOKENS
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.scheduler.scheduler import Scheduler


def _cost() -> LiveCost:
    """10 ms a decode row, 0.1 ms a prefill token, attention free."""
    curve = CostCurve((1, 2), (0.010, 0.020))
    return LiveCost(StepCostModel(curve, 0.0, 0.0, per_prefill_token=1e-4, context=0))


def _scheduler(budget: int, target_ms: float, cost: LiveCost | None) -> Scheduler:
    config = SchedulerConfig(budget, 16, itl_target_ms=target_ms)
    return Scheduler(config, BlockAllocator(256, 16), max_model_len=4096, cost=cost)


def _seq(i: int, prompt: int) -> Sequence:
    return Sequence(i, f"r{i}", [7] * prompt, SamplingParams(max_new_tokens=50))


def _run(batch: ScheduledBatch) -> None:
    """What the engine does with a step's work: compute it, emit a token where it samples."""
    for w in batch.work:
        w.seq.num_computed += w.num_tokens
        if w.samples:
            w.seq.output_ids.append(8)
            w.seq.num_computed = w.seq.num_tokens - 1


def _tokens(batch: ScheduledBatch) -> dict[int, int]:
    return {w.seq.seq_id: w.num_tokens for w in batch.work}


def test_a_newcomers_prompt_is_chunked_to_keep_the_step_within_the_target() -> None:
    sched = _scheduler(2048, 30.0, _cost())
    sched.add(_seq(0, 10))
    _run(sched.schedule())  # its prompt in one step: nothing else runs
    sched.add(_seq(1, 700))
    sizes = []
    while sched.running[-1].num_computed < 700:
        batch = sched.schedule()
        assert _tokens(batch)[0] == 1  # the stream decodes every step
        sizes.append(_tokens(batch).get(1, 0))
        shape = StepShape.of([(1, 0)], prefill=sizes[-1])
        assert sched.cost is not None and sched.cost.model.seconds(shape) <= 0.030
        _run(batch)
    chunk = int((0.030 - 0.010) / 1e-4)  # (30 - 10) ms / 0.1 ms, in floats (199)
    assert sizes[:3] == [chunk] * 3 and sum(sizes) == 700


def test_prefill_still_moves_where_the_decode_rows_alone_are_over_the_target() -> None:
    sched = _scheduler(2048, 5.0, _cost())  # a decode row alone takes 10 ms
    sched.add(_seq(0, 10))
    _run(sched.schedule())
    sched.add(_seq(1, 700))
    assert _tokens(sched.schedule()) == {0: 1, 1: MIN_PREFILL_TOKENS}


def test_no_target_or_no_cost_chunks_by_the_token_budget_alone() -> None:
    for sched in (_scheduler(2048, 0.0, _cost()), _scheduler(2048, 30.0, None)):
        sched.add(_seq(0, 700))
        assert _tokens(sched.schedule()) == {0: 700}


def test_decode_rows_are_never_starved_by_a_prefill_ahead_of_them() -> None:
    """A long prompt admitted first runs ahead of later sequences in the running order; the
    token budget still leaves a row for each decode sequence behind it."""
    sched = _scheduler(64, 0.0, None)
    sched.add(_seq(0, 500))
    _run(sched.schedule())  # 64 of its 500 prompt tokens
    for i in (1, 2):
        sched.running.append(_seq(i, 10))  # decoding sequences behind it (as if admitted)
        s = sched.running[-1]
        s.status = s.status.RUNNING
        sched.allocator.grow(s.block_table, 11)
        s.output_ids.append(8)
        s.num_computed = s.num_tokens - 1
    assert _tokens(sched.schedule()) == {0: 62, 1: 1, 2: 1}


def test_a_prompt_with_no_stream_beside_it_is_not_chunked_for_time() -> None:
    """Nothing decodes: no stream to stall, and chunks would only cost the prompt steps."""
    sched = _scheduler(2048, 30.0, _cost())
    sched.add(_seq(0, 700))
    sched.add(_seq(1, 300))
    assert _tokens(sched.schedule()) == {0: 700, 1: 300}
