"""The engine's observer hooks (engine/observer.py): order, plans, timings, detaching, and the
observers `SPECSERVE_OBSERVERS` attaches."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from specserve.engine.engine import Engine
from specserve.engine.observer import ENV, PHASES, EngineObserver, StepTiming
from specserve.engine.plan import StepPlan
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams, Sequence
from specserve.speculation.proposer import Draft
from tests.engine.helpers import make_engine, run_all

LOOPY = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9]]


class Recorder(EngineObserver):
    def __init__(self, engine: Engine | None = None) -> None:
        self.events: list[str] = []
        self.plans: list[StepPlan] = []
        self.timings: list[StepTiming] = []
        self.verified: list[tuple[int, int]] = []  # (drafted, accepted)
        self.committed = 0
        self.outputs = 0

    def on_step_start(self) -> None:
        self.events.append("start")

    def on_proposed(self, plan: StepPlan) -> None:
        self.events.append("proposed")
        self.plans.append(plan)

    def on_verified(self, seq: Sequence, draft: Draft, num_accepted: int) -> None:
        self.events.append("verified")
        self.verified.append((len(draft.tokens), num_accepted))

    def on_committed(self, seq: Sequence, token_ids: list[int]) -> None:
        self.events.append("committed")
        self.committed += len(token_ids)

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        self.events.append("end")
        self.timings.append(timing)
        self.outputs += len(outputs)


def _steps(events: list[str]) -> list[list[str]]:
    """The events split per step, each from its "start" to its "end"."""
    steps: list[list[str]] = []
    for e in events:
        if e == "start":
            steps.append([])
        steps[-1].append(e)
    return steps


def test_hooks_fire_in_order_with_plans_and_timings(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, speculate=3, policy="static")
    rec = Recorder()
    engine.observers.add(rec)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    run_all(engine, LOOPY, params)

    steps = _steps(rec.events)
    assert steps and len(steps) == len(rec.timings) == engine.stats.steps
    for step in steps:  # start, proposed, (verified? committed)*, end
        assert step[0] == "start" and step[1] == "proposed" and step[-1] == "end"
        body = step[2:-1]
        assert set(body) <= {"verified", "committed"}
        for i, e in enumerate(body):
            if e == "verified":  # a draft's outcome comes before its tokens are committed
                assert body[i + 1] == "committed"

    assert rec.committed == engine.stats.tokens_emitted == 2 * 20
    drafted = engine.stats.proposer.drafted_tokens
    assert sum(d for d, _ in rec.verified) == drafted > 0
    assert sum(a for _, a in rec.verified) == engine.stats.proposer.accepted_tokens
    assert all(0 <= a <= d <= 3 for d, a in rec.verified)
    assert rec.outputs > 0

    for plan, timing in zip(rec.plans, rec.timings, strict=True):
        assert timing.plan is plan and timing.shape is not None
        assert set(timing.seconds) == set(PHASES)
        assert all(s >= 0.0 for s in timing.seconds.values())
        assert timing.seconds["forward"] > 0.0 and timing.seconds["verify"] > 0.0
        assert timing.other >= 0.0 and timing.total >= timing.seconds["forward"]
        assert 1 <= len(plan.seqs) <= 2
        assert all(len(p.draft_tokens) <= 3 for p in plan.seqs)
    assert any(p.draft is not None for plan in rec.plans for p in plan.seqs)


def test_a_step_with_nothing_to_run_calls_start_and_end(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama)
    rec = Recorder()
    engine.observers.add(rec)
    assert engine.step() == []
    assert rec.events == ["start", "end"]
    assert rec.timings[0].plan is None and rec.timings[0].shape is None


def test_removed_observer_is_not_called(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, speculate=3, policy="static")
    kept, removed = Recorder(), Recorder()
    engine.observers.add(kept)
    engine.observers.add(removed)
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    run_all(engine, LOOPY[:1], params)
    seen = len(removed.events)
    assert seen > 0
    engine.observers.remove(removed)
    run_all(engine, LOOPY[1:], params)
    assert len(removed.events) == seen
    assert len(kept.events) > seen
    engine.observers.remove(kept)
    assert not engine.observers


def test_the_environment_attaches_the_test_hooks(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What a test server's engine gets (tests/hooks/step_hooks.py): a floor under each step,
    and a step that dies while the die file exists."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "hooks"))
    die = tmp_path / "die"
    monkeypatch.setenv(ENV, "step_hooks:observer")
    monkeypatch.setenv("SPECSERVE_TEST_STEP_FLOOR_S", "0.2")
    monkeypatch.setenv("SPECSERVE_TEST_DIE_FILE", str(die))
    engine = make_engine(tiny_llama)
    started = time.monotonic()
    engine.step()
    assert time.monotonic() - started >= 0.2
    die.touch()
    with pytest.raises(BaseException, match="exists"):
        engine.step()
    monkeypatch.delenv(ENV)
    assert not make_engine(tiny_llama).observers
