"""Admission comes before any work on a request (issue 24, items 4 and 11): a body refused at 429
is never tokenised, prompts are tokenised in a worker thread with a tokenizer of their own (not
under the engine's lock), /tokenize is admitted and capped, and n choices take n slots.

In-process app (uvicorn in a thread) so that the tests can hold slots and spy on tokenizers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specserve.config import CacheConfig, EngineConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.server.app import create_app
from specserve.server.context import ServerContext
from specserve.server.settings import ServerSettings
from tests import http
from tests.server.test_isolation import ThreadServer

BIG = "x " * 1_000_000  # 2 MB of prompt
CHAT = {"messages": [{"role": "user", "content": BIG}]}
HI = [{"role": "user", "content": "hi"}]
BODIES: dict[str, dict[str, Any]] = {
    "/generate": {"inputs": BIG},
    "/generate_stream": {"inputs": BIG},
    "/v1/completions": {"prompt": BIG},
    "/v1/chat/completions": CHAT,
    "/tokenize": {"prompt": BIG},
    "/detokenize": {"tokens": [5] * 300_000},
}


@pytest.fixture(scope="module")
def app(tiny_model: Path) -> Iterator[tuple[ThreadServer, ServerContext]]:
    config = EngineConfig(
        model=str(tiny_model), num_threads=1, max_model_len=1024, cache=CacheConfig(num_blocks=64)
    )
    settings = ServerSettings(model_id="tiny", max_concurrent_requests=2, max_body_bytes=3_000_000)
    application = create_app(AsyncEngine(Engine(config)), settings)
    with ThreadServer(application) as server:
        yield server, application.state.ctx


@pytest.fixture
def encodes(app: tuple[ThreadServer, ServerContext], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the threads that called encode / apply_chat_template on either tokenizer."""
    _, ctx = app
    calls: list[str] = []

    def spy(fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(threading.current_thread().name)
            return fn(*args, **kwargs)

        return counted

    prompt_tokenizer = getattr(ctx, "prompt_tokenizer", ctx.tokenizer)
    tokenizers = {id(t): t for t in (ctx.tokenizer, prompt_tokenizer)}
    for tok in tokenizers.values():
        for name in ("encode", "apply_chat_template"):
            monkeypatch.setattr(tok, name, spy(getattr(tok, name)))
    return calls


@pytest.mark.parametrize("route", list(BODIES))
def test_a_2mb_body_at_429_is_not_tokenised(
    app: tuple[ThreadServer, ServerContext], encodes: list[str], route: str
) -> None:
    server, ctx = app
    held = ctx.service.admit("/test", 2)  # every slot taken
    try:
        r = http.post(server.url + route, json=BODIES[route], timeout=30)
    finally:
        ctx.service.close(held)
    assert r.status_code == 429, r.text[:300]
    assert encodes == []


def test_prompts_are_tokenised_in_a_worker_thread_without_the_engine_lock(
    app: tuple[ThreadServer, ServerContext], encodes: list[str]
) -> None:
    server, ctx = app
    assert ctx.prompt_tokenizer.lock is not ctx.tokenizer.lock
    with ctx.tokenizer.lock:  # as if the engine's detokenizer held it for a long while
        for body in ({"inputs": "hello"}, {"prompt": "hello"}, {"messages": HI}):
            r = http.post(server.url + "/tokenize", json=body, timeout=30)
            assert r.status_code == 200, r.text
        r = http.post(server.url + "/detokenize", json={"tokens": [5, 6]}, timeout=30)
        assert r.status_code == 200, r.text
    assert encodes and server.thread.name not in encodes
    r = http.post(server.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
    assert r.status_code == 200 and server.thread.name not in encodes


def test_tokenize_refuses_a_prompt_longer_than_any_context_before_tokenising(
    app: tuple[ThreadServer, ServerContext], encodes: list[str]
) -> None:
    server, ctx = app
    cap = ctx.limits.max_prompt_chars
    assert cap is not None and cap < len(BIG)
    r = http.post(server.url + "/tokenize", json={"prompt": BIG}, timeout=30)
    assert r.status_code == 422, r.text
    assert "prompt" in r.json()["error"] and f"the limit is {cap}" in r.json()["error"]
    r = http.post(server.url + "/v1/completions", json={"prompt": BIG}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert encodes == []


def test_n_choices_take_n_slots(app: tuple[ThreadServer, ServerContext]) -> None:
    server, ctx = app
    body = {"prompt": "hi", "max_tokens": 2, "n": 2}
    held = ctx.service.admit("/test")  # one of two slots taken
    try:
        r = http.post(server.url + "/v1/completions", json=body)
        assert r.status_code == 429, r.text
        r = http.post(server.url + "/v1/completions", json={**body, "n": 3})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "n"
        assert "--max-concurrent-requests" in r.json()["error"]["message"]
    finally:
        ctx.service.close(held)
    assert http.post(server.url + "/v1/completions", json=body).status_code == 200
    assert ctx.service.active == 0
