"""Engine observers tests attach to (engine/observer.py) in place of wrapping `Engine.step`."""

from __future__ import annotations

import threading
import time

from specserve.engine.engine import Engine
from specserve.engine.observer import EngineObserver, StepTiming
from specserve.engine.plan import StepPlan
from specserve.outputs import RequestOutput


class StepFloor(EngineObserver):
    """Every step lasts at least `seconds` (so that a stream outlasts what a test does)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = 0.0

    def on_step_start(self) -> None:
        self.started = time.monotonic()

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.started)))


class HoldSteps(EngineObserver):
    """A step that starts with work waits for `release`; `stepping` is set once one waits."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.stepping, self.release = threading.Event(), threading.Event()

    def on_step_start(self) -> None:
        if self.engine.has_work() and not self.release.is_set():
            self.stepping.set()
            self.release.wait()


class FedTokens(EngineObserver):
    """The tokens each forward pass scores (verified drafts included), in step order."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def on_proposed(self, plan: StepPlan) -> None:
        if plan.seqs:  # else the proposer failed every sequence and nothing runs
            self.tokens.append(plan.num_tokens)


class LoopBug(EngineObserver):
    """Raises out of the step it ends, as a bug in the step thread's loop would."""

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        raise RuntimeError("loop bug")


class OutputSteps(EngineObserver):
    """Counts the steps that returned outputs."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        self.steps += bool(outputs)
