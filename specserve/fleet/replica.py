"""One replica of a pool: an engine, started from the pool's flags as `serve` starts one.

Ray Serve constructs `PoolReplica` in a worker process (one per replica) and calls
`reconfigure` with the pool's live settings (its user_config) right after, and again whenever
they change: the engine swaps them between steps (`Engine.set_speculation`), so requests in
flight go on and the process stays the same. The ingress calls `describe` (what validation needs:
tokenizer, limits), streams `generate`, and broadcasts `state` to every replica for /metrics and
/info. Nothing here imports Ray: the deployment options are added in `fleet/deploy.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from specserve.cli_args import engine_config
from specserve.config import EngineConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.fleet.flags import LIVE_FIELDS, with_defaults
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams
from specserve.server.info import engine_info
from specserve.server.metrics import EngineSnapshot, snapshot
from specserve.server.provenance import Provenance
from specserve.server.settings import Limits, ServerSettings
from specserve.server.startup import freeze_startup_heap, start, with_profile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolDescription:
    """What the ingress needs to validate and admit a pool's requests as `serve` does."""

    tokenizer: Any
    settings: ServerSettings
    limits: Limits
    provenance: Provenance


@dataclass(frozen=True)
class ReplicaState:
    """One replica at one instant, for /metrics (snapshot) and /info (the rest)."""

    replica: str
    pid: int
    node: str
    started: float
    live: dict[str, Any]
    snapshot: EngineSnapshot
    info: dict[str, Any]  # the same record as `serve`'s /info


class PoolReplica:
    """Built from the pool's restart fields; the engine starts on the first `reconfigure`,
    which Ray Serve calls with the live settings before the replica takes requests. Later calls
    swap the live settings in place."""

    def __init__(self, pool: str, values: dict[str, Any]) -> None:
        """`values`: the pool's flags (`fleet.config.pool_values`) but the live ones."""
        self.pool, self.values = pool, dict(values)
        self._engine: AsyncEngine | None = None
        self._up = asyncio.Event()  # the engine started (Serve may call before it has)
        # Set when the engine starts:
        self.config: EngineConfig
        self.settings: ServerSettings
        self.limits: Limits
        self.provenance: Provenance
        self.started = 0.0

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError(f"pool {self.pool}: the engine has not started")
        return self._engine

    async def reconfigure(self, live: dict[str, Any]) -> None:
        """Apply the pool's live settings (Ray Serve user_config) between engine steps."""
        self.values.update(live)
        if self._engine is None:
            await asyncio.to_thread(self._start)
            self._up.set()
            return
        values, _ = with_profile(with_defaults(self.values))  # a profile sets N and the gate
        spec = engine_config(values).spec
        if spec != self.config.spec:
            await asyncio.to_thread(self.engine.run_locked, lambda e: e.set_speculation(spec))
            logger.info("pool %s: speculation now %s", self.pool, spec)
        self.config = replace(self.config, spec=spec)
        self.limits = replace(self.limits, speculate=spec.speculate)

    def _start(self) -> None:
        started = start(with_defaults(self.values))  # as `serve` starts its engine
        self.config, self.settings = started.config, started.settings
        self.provenance = started.provenance
        self.limits = Limits.from_engine(started.engine.engine, self.settings)
        self.started = time.time()
        self._engine = started.engine
        logger.info("pool %s: replica %d up: %s", self.pool, os.getpid(), self.config.spec)
        freeze_startup_heap()  # as `serve` does: no full collection walks the model again

    def check_health(self) -> None:
        """Ray Serve's periodic probe: raising marks this replica unhealthy, and Serve replaces
        it. A replica whose engine thread died would answer every request with a 503."""
        if self._engine is not None and not self._engine.alive:
            raise RuntimeError(f"pool {self.pool}: the engine stopped: {self._engine.died}")

    async def health(self) -> bool:
        """Whether this replica serves now: its engine started and its step thread runs."""
        return self._engine is not None and self._engine.alive

    async def describe(self) -> PoolDescription:
        await self._up.wait()
        return PoolDescription(
            self.engine.engine.tokenizer, self.settings, self.limits, self.provenance
        )

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        after: str | None = None,
        stream: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs, streamed (`stream=False`: the first and the last, see
        `AsyncEngine.generate`); cancelling the caller's stream aborts it."""
        await self._up.wait()
        outputs = self.engine.generate(prompt_ids, params, request_id, after, stream)
        async with contextlib.aclosing(outputs) as outs:
            async for out in outs:
                yield out

    async def state(self) -> ReplicaState:
        await self._up.wait()

        def read(engine: Engine) -> tuple[EngineSnapshot, dict[str, Any]]:
            info = engine_info(engine, self.settings, self.limits, self.provenance)
            return snapshot(engine), info.model_dump(mode="json")

        snap, info = await asyncio.to_thread(self.engine.read_between_steps, read)
        live = {k: self.values[k] for k in LIVE_FIELDS}
        return ReplicaState(
            replica_id(self.pool), os.getpid(), socket.gethostname(), self.started, live, snap, info
        )


def replica_id(pool: str) -> str:
    """Ray Serve's id of this replica; pool and pid outside a replica (local testing mode)."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # not in a Serve replica
        return f"{pool}-{os.getpid()}"
