"""Overload (429 + Retry-After) and client disconnects (request aborted, KV blocks freed)."""

from __future__ import annotations

import contextlib

import httpx

from tests import http
from tests.server.conftest import LONG, Server, idle, scrape, sse_events, wait_for

BODY = {"inputs": "The quick brown fox", "parameters": LONG}


def test_beyond_max_concurrent_gets_429_and_server_keeps_serving(long_server: Server) -> None:
    idle(long_server.url)
    before = scrape(long_server.url)
    with contextlib.ExitStack() as stack, httpx.Client(timeout=30) as client:
        streams = []  # kept alive: a collected line iterator closes its connection
        for _ in range(4):  # the server's --max-concurrent-requests
            r = stack.enter_context(
                client.stream("POST", long_server.url + "/generate_stream", json=BODY)
            )
            streams.append(sse_events(r.iter_lines()))
            next(streams[-1])  # admitted and generating
        assert scrape(long_server.url)["specserve_requests_in_flight"] == 4
        r = http.post(long_server.url + "/generate", json=BODY)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert r.json()["error_type"] == "overloaded"
        assert "--max-concurrent-requests" in r.json()["error"]
        r = http.post(long_server.url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert http.get(long_server.url + "/health").status_code == 200
    after = idle(long_server.url)
    key = 'specserve_requests_total{outcome="overloaded",route="/generate"}'
    assert after[key] - before.get(key, 0) == 1
    r = http.post(long_server.url + "/generate", json={"inputs": "hi"})
    assert r.status_code == 200


def _cancelled(route: str) -> str:
    return f'specserve_requests_total{{outcome="cancelled",route="{route}"}}'


def test_stream_disconnect_aborts_and_frees_kv(long_server: Server) -> None:
    before = idle(long_server.url)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", long_server.url + "/generate_stream", json=BODY) as r,
    ):
        events = sse_events(r.iter_lines())
        for _ in range(5):
            next(events)
        busy = scrape(long_server.url)
        assert busy["specserve_kv_cache_blocks_used"] > 0
        assert busy["specserve_requests_in_flight"] == 1
    after = idle(long_server.url)  # KV blocks back to 0 without waiting for 3000 tokens
    assert (
        after[_cancelled("/generate_stream")] - before.get(_cancelled("/generate_stream"), 0) == 1
    )
    made = after["specserve_generated_tokens_total"] - before["specserve_generated_tokens_total"]
    assert made < LONG["max_new_tokens"]


def test_non_streaming_disconnect_aborts_and_frees_kv(long_server: Server) -> None:
    before = idle(long_server.url)
    try:
        http.post(long_server.url + "/generate", json=BODY, timeout=0.5)
    except httpx.ReadTimeout:
        pass  # the client gives up and closes the connection
    else:
        raise AssertionError("the long request finished before the client gave up")
    after = wait_for(
        long_server.url,
        lambda m: m.get(_cancelled("/generate"), 0) > before.get(_cancelled("/generate"), 0),
    )
    after = idle(long_server.url)
    made = after["specserve_generated_tokens_total"] - before["specserve_generated_tokens_total"]
    assert made < LONG["max_new_tokens"]
