"""spec_bench's cells: one configuration's pass over a workload at one concurrency, in process.

Closed loop: `concurrency` units (a conversation, or a lone request) are in flight at once;
when a unit's request finishes, its next turn is sent with the reply it got (the same text the
server would stream), or the next unit starts. Each cell starts with an empty cross-request
cache (`reset` on the proposers that keep one) and an empty prefix cache, so no cell drafts
from, or reuses the KV of, another's replay of the same prompts; within the cell, reuse across
requests is real.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from benchmarks.spec_report import Run
from specserve.bench.workload_items import (
    ChatMessage,
    WorkloadItem,
    encode_item,
    next_history,
    with_history,
)
from specserve.engine.engine import Engine
from specserve.outputs import RequestOutput
from specserve.request import FinishReason, SamplingParams


@dataclass(frozen=True)
class Config:
    """One side of the comparison: who proposes, under which policy, with which cap."""

    proposer: str  # "none": the N = 0 baseline
    policy: str  # "static" | "adaptive"
    n: int

    @property
    def label(self) -> str:
        if self.n == 0:
            return "N=0"
        return f"{self.proposer} {'adaptive<=' if self.policy == 'adaptive' else 'N='}{self.n}"


@dataclass
class _Live:
    """One request in flight: its unit, where it is in it, what it has produced."""

    unit: list[WorkloadItem]
    turn: int
    sent: WorkloadItem
    prompt_tokens: int
    start: float
    steps0: int
    first: float | None = None
    tokens: list[int] = field(default_factory=list)
    text: str = ""


def run_cell(
    engine: Engine,
    units: list[list[WorkloadItem]],
    config: Config,
    concurrency: int,
    params: SamplingParams,
    new_tokens: dict[str, int] | None = None,
) -> tuple[list[Run], float, dict[str, int]]:
    """(runs in finish order, wall seconds, engine counter deltas) of one cell. `new_tokens`:
    per item id, its own max_new_tokens (the same on every side of a comparison)."""
    if engine.res.proposer is not None:
        engine.res.proposer.reset()
    engine.res.allocator.reset_cache()  # nor reuses another cell's prompts from the prefix cache
    params = replace(
        params, speculate=config.n, speculation_policy=config.policy if config.n else None
    )
    before = _counters(engine)
    started = time.perf_counter()
    pending, live, runs = deque(units), {}, []  # type: ignore[var-annotated]
    while pending or live:
        while pending and len(live) < concurrency:
            _submit(engine, live, pending.popleft(), 0, (), params, new_tokens)
        for out in engine.step():
            state = live[out.request_id]
            _advance(state, out)
            if not out.finished:
                continue
            del live[out.request_id]
            runs.append(_run(engine, state, out, config, concurrency))
            if out.finish_reason != FinishReason.ERROR and state.turn + 1 < len(state.unit):
                history = next_history(state.sent, state.text)
                _submit(engine, live, state.unit, state.turn + 1, history, params, new_tokens)
    wall = time.perf_counter() - started
    after = _counters(engine)
    return runs, wall, {k: after[k] - before[k] for k in after}


def _submit(
    engine: Engine,
    live: dict[str, _Live],
    unit: list[WorkloadItem],
    turn: int,
    history: tuple[ChatMessage, ...],
    params: SamplingParams,
    new_tokens: dict[str, int] | None = None,
) -> None:
    sent = with_history(unit[turn], history)
    ids = encode_item(engine, sent)
    if new_tokens is not None and sent.id in new_tokens:
        params = replace(params, max_new_tokens=new_tokens[sent.id])
    rid = engine.add_request(ids, params)
    live[rid] = _Live(unit, turn, sent, len(ids), time.perf_counter(), engine.stats.steps)


def _advance(state: _Live, out: RequestOutput) -> None:
    state.tokens += out.new_token_ids
    state.text += out.new_text
    if state.first is None and out.new_token_ids:
        state.first = time.perf_counter()


def _run(engine: Engine, s: _Live, out: RequestOutput, c: Config, concurrency: int) -> Run:
    end = time.perf_counter()
    first = s.first or end
    return Run(
        workload=s.unit[s.turn].workload,
        item_id=s.unit[s.turn].id,
        proposer=c.proposer,
        n=c.n,
        policy=c.policy,
        concurrency=concurrency,
        prompt_tokens=s.prompt_tokens,
        tokens=s.tokens,
        total_s=end - s.start,
        decode_s=end - first,
        steps=engine.stats.steps - s.steps0,
        draft_steps=out.spec_steps,
        drafted=out.drafted_tokens,
        accepted=out.accepted_tokens,
        finish_reason=out.finish_reason or "",
    )


def _counters(engine: Engine) -> dict[str, int]:
    prop, policy = engine.stats.proposer, engine.res.policy
    out: dict[str, Any] = {
        "steps": engine.stats.steps,
        "spec_steps": engine.stats.spec_steps,
        "proposed": prop.proposed_tokens,
        "drafted": prop.drafted_tokens,
        "accepted": prop.accepted_tokens,
        "trimmed": policy.stats.trimmed_tokens if policy is not None else 0,
        "skipped_steps": policy.stats.skipped_steps if policy is not None else 0,
        "unpaid_steps": policy.stats.unpaid_steps if policy is not None else 0,
    }
    return out
