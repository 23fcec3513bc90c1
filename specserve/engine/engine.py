"""The engine: one step = schedule -> propose -> run target -> verify -> commit.

Not thread-safe by itself; `AsyncEngine` serialises access with a lock.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import replace

import torch

from specserve.config import EngineConfig, SpecConfig
from specserve.engine import drafting
from specserve.engine.admission import new_live, prepare_request
from specserve.engine.drafting import force_drafts, keep_prefixes, open_caps, propose, static_caps
from specserve.engine.facts import EngineFacts, KvPool, engine_facts, kv_pool
from specserve.engine.live import Live, describe, end, take_prompt_rows
from specserve.engine.logprobs import span_logprobs
from specserve.engine.observer import StepClock, from_env
from specserve.engine.plan import SeqPlan, StepPlan, plan_step
from specserve.engine.prompt import encode_messages, encode_text
from specserve.engine.resources import EngineResources, load_resources
from specserve.engine.respeculate import respeculate
from specserve.engine.stats import EngineStats, StepRecord
from specserve.engine.tokenizer import locked
from specserve.engine.verification import (
    VerifyFailure,
    batch_picks,
    finite_rows,
    sample_rows,
    verified,
)
from specserve.grammar import Grammars
from specserve.models.llama import DecoderLM
from specserve.outputs import RequestOutput, TokenLogprob
from specserve.request import FinishReason, LogitsProcessor, SamplingParams, Sequence
from specserve.runner.cost import LiveCost
from specserve.runner.model_runner import RunOutput
from specserve.scheduler.batch import ScheduledBatch, SeqWork
from specserve.speculation.policy import SpeculationPolicy
from specserve.speculation.proposer import HiddenRows, Proposer
from specserve.speculation.registry import REGISTRY
from specserve.speculation.verify import VerifyResult

logger = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        resources: EngineResources | None = None,
        eos_ids: frozenset[int] | None = None,
        step_cost: LiveCost | None = None,
    ) -> None:
        """`eos_ids`: the tokens that end a request (default: the model's own). `step_cost`: a
        step cost model to schedule and price drafts by instead of the start-up profile (a
        reproducible one, for tests and benchmarks)."""
        self.config = config
        self.res = resources or load_resources(config, step_cost)
        self.eos_ids = self.res.eos_ids if eos_ids is None else eos_ids
        self.facts: EngineFacts = engine_facts(self.res)
        self.grammars = Grammars(self.res.tokenizer, self.facts.vocab_size, self.eos_ids)
        self.res.tokenizer = locked(self.res.tokenizer)  # shared by the event loop and steps
        self.scheduler = self.res.scheduler
        self.stats = EngineStats()
        self._live: dict[str, Live] = {}
        self._outbox: list[RequestOutput] = []  # outputs not yet returned by step()
        self._ids = itertools.count()
        self.last_step: StepRecord | None = None
        self._clock = StepClock()  # the step in progress
        self.observers = from_env(self)  # see engine/observer.py

    # ----------------------------------------------------------------- requests
    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.res.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.res.max_model_len

    # ------------------------------------------- what it runs (read-only outside the engine)
    @property
    def model(self) -> DecoderLM:
        return self.res.model

    @property
    def proposer(self) -> Proposer | None:
        """None with speculation off; changed by `set_speculation` or `use_proposer`."""
        return self.res.proposer

    @property
    def policy(self) -> SpeculationPolicy | None:
        return self.res.policy

    def kv_pool(self) -> KvPool:
        return kv_pool(self.res)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt prefix; how many blocks held one."""
        return self.res.allocator.reset_cache()

    def reset_proposer_cache(self) -> bool:
        """Forget what the proposer learned across requests; False if it keeps nothing."""
        return self.res.proposer.reset() if self.res.proposer is not None else False

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_messages(self.res.tokenizer, messages)

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        logits_processors: tuple[LogitsProcessor, ...] = (),
    ) -> str:
        """Queue a request; raises ValueError naming the limit on bad input."""
        ids, params = self.prepare(prompt, params or SamplingParams())
        return self.add_prepared(ids, params, request_id, logits_processors=logits_processors)

    def prepare(
        self, prompt: str | list[int], params: SamplingParams
    ) -> tuple[list[int], SamplingParams]:
        """Tokenize and validate without touching engine state (safe from any thread)."""
        return prepare_request(self.res, self.grammars, prompt, params)

    def add_prepared(
        self,
        ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        after: str | None = None,
        logits_processors: tuple[LogitsProcessor, ...] = (),
    ) -> str:
        """`after`: a live request with the same prompt (an earlier choice of the same call);
        this one queues once that one's prompt is computed, to reuse its cached blocks.
        `logits_processors`: see `Sequence.logits_processors`; a grammar's comes first."""
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in use")
        live = new_live(next(self._ids), request_id, ids, params, self.grammars, self.res.tokenizer)
        live.seq.logits_processors += logits_processors
        self._live[request_id] = live
        sibling = self._live.get(after) if after is not None else None
        self.scheduler.add(live.seq, after=sibling.seq if sibling is not None else None)
        return request_id

    def encode(self, text: str) -> list[int]:
        """Prompt text -> token ids, without adding special tokens (templates add their own)."""
        return encode_text(self.res.tokenizer, text)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks. False if it is unknown or finished."""
        live = self._live.get(request_id)
        if live is None:
            return False
        self._finish(live, FinishReason.ABORT)
        return True

    def abort_all(self, error: str) -> None:
        """Stop every live request now (shutdown past its drain timeout), freeing its blocks;
        each gets a final output with finish_reason "abort" and `error`."""
        for live in list(self._live.values()):
            self._finish(live, FinishReason.ABORT, error=error)

    def set_speculation(self, spec: SpecConfig) -> None:
        """Swap the speculation settings between steps (under `AsyncEngine.run_locked`).
        Requests in flight go on; sequences forget their drafting state if the proposer changes.
        ValueError when `spec` needs artifacts this engine has not loaded (then restart it)."""
        proposer, policy = respeculate(self.res, self.config, spec)
        self.use_proposer(proposer)
        self.res.policy = policy
        self.config = replace(self.config, spec=spec)

    def use_proposer(self, proposer: Proposer | None) -> None:
        """Draft with `proposer` from the next step on: one the registry does not build (trained
        in process, or a test's); N and the policy stay. Sequences in flight forget their
        drafting state if it changes."""
        if proposer is not self.res.proposer:
            for live in self._live.values():
                drafting.release(self.res.proposer, live.seq)
        self.res.proposer = proposer

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._outbox)

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """One step; returns every output since the last step (aborts included).

        A failure fails only the requests it concerns and never escapes, so no step is retried
        forever: a proposer that raises is retried one sequence at a time and fails the ones it
        raises for (or returns a bad draft for); a failed forward pass fails the sequences it
        ran; a non-finite logits row, a failed verify or detokenization fails its own request;
        anything else fails the step's requests (every live one if scheduling itself failed).
        """
        clock = self._clock = StepClock()
        self.observers.step_start()
        batch: ScheduledBatch | None = None
        try:
            batch = self.scheduler.schedule(self._draft_caps if self.res.proposer else None)
            for seq in batch.preempted:
                drafting.release(self.res.proposer, seq)
            if not batch.is_empty:
                self._run_batch(batch)
        except Exception as exc:
            logger.exception("engine step failed")
            failed = batch.work if batch is not None else []
            seqs = [w.seq for w in failed] or [x.seq for x in self._live.values()]
            self._fail(seqs, f"engine step failed: {describe(exc)}")
        done, self._outbox = self._outbox, []
        self.observers.step_end(clock, done)
        return done

    def _run_batch(self, batch: ScheduledBatch) -> None:
        plan = self._clock.plan = self._plan(batch)
        self.observers.proposed(plan)
        if not plan.seqs:  # the proposer failed every sequence
            return
        try:
            with self._clock.phase("forward"):
                run = self.res.runner.run(plan.run_items())
        except Exception as exc:  # one pass for all: it fails them all, not the engine
            logger.exception("forward pass failed")
            self._fail([p.seq for p in plan.seqs], f"forward pass failed: {describe(exc)}")
            return
        cost = self.res.cost or (self.res.policy.cost if self.res.policy is not None else None)
        if cost is not None:
            cost.observe(plan.shape(), self._clock.seconds["forward"])
        with self._clock.phase("verify"):
            self._verify_and_commit(plan, run)
        self.last_step = self.stats.count_step(plan)

    def _plan(self, batch: ScheduledBatch) -> StepPlan:
        """Propose, keep the policy's prefix of each draft, give the KV slots reserved for the
        rest (and for drafts that found nothing) back to the pool: the step's plan."""
        work = batch.work
        vocab = self.facts.vocab_size
        started = time.perf_counter()
        with self._clock.phase("propose"):
            proposed = propose(self.res.proposer, work, vocab, lambda s, e: self._fail([s], e))
        proposed = force_drafts(work, proposed)
        seconds = time.perf_counter() - started
        with self._clock.phase("decide"):
            kept = keep_prefixes(self.res.policy, work, proposed, seconds)
        lengths = {w.seq.seq_id: len(d.tokens) for w, d in zip(work, kept, strict=True) if d}
        trimmed = self.scheduler.trim_drafts(work, lengths)
        return plan_step(batch.num_running, work, trimmed, proposed, kept, self._prompt_rows)

    def _prompt_rows(self, w: SeqWork) -> int:
        return self._live[w.seq.request_id].prompt_rows(w)

    def _draft_caps(self, seqs: list[Sequence], num_running: int, scheduled: int) -> list[int]:
        caps = static_caps(seqs, self.config.spec.speculate, self.max_model_len)
        return open_caps(self.res.policy, seqs, caps, num_running, scheduled)

    def _verify_and_commit(self, plan: StepPlan, run: RunOutput) -> None:
        """Each sampling sequence verifies and commits alone: a non-finite logits row or an
        exception fails that request only (see `engine/verification.py`)."""
        take_prompt_rows(plan, run, self._live, self.res.model.logits)
        for p in plan.seqs:
            if not p.work.samples:
                p.seq.num_computed += p.work.num_tokens
                self.scheduler.cache_committed(p.seq)
        rows = sample_rows(plan)
        if not rows:
            return
        finite = finite_rows(run.logits)
        picks = batch_picks(run.logits, rows)
        every_row = REGISTRY.hidden_rows(self.res.proposer) is HiddenRows.ACCEPTED
        for p in plan.sampling:
            seq = p.seq
            result = verified(p, run.logits, rows, picks, finite)
            if isinstance(result, VerifyFailure):
                self._fail([seq], result.error)
                continue
            try:
                lps = span_logprobs(p, result.tokens, run.logits, rows)
                last = p.logits.start + result.num_accepted  # produced the last commit
                hidden = run.hidden[p.logits.start : last + 1] if every_row else run.hidden[last]
                self._commit(p, result, hidden, lps)
            except Exception as exc:  # detokenization, stop checks, the proposer's sync
                logger.exception("commit failed for %s", seq.request_id)
                self._fail([seq], f"commit failed: {describe(exc)}")

    def _commit(
        self,
        p: SeqPlan,
        result: VerifyResult,
        hidden: torch.Tensor,
        logprobs: list[TokenLogprob] | None = None,
    ) -> None:
        seq = p.seq
        live = self._live.get(seq.request_id)
        if live is None or seq.is_finished:
            return
        if p.draft is not None:
            self.stats.record_draft(seq, p.draft, result.num_accepted)
            self.observers.verified(seq, p.draft, result.num_accepted)
            if self.res.policy is not None and not p.draft.forced:
                self.res.policy.record(p.draft, result.num_accepted, seq.draft_odds)
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
            self.scheduler.unpark(seq)
        new_ids, reason = live.push_until_stop(result.tokens, self.eos_ids, self.max_model_len)
        self.stats.tokens_emitted += len(new_ids)
        self.observers.committed(seq, new_ids)
        # KV holds every committed token but the last (its K/V come with the next pass); the
        # rejected drafts' slots after it are dropped.
        seq.num_computed = seq.num_tokens - 1
        lps = logprobs[: len(new_ids)] if logprobs is not None else None
        if reason:
            self._finish(live, reason, new_ids, logprobs=lps)
            return
        self.scheduler.truncate(seq, seq.num_computed)
        self.scheduler.cache_committed(seq)
        if self.res.proposer is not None:
            self.res.proposer.sync(seq, hidden)
        self._outbox.append(live.output(new_ids, finished=False, logprobs=lps))

    def _fail(self, seqs: list[Sequence], error: str) -> None:
        for seq in seqs:
            live = self._live.get(seq.request_id)
            if live is not None:
                self._finish(live, FinishReason.ERROR, error=error)

    def _finish(
        self,
        live: Live,
        reason: FinishReason,
        new_ids: list[int] | None = None,
        error: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> None:
        """Never raises: it is how failures end requests."""
        self._live.pop(live.seq.request_id, None)
        proposer = self.res.proposer
        self._outbox.append(end(live, reason, self.scheduler, proposer, new_ids, error, logprobs))
