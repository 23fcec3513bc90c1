"""Draft slots: reserved from free blocks only, and given back when the policy keeps less."""

from __future__ import annotations

from specserve.config import SchedulerConfig
from specserve.request import SamplingParams, Sequence
from specserve.scheduler.kv_blocks import BlockAllocator, blocks_for
from specserve.scheduler.scheduler import Scheduler


def decoding(seq_id: int, n: int) -> Sequence:
    seq = Sequence(seq_id, f"r{seq_id}", list(range(n)), SamplingParams(), output_ids=[1])
    return seq


def test_trim_gives_back_exactly_the_unused_slots() -> None:
    alloc = BlockAllocator(64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_batch_tokens=64), alloc)
    seqs = [decoding(i, n) for i, n in enumerate((7, 10, 15))]
    for s in seqs:
        sched.add(s)
    sched.schedule()  # prefill
    for s in seqs:
        s.num_computed = s.num_tokens - 1
    batch = sched.schedule(lambda decode, running, scheduled: [8] * len(decode))
    assert [w.max_drafts for w in batch.work] == [8, 8, 8]
    assert [len(s.block_table) for s in seqs] == [blocks_for(s.num_tokens + 8, 4) for s in seqs]
    used = alloc.num_used
    work = sched.trim_drafts(batch.work, {seqs[0].seq_id: 3, seqs[2].seq_id: 8})
    assert [w.max_drafts for w in work] == [3, 0, 8]
    assert [len(s.block_table) for s in seqs] == [
        blocks_for(seqs[0].num_tokens + 3, 4),
        blocks_for(seqs[1].num_tokens, 4),
        blocks_for(seqs[2].num_tokens + 8, 4),
    ]
    assert alloc.num_used < used
