"""Test hooks, loaded at start-up by a process whose PYTHONPATH starts with this folder (a test
server, or a Ray worker of a test cluster). Each is off unless its variable is set, and nothing
is imported until the process itself imports the engine (a Ray worker that never runs one pays
nothing at start-up).

- SPECSERVE_TEST_STEP_FLOOR_S: every engine step lasts at least that many seconds. Tests that
  act on a request while it runs (disconnect, drain, overload, a live reconfigure) need it not
  to finish first. Without a floor, how long 3000 tokens of the tiny model take depends on the
  machine: on an idle one they finished inside a 2 s drain timeout. With one, such a request
  lasts at least floor x tokens on any machine; a busy machine only makes it longer.
- SPECSERVE_TEST_DIE_FILE: while that file exists, an engine thread that finishes a step dies
  (as a bug in its loop would kill it): how a test kills the engine inside a fleet replica.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

_FLOOR_S = float(os.environ.get("SPECSERVE_TEST_STEP_FLOOR_S", "0"))
_DIE_FILE = os.environ.get("SPECSERVE_TEST_DIE_FILE")
_TARGET = "specserve.engine.engine"


class InjectedDeath(BaseException):
    """Not an Exception: nothing on the way catches it, as with a real bug in the loop."""


def _hook(module: ModuleType) -> None:
    engine = module.Engine
    step = engine.step

    def hooked_step(self: Any) -> object:
        started = time.monotonic()
        out = step(self)
        rest = _FLOOR_S - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)
        if _DIE_FILE and Path(_DIE_FILE).exists():
            raise InjectedDeath(f"{_DIE_FILE} exists")
        return out

    engine.step = hooked_step


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; for the engine module it wraps the real loader so that the hook
    runs right after the module has executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)  # once; and let the normal finders find it
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _FLOOR_S > 0 or _DIE_FILE:
    sys.meta_path.insert(0, _AfterImport())
