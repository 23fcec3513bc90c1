"""The scheduler against a simulated engine (no model): each step computes what it was given,
samples one token per sampling sequence (plus accepted drafts), and frees rejected slots, as
`Engine` does. Checks the rule in the scheduler's docstring: no request is preempted twice,
nothing livelocks, and block accounting stays exact."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from specserve.config import SchedulerConfig
from specserve.request import SamplingParams, Sequence
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class Request:
    arrival_step: int
    prompt_len: int
    max_new: int


@dataclass
class Run:
    seqs: list[Sequence]
    steps: int
    preemptions: int


def simulate(
    requests: list[Request],
    num_blocks: int,
    block_size: int = 16,
    max_batch_tokens: int = 512,
    max_running: int = 64,
    speculate: int = 0,
    seed: int = 0,
    max_steps: int = 100_000,
) -> Run:
    rng = random.Random(seed)
    alloc = BlockAllocator(num_blocks, block_size)
    sched = Scheduler(SchedulerConfig(max_batch_tokens, max_running), alloc, max_model_len=8192)
    seqs = [
        Sequence(i, f"r{i}", [7] * r.prompt_len, SamplingParams(max_new_tokens=r.max_new))
        for i, r in enumerate(requests)
    ]
    live = 0
    step = 0
    for step in range(max_steps):
        for seq, r in zip(seqs, requests, strict=True):
            if r.arrival_step == step:
                sched.add(seq)
                live += 1
        if live == 0 and step > max(r.arrival_step for r in requests):
            break

        def caps(batch: list[Sequence], running: int, scheduled: int) -> list[int]:
            return [min(speculate, s.tokens_left - 1) for s in batch]

        batch = sched.schedule(caps if speculate else None)
        assert sched.num_available >= 0
        held = sum(len(s.block_table) for s in seqs)
        assert held + alloc.num_free == num_blocks
        for w in batch.work:
            s = w.seq
            assert len(s.block_table) * block_size >= s.num_computed + w.num_tokens + w.max_drafts
            if not w.samples:
                s.num_computed += w.num_tokens
                continue
            emitted = 1 + rng.randint(0, w.max_drafts)
            s.output_ids += [8] * min(emitted, s.tokens_left)
            if s.tokens_left == 0:
                sched.remove(s)
                s.status = s.status.FINISHED
                live -= 1
            else:
                s.num_computed = s.num_tokens - 1
                alloc.truncate(s.block_table, s.num_computed)
    assert live == 0, f"not finished after {max_steps} steps: livelock"
    assert alloc.num_free == num_blocks
    return Run(seqs, step, sched.num_preemptions)


# The reproduction in blocks: a 2000-token pool, a 512-token budget, two 900-token
# prompts x 300 new tokens (together 2400 tokens at the end).
THRASH = [Request(0, 900, 300), Request(0, 900, 300)]


def test_two_long_requests_on_a_small_pool_preempt_at_most_once() -> None:
    run = simulate(THRASH, num_blocks=125, max_batch_tokens=512)
    assert run.preemptions == 1  # they cannot both fit: one waits, once
    assert max(s.num_preemptions for s in run.seqs) == 1


@pytest.mark.parametrize("speculate", [0, 3])
def test_default_budget_reproduction(speculate: int) -> None:
    # Two 2700-token prompts x 500 new tokens on a 5824-token pool.
    reqs = [Request(0, 2700, 500), Request(0, 2700, 500)]
    run = simulate(reqs, num_blocks=364, max_batch_tokens=2048, speculate=speculate)
    assert run.preemptions <= 1


@pytest.mark.parametrize("seed", range(40))
def test_random_load_never_preempts_a_request_twice(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    num_blocks = rng.randint(8, 80)
    capacity = num_blocks * block_size
    reqs = []
    for _ in range(rng.randint(2, 30)):
        prompt = rng.randint(1, capacity - 1)
        reqs.append(Request(rng.randint(0, 60), prompt, rng.randint(1, capacity - prompt)))
    run = simulate(
        reqs,
        num_blocks=num_blocks,
        block_size=block_size,
        max_batch_tokens=rng.choice([1, 7, 64, 4096]),
        max_running=rng.choice([1, 3, 64]),
        speculate=rng.choice([0, 0, 2, 5]),
        seed=seed,
    )
    assert max(s.num_preemptions for s in run.seqs) <= 1


def test_protected_sequence_gets_its_worst_case_reserved() -> None:
    alloc = BlockAllocator(10, 4)
    sched = Scheduler(SchedulerConfig(64, 8), alloc)
    a = Sequence(0, "a", [1] * 8, SamplingParams(max_new_tokens=8))  # worst case 4 blocks
    a.num_preemptions = 1  # preempted once before
    sched.add(a)
    sched.schedule()
    assert len(a.block_table) == 2  # its prompt now, two more held for it
    assert sched.num_available == 10 - 4
    b = Sequence(1, "b", [1] * 12, SamplingParams(max_new_tokens=4))
    sched.add(b)  # its 3 prompt blocks + a growth block for a and for b: 5 <= 6
    sched.schedule()
    assert b in sched.running and sched.num_available == 3
    c = Sequence(2, "c", [1] * 4, SamplingParams(max_new_tokens=4))
    sched.add(c)  # 1 block + 3 growth blocks > 3 available
    sched.schedule()
    assert c in sched.waiting
