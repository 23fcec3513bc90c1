"""A fleet heals and reports: replicas whose engine died fail Ray Serve's health probe, the
ingress's /health counts each pool's serving replicas, scrapes share one broadcast a second,
and the API key reaches the ingress by a private file, never in what Ray logs."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import stat
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from specserve.fleet.config import live_settings, parse_fleet, pool_values
from specserve.fleet.flags import LIVE_FIELDS
from specserve.fleet.ingress import FleetContexts, fleet_app
from specserve.fleet.replica import PoolReplica
from specserve.server.context import ServerContext
from specserve.server.settings import ServerSettings
from tests.engine.observers import LoopBug
from tests.fleet.conftest import two_pools


class FakeHandle:
    """A pool's Ray Serve handle: `broadcast` answers `health` with one replica's verdict."""

    def __init__(self, serving: bool) -> None:
        self.serving = serving
        self.calls: Counter[str] = Counter()

    def broadcast(self, method: str) -> Any:
        self.calls[method] += 1
        results: list[Any] = [self.serving] if method == "health" else []

        async def results_async(timeout_s: float, return_exceptions: bool) -> list[Any]:
            return results

        return SimpleNamespace(results_async=results_async)


def get(contexts: FleetContexts, *paths: str) -> list[httpx.Response]:
    app = fleet_app(contexts, ServerSettings(model_id="fleet"))

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as client:
            return [await client.get(p) for p in paths]

    return asyncio.run(run())


def test_health_is_503_while_a_pool_has_no_serving_replica(fleet_model: Path) -> None:
    config = parse_fleet(two_pools(fleet_model), "test")
    handles = {"code": FakeHandle(True), "chat": FakeHandle(False)}
    [r] = get(FleetContexts(config, handles), "/health")
    assert r.status_code == 503
    assert r.json() == {"status": "degraded", "pools": {"code": 1, "chat": 0}}
    handles["chat"].serving = True
    [r] = get(FleetContexts(config, handles), "/health")
    assert r.status_code == 200 and r.json()["pools"] == {"code": 1, "chat": 1}


def test_scrapes_within_a_second_share_one_broadcast(fleet_model: Path) -> None:
    config = parse_fleet(two_pools(fleet_model), "test")
    handles = {"code": FakeHandle(True), "chat": FakeHandle(True)}
    contexts = FleetContexts(config, handles)
    responses = get(contexts, "/metrics", "/metrics", "/metrics")
    assert all(r.status_code == 200 for r in responses)
    assert handles["code"].calls["state"] == 1 and handles["chat"].calls["state"] == 1
    contexts.pools["chat"].service.finished += 1  # a request ended: the next scrape reads anew
    get(contexts, "/metrics", "/info")
    assert handles["code"].calls["state"] == 2 and handles["chat"].calls["state"] == 2


def test_a_replica_whose_engine_died_fails_the_health_probe(fleet_model: Path) -> None:
    pool = parse_fleet(two_pools(fleet_model), "test").pools["code"]
    fixed = {k: v for k, v in pool_values(pool).items() if k not in LIVE_FIELDS}
    replica = PoolReplica("code", fixed)
    replica.check_health()  # not started yet: Serve waits for reconfigure, not our probe

    async def run() -> None:
        await replica.reconfigure(live_settings(pool))
        front = replica.engine
        try:
            replica.check_health()
            assert await replica.health()
            front.run_locked(lambda e: e.observers.add(LoopBug()))
            front.abort("wake-up")  # wakes the step thread: its next step dies
            async with asyncio.timeout(60):
                while front.alive:
                    await asyncio.sleep(0.02)
            with pytest.raises(RuntimeError, match="the engine stopped: RuntimeError: loop bug"):
                replica.check_health()
            assert not await replica.health()
        finally:
            gc.unfreeze()  # the replica froze its start-up heap, as `serve` does
            await front.shutdown(timeout=5.0)

    asyncio.run(run())


def test_the_api_key_travels_by_a_private_file(
    fleet_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specserve.fleet.deploy import INGRESS, INGRESS_ENV, deploy_schema
    from specserve.fleet.secrets import read_secret

    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    key = "sk-fleet-key-0123456789"
    config = parse_fleet({**two_pools(fleet_model), "api_key": key}, "test")
    schema = deploy_schema(config).model_dump(mode="json")
    assert key not in json.dumps(schema)  # what Ray writes to its logs
    [ingress] = [d for d in schema["applications"][0]["deployments"] if d["name"] == INGRESS]
    env = json.loads(ingress["ray_actor_options"]["runtime_env"]["env_vars"][INGRESS_ENV])
    path = Path(env["api_key_file"])
    assert read_secret(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="group or others may access it"):
        read_secret(path)


def test_requests_waiting_for_a_pool_share_one_describe(fleet_model: Path) -> None:
    """A pool that cannot describe itself fails every waiting request at once, not one after
    another (each used to wait its turn for its own 60 s describe)."""
    config = parse_fleet(two_pools(fleet_model), "test")
    contexts = FleetContexts(config, {"code": FakeHandle(True), "chat": FakeHandle(True)})
    calls = 0

    async def main() -> list[ServerContext | BaseException]:
        release = asyncio.Event()

        async def describe() -> Any:
            nonlocal calls
            calls += 1
            await release.wait()
            raise RuntimeError("replica unreachable")

        contexts.pools["code"].client.describe = describe  # type: ignore[method-assign]
        waiting = [asyncio.ensure_future(contexts.context("code")) for _ in range(3)]
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        with pytest.raises(Exception, match="replica unreachable"):
            await contexts.context("code")  # the next request tries again
        return results

    results = asyncio.run(main())
    assert calls == 2
    assert all("pool 'code' is unavailable: replica unreachable" in str(r) for r in results)


def test_a_pool_model_that_does_not_exist_is_refused_before_deploying(fleet_model: Path) -> None:
    from specserve.fleet.config import FleetConfigError, check_models, with_changes

    config = parse_fleet(two_pools(fleet_model), "test")
    check_models(config)
    typo = with_changes(config, "chat", {"model": str(fleet_model) + "-typo"})
    with pytest.raises(FleetConfigError, match=r"pool 'chat': model .*-typo' does not exist"):
        check_models(typo, ["chat"])


def test_a_draining_fleet_refuses_new_requests_and_says_so(fleet_model: Path) -> None:
    config = parse_fleet(two_pools(fleet_model, drain_timeout=7), "test")
    assert config.drain_timeout == 7  # serve's --drain-timeout, fleet-wide
    contexts = FleetContexts(config, {"code": FakeHandle(True), "chat": FakeHandle(True)})
    contexts.pools["code"].service.active = 2  # two requests in flight through the ingress
    assert contexts.drain() == 2
    app = fleet_app(contexts, ServerSettings(model_id="fleet"))

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as client:
            health = await client.get("/health")
            generate = await client.post("/generate", json={"inputs": "hi"})
            return [health, generate]

    health, generate = asyncio.run(run())
    assert health.status_code == 503 and health.json() == {"status": "draining", "in_flight": 2}
    assert generate.status_code == 503, generate.text
    assert "shutting down" in generate.json()["error"]


def test_probes_within_a_second_share_one_broadcast(fleet_model: Path) -> None:
    """Issue 54 item 9: /health needs no key and broadcast to every replica per call. Probes
    now share one broadcast a second, as scrapes do."""
    config = parse_fleet(two_pools(fleet_model), "test")
    handles = {"code": FakeHandle(True), "chat": FakeHandle(True)}
    contexts = FleetContexts(config, handles)
    responses = get(contexts, "/health", "/health", "/health")
    assert all(r.status_code == 200 for r in responses)
    assert handles["code"].calls["health"] == 1 and handles["chat"].calls["health"] == 1
    contexts.refresh()  # a redeploy: the next probe asks again
    get(contexts, "/health")
    assert handles["code"].calls["health"] == 2
