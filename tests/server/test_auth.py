"""--api-key (here through its environment form, API_KEY): bearer token or 401."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from specserve.server.middleware import GuardMiddleware, matching_key
from tests import http
from tests.server.conftest import Server, start_server

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def auth_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("logs") / "auth-server.log"
    server = start_server(["--model", str(tiny_model)], log, env={"API_KEY": KEY})
    yield server
    server.stop()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": "Bearer"},
    ],
)
def test_missing_or_wrong_key_gets_401(auth_server: Server, headers: dict[str, str]) -> None:
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 2}}
    r = http.post(auth_server.url + "/generate", json=body, headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error_type"] == "unauthorized"
    r = http.get(auth_server.url + "/v1/models", headers=headers)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert http.get(auth_server.url + "/info", headers=headers).status_code == 401


def test_right_key_passes_and_probes_stay_open(auth_server: Server) -> None:
    good = {"Authorization": f"Bearer {KEY}"}
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 2}}
    assert http.post(auth_server.url + "/generate", json=body, headers=good).status_code == 200
    assert http.get(auth_server.url + "/health").status_code == 200
    metrics = http.get(auth_server.url + "/metrics").text
    assert 'specserve_requests_total{outcome="unauthorized",route="/generate"}' in metrics


def test_openai_sdk_with_and_without_key(auth_server: Server) -> None:
    ok = openai.OpenAI(base_url=auth_server.url + "/v1", api_key=KEY)
    [model] = ok.models.list().data
    assert ok.models.retrieve(model.id).id == model.id
    assert ok.completions.create(model=model.id, prompt="hi", max_tokens=2).usage is not None
    bad = openai.OpenAI(base_url=auth_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=model.id, prompt="hi", max_tokens=2)


def token_matches(header: str | None, key: str) -> bool:
    return matching_key(header, (key,)) is not None


def test_token_matches() -> None:
    assert token_matches(f"Bearer {KEY}", KEY)
    assert token_matches(f"bearer {KEY}", KEY)
    assert not token_matches(None, KEY)
    assert not token_matches(KEY, KEY)
    assert not token_matches(f"Bearer {KEY[:-1]}", KEY)
    assert not token_matches("Bearer ünïcode", KEY)


@pytest.mark.parametrize("private", [False, True])
def test_private_metrics_puts_metrics_behind_the_key(private: bool) -> None:
    """--private-metrics (PRIVATE_METRICS): /metrics needs the key too; /health never does."""

    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/metrics", ok), Route("/health", ok), Route("/info", ok)])
    guarded = GuardMiddleware(app, (KEY,), 1000, lambda path, outcome: None, private)

    async def get(path: str, key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            return (await client.get(path, headers=headers)).status_code

    async def run() -> list[int]:
        return [await get(p, k) for p in ("/metrics", "/health", "/info") for k in (None, KEY)]

    metrics_open = 401 if private else 200
    assert asyncio.run(run()) == [metrics_open, 200, 200, 200, 401, 200]
