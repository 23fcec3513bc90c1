"""The engine: one step = schedule -> propose -> run target -> verify -> commit.

Not thread-safe by itself; `AsyncEngine` serialises access with a lock.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass, replace

import torch

from specserve.config import EngineConfig
from specserve.engine.detokenizer import IncrementalDetokenizer
from specserve.engine.request import (
    RequestOutput,
    SamplingParams,
    SeqStatus,
    Sequence,
    check_request,
)
from specserve.engine.resources import EngineResources, load_resources
from specserve.engine.stats import EngineStats, StepRecord, is_decode, step_shape
from specserve.runner.model_runner import RunItem, RunOutput
from specserve.runner.sampler import SampleRow, processed_logits, sample
from specserve.scheduler.scheduler import ScheduledBatch, SeqWork
from specserve.spec.policy import DecodeSeq
from specserve.spec.proposer import Draft
from specserve.spec.verify import VerifyResult, verify_deterministic, verify_sampled

logger = logging.getLogger(__name__)


@dataclass
class _Live:
    """Engine-side state of one request."""

    seq: Sequence
    detok: IncrementalDetokenizer
    pending_text: str = ""


class Engine:
    def __init__(self, config: EngineConfig, resources: EngineResources | None = None) -> None:
        self.config = config
        self.res = resources or load_resources(config)
        self.scheduler = self.res.scheduler
        self.stats = EngineStats()
        self._live: dict[str, _Live] = {}
        self._finished_outputs: list[RequestOutput] = []
        self._ids = itertools.count()
        self.last_step: StepRecord | None = None

    # ----------------------------------------------------------------- requests
    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.res.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.res.max_model_len

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.res.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self.res.tokenizer.encode(text, add_special_tokens=False))

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; raises ValueError naming the limit on bad input."""
        ids, params = self.prepare(prompt, params or SamplingParams())
        return self.add_prepared(ids, params, request_id)

    def prepare(
        self, prompt: str | list[int], params: SamplingParams
    ) -> tuple[list[int], SamplingParams]:
        """Tokenize and validate without touching engine state (safe from any thread).
        A sampled request without a seed gets a random one here, so it can be reported."""
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        alloc = self.res.allocator
        check_request(
            ids,
            params,
            vocab_size=self.res.model.arch.vocab_size,
            max_model_len=self.max_model_len,
            kv_capacity=alloc.num_blocks * alloc.block_size,
        )
        policy = self.res.policy
        if params.speculation_policy == "adaptive" and not (policy and policy.adaptive):
            raise ValueError(
                "speculation_policy 'adaptive' needs a server started with "
                "--speculation-policy adaptive"
            )
        if not params.greedy and params.seed is None:
            params = replace(params, seed=random.getrandbits(63))
        return ids, params

    def add_prepared(
        self, ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(seq_id=next(self._ids), request_id=request_id, prompt_ids=ids, params=params)
        self._live[request_id] = _Live(seq, IncrementalDetokenizer(self.res.tokenizer, params.stop))
        self.scheduler.add(seq)
        return request_id

    def encode(self, text: str) -> list[int]:
        """Prompt text -> token ids, without adding special tokens (templates add their own)."""
        return list(self.res.tokenizer.encode(text, add_special_tokens=False))

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks. False if it is unknown or finished."""
        live = self._live.get(request_id)
        if live is None:
            return False
        self._finish(live, "abort")
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._finished_outputs)

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        outputs, self._finished_outputs = self._finished_outputs, []
        batch = self.scheduler.schedule(self._draft_caps if self.res.proposer else None)
        for seq in batch.preempted:
            self._release_proposer(seq)
        if batch.is_empty:
            return outputs
        proposed = self._propose(batch)
        reserved = {w.seq.seq_id: w.max_drafts for w in batch.work if w.max_drafts}
        batch, drafts = self._decide(batch, proposed)
        try:
            started = time.perf_counter()
            run = self.res.runner.run(self._run_items(batch, drafts))
            elapsed = time.perf_counter() - started
        except Exception as exc:  # a failed pass fails its batch, not the engine
            logger.exception("forward pass failed")
            for w in batch.work:
                self._finish(self._live[w.seq.request_id], "error", error=str(exc))
            return outputs + self._drain_finished()
        if self.res.policy is not None:
            self.res.policy.observe(step_shape(batch, drafts), elapsed)
        outputs += self._verify_and_commit(batch, drafts, run)
        self.last_step = self.stats.count_step(batch, reserved, proposed, drafts)
        return outputs + self._drain_finished()

    def _draft_caps(self, seqs: list[Sequence], num_running: int, scheduled: int) -> list[int]:
        caps = self._static_caps(seqs)
        policy = self.res.policy
        if policy is None:
            return caps
        views = [
            DecodeSeq(s.num_tokens, self._static(s), c) for s, c in zip(seqs, caps, strict=True)
        ]
        return policy.open(views, num_running, scheduled)

    def _static(self, seq: Sequence) -> bool:
        """Whether `seq` verifies its whole draft (the static policy, or its own request)."""
        policy = self.res.policy
        return policy is None or not policy.adaptive or seq.params.speculation_policy == "static"

    def _static_caps(self, seqs: list[Sequence]) -> list[int]:
        n = self.config.spec.speculate
        caps = []
        for seq in seqs:
            cap = n if seq.params.speculate is None else min(seq.params.speculate, n)
            # k+1 emitted tokens must fit in max_new_tokens; k drafts must fit in the context.
            cap = min(cap, seq.tokens_left - 1, self.max_model_len - seq.num_tokens)
            caps.append(max(0, cap))
        return caps

    def _propose(self, batch: ScheduledBatch) -> dict[int, Draft]:
        proposer = self.res.proposer
        spec = [w for w in batch.work if w.max_drafts > 0]
        if proposer is None or not spec:
            return {}
        drafts = proposer.propose([w.seq for w in spec], [w.max_drafts for w in spec])
        return {w.seq.seq_id: d for w, d in zip(spec, drafts, strict=True) if d.tokens}

    def _decide(
        self, batch: ScheduledBatch, proposed: dict[int, Draft]
    ) -> tuple[ScheduledBatch, dict[int, Draft]]:
        """The policy keeps a prefix of each draft; the KV slots reserved for the rest (and for
        drafts that found nothing) go back to the pool before the pass."""
        drafts = proposed
        policy = self.res.policy
        decode = [w.seq for w in batch.work if is_decode(w)]
        if policy is not None and decode:
            views = [
                DecodeSeq(s.num_tokens, self._static(s), draft=proposed.get(s.seq_id))
                for s in decode
            ]
            prefill = sum(w.num_tokens for w in batch.work if not is_decode(w))
            ks = policy.choose(views, prefill)
            drafts = {
                s.seq_id: proposed[s.seq_id].prefix(k)
                for s, k in zip(decode, ks, strict=True)
                if k and s.seq_id in proposed
            }
        kept = {sid: len(d.tokens) for sid, d in drafts.items()}
        return replace(batch, work=self.scheduler.trim_drafts(batch.work, kept)), drafts

    def _run_items(self, batch: ScheduledBatch, drafts: dict[int, Draft]) -> list[RunItem]:
        items = []
        for w in batch.work:
            seq = w.seq
            fed = seq.token_slice(seq.num_computed, seq.num_computed + w.num_tokens)
            extra = drafts[seq.seq_id].tokens if seq.seq_id in drafts else []
            n_logits = 1 + len(extra) if w.samples else 0
            items.append(RunItem(fed + extra, seq.num_computed, seq.block_table, n_logits))
        return items

    def _verify_and_commit(
        self, batch: ScheduledBatch, drafts: dict[int, Draft], run: RunOutput
    ) -> list[RequestOutput]:
        rows: list[SampleRow] = []
        for w in (w for w in batch.work if w.samples):
            seq, d = w.seq, drafts.get(w.seq.seq_id)
            extra = d.tokens if d else []
            # Only a repetition penalty reads the history: skip copying the context otherwise.
            ctx = seq.token_ids if seq.params.repetition_penalty != 1.0 else []
            for i in range(len(extra) + 1):
                history = ctx + extra[:i] if ctx else []
                rows.append(SampleRow(seq.params, history, len(seq.output_ids) + i))
        picks = [s.token for s in sample(run.logits, rows)] if rows else []
        outputs: list[RequestOutput] = []
        cursor = 0
        for w in batch.work:
            if not w.samples:
                w.seq.num_computed += w.num_tokens
                continue
            d = drafts.get(w.seq.seq_id)
            k = len(d.tokens) if d else 0
            span = slice(cursor, cursor + k + 1)
            if d is not None and d.probs is not None:
                result = self._verify_sampled(d, run.logits[span], rows[span])
            else:
                result = verify_deterministic(d.tokens if d else [], picks[span])
            hidden = run.hidden[cursor + result.num_accepted]
            cursor += k + 1
            out = self._commit(w, result, d, hidden)
            if out is not None:
                outputs.append(out)
        return outputs

    @staticmethod
    def _verify_sampled(d: Draft, logits: torch.Tensor, rows: list[SampleRow]) -> VerifyResult:
        assert d.probs is not None
        target = torch.stack([processed_logits(logits[i], r) for i, r in enumerate(rows)])
        seed = rows[0].params.seed or 0
        return verify_sampled(d.tokens, d.probs, target, seed, rows[0].out_pos)

    def _commit(
        self, w: SeqWork, result: VerifyResult, draft: Draft | None, hidden: torch.Tensor
    ) -> RequestOutput | None:
        seq = w.seq
        live = self._live.get(seq.request_id)
        if live is None or seq.is_finished:
            return None
        if draft is not None:
            k = len(draft.tokens)
            seq.spec.drafted += k
            seq.spec.accepted += result.num_accepted
            seq.spec.steps += 1
            self.stats.proposer.record(k, result.num_accepted)
            if self.res.policy is not None:
                self.res.policy.record(draft, result.num_accepted)
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
        new_ids: list[int] = []
        reason = None
        for token in result.tokens:
            seq.output_ids.append(token)
            new_ids.append(token)
            live.pending_text += live.detok.push(token)
            reason = self._stop_reason(live, token)
            if reason:
                break
        self.stats.tokens_emitted += len(new_ids)
        if reason:
            self._finish(live, reason, new_ids)
            return None
        seq.num_computed = seq.num_tokens - 1
        self.res.allocator.truncate(seq.block_table, seq.num_computed)
        if self.res.proposer is not None:
            self.res.proposer.sync(seq, hidden)
        return self._output(live, new_ids, finished=False)

    def _stop_reason(self, live: _Live, token: int) -> str | None:
        seq = live.seq
        if token in self.res.eos_ids and not seq.params.ignore_eos:
            return "eos"
        if live.detok.stopped:
            return "stop"
        if seq.tokens_left <= 0 or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(
        self, live: _Live, reason: str, new_ids: list[int] | None = None, error: str | None = None
    ) -> None:
        seq = live.seq
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.scheduler.remove(seq)
        self._release_proposer(seq)
        self._live.pop(seq.request_id, None)
        live.pending_text += live.detok.flush()
        self._finished_outputs.append(self._output(live, new_ids or [], True, error=error))

    def _drain_finished(self) -> list[RequestOutput]:
        done, self._finished_outputs = self._finished_outputs, []
        return done

    def _release_proposer(self, seq: Sequence) -> None:
        if self.res.proposer is not None:
            self.res.proposer.release(seq)

    def _output(
        self, live: _Live, new_ids: list[int], finished: bool, error: str | None = None
    ) -> RequestOutput:
        text, live.pending_text = live.pending_text, ""
        return RequestOutput.of(live.seq, new_ids, text, finished, error)
