"""Shutdown drains: the listener stays open (/health 503) while requests finish; what is left at
--drain-timeout ends with an error the client can read; nothing is logged as unhandled. And a
dead engine thread turns /health to 503 and fails requests at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from specserve.config import CacheConfig, EngineConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.server.app import create_app
from specserve.server.settings import ServerSettings
from tests import http
from tests.engine.observers import LoopBug
from tests.server.conftest import (
    LONG,
    TINY_FLAGS,
    floored_env,
    sse_events,
    start_server,
    wait_for,
)
from tests.server.test_isolation import ThreadServer

BODY = {"inputs": "hello", "parameters": LONG}


def test_drain_timeout_ends_open_requests_with_errors(tiny_model: Path, tmp_path: Path) -> None:
    flags = ["--model", str(tiny_model), *TINY_FLAGS, "--drain-timeout", "2"]
    server = start_server(flags, tmp_path / "drain.log", env=floored_env())  # LONG outlasts 2 s
    blocking: dict[str, httpx.Response] = {}

    def non_streaming() -> None:
        blocking["r"] = http.post(server.url + "/generate", json=BODY, timeout=60)

    try:
        with http.stream("POST", server.url + "/generate_stream", json=BODY, timeout=60) as s:
            events = sse_events(s.iter_lines())
            assert "token" in next(events)
            thread = threading.Thread(target=non_streaming)
            thread.start()
            wait_for(server.url, lambda m: m["specserve_requests_in_flight"] == 2)
            server.proc.terminate()
            health = _wait_draining(server.url)  # the listener is still open
            assert health.json() == {"status": "draining"}
            refused = http.post(server.url + "/generate", json={"inputs": "hi"})
            assert refused.status_code == 503 and refused.json()["error_type"] == "unavailable"
            rest = list(events)
        last = rest[-1]
        assert last.get("error_type") == "generation", last
        assert "shutting down" in str(last["error"]) and "drain timeout (2 s)" in str(last["error"])
        thread.join(30)
        r = blocking["r"]
        assert r.status_code == 503 and r.json()["error_type"] == "unavailable", r.text
        assert "shutting down" in r.json()["error"]
        assert server.proc.wait(30) == 0
        log = server.log.read_text()
        assert "engine stopped" in log
        assert "aborting 2 request(s) still in flight" in log
        for unhandled in ("Traceback", "CancelledError", "Exception in ASGI application"):
            assert unhandled not in log, log
    finally:
        server.stop()


def _wait_draining(url: str, timeout: float = 30) -> httpx.Response:
    """/health once the server has taken the signal (503), however busy the machine."""
    deadline = time.monotonic() + timeout
    while (health := http.get(url + "/health")).status_code == 200:
        assert time.monotonic() < deadline, "the server never started draining"
        time.sleep(0.02)
    assert health.status_code == 503, health.text
    return health


def test_dead_engine_thread_turns_health_503(tiny_model: Path) -> None:
    config = EngineConfig(model=str(tiny_model), num_threads=1, cache=CacheConfig(num_blocks=64))
    front = AsyncEngine(Engine(config))
    app = create_app(front, ServerSettings(model_id="tiny"))
    with ThreadServer(app) as server:
        assert http.get(server.url + "/health").status_code == 200

        front.run_locked(lambda e: e.observers.add(LoopBug()))
        front.abort("wake-up")  # wakes the loop: its next step dies
        deadline = time.monotonic() + 60
        while front.alive and time.monotonic() < deadline:
            time.sleep(0.02)
        health = http.get(server.url + "/health")
        assert health.status_code == 503
        assert health.json() == {"status": "engine_failed", "error": "RuntimeError: loop bug"}
        started = time.monotonic()
        r = http.post(server.url + "/generate", json={"inputs": "hi"}, timeout=60)
        assert r.status_code == 503 and "the engine stopped" in r.json()["error"]
        assert time.monotonic() - started < 30  # refused, not queued for nobody (a 60 s wait)
