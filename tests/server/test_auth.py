"""--api-key (here through its environment form, API_KEY): bearer token or 401."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from specserve.server.middleware import GuardMiddleware, matching_key, tenant_id
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


def test_admin_routes_take_the_admin_key() -> None:
    """Issue 54 item 6: any tenant's key emptied every tenant's caches and read their activity
    in /info. /info and the resets take the admin key where one is given; with one key (or
    none) and no admin key, its holder is the operator; with tenant keys and none, nobody."""

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(request.scope.get("state", {}).get("tenant")))

    routes = [Route(p, ok, methods=["GET", "POST"]) for p in ("/info", "/reset_prefix_cache")]
    app = Starlette(routes=[*routes, Route("/generate", ok, methods=["POST"])])

    def statuses(keys: tuple[str, ...], admin: str | None, key: str | None) -> list[int]:
        guarded = GuardMiddleware(app, keys, 1000, lambda path, outcome: None, admin_key=admin)

        async def run() -> list[int]:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            transport = httpx.ASGITransport(app=guarded)
            async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
                return [
                    (await client.get("/info", headers=headers)).status_code,
                    (await client.post("/reset_prefix_cache", headers=headers)).status_code,
                    (await client.post("/generate", headers=headers)).status_code,
                ]

        return asyncio.run(run())

    tenants = ("tenant-a", "tenant-b")
    for key in tenants:
        assert statuses(tenants, "the-admin", key) == [403, 403, 200]
        assert statuses(tenants, None, key) == [403, 403, 200]
    assert statuses(tenants, "the-admin", "the-admin") == [200, 200, 200]
    assert statuses(tenants, "the-admin", None) == [401, 401, 401]
    assert statuses((KEY,), None, KEY) == [200, 200, 200]
    assert statuses((KEY,), "the-admin", KEY) == [403, 403, 200]
    assert statuses((KEY,), "the-admin", "the-admin") == [200, 200, 200]
    assert statuses((), None, None) == [200, 200, 200]
    assert statuses((), "the-admin", None) == [403, 403, 200]


def test_the_admin_key_is_a_tenant_of_its_own() -> None:
    async def tenant(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(request.scope.get("state", {}).get("tenant")))

    app = Starlette(routes=[Route("/generate", tenant, methods=["POST"])])
    guarded = GuardMiddleware(app, ("a", "b"), 1000, lambda p, o: None, admin_key="the-admin")

    async def run() -> str:
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://s") as client:
            headers = {"Authorization": "Bearer the-admin"}
            return (await client.post("/generate", headers=headers)).text

    assert asyncio.run(run()) == tenant_id("the-admin")
