"""Continuous batching under a token budget, with KV-block admission and preemption by recompute.

Each step serves running sequences first, oldest first (a decode token, or the next prefill
chunk), then admits waiting ones in FIFO order while the token budget and the running limit
allow, then lets decode sequences reserve slots for drafts from what is left.

Shortest first: half of a step's prompt tokens go to the prompts with the fewest tokens left,
running or waiting (a waiting one is then admitted out of turn), the other half in the order
above. A 50-token question so starts within a step or two instead of after every longer prompt
queued before it, and the oldest prompt still moves by at least half of each step's prompt
tokens, so none starves; nothing skips a queue head that waits for KV blocks.

One prefix computed once (shared_prefix.py): a waiting prompt whose next block to compute is a
block another running prompt is computing now waits until that one has committed it, then
starts from the cache; such a prompt does not hold up the queue behind it.

The rule that keeps KV pressure from turning into thrash:

1. Admission takes the blocks of the whole prompt at once (prompt plus any output a preempted
   sequence recomputes), so later prefill chunks never need a block. A fresh sequence is
   admitted only if, after that, one free block per running sequence (itself included) is
   left for growth.
2. When a running sequence needs a block and none is free, the newest running sequence that was
   never preempted is preempted (its blocks freed; back to the head of the queue, recomputed
   later); if there is none after it, it preempts itself.
3. A preempted sequence becomes *protected*: it is re-admitted only when the free blocks cover
   its whole worst case (prompt + max_new_tokens, capped by the context window), and those
   blocks stay reserved for it until it finishes. So it is never preempted again.
4. "Free" always means free minus the reservations of protected running sequences. Drafts take
   slots only from free blocks: speculation never causes a preemption.

A model with sliding-window layers also keeps their blocks in a `WindowBlocks` pool, sized never
to run out: those grow with each step's rows, not at admission, and give back what falls behind
the window; the rules above count full-layer blocks only. The blocks' side of the rules
(reservations, fits, admissibility, growing and freeing) is kv_ledger.py's `KVLedger`.

Hence each request is preempted at most once, and there is no livelock: every step computes
tokens for the oldest running sequence or preempts someone (at most once per request); running
sequences finish; the queue's head is admitted at the latest when nothing else runs (its worst
case fits the pool: `check_request` refuses requests that could not).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from itertools import islice

from specserve.config import SchedulerConfig
from specserve.request import SeqStatus, Sequence
from specserve.runner.cost import LiveCost
from specserve.scheduler.batch import DraftCaps, ScheduledBatch, SeqWork
from specserve.scheduler.chunking import prefill_budget
from specserve.scheduler.kv_blocks import BlockAllocator, PrefixMatch
from specserve.scheduler.kv_ledger import KVLedger
from specserve.scheduler.shared_prefix import SharedPrefixes
from specserve.scheduler.window_blocks import WindowBlocks

SHORT_LOOKAHEAD = 64  # waiting sequences looked through for the shortest prompts


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        allocator: BlockAllocator,
        max_model_len: int | None = None,
        cost: LiveCost | None = None,
        window: WindowBlocks | None = None,
    ) -> None:
        self.config = config
        self.kv = KVLedger(allocator, max_model_len, window)
        self.allocator, self.window = allocator, window
        self.cost = cost  # sizes prefill chunks to the ITL target (none: the token budget)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._parked: dict[int, list[Sequence]] = {}  # seq_id -> siblings waiting on its prompt
        self.shared = SharedPrefixes(allocator)

    def add(self, seq: Sequence, after: Sequence | None = None) -> None:
        """Queue `seq`. `after`: a sequence with the same prompt (an earlier choice of the same
        request) whose prompt is not computed yet: `seq` waits for it, then queues first and
        reuses its cached blocks instead of computing them again."""
        seq.status = SeqStatus.WAITING
        if (
            after is not None
            and not after.is_finished
            and not after.output_ids
            and self.allocator.caching
        ):
            self._parked.setdefault(after.seq_id, []).append(seq)
            return
        self.waiting.append(seq)

    def unpark(self, seq: Sequence) -> None:
        """`seq`'s prompt is computed (its first token is out), or it ended: the sequences
        waiting on it queue now, at the head."""
        for sibling in reversed(self._parked.pop(seq.seq_id, [])):
            if not sibling.is_finished:
                self.waiting.appendleft(sibling)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._parked)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence from the queues (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.shared.forget(seq)
        self.kv.free(seq)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Shrink `seq`'s tables to `num_tokens` positions (drafts verification rejected)."""
        self.kv.truncate(seq, num_tokens)

    def cache_committed(self, seq: Sequence) -> None:
        """Offer `seq`'s blocks that are now full of committed tokens to the prefix cache."""
        self.kv.cache_committed(seq)

    @property
    def num_available(self) -> int:
        """Free blocks not reserved for protected running sequences."""
        return self.kv.available(self.running)

    def schedule(self, draft_caps: DraftCaps | None = None) -> ScheduledBatch:
        self.kv.recount(self.running)
        self.shared.refresh(self.running if self.waiting else [])
        budget = self.config.max_batch_tokens
        target = self.config.itl_target_ms / 1e3
        prefill = prefill_budget(self.running, bool(self.waiting), budget, self.cost, target)
        first = self._shortest_first(prefill // 2)
        prefill -= sum(first.values())  # the rest goes in order
        work: list[SeqWork] = []
        preempted: list[Sequence] = []
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING or budget == 0:
                continue  # preempted earlier in this step
            left, planned = seq.num_uncomputed, first.pop(seq.seq_id, 0)
            n = min(left, budget if left == 1 else planned + prefill)
            if n == 0 or not self._reserve(seq, n, preempted):
                continue
            work.append(SeqWork(seq, n, samples=seq.num_computed + n == seq.num_tokens))
            budget -= n
            prefill -= max(0, n - planned) if left > 1 else 0
        if not preempted:
            budget, prefill = self._admit_first(work, budget, prefill, first)
            budget = self._admit(work, budget, prefill)
        if draft_caps is not None:
            work = self._reserve_drafts(work, budget, draft_caps)
        return ScheduledBatch(work=work, preempted=preempted, num_running=len(self.running))

    # ---------------------------------------------------------------- the rule
    def _reserve(self, seq: Sequence, n: int, preempted: list[Sequence]) -> bool:
        """Grow `seq` by n slots, preempting (rule 2) as needed. False if `seq` itself went."""
        while not self.kv.fits(seq, seq.num_computed + n):
            victim = self._victim(seq)
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        self.kv.grow(seq, seq.num_computed + n)
        self.kv.grow_window(seq, seq.num_computed + n)
        return True

    def _victim(self, seq: Sequence) -> Sequence:
        """The newest never-preempted sequence not yet scheduled this step (`seq` or after)."""
        later = self.running[self.running.index(seq) :]
        return next((s for s in reversed(later) if not s.num_preemptions), seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.shared.forget(seq)
        self.kv.release(seq)
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _admissible(self, seq: Sequence) -> PrefixMatch | None:
        """The cached prefix `seq` would share, or None if it must wait (rules 1 and 3)."""
        return self.kv.admissible(seq, len(self.running))

    def _shortest_first(self, room: int) -> dict[int, int]:
        """`room` prompt tokens for the prompts with the fewest left, smallest first: running
        ones still in prefill, and waiting ones (among the first SHORT_LOOKAHEAD) that could
        be admitted now, none while the queue's head waits for blocks. seq_id -> tokens."""
        slots = self.config.max_running_requests - len(self.running)
        waiting = list(islice(self.waiting, SHORT_LOOKAHEAD)) if slots > 0 else []
        if waiting and self._admissible(self.waiting[0]) is None:
            waiting = []
        prefilling = [s for s in self.running if s.num_uncomputed > 1]
        out: dict[int, int] = {}
        for seq in sorted(prefilling + waiting, key=lambda s: s.num_uncomputed):
            if room <= 0:
                break
            if seq.status is SeqStatus.WAITING:
                match = self._admissible(seq) if slots else None
                if match is None or self.shared.holds(match):
                    continue
                slots -= 1
            out[seq.seq_id] = min(seq.num_uncomputed, room)
            room -= out[seq.seq_id]
        return out

    def _admit_first(
        self, work: list[SeqWork], budget: int, prefill: int, first: dict[int, int]
    ) -> tuple[int, int]:
        """Admit the waiting sequences `first` gives tokens, out of turn, while the queue's
        head could still be admitted (the head itself also takes the `prefill` tokens left
        in order); tokens they do not use return to `prefill`. (budget, prefill) left."""
        if not first:  # the running loop took its own; none waiting was chosen
            return budget, prefill
        for seq in [s for s in islice(self.waiting, SHORT_LOOKAHEAD) if s.seq_id in first]:
            planned = first[seq.seq_id]
            in_order = prefill if seq is self.waiting[0] else 0
            match = self._admissible(seq) if self._admissible(self.waiting[0]) else None
            n = 0
            if match is not None and budget > 0 and not self.shared.holds(match):
                self.waiting.remove(seq)
                n = self._start(seq, match, work, min(planned + in_order, budget))
            budget, prefill = budget - n, prefill + planned - n
        return budget, prefill

    def _admit(self, work: list[SeqWork], budget: int, prefill: int) -> int:
        """Admit waiting sequences in order while `budget` (tokens) and `prefill` (prompt
        tokens) last, passing over (up to SHORT_LOOKAHEAD) those held for a sibling's
        prefix; the budget left."""
        passed = 0  # (so at most max_running_requests + SHORT_LOOKAHEAD are looked at)
        for seq in list(islice(self.waiting, self.config.max_running_requests + SHORT_LOOKAHEAD)):
            if min(budget, prefill) <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            match = self._admissible(seq)
            if match is None:
                break
            if self.shared.holds(match):
                passed += 1
                if passed >= SHORT_LOOKAHEAD:
                    break
                continue
            self.waiting.remove(seq)
            n = self._start(seq, match, work, min(budget, prefill))
            budget, prefill = budget - n, prefill - n
        return budget

    def _start(self, seq: Sequence, match: PrefixMatch, work: list[SeqWork], room: int) -> int:
        """Run `seq` (taken off the queue), sharing `match`, with a first chunk of at most
        `room` tokens; the chunk's tokens."""
        self.kv.start(seq, match)
        self.shared.started(seq)
        seq.status = SeqStatus.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        self.running.append(seq)
        n = min(seq.num_uncomputed, room)
        self.kv.grow_window(seq, seq.num_computed + n)
        work.append(SeqWork(seq, n, samples=seq.num_computed + n == seq.num_tokens))
        return n

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
            # Only slots that fit without preempting anyone (rule 4).
            while k > 0 and not self.kv.fits(seq, seq.num_tokens + k):
                k -= 1
            if k > 0:
                self.kv.grow(seq, seq.num_tokens + k)
                self.kv.grow_window(seq, seq.num_tokens + k)
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
                self.truncate(w.seq, w.seq.num_tokens + k)
                w = replace(w, max_drafts=k)
            out.append(w)
        return out
