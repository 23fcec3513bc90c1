"""Test hooks for a process the tests start (a test server, a Ray worker of a test cluster):
`SPECSERVE_OBSERVERS=step_hooks:observer` with this folder on PYTHONPATH attaches `observer`
to every engine the process builds (engine/observer.py). Each hook is off unless its variable
is set.

- SPECSERVE_TEST_STEP_FLOOR_S: every engine step lasts at least that many seconds. Tests that
  act on a request while it runs (disconnect, drain, overload, a live reconfigure) need it not
  to finish first. Without a floor, how long 3000 tokens of the tiny model take depends on the
  machine: on an idle one they finished inside a 2 s drain timeout. With one, such a request
  lasts at least floor x tokens on any machine; a busy machine only makes it longer.
- SPECSERVE_TEST_DIE_FILE: while that file exists, an engine thread that finishes a step dies
  (as a bug in its loop would kill it): how a test kills the engine inside a fleet replica.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from specserve.engine.observer import EngineObserver, StepTiming
from specserve.outputs import RequestOutput


class InjectedDeath(BaseException):
    """Not an Exception: nothing on the way catches it, as with a real bug in the loop."""


class StepHooks(EngineObserver):
    def __init__(self, floor_s: float, die_file: str | None) -> None:
        self.floor_s, self.die_file = floor_s, die_file
        self.started = 0.0

    def on_step_start(self) -> None:
        self.started = time.monotonic()

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        rest = self.floor_s - (time.monotonic() - self.started)
        if rest > 0:
            time.sleep(rest)
        if self.die_file and Path(self.die_file).exists():
            raise InjectedDeath(f"{self.die_file} exists")


def observer(engine: Any) -> StepHooks:
    floor_s = float(os.environ.get("SPECSERVE_TEST_STEP_FLOOR_S", "0"))
    return StepHooks(floor_s, os.environ.get("SPECSERVE_TEST_DIE_FILE"))
