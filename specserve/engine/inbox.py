"""What callers on other threads send the step thread (engine/async_engine.py), and how the
step thread applies each item between steps: only it touches the engine's mutable state."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from specserve.engine.engine import Engine
from specserve.outputs import RequestOutput
from specserve.request import FinishReason, SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Add:
    request_id: str
    ids: list[int]
    params: SamplingParams
    after: str | None = None


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class AbortAll:
    error: str


@dataclass(frozen=True)
class Read:
    fn: Callable[[Engine], object]
    done: Future[object]


Item = Add | Abort | AbortAll | Read


def apply(engine: Engine, item: Item) -> RequestOutput | None:
    """Carry out one item; the final output of an added request that failed to start (a
    refusal or a fault), else None. A reader's exception goes to its future."""
    if isinstance(item, Read):
        try:
            item.done.set_result(item.fn(engine))
        except Exception as exc:  # the reader's to raise
            item.done.set_exception(exc)
        return None
    if isinstance(item, AbortAll):
        engine.abort_all(item.error)
        return None
    if isinstance(item, Abort):
        engine.abort(item.request_id)
        return None
    try:
        engine.add_prepared(item.ids, item.params, item.request_id, item.after)
    except Exception as exc:  # ValueError: refused; anything else: this request fails
        if not isinstance(exc, ValueError):
            logger.exception("adding request %s failed", item.request_id)
        return RequestOutput(
            item.request_id, [], "", True, FinishReason.ERROR, len(item.ids), 0, error=str(exc)
        )
    return None
