"""`specserve serve`: load the engine, log what was resolved, serve HTTP, drain on shutdown.

The engine starts as a fleet replica's does (`server/startup.py`, the speculation profile
included); a stale profile under --strict-profile exits 2.

Shutdown (SIGTERM or Ctrl-C) drains: /health turns 503 and new generation requests get 503,
while the listener stays open and requests in flight finish. Those still running after
--drain-timeout are aborted: an open stream gets a final error event, a waiting non-streaming
request a JSON 503. Then uvicorn stops listening and the engine loop is stopped. A second
Ctrl-C forces exit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine, Mapping
from dataclasses import asdict
from types import FrameType
from typing import Any

import torch
import uvicorn

from specserve.cli_args import add_engine_args
from specserve.cli_flags import add_option
from specserve.config import EngineConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.server.provenance import Provenance
from specserve.server.service import GenerationService
from specserve.server.settings import ServerSettings
from specserve.server.startup import SERVE_OPTIONS, FlagError, freeze_startup_heap, start

logger = logging.getLogger("specserve.serve")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the `specserve` subcommand parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="serve the TGI- and OpenAI-compatible HTTP API",
        description="Serve /generate, /generate_stream, /v1/completions, /v1/chat/completions, "
        "/v1/models, /info, /health and /metrics. Every flag can also be set through the "
        "environment variable named in its help.",
    )
    add_engine_args(p)
    for option in SERVE_OPTIONS:
        add_option(p, option)
    p.set_defaults(func=cmd_serve)
    return p


def cmd_serve(args: argparse.Namespace) -> int:
    from specserve.server.app import create_app
    from specserve.server.direct import capture

    # Only the step thread runs multi-threaded regions, and it builds the engine itself (see
    # engine/async_engine.py): this thread serves HTTP and keeps torch at one thread.
    torch.set_num_threads(1)
    try:
        started = start(vars(args))
    except FlagError as exc:
        raise SystemExit(f"error: {exc}") from exc
    except ValueError as exc:  # StaleProfileError included
        print(f"error: {exc}", file=sys.stderr)
        return 2
    async_engine, settings, provenance = started.engine, started.settings, started.provenance
    log_startup(started.config, settings, async_engine.engine, provenance)
    app = create_app(async_engine, settings, provenance)
    freeze_startup_heap()
    server = DrainingServer(
        uvicorn.Config(
            app if args.stream_from_loop else capture(app),
            host=args.host,
            port=args.port,
            log_level="info",
            timeout_graceful_shutdown=int(DRAIN_GRACE_S),
        ),
        app.state.ctx.service,
        args.drain_timeout,
    )
    run_loop(_serve(server, async_engine))
    return 0


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop where it is installed, else on asyncio's own loop. Measured ad hoc on 2
    cores, batch-1 streaming, the step thread's time between the end of one step and the start
    of the next (the hand-over and the loop's work for it, done while no parallel region runs)
    was 0.13-0.15 ms a token on uvloop against 0.64-0.91 ms on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


# Seconds given, after the drain, to the last aborted responses and to the engine thread.
DRAIN_GRACE_S = 5.0


async def _serve(server: uvicorn.Server, async_engine: AsyncEngine) -> None:
    try:
        await server.serve()  # returns once drained (see DrainingServer)
    finally:
        if await async_engine.shutdown(timeout=DRAIN_GRACE_S, grace=DRAIN_GRACE_S):
            logger.info("engine stopped")
        else:
            logger.error("the engine thread did not stop within %.0f s", 2 * DRAIN_GRACE_S)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains before it stops listening (see the module docstring).

    uvicorn's own shutdown closes the listener at once, so no probe could see the 503: here the
    first signal only marks the service as draining, and `on_tick` (every 0.1 s) lets uvicorn
    exit once nothing is in flight, or `drain_timeout` + DRAIN_GRACE_S after the signal, having
    aborted what was left at `drain_timeout`. Unlike uvicorn's handler it does not re-raise the
    signal afterwards, so the engine is stopped and the process exits 0."""

    def __init__(
        self, config: uvicorn.Config, service: GenerationService, drain_timeout: float
    ) -> None:
        super().__init__(config)
        self.service = service
        self.drain_timeout = drain_timeout
        self._drain_started: float | None = None
        self._aborted = False
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_started is None:
            self._drain_started = time.monotonic()
            self.service.draining = True
        elif sig == signal.SIGINT:  # a second Ctrl-C: stop waiting for requests
            self.force_exit = self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self._drain_started is not None and not self.should_exit:
            self.should_exit = self._drained(time.monotonic() - self._drain_started)
        return await super().on_tick(counter)

    def _drained(self, waited: float) -> bool:
        active = self.service.active
        if not self._announced:  # logged here, not from the signal handler
            self._announced = True
            logger.info(
                "shutting down: draining %d request(s), up to %.0f s", active, self.drain_timeout
            )
        if active and waited >= self.drain_timeout and not self._aborted:
            self._aborted = True
            logger.warning(
                "drain timeout (%.0f s): aborting %d request(s) still in flight",
                self.drain_timeout,
                active,
            )
            self.service.engine.abort_all(
                f"the server is shutting down: the drain timeout ({self.drain_timeout:.0f} s) "
                "passed before this request finished"
            )
        return active == 0 or waited >= self.drain_timeout + DRAIN_GRACE_S


def log_startup(
    config: EngineConfig, settings: ServerSettings, engine: Engine, provenance: Provenance
) -> None:
    """The resolved configuration, the fingerprints and the memory budget, one line each."""
    shown = asdict(settings) | {
        "api_key": "<set>" if settings.api_key else None,
        "tenant_keys": f"<{len(settings.tenant_keys)} set>" if settings.tenant_keys else None,
        "admin_key": "<set>" if settings.admin_key else None,
    }
    logger.info("engine config: %s", asdict(config))
    logger.info("server settings: %s", shown)
    facts, kv = engine.facts, engine.kv_pool()
    proposer = engine.proposer.name if engine.proposer is not None else "off"
    logger.info(
        "model %s on %s: context %d tokens; speculation N=%d proposer=%s",
        facts.model_dir,
        facts.device,
        engine.max_model_len,
        config.spec.speculate,
        proposer,
    )
    logger.info(
        "memory budget: weights %.1f MiB + KV cache %.1f MiB (%d blocks x %d = %d tokens) "
        "= %.1f MiB",
        facts.weight_bytes / 2**20,
        kv.kv_bytes / 2**20,
        kv.num_blocks,
        kv.block_size,
        kv.tokens,
        (facts.weight_bytes + kv.kv_bytes) / 2**20,
    )
    if provenance.fingerprints is not None:
        fps = provenance.fingerprints
        logger.info("fingerprints: target %s; proposer %s", fps.target, fps.proposer)
    warning = wait_policy_warning(os.environ)
    if warning is not None:
        logger.warning(warning)


def wait_policy_warning(env: Mapping[str, str]) -> str | None:
    """What to tell the user about an OpenMP wait policy that slows the engine down; else None."""
    if env.get("OMP_WAIT_POLICY", "").strip().upper() != "PASSIVE":
        return None
    return (
        "OMP_WAIT_POLICY=PASSIVE: every parallel region starts by waking a sleeping thread; "
        "batch-1 decode measured 2x slower with it (docs/benchmarks.md). Unset it unless the "
        "server must leave idle cores alone"
    )
