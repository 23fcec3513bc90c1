"""A failure inside one request fails only that request; shutdown drains requests in flight.

The isolation tests inject faults, so they serve `create_app` in-process (uvicorn in a thread);
the drain test sends SIGTERM to a real `specserve serve` process.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from specserve.config import CacheConfig, EngineConfig, SpecConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.server.app import create_app
from specserve.server.context import ServerContext
from specserve.server.settings import ServerSettings
from tests import http
from tests.server.conftest import (
    TINY_FLAGS,
    Server,
    free_port,
    idle,
    sse_events,
    start_server,
)


class ThreadServer:
    def __init__(self, app: Any) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def inproc(tiny_model: Path) -> Iterator[tuple[ThreadServer, ServerContext]]:
    config = EngineConfig(
        model=str(tiny_model),
        num_threads=1,
        max_model_len=1024,
        cache=CacheConfig(num_blocks=256),
        spec=SpecConfig(speculate=2),
    )
    async_engine = AsyncEngine(Engine(config))
    app = create_app(async_engine, ServerSettings(model_id="tiny"))
    with ThreadServer(app) as server:
        yield server, app.state.ctx


def ok(url: str) -> None:
    r = http.post(url + "/generate", json={"inputs": "hello", "parameters": {"max_new_tokens": 4}})
    assert r.status_code == 200, r.text


def test_handler_exception_fails_only_that_request(
    inproc: tuple[ThreadServer, ServerContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ctx = inproc
    real = ctx.encode  # the chat route renders the template, then encodes the text with this

    def flaky(text: str) -> list[int]:
        if "BOOM" in text:
            raise RuntimeError("injected fault")
        return real(text)

    monkeypatch.setattr(ctx, "encode", flaky)
    url = server.url + "/v1/chat/completions"
    r = http.post(url, json={"messages": [{"role": "user", "content": "BOOM"}]})
    assert r.status_code == 500
    assert "injected fault" in r.json()["error"]["message"]
    r = http.post(url, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200
    ok(server.url)


def test_forward_failure_fails_the_request_not_the_server(
    inproc: tuple[ThreadServer, ServerContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ctx = inproc
    runner = ctx.async_engine.engine.res.runner
    real_run = runner.run
    calls = {"n": 0}

    def fail_once(items: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device fell over")
        return real_run(items)

    monkeypatch.setattr(runner, "run", fail_once)
    r = http.post(server.url + "/generate", json={"inputs": "hello"})
    failed = "generation failed: forward pass failed: RuntimeError: device fell over"
    assert r.status_code == 500
    assert r.json() == {"error": failed, "error_type": "generation"}
    calls["n"] = 0
    body = {"inputs": "hello", "parameters": {"max_new_tokens": 4}}
    with http.stream("POST", server.url + "/generate_stream", json=body) as s:
        events = list(sse_events(s.iter_lines()))
    assert events == [{"error": failed, "error_type": "generation"}]
    idle(server.url)
    ok(server.url)


def test_exception_mid_stream_becomes_an_error_event(
    inproc: tuple[ThreadServer, ServerContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ctx = inproc

    def broken(ids: list[int], text: str) -> list[str]:
        raise ValueError("bad split")

    monkeypatch.setattr(ctx, "token_texts", broken)
    body = {"inputs": "hello", "parameters": {"max_new_tokens": 50, "ignore_eos": True}}
    with http.stream("POST", server.url + "/generate_stream", json=body) as s:
        events = list(sse_events(s.iter_lines()))
    assert len(events) == 1 and "bad split" in str(events[0]["error"])
    monkeypatch.undo()
    idle(server.url)  # the abandoned request was aborted and its KV freed
    ok(server.url)


def test_draining_refuses_new_work(inproc: tuple[ThreadServer, ServerContext]) -> None:
    server, ctx = inproc
    ctx.service.draining = True
    try:
        assert http.get(server.url + "/health").status_code == 503
        r = http.post(server.url + "/generate", json={"inputs": "hi"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
    finally:
        ctx.service.draining = False
    ok(server.url)


def test_sigterm_drains_in_flight_requests(tiny_model: Path, tmp_path: Path) -> None:
    server = start_server(["--model", str(tiny_model), *TINY_FLAGS], tmp_path / "drain.log")
    try:
        body = {
            "inputs": "hello",
            "parameters": {
                "max_new_tokens": 1500,
                "ignore_eos": True,
                "speculate": 0,
                "details": True,
            },
        }
        with http.stream("POST", server.url + "/generate_stream", json=body, timeout=60) as s:
            events = sse_events(s.iter_lines())
            first = next(events)
            server.proc.terminate()  # SIGTERM while the request is in flight
            rest = list(events)
        assert first["index"] == 1
        details = rest[-1]["details"]
        assert isinstance(details, dict)
        assert details["generated_tokens"] == 1500 and details["finish_reason"] == "length"
        assert server.proc.wait(30) == 0
        assert "engine stopped" in server.log.read_text()
    finally:
        server.stop()


def test_serve_freezes_what_lives_after_start_up(tiny_server: Server) -> None:
    """A full garbage collection would walk every object of the model and its modules while
    holding the GIL, stalling every stream: `serve` freezes them once it has started."""
    match = re.search(r"(\d+) objects alive after start-up frozen", tiny_server.log.read_text())
    assert match is not None and int(match[1]) > 10_000, tiny_server.log_tail()
