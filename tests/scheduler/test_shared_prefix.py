"""One prefix computed once: a waiting prompt whose next block is one a running prompt is still
computing waits for it to be committed, then starts from the cache, instead of computing the
same blocks beside it. No clock and no model: the step's work is computed as the engine would,
its full blocks offered to the cache after each step."""

from __future__ import annotations

from specserve.config import SchedulerConfig
from specserve.request import SamplingParams, Sequence
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.scheduler.scheduler import Scheduler

BS = 16
SHARED = list(range(100, 196))  # six whole blocks both prompts start with


def _scheduler(budget: int, caching: bool = True) -> Scheduler:
    return Scheduler(SchedulerConfig(budget, 64), BlockAllocator(256, BS, caching), 4096)


def _seq(i: int, prompt: list[int], salt: str | None = None) -> Sequence:
    params = SamplingParams(max_new_tokens=4, cache_salt=salt)
    return Sequence(i, f"r{i}", prompt, params)


def _drive(sched: Scheduler, seqs: list[Sequence]) -> tuple[dict[int, int], list[dict[int, int]]]:
    """Run until every prompt has its first token: prompt tokens each computed, and the
    steps' work (seq_id -> tokens)."""
    computed = {s.seq_id: 0 for s in seqs}
    steps = []
    while not all(s.output_ids for s in seqs):
        batch = sched.schedule()
        for w in batch.work:
            if not w.seq.output_ids:
                computed[w.seq.seq_id] += w.num_tokens
            w.seq.num_computed += w.num_tokens
            if w.samples:
                w.seq.output_ids.append(8)
                w.seq.num_computed = w.seq.num_tokens - 1
            sched.cache_committed(w.seq)
        steps.append({w.seq.seq_id: w.num_tokens for w in batch.work})
        assert len(steps) < 100
    return computed, steps


def test_a_prompt_waits_for_the_shared_prefix_a_running_one_computes() -> None:
    """64 prompt tokens a step. The shorter prompt goes first (shortest first) and computes the
    96 shared tokens over two steps; the longer one, which would have taken the step's other
    32 tokens and computed the same blocks, waits until they are committed, then computes only
    its own tail from the cache."""
    sched = _scheduler(64)
    a, b = _seq(0, [*SHARED, *range(500, 540)]), _seq(1, [*SHARED, 9, 9, 9])
    sched.add(a)
    sched.add(b)
    computed, steps = _drive(sched, [a, b])
    assert computed == {0: 40, 1: 99}  # the prefix once
    assert 0 not in steps[0] and 0 not in steps[1]  # held while `b` computes it
    assert a.cached_blocks >= 6


def test_the_hold_ends_at_the_first_block_the_prompts_do_not_share() -> None:
    """Sharing only the first two blocks: once those are committed, the second prompt computes
    its own blocks beside the first's rest."""
    sched = _scheduler(64)
    a = _seq(0, [*SHARED[:32], *range(500, 564)])
    b = _seq(1, [*SHARED[:32], *range(700, 780)])
    sched.add(a)
    sched.add(b)
    computed, steps = _drive(sched, [a, b])
    assert computed == {0: 96, 1: 80}
    assert steps[1] == {0: 32, 1: 32}


def test_prompts_under_other_salts_or_without_a_cache_are_not_held() -> None:
    for salts, caching in (((None, "tenant-b"), True), ((None, None), False)):
        sched = _scheduler(256, caching)
        a, b = _seq(0, [*SHARED, 1], salts[0]), _seq(1, [*SHARED, 2], salts[1])
        sched.add(a)
        sched.add(b)
        computed, steps = _drive(sched, [a, b])
        assert computed == {0: 97, 1: 97}  # nothing shared: neither waits for the other
        assert steps[0] == {0: 97, 1: 97}


def test_a_held_prompt_lets_the_queue_behind_it_start() -> None:
    """The held prompt waits for its sibling, not for blocks: a prompt queued after it is
    admitted meanwhile."""
    sched = _scheduler(256)
    a, b, c = _seq(0, [*SHARED, 1]), _seq(1, [*SHARED, 2]), _seq(2, list(range(900, 940)))
    for s in (a, b, c):
        sched.add(s)
    computed, steps = _drive(sched, [a, b, c])
    assert 2 in steps[0] and 1 not in steps[0]
    assert computed == {0: 97, 1: 1, 2: 40}
