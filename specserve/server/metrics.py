"""Prometheus metrics on a per-app registry (several apps may live in one process).

Request-side series (counts, latencies, lengths) are observed as requests run. Engine-side series
(batch size, KV blocks, speculation counters, the policy's chosen k, gated steps and predicted
speedup) are read from the engine at scrape time, so they are never stale and cost nothing
between scrapes: between two steps, by the step thread itself while one runs (a scrape never
waits on the engine's lock: `AsyncEngine.read_between_steps`), and scrapes that arrive while a
read is under way share it (`Coalesced`), so a flood of them costs one read at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from specserve.outputs import RequestOutput
from specserve.server.engine_metrics import EngineCollector, Labelled
from specserve.server.engine_snapshot import EngineSnapshot, snapshot
from specserve.server.outcome import Outcome

__all__ = [
    "Coalesced",
    "EngineSnapshot",
    "Labelled",
    "ServerMetrics",
    "queue_seconds",
    "snapshot",
]
T = TypeVar("T")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class Coalesced(Generic[T]):
    """`fn` for callers in any thread; those who call while a call runs wait for it and share
    its result (or its exception) instead of starting another."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._running: Future[T] | None = None
        self.waiting = 0  # callers sharing the call under way (for tests)

    def __call__(self) -> T:
        with self._lock:
            running = self._running
            if running is None:
                running = self._running = Future()
                mine = True
            else:
                self.waiting += 1
                mine = False
        if not mine:
            try:
                return running.result()
            finally:
                with self._lock:
                    self.waiting -= 1
        try:
            running.set_result(self._fn())
        except BaseException as exc:
            running.set_exception(exc)
        finally:
            with self._lock:
                self._running = None
        return running.result()


class ServerMetrics:
    def __init__(self, read_engine: Callable[[], Labelled]) -> None:
        disable_created_metrics()  # process-wide: drop the `_created` twin of every series
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "specserve_requests",
            "Generation requests by route and outcome",
            ["route", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge(
            "specserve_requests_in_flight",
            "Generation requests admitted and not finished",
            registry=r,
        )
        lat, tok = LATENCY_BUCKETS, TOKEN_BUCKETS
        self.queue = _hist(
            r, "specserve_request_queue_seconds", "Time from arrival to first scheduling", lat
        )
        self.ttft = _hist(
            r,
            "specserve_time_to_first_token_seconds",
            "Time from arrival to the first generated token",
            lat,
        )
        self.itl = _hist(
            r,
            "specserve_inter_token_latency_seconds",
            "Time between generated tokens (a multi-token step spreads its gap)",
            lat,
        )
        self.e2e = _hist(
            r,
            "specserve_request_duration_seconds",
            "Time from arrival to the last token of a completed request",
            lat,
        )
        self.input_tokens = _hist(
            r, "specserve_request_input_tokens", "Prompt length of completed requests", tok
        )
        self.output_tokens = _hist(
            r, "specserve_request_output_tokens", "Generated length of completed requests", tok
        )
        self.ignored_fields = Counter(
            "specserve_request_ignored_fields",
            "Request fields no model of the API defines, ignored (and logged) by route",
            ["route"],
            registry=r,
        )
        self.direct_writes = Counter(
            "specserve_stream_direct_writes",
            "Streamed outputs written to their socket by the engine's thread "
            "(specserve/server/direct.py)",
            registry=r,
        )
        r.register(EngineCollector(read_engine))

    def show_profile(self, stale: bool) -> None:
        """Export whether the applied speculation profile is stale (only when one is applied)."""
        Gauge(
            "specserve_speculation_profile_stale",
            "1 when the speculation profile was measured on other artifacts: re-measure it",
            registry=self.registry,
        ).set(int(stale))

    def show_block_fallback(self, fell_back: bool) -> None:
        """Export whether the GGUF block kernels failed their start-up check (float32 serves)."""
        Gauge(
            "specserve_block_kernels_fallback",
            "1 when the GGUF block kernels failed their start-up product check and the model "
            "runs its float32 weights instead",
            registry=self.registry,
        ).set(int(fell_back))

    def count(self, route: str, outcome: Outcome) -> None:
        self.requests.labels(route=route, outcome=outcome).inc()

    def count_ignored(self, route: str, fields: int) -> None:
        self.ignored_fields.labels(route=route).inc(fields)

    def render(self) -> bytes:
        """Exposition text; reads the engine, so call it off the event loop."""
        return generate_latest(self.registry)


def _hist(
    registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...]
) -> Histogram:
    return Histogram(name, doc, buckets=buckets, registry=registry)


def queue_seconds(out: RequestOutput) -> float | None:
    """Engine-reported wait before first scheduling, when the engine reports it."""
    value = getattr(out, "queue_seconds", None)
    return float(value) if value is not None else None
