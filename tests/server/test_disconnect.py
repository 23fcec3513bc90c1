"""A client that goes away mid-generation while its request is speculating, on every streaming
route and a non-streaming one: the request is aborted, and every KV block, the target's and the
draft model's, is freed without waiting for its 3000 tokens."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests import http
from tests.server.conftest import Server, idle, scrape, sse_events

SPEC = {"max_new_tokens": 3000, "ignore_eos": True}  # speculation at the server's N
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
ROUTES: dict[str, dict[str, Any]] = {
    "/generate_stream": {"inputs": PROMPT, "parameters": SPEC},
    "/v1/completions": {"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True, "stream": True},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    },
}


def _drafted(m: dict[str, float], proposer: str) -> float:
    return m.get(f'specserve_spec_drafted_tokens_total{{proposer="{proposer}"}}', 0)


def _cancelled(m: dict[str, float], route: str) -> float:
    return m.get(f'specserve_requests_total{{outcome="cancelled",route="{route}"}}', 0)


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_stream_disconnect_while_speculating(
    request: pytest.FixtureRequest, proposer: str, route: str
) -> None:
    server: Server = request.getfixturevalue(
        "long_server" if proposer == "ngram" else "draft_server"
    )
    before = idle(server.url)
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", server.url + route, json=ROUTES[route]) as r,
    ):
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
        # until it has drafted (the adaptive policy may sit out its first steps: on a busy
        # machine a closed batch size explores only now and then), at most 1,000 tokens
        for seen in range(1, 1001):
            next(events)
            if seen % 40 == 0:
                busy = scrape(server.url)
                if _drafted(busy, proposer) > _drafted(before, proposer):
                    break
        assert _drafted(busy, proposer) > _drafted(before, proposer)  # it is speculating
        assert busy["specserve_kv_cache_blocks_used"] > 0
        if proposer == "draft":
            assert busy["specserve_draft_kv_cache_blocks_used"] > 0
    after = idle(server.url)  # target and draft blocks back to 0
    assert _cancelled(after, route) - _cancelled(before, route) == 1
    made = after["specserve_generated_tokens_total"] - before["specserve_generated_tokens_total"]
    assert made < 3000


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_non_streaming_chat_disconnect_while_speculating(
    request: pytest.FixtureRequest, proposer: str
) -> None:
    server: Server = request.getfixturevalue(
        "long_server" if proposer == "ngram" else "draft_server"
    )
    before = idle(server.url)
    body = {**ROUTES["/v1/chat/completions"], "stream": False}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        http.post(server.url + "/v1/chat/completions", json=body, timeout=1.0)
    after = idle(server.url)
    route = "/v1/chat/completions"
    assert _cancelled(after, route) - _cancelled(before, route) == 1
    assert _drafted(after, proposer) > _drafted(before, proposer)
    made = after["specserve_generated_tokens_total"] - before["specserve_generated_tokens_total"]
    assert 0 < made < 3000
