"""How a step's outputs reach their consumers (see engine/async_engine.py's docstring).

The step thread decides, per request, what to hand over (`Listener.take`) or lets a sink take
it; `hand_over` runs on the consumers' loop, once per step, and each output carries the
`Ticket` of its hand-over, released as its consumer comes back for the next one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from specserve.outputs import RequestOutput

# A streaming request's consumer on the step thread (engine/async_engine.py): called with
# each output that is not the last, while the event loop has nothing of that request's left to
# do; True if it took the output (the loop never sees it), False to have it handed over. An
# exception means its consumer is gone or broken: the output is dropped and the request aborted.
Sink = Callable[[RequestOutput], bool]


class Ticket:
    """One hand-over's outputs not yet consumed, on the loop's thread: `done` is set once every
    consumer has come back for its next output (or left)."""

    def __init__(self, count: int, done: threading.Event) -> None:
        self.left, self.done = count, done

    def release(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()


class Handed(NamedTuple):
    """An output on its request's queue, with the ticket of the hand-over that brought it."""

    output: RequestOutput
    ticket: Ticket


# A request's queue.
Outputs = asyncio.Queue[Handed]


@dataclass
class Listener:
    """Where one request's outputs go. `held`, `first_sent` and `handed` belong to the step
    thread, `taken` to the loop: the loop is idle for this request while they are equal."""

    loop: asyncio.AbstractEventLoop
    queue: Outputs
    stream: bool
    sink: Sink | None = None
    held: RequestOutput | None = None
    first_sent: bool = False
    handed: int = 0  # outputs handed over to the loop
    taken: int = 0  # of those, how many the consumer has done with

    def take(self, out: RequestOutput) -> RequestOutput | None:
        """What to hand over now: every output when streaming; else the first one with tokens
        (the caller times its first token) and then only the last, the ones between merged."""
        if self.held is not None:
            out, self.held = self.held.then(out), None
        if self.stream or out.finished or (not self.first_sent and out.new_token_ids):
            self.first_sent = self.first_sent or bool(out.new_token_ids)
            return out
        self.held = out
        return None


def hand_over(
    items: list[tuple[Outputs, RequestOutput]],
    done: threading.Event,
) -> None:
    """On the consumers' loop: queue the outputs, each with the ticket that sets `done`."""
    ticket = Ticket(len(items), done)
    for queue, out in items:
        queue.put_nowait(Handed(out, ticket))
