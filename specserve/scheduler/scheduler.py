"""Continuous batching under a token budget, with KV-block admission and preemption by recompute.

Each step: running sequences first, oldest first (decode tokens and unfinished prefill chunks);
when blocks run out the newest running sequence is preempted (its blocks freed, it goes back to
the head of the queue and is recomputed later). Then waiting sequences are admitted in FIFO order
while the token budget, the running limit and free blocks allow; admission never skips ahead.
Finally decode sequences may reserve extra slots for speculative drafts, only from what is left:
speculation never causes a preemption.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from specserve.config import SchedulerConfig
from specserve.engine.request import SeqStatus, Sequence
from specserve.scheduler.kv_blocks import BlockAllocator


@dataclass(frozen=True)
class SeqWork:
    """One sequence's share of a step."""

    seq: Sequence
    num_tokens: int  # uncomputed tokens fed this step (a prefill chunk, or 1 when decoding)
    samples: bool  # the chunk reaches the end of the sequence: the step samples its next token
    max_drafts: int = 0  # KV slots reserved for drafts after the fed tokens


@dataclass(frozen=True)
class ScheduledBatch:
    work: list[SeqWork]
    preempted: list[Sequence]
    num_running: int  # running sequences after scheduling (the load the policy sees)

    @property
    def num_tokens(self) -> int:
        return sum(w.num_tokens + w.max_drafts for w in self.work)

    @property
    def is_empty(self) -> bool:
        return not self.work


# (decode sequences of a step, running sequences, tokens scheduled so far) -> drafts each may
# propose, in the same order.
DraftCaps = Callable[[list[Sequence], int, int], list[int]]


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: BlockAllocator) -> None:
        self.config = config
        self.allocator = allocator
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence from the queues (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.free(seq.block_table)

    def schedule(self, draft_caps: DraftCaps | None = None) -> ScheduledBatch:
        budget = self.config.max_batch_tokens
        work: list[SeqWork] = []
        preempted: list[Sequence] = []
        for seq in list(self.running):
            if seq in preempted or budget == 0:
                continue
            n = min(seq.num_uncomputed, budget)
            if not self._reserve(seq, n, preempted):
                continue
            work.append(SeqWork(seq, n, samples=seq.num_computed + n == seq.num_tokens))
            budget -= n
        if not preempted:
            budget = self._admit(work, budget)
        if draft_caps is not None:
            work = self._reserve_drafts(work, budget, draft_caps)
        return ScheduledBatch(work=work, preempted=preempted, num_running=len(self.running))

    def _reserve(self, seq: Sequence, n: int, preempted: list[Sequence]) -> bool:
        """Grow `seq` by n slots, preempting the newest running sequences as needed."""
        while not self.allocator.can_grow(seq.block_table, seq.num_computed + n):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        self.allocator.grow(seq.block_table, seq.num_computed + n)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.allocator.free(seq.block_table)
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _admit(self, work: list[SeqWork], budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running_requests:
            seq = self.waiting[0]
            n = min(seq.num_uncomputed, budget)
            if not self.allocator.can_grow(seq.block_table, seq.num_computed + n):
                break
            self.waiting.popleft()
            self.allocator.grow(seq.block_table, seq.num_computed + n)
            seq.status = SeqStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            work.append(SeqWork(seq, n, samples=seq.num_computed + n == seq.num_tokens))
            budget -= n
        return budget

    def _reserve_drafts(self, work: list[SeqWork], budget: int, caps: DraftCaps) -> list[SeqWork]:
        decode = [i for i, w in enumerate(work) if w.samples and w.num_tokens == 1]
        if not decode:
            return work
        scheduled = self.config.max_batch_tokens - budget
        wanted = caps([work[i].seq for i in decode], len(self.running), scheduled)
        out = list(work)
        for i, k in zip(decode, wanted, strict=True):
            seq = work[i].seq
            k = min(k, budget)
            # Only slots that fit in free blocks: drafts never evict anyone.
            while k > 0 and not self.allocator.can_grow(seq.block_table, seq.num_tokens + k):
                k -= 1
            if k > 0:
                self.allocator.grow(seq.block_table, seq.num_tokens + k)
                out[i] = SeqWork(seq, 1, samples=True, max_drafts=k)
                budget -= k
        return out

    def trim_drafts(self, work: list[SeqWork], kept: dict[int, int]) -> list[SeqWork]:
        """Give back reserved draft slots nobody will verify: each sequence keeps
        `kept[seq_id]` (none if absent); blocks that became empty return to the pool."""
        out = []
        for w in work:
            k = kept.get(w.seq.seq_id, 0)
            if w.max_drafts > k:
                self.allocator.truncate(w.seq.block_table, w.seq.num_tokens + k)
                w = replace(w, max_drafts=k)
            out.append(w)
        return out
