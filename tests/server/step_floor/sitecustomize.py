"""Loaded at start-up by a test server whose PYTHONPATH starts with this folder: every engine
step lasts at least SPECSERVE_TEST_STEP_FLOOR_S seconds.

Tests that act on a request while it runs (disconnect, drain, overload) need it not to finish
first. Without a floor, how long 3000 tokens of the tiny model take depends on the machine:
on an idle one they finished inside a 2 s drain timeout. With one, the request lasts at least
floor x tokens on any machine; a busy machine only makes it longer.
"""

from __future__ import annotations

import os
import time

_FLOOR_S = float(os.environ.get("SPECSERVE_TEST_STEP_FLOOR_S", "0"))

if _FLOOR_S > 0:
    from specserve.engine.engine import Engine

    _step = Engine.step

    def _floored_step(self: Engine) -> object:
        started = time.monotonic()
        out = _step(self)
        rest = _FLOOR_S - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)
        return out

    Engine.step = _floored_step  # type: ignore[assignment,method-assign]
