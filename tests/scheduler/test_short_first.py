"""Shortest first: half of a step's prompt tokens go to the prompts with the fewest tokens
left, running or waiting (waiting ones admitted out of turn), the other half in order; nothing
skips a queue head that waits for KV blocks. No clock and no model: the step's work is
computed as the engine would."""

from __future__ import annotations

from specserve.config import SchedulerConfig
from specserve.request import SamplingParams, Sequence
from specserve.scheduler.batch import ScheduledBatch
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.scheduler.scheduler import Scheduler


def _scheduler(budget: int, blocks: int = 512, running: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(budget, running), BlockAllocator(blocks, 16), 4096)


def _seq(i: int, prompt: int) -> Sequence:
    return Sequence(i, f"r{i}", [7] * prompt, SamplingParams(max_new_tokens=50))


def _run(batch: ScheduledBatch) -> dict[int, int]:
    """Compute the step's work (a token out where it samples); its tokens per sequence."""
    for w in batch.work:
        w.seq.num_computed += w.num_tokens
        if w.samples:
            w.seq.output_ids.append(8)
            w.seq.num_computed = w.seq.num_tokens - 1
    return {w.seq.seq_id: w.num_tokens for w in batch.work}


def test_a_short_prompt_behind_long_ones_is_computed_whole_in_the_next_step() -> None:
    sched = _scheduler(2048)
    for i in range(6):
        sched.add(_seq(i, 700))
    sched.add(_seq(6, 40))
    assert _run(sched.schedule()) == {6: 40, 0: 700, 1: 700, 2: 608}
    assert sched.running[0].output_ids == [8]  # its first token, in the first step


def test_a_short_prompt_moves_beside_a_long_one_when_steps_are_small() -> None:
    """32 prompt tokens a step (a decode row beside them): the 48-token prompt takes half of
    each step and samples in the third, where in order it would wait ~60 steps for the long
    one; the long one moves by the other half."""
    sched = _scheduler(33)
    sched.add(_seq(0, 10))
    _run(sched.schedule())  # decoding from here on
    sched.add(_seq(1, 2000))
    _run(sched.schedule())
    sched.add(_seq(2, 48))
    steps = [_run(sched.schedule()) for _ in range(3)]
    assert steps == [{0: 1, 1: 16, 2: 16}] * 3
    assert sched.running[-1].output_ids == [8]  # the short one's first token
    assert _run(sched.schedule()) == {0: 1, 1: 31, 2: 1}  # two decode rows now


def test_without_short_prompts_the_queue_is_served_in_order() -> None:
    sched = _scheduler(2048)
    for i in range(4):
        sched.add(_seq(i, 700))
    assert _run(sched.schedule()) == {0: 700, 1: 700, 2: 648}
    assert _run(sched.schedule()) == {0: 1, 1: 1, 2: 52, 3: 700}


def test_running_prompts_keep_half_of_each_steps_prompt_tokens() -> None:
    """Three short prompts arrive every step, more than half the budget; the long one still
    moves by at least half of what the decode rows leave."""
    sched = _scheduler(512)
    sched.add(_seq(0, 2000))
    _run(sched.schedule())  # 512 of its tokens, nothing else waiting
    long = sched.running[0]
    for step in range(1, 8):
        left = long.num_uncomputed
        for j in range(3):
            sched.add(_seq(10 * step + j, 100))
        tokens = _run(sched.schedule())
        decode = sum(1 for i, n in tokens.items() if n == 1 and i != 0)
        prompt = 512 - decode
        assert tokens[0] >= min(left, prompt - prompt // 2)
        assert sum(n for i, n in tokens.items() if n > 1 and i != 0) > 0  # short ones went
    assert long.output_ids  # it finished its prompt all the same


def test_nothing_skips_a_head_that_waits_for_blocks() -> None:
    sched = _scheduler(2048, blocks=64)
    sched.add(_seq(0, 600))  # 38 blocks: runs
    _run(sched.schedule())
    sched.add(_seq(1, 600))  # 38 more do not fit: waits
    sched.add(_seq(2, 20))  # would fit, but does not skip it
    assert _run(sched.schedule()) == {0: 1}
    assert [s.seq_id for s in sched.waiting] == [1, 2]


def test_no_tokens_are_held_back_when_no_sequence_may_start() -> None:
    sched = _scheduler(512, running=1)
    sched.add(_seq(0, 2000))
    _run(sched.schedule())
    sched.add(_seq(1, 40))  # the running limit keeps it waiting
    assert _run(sched.schedule()) == {0: 512}
