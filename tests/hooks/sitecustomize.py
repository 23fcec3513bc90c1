"""Test hooks, loaded at start-up by a process whose PYTHONPATH starts with this folder (a test
server, or a Ray worker of a test cluster). Each is off unless its variable is set.

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

_FLOOR_S = float(os.environ.get("SPECSERVE_TEST_STEP_FLOOR_S", "0"))
_DIE_FILE = os.environ.get("SPECSERVE_TEST_DIE_FILE")


class InjectedDeath(BaseException):
    """Not an Exception: nothing on the way catches it, as with a real bug in the loop."""


if _FLOOR_S > 0 or _DIE_FILE:
    from specserve.engine.engine import Engine

    _step = Engine.step

    def _hooked_step(self: Engine) -> object:
        started = time.monotonic()
        out = _step(self)
        rest = _FLOOR_S - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)
        if _DIE_FILE and Path(_DIE_FILE).exists():
            raise InjectedDeath(f"{_DIE_FILE} exists")
        return out

    Engine.step = _hooked_step  # type: ignore[assignment,method-assign]
