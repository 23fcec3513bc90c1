"""Fault injection: a failure inside a step fails only the request it concerns.

Each test runs the same requests clean, then with one fault injected: the faulty request ends
with finish_reason "error" and a message naming the stage; every other request finishes with
exactly the clean run's tokens; no KV block (target or draft) is left held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import specserve.engine.verification as verification
from specserve.engine.engine import Engine
from specserve.request import SamplingParams, Sequence
from specserve.runner.model_runner import RunItem, RunOutput
from specserve.speculation.proposer import Draft
from tests.engine.helpers import Outcome, assert_no_kv_held, collect, make_engine, run_all
from tests.tiny import noisy_copy

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [12, 13, 14, 12, 13, 14]]
PARAMS = [
    SamplingParams(max_new_tokens=24, ignore_eos=True),
    SamplingParams(max_new_tokens=24, ignore_eos=True),
    SamplingParams(max_new_tokens=24, temperature=1.2, seed=3, ignore_eos=True),
]
FAULTY = 1  # the request each fault is aimed at


@pytest.fixture(scope="module")
def draft_dir(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return noisy_copy(tiny_llama, tmp_path_factory.mktemp("noisy-draft"), noise=0.3)


def engine_for(tiny_llama: Path, draft_dir: Path, kind: str) -> Engine:
    """Static policy: the faults must hit batched proposing calls and drafts must land, every
    step (the adaptive default decides both from step timings)."""
    if kind == "draft":
        return make_engine(
            tiny_llama, speculate=3, proposer="draft", draft_model=str(draft_dir), policy="static"
        )
    return make_engine(tiny_llama, speculate=3, policy="static")


def clean(tiny_llama: Path, draft_dir: Path, kind: str = "ngram") -> list[list[int]]:
    return run_all(engine_for(tiny_llama, draft_dir, kind), PROMPTS, PARAMS)


def assert_only_faulty_failed(got: list[Outcome], want: list[list[int]], needle: str) -> None:
    for i, (o, w) in enumerate(zip(got, want, strict=True)):
        if i == FAULTY:
            assert o.finish_reason == "error" and needle in (o.error or ""), o
            assert o.tokens == w[: len(o.tokens)]  # what it streamed before the fault was right
        else:
            assert (o.finish_reason, o.tokens) == ("length", w), (i, o)


def faulty_seq(engine: Engine) -> Sequence | None:
    return next((s for s in engine.scheduler.running if s.prompt_ids == PROMPTS[FAULTY]), None)


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_proposer_that_raises(tiny_llama: Path, draft_dir: Path, kind: str) -> None:
    want = clean(tiny_llama, draft_dir, kind)
    engine = engine_for(tiny_llama, draft_dir, kind)
    proposer = engine.res.proposer
    assert proposer is not None
    real = proposer.propose
    seen = {"batched": 0}

    def propose(seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        out = real(seqs, ks)  # the draft model has fed the batch: its KV is half updated
        hit = [s for s in seqs if s.prompt_ids == PROMPTS[FAULTY]]
        if hit and len(hit[0].output_ids) >= 4:
            seen["batched"] += len(seqs) > 1
            raise RuntimeError("proposer bug")
        return out

    proposer.propose = propose  # type: ignore[method-assign]
    got = collect(engine, PROMPTS, PARAMS)
    assert seen["batched"] > 0  # the fault hit a batched call: the others were retried alone
    assert_only_faulty_failed(got, want, "proposer")
    assert "proposer bug" in (got[FAULTY].error or "")
    assert engine.stats.proposer.accepted_tokens > 0
    assert_no_kv_held(engine)


def test_proposer_returning_a_bad_draft(tiny_llama: Path, draft_dir: Path) -> None:
    want = clean(tiny_llama, draft_dir)
    engine = engine_for(tiny_llama, draft_dir, "ngram")
    proposer = engine.res.proposer
    assert proposer is not None
    real = proposer.propose

    def propose(seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        out = real(seqs, ks)
        return [
            Draft([10**6]) if s.prompt_ids == PROMPTS[FAULTY] else d
            for s, d in zip(seqs, out, strict=True)
        ]

    proposer.propose = propose  # type: ignore[method-assign]
    got = collect(engine, PROMPTS, PARAMS)
    assert_only_faulty_failed(got, want, "invalid draft")
    assert_no_kv_held(engine)


def test_proposer_scoring_nan_fails_nothing(tiny_llama: Path, draft_dir: Path) -> None:
    """A NaN confidence (a head fed NaN features scores NaN) counts as 0: every request ends as
    in the clean run, and the calibration all requests share records no NaN."""
    want = clean(tiny_llama, draft_dir)
    engine = engine_for(tiny_llama, draft_dir, "ngram")
    proposer, policy = engine.res.proposer, engine.res.policy
    assert proposer is not None and policy is not None
    real = proposer.propose

    def propose(seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        return [replace(d, confidence=[math.nan] * len(d.tokens)) for d in real(seqs, ks)]

    proposer.propose = propose  # type: ignore[method-assign]
    got = collect(engine, PROMPTS, PARAMS)
    assert [(o.finish_reason, o.tokens) for o in got] == [("length", w) for w in want]
    calibration = policy.calibration
    assert sum(calibration.tested) > 0 and calibration.confidence_sum[0] == 0.0
    assert all(math.isfinite(c) for c in calibration.confidence_sum)
    assert_no_kv_held(engine)


def test_verify_that_raises(
    tiny_llama: Path, draft_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = clean(tiny_llama, draft_dir)
    engine = engine_for(tiny_llama, draft_dir, "ngram")
    real = verification.verify_deterministic
    calls = {"n": 0}

    def verify(drafts: list[int], targets: list[int]) -> Any:
        calls["n"] += 1
        if calls["n"] == 3 * 4 + 2:  # some step in the middle: whichever request is second
            raise RuntimeError("verify bug")
        return real(drafts, targets)

    monkeypatch.setattr(verification, "verify_deterministic", verify)
    got = collect(engine, PROMPTS, PARAMS)  # n-gram drafts: every request goes through it
    failed = [i for i, o in enumerate(got) if o.finish_reason == "error"]
    assert len(failed) == 1, got
    for i, (o, w) in enumerate(zip(got, want, strict=True)):
        if i in failed:
            assert "verify failed: RuntimeError: verify bug" in (o.error or "")
        else:
            assert (o.finish_reason, o.tokens) == ("length", w)
    assert_no_kv_held(engine)


def test_nan_logits_row(tiny_llama: Path, draft_dir: Path) -> None:
    want = clean(tiny_llama, draft_dir)
    engine = engine_for(tiny_llama, draft_dir, "ngram")
    runner = engine.res.runner
    real = runner.run

    def run(items: list[RunItem]) -> RunOutput:
        out = real(items)
        logits = out.logits.clone()  # [rows, vocab]
        seq = faulty_seq(engine) if engine.stats.steps >= 5 else None
        row = 0
        for item in items:
            row += item.num_logits
            if seq is not None and item.block_table is seq.block_table and item.num_logits:
                logits[row - 1] = float("nan")  # its last scored row
        return RunOutput(logits, out.hidden)

    runner.run = run  # type: ignore[method-assign]
    got = collect(engine, PROMPTS, PARAMS)
    assert_only_faulty_failed(got, want, "non-finite logits")
    assert got[FAULTY].tokens  # it failed mid-stream, not at the start
    assert_no_kv_held(engine)


def test_tokenizer_error(tiny_llama: Path, draft_dir: Path) -> None:
    want = clean(tiny_llama, draft_dir)
    engine = engine_for(tiny_llama, draft_dir, "ngram")
    ids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, PARAMS, strict=True)]
    live = engine._live[ids[FAULTY]]
    real_decode: Callable[..., str] = live.detok.tokenizer.decode

    class Failing:
        def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
            if len(live.seq.output_ids) > 6:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
            return real_decode(token_ids, skip_special_tokens=skip_special_tokens)

    live.detok.tokenizer = Failing()
    outcomes = {i: Outcome() for i in ids}
    while engine.has_work():
        for out in engine.step():
            outcomes[out.request_id].tokens += out.new_token_ids
            if out.finished:
                outcomes[out.request_id].finish_reason = out.finish_reason
                outcomes[out.request_id].error = out.error
    assert_only_faulty_failed([outcomes[i] for i in ids], want, "commit failed")
    assert_no_kv_held(engine)


def test_forward_failure_fails_its_batch_then_the_engine_goes_on(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, speculate=3)
    real = engine.res.runner.run
    calls = {"n": 0}

    def run(items: list[RunItem]) -> RunOutput:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device fell over")
        return real(items)

    engine.res.runner.run = run  # type: ignore[method-assign]
    got = collect(engine, PROMPTS, PARAMS)
    assert {o.finish_reason for o in got} == {"error"}
    for o in got:
        assert "forward pass failed: RuntimeError: device fell over" in (o.error or "")
    assert_no_kv_held(engine)
    assert len(run_all(engine, PROMPTS[:1], PARAMS[0])[0]) == 24


def test_a_step_that_raises_keeps_outputs_already_taken(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(tiny_llama)
    a = engine.add_request(PROMPTS[0], PARAMS[0])
    b = engine.add_request(PROMPTS[1], PARAMS[1])
    engine.step()
    assert engine.abort(a)  # its final output waits for the next step

    def broken(*args: object) -> None:
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine.scheduler, "schedule", broken)
    outs = engine.step()  # must not raise, and must not lose a's abort
    assert {(o.request_id, o.finish_reason) for o in outs} == {(a, "abort"), (b, "error")}
    assert "scheduler bug" in (next(o for o in outs if o.request_id == b).error or "")
    monkeypatch.undo()
    assert not engine.has_work()
    assert_no_kv_held(engine)
    assert len(run_all(engine, PROMPTS[:1], PARAMS[0])[0]) == 24


def test_nan_check_sees_inf_and_nan_rows() -> None:
    logits = torch.zeros(3, 5)
    logits[1, 2] = float("nan")
    logits[2, 0] = float("inf")
    assert verification.finite_rows(logits) == [True, False, False]
