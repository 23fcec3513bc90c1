"""The fleet's HTTP front: `serve`'s own routes (`server.app.api_app`), a context per pool.

Each request is routed (`Router.select_pool` over path, headers and the body's model name),
then validated, admitted (429 per pool) and timed by the same code as in `serve`, against the
pool's limits and tokenizer; `PoolClient` (pool_client.py) streams it from one of the pool's
replicas over a Ray Serve handle. Importing this module does not import Ray: the handles come
from the caller.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from specserve.fleet.config import FleetConfig, live_settings, restart_key
from specserve.fleet.observe import FleetInfo, PoolInfo, ReplicaInfo, render_pools
from specserve.fleet.pool_client import PoolClient, PoolEntry
from specserve.fleet.replica import ReplicaState
from specserve.fleet.routing import Router, UnknownPool
from specserve.server.app import api_app
from specserve.server.context import ServerContext, route_label
from specserve.server.errors import ApiError, ErrorKind, invalid
from specserve.server.info_schemas import Info
from specserve.server.outcome import Outcome
from specserve.server.settings import ServerSettings

logger = logging.getLogger(__name__)
STATE_TIMEOUT_S = 10.0  # a replica that does not report its state by then is "unreachable"
STATE_MAX_AGE_S = 1.0  # scrapes within this with no request finished between share a broadcast


class FleetContexts:
    """`Contexts` of the ingress: the pool's context for each request."""

    def __init__(self, config: FleetConfig | None, handles: dict[str, Any]) -> None:
        """`config` None: it arrives with the first `update` (Ray Serve's reconfigure)."""
        self.config = config
        self.router = Router.of(config) if config is not None else None
        self.pools = {name: PoolEntry.of(PoolClient(name, h)) for name, h in handles.items()}
        self._states_read = -STATE_MAX_AGE_S  # monotonic time of the last broadcast
        self._states_after = -1  # requests finished through the ingress before it
        self._states_lock = asyncio.Lock()
        self._health: dict[str, int] = {}  # the last health broadcast's counts per pool
        self._health_read = -STATE_MAX_AGE_S  # monotonic time it started
        self._health_lock = asyncio.Lock()

    def update(self, config: FleetConfig) -> None:
        """A new config (routes, live settings): pools describe themselves again on next use."""
        self.config, self.router = config, Router.of(config)
        self.refresh()

    def refresh(self) -> None:
        for entry in self.pools.values():
            entry.ctx, entry.describing = None, None
        self._states_read = self._health_read = -STATE_MAX_AGE_S

    def drain(self) -> int:
        """From now on new requests get 503 and /health 503 "draining"; those in flight go on.
        How many are in flight."""
        for entry in self.pools.values():
            entry.service.draining = True
        return self.in_flight()

    @property
    def draining(self) -> bool:
        return any(entry.service.draining for entry in self.pools.values())

    def in_flight(self) -> int:
        """Requests admitted through this ingress and not yet closed."""
        return sum(entry.service.active for entry in self.pools.values())

    async def pick(self, request: Request) -> ServerContext:
        if self.router is None:
            raise ApiError(503, "the fleet is starting", ErrorKind.UNAVAILABLE)
        if self.draining:  # before a pool is asked anything (it may be stopping too)
            raise ApiError(503, "the fleet is shutting down", ErrorKind.UNAVAILABLE)
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            name = self.router.select_pool(request.url.path, headers, await _model_of(request))
        except UnknownPool as exc:
            raise invalid(f"header {exc.header}", str(exc)) from exc
        request.state.chosen = name
        return await self.context(name)

    def count(self, path: str, headers: dict[str, str], outcome: Outcome, chosen: Any) -> None:
        name = chosen if chosen in self.pools else self._fallback(path, headers)
        if name is not None:
            self.pools[name].metrics.count(route_label(path), outcome)

    def _fallback(self, path: str, headers: dict[str, str]) -> str | None:
        """Where a request that failed before routing counts: its pool by path and headers."""
        if self.router is None:
            return None
        try:
            return self.router.select_pool(path, {k.lower(): v for k, v in headers.items()}, None)
        except UnknownPool:
            return self.router.default_pool

    async def context(self, name: str) -> ServerContext:
        """The pool's context; requests that arrive while it describes itself wait for that one
        describe (its failure fails them all at once; the next request tries again)."""
        entry = self.pools[name]
        if entry.ctx is not None:
            return entry.ctx
        if entry.describing is None or entry.describing.done():
            entry.describing = asyncio.ensure_future(self._describe(name, entry))
        describing = entry.describing
        ctx = await asyncio.shield(describing)  # a waiter that goes away leaves it running
        if entry.describing is describing:  # not refreshed meanwhile
            entry.ctx = ctx
        return ctx

    async def _describe(self, name: str, entry: PoolEntry) -> ServerContext:
        try:
            desc = await asyncio.wait_for(entry.client.describe(), STATE_TIMEOUT_S * 6)
        except Exception as exc:
            raise ApiError(
                503, f"pool {name!r} is unavailable: {exc}", ErrorKind.UNAVAILABLE
            ) from exc
        entry.service.max_concurrent = desc.settings.max_concurrent_requests
        profile = desc.provenance.profile
        if profile is not None and not entry.shows_profile:
            entry.metrics.show_profile(profile.stale)
            entry.shows_profile = True
        special = frozenset(int(i) for i in desc.tokenizer.all_special_ids)
        # A model name a route sends to this pool names it too (besides the served model's).
        routes = self.config.routes if self.config is not None else []
        routed = [r.model for r in routes if r.model and r.pool == name]
        limits = replace(desc.limits, model_names=(*desc.limits.model_names, *routed))
        return ServerContext(
            entry.client,
            desc.settings,
            limits,
            entry.metrics,
            entry.service,
            special,
            desc.provenance,
        )

    async def read_states(self) -> None:
        """Every replica's state, by broadcast to each pool (for /metrics and /info). A flood of
        scrapes costs the replicas at most one broadcast a second: a caller reuses the last one
        (or waits for the one running) if it is younger than STATE_MAX_AGE_S and no request
        has finished through the ingress since it started, so a scrape right after a request
        still counts that request."""
        async with self._states_lock:
            finished = sum(e.service.finished for e in self.pools.values())
            stale = time.monotonic() - self._states_read >= STATE_MAX_AGE_S
            if stale or finished != self._states_after:
                self._states_read, self._states_after = time.monotonic(), finished
                await self._broadcast_state()

    async def pool_health(self) -> dict[str, int]:
        """Per pool, its replicas that serve now (their engine thread runs). /health needs no
        key, so a flood of probes costs the replicas at most one broadcast a second, as scrapes
        do: a caller reuses the last one (or waits for the one running) if it is younger than
        STATE_MAX_AGE_S."""
        async with self._health_lock:
            if time.monotonic() - self._health_read >= STATE_MAX_AGE_S:
                self._health_read = time.monotonic()
                self._health = await self._broadcast_health()
            return dict(self._health)

    async def _broadcast_health(self) -> dict[str, int]:
        async def one(entry: PoolEntry) -> int:
            try:
                got = await entry.client.handle.broadcast("health").results_async(
                    timeout_s=STATE_TIMEOUT_S, return_exceptions=True
                )
            except Exception:  # no replica at all right now
                return 0
            return sum(r is True for r in got)

        counts = await asyncio.gather(*(one(e) for e in self.pools.values()))
        return dict(zip(self.pools, counts, strict=True))

    async def _broadcast_state(self) -> None:
        async def one(entry: PoolEntry) -> None:
            try:
                got = await entry.client.handle.broadcast("state").results_async(
                    timeout_s=STATE_TIMEOUT_S, return_exceptions=True
                )
            except Exception as exc:  # no replica at all right now
                got = [exc]
            states = [s for s in got if isinstance(s, ReplicaState)]
            failed = [f"{type(e).__name__}: {e}"[:300] for e in got if _failed(e)]
            entry.reported.states, entry.reported.unreachable = states, failed

        await asyncio.gather(*(one(e) for e in self.pools.values()))

    def info(self) -> FleetInfo:
        if self.config is None:
            raise ApiError(503, "the fleet is starting", ErrorKind.UNAVAILABLE)
        pools = {}
        for name, entry in self.pools.items():
            pool = self.config.pools[name]
            first = entry.reported.states[0].info if entry.reported.states else None
            engine = Info.model_validate(first) if first is not None else None
            profile = engine.speculation_profile if engine is not None else None
            pools[name] = PoolInfo(
                settings=live_settings(pool),
                version=restart_key(pool),
                replicas=[
                    ReplicaInfo(
                        replica=s.replica, pid=s.pid, node=s.node, started=s.started, live=s.live
                    )
                    for s in entry.reported.states
                ],
                unreachable=entry.reported.unreachable,
                engine=engine,
                profile_stale=profile.stale if profile is not None else None,
            )
        routes = [r.model_dump(exclude_none=True) for r in self.config.routes]
        return FleetInfo(default_pool=self.config.default_pool, routes=routes, pools=pools)


def _failed(result: Any) -> bool:
    return isinstance(result, BaseException)


async def _model_of(request: Request) -> str | None:
    """The model a generation request names: OpenAI `model`, TGI `parameters.model`."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(await request.body() or b"null")
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return None  # the route answers the malformed body
    if not isinstance(body, dict):
        return None
    params = body.get("parameters")
    model = body.get("model") or (params.get("model") if isinstance(params, dict) else None)
    return model if isinstance(model, str) else None


def fleet_app(contexts: FleetContexts, guard: ServerSettings) -> FastAPI:
    """The ingress app: serve's routes over the pools, with the fleet's /health, /info and
    /metrics. `guard`: the API key and body limit, as `serve` takes them."""
    app = api_app(contexts, guard)
    app.state.fleet = contexts

    async def health() -> JSONResponse:
        """200 while every pool has a replica that serves; else 503. Each pool's count.
        503 "draining" once the fleet is being stopped."""
        if contexts.draining:
            body = {"status": "draining", "in_flight": contexts.in_flight()}
            return JSONResponse(body, status_code=503)
        pools = await contexts.pool_health()
        ok = all(pools.values())
        body = {"status": "ok" if ok else "degraded", "pools": pools}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def info() -> FleetInfo:
        await contexts.read_states()
        return contexts.info()

    async def metrics() -> Response:
        await contexts.read_states()
        registries = {name: e.metrics.registry for name, e in contexts.pools.items()}
        body = await asyncio.to_thread(render_pools, registries)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/health", health, methods=["GET"], tags=["status"])
    app.add_api_route("/info", info, methods=["GET"], response_model=FleetInfo, tags=["status"])
    app.add_api_route("/metrics", metrics, methods=["GET"], tags=["status"])
    return app
