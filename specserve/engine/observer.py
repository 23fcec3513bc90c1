"""The engine's seam for tests and benchmarks: observers it calls as a step goes.

One `Engine.step()` calls, in order:

    on_step_start()                      before scheduling
    on_proposed(plan)                    the plan: drafts proposed, the policy's prefixes kept
    on_verified(seq, draft, accepted)    per verified draft, before the policy learns from it
    on_committed(seq, token_ids)         per sequence whose verified tokens were committed
    on_step_end(timing, outputs)         the step's phases in seconds, and what it returns

A step with nothing to run (or whose proposer failed every sequence) calls only the first and
the last, with `timing.plan` None. Observers attach with `engine.observers.add(obs)` and detach
with `.remove(obs)`; with none attached the engine pays a check of an empty list per hook.
`SPECSERVE_OBSERVERS` ("module:factory,...") attaches `factory(engine)` to every engine the
process builds (how a test reaches the engine of a server it starts). An observer that raises
raises through the step: hooks are for tests and benchmarks, not for serving.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from specserve.engine.plan import StepPlan
from specserve.outputs import RequestOutput
from specserve.request import Sequence
from specserve.runner.cost import StepShape
from specserve.speculation.proposer import Draft

PHASES = ("propose", "decide", "forward", "verify")
ENV = "SPECSERVE_OBSERVERS"


@dataclass(frozen=True)
class StepTiming:
    """One step's wall time by phase: propose (`drafting.propose`), decide (the policy's
    `keep_prefixes`), forward (`ModelRunner.run`), verify (sampling, acceptance, commits, the
    proposer's sync); `other` is the rest of `step()` (scheduling, forced drafts, outputs)."""

    plan: StepPlan | None  # None: nothing ran
    seconds: dict[str, float]  # phase -> seconds, every one of PHASES
    total: float

    @property
    def other(self) -> float:
        return self.total - sum(self.seconds.values())

    @property
    def shape(self) -> StepShape | None:
        return self.plan.shape() if self.plan is not None else None


class EngineObserver:
    """No-op hooks; subclass and override the ones you need (see the module docstring)."""

    def on_step_start(self) -> None:
        pass

    def on_proposed(self, plan: StepPlan) -> None:
        pass

    def on_verified(self, seq: Sequence, draft: Draft, num_accepted: int) -> None:
        pass

    def on_committed(self, seq: Sequence, token_ids: list[int]) -> None:
        pass

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        pass


@dataclass
class StepClock:
    """The phases of the step in progress, written by the engine as it goes."""

    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    plan: StepPlan | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started

    def timing(self) -> StepTiming:
        return StepTiming(self.plan, self.seconds, time.perf_counter() - self.started)


class Observers:
    """The observers attached to one engine, called in the order they were added."""

    def __init__(self, observers: list[EngineObserver] | None = None) -> None:
        self._all: list[EngineObserver] = list(observers or [])

    def __bool__(self) -> bool:
        return bool(self._all)

    def add(self, observer: EngineObserver) -> None:
        self._all.append(observer)

    def remove(self, observer: EngineObserver) -> None:
        self._all.remove(observer)

    def step_start(self) -> None:
        for o in self._all:
            o.on_step_start()

    def proposed(self, plan: StepPlan) -> None:
        for o in self._all:
            o.on_proposed(plan)

    def verified(self, seq: Sequence, draft: Draft, num_accepted: int) -> None:
        for o in self._all:
            o.on_verified(seq, draft, num_accepted)

    def committed(self, seq: Sequence, token_ids: list[int]) -> None:
        for o in self._all:
            o.on_committed(seq, token_ids)

    def step_end(self, clock: StepClock, outputs: list[RequestOutput]) -> None:
        if not self._all:
            return
        timing = clock.timing()
        for o in self._all:
            o.on_step_end(timing, outputs)


def from_env(engine: Any) -> Observers:
    """Observers named by `SPECSERVE_OBSERVERS`: each "module:factory" called with `engine`."""
    named = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    observers = []
    for name in named:
        module, _, factory = name.partition(":")
        observers.append(getattr(importlib.import_module(module), factory)(engine))
    return Observers(observers)
