"""The pools as the ingress holds them: `PoolClient`, a pool's `Backend` (its tokenizer here, its
engines behind a Ray Serve handle), and `PoolEntry`, the client with what its replicas reported,
its metrics and its admission. Importing this module does not import Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from specserve.engine.handover import Sink
from specserve.engine.prompt import encode_messages, encode_text
from specserve.fleet.replica import PoolDescription, ReplicaState
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams
from specserve.server.context import ServerContext
from specserve.server.metrics import ServerMetrics
from specserve.server.service import GenerationService


class PoolClient:
    """The `Backend` of one pool: its tokenizer here, its engines behind a Ray Serve handle."""

    def __init__(self, name: str, handle: Any) -> None:
        self.name, self.handle = name, handle
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return encode_text(self._tokenizer, text)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_messages(self._tokenizer, messages)

    # Replicas own their engines; Ray Serve replaces a dead one, and a request whose replica
    # died fails with RuntimeError (generate). The ingress itself has no engine to lose.
    alive = True
    died: str | None = None

    def abort_all(self, error: str) -> None:
        del error  # each replica drains its own engine

    async def describe(self) -> PoolDescription:
        desc: PoolDescription = await self.handle.describe.remote()
        self._tokenizer = desc.tokenizer
        return desc

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        after: str | None = None,
        stream: bool = True,
        sink: Sink | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """ValueError: the engine refused the request. RuntimeError: the replica failed (died,
        unreachable) - before the first output the request was not served (503), after it the
        stream ends with an error event. `sink` is ignored: the engine runs elsewhere."""
        del sink
        # `after` travels along; on another replica than its sibling's it is simply unknown.
        call = self.handle.options(stream=True).generate
        outputs = call.remote(prompt_ids, params, request_id, after, stream)
        finished = False
        try:
            async for out in outputs:
                finished = out.finished
                yield out
        except ValueError:
            raise
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise RuntimeError(
                f"pool {self.name!r}: its replica failed ({type(exc).__name__}: {first[:200]})"
            ) from exc
        finally:
            if not finished:
                outputs.cancel()  # the replica's generator is closed, which aborts the request


@dataclass
class Reported:
    """What the pool's replicas said at the last broadcast."""

    states: list[ReplicaState] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)


@dataclass
class PoolEntry:
    client: PoolClient
    reported: Reported
    metrics: ServerMetrics  # request series observed here, engine series from `reported`
    service: GenerationService  # admission (429) across the pool's replicas
    ctx: ServerContext | None = None  # None until the pool described itself (or after refresh)
    shows_profile: bool = False
    describing: asyncio.Future[ServerContext] | None = None  # the one describe under way

    @classmethod
    def of(cls, client: PoolClient) -> PoolEntry:
        reported = Reported()
        metrics = ServerMetrics(lambda: _labelled(reported.states))
        return cls(client, reported, metrics, GenerationService(client, metrics, 128, 1))


def _labelled(states: list[ReplicaState]) -> list[tuple[dict[str, str], Any]]:
    return [({"replica": s.replica}, s.snapshot) for s in states]
