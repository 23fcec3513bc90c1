"""The ingress app over two pools run in Ray Serve's local testing mode (in this process).

The pools are the real `PoolReplica` deployments behind local Ray Serve handles; the ingress is
`fleet_app`, exercised in-process over ASGI. What a real cluster adds (the HTTP proxy, replica
processes, restarts) is in test_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from specserve.fleet.config import FleetConfig, live_settings, parse_fleet, pool_values
from specserve.fleet.flags import LIVE_FIELDS
from specserve.fleet.ingress import FleetContexts, fleet_app
from specserve.server.settings import ServerSettings
from tests.fleet.conftest import LOOPY, two_pools


def local_pool(name: str, config: FleetConfig) -> Any:
    from ray import serve

    from specserve.fleet.replica import PoolReplica

    pool = config.pools[name]
    fixed = {k: v for k, v in pool_values(pool).items() if k not in LIVE_FIELDS}
    deployment = serve.deployment(name=f"pool-{name}", user_config=live_settings(pool))
    app = deployment(PoolReplica).bind(name, fixed)
    return serve.run(app, name=name, route_prefix=None, _local_testing_mode=True)


@pytest.fixture(scope="module")
def fleet(fleet_model: Path) -> Iterator[tuple[FleetContexts, dict[str, Any]]]:
    config = parse_fleet(two_pools(fleet_model), "test")
    handles = {name: local_pool(name, config) for name in config.pools}
    yield FleetContexts(config, handles), handles


def call(contexts: FleetContexts, fn: Any, guard: ServerSettings | None = None) -> Any:
    app = fleet_app(contexts, guard or ServerSettings(model_id="fleet"))

    async def run() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as client:
            return await fn(client)

    return asyncio.run(run())


def gen(max_new: int = 24, **params: Any) -> dict[str, Any]:
    return {"inputs": LOOPY, "parameters": {"max_new_tokens": max_new, "details": True, **params}}


def drafted(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    details = response.json()["details"]
    assert details["finish_reason"] == "length"
    return int(details["drafted_tokens"])


def test_each_route_reaches_its_pool(fleet: tuple[FleetContexts, Any]) -> None:
    contexts, _ = fleet

    async def go(c: httpx.AsyncClient) -> None:
        assert drafted(await c.post("/generate", json=gen())) == 0  # default: chat, N=0
        code = {"x-specserve-pool": "code"}
        assert drafted(await c.post("/generate", json=gen(), headers=code)) > 0
        assert drafted(await c.post("/generate", json=gen(model="smol-code"))) > 0
        # by path; greedy, EOS ignored: a sampled reply could end or wander before any draft
        completion = {"prompt": LOOPY, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        r = await c.post("/v1/completions", json=completion)
        usage = r.json()["usage"]["completion_tokens_details"]
        assert r.status_code == 200
        assert usage["accepted_prediction_tokens"] + usage["rejected_prediction_tokens"] > 0
        body = {"model": "smol-code", "messages": [{"role": "user", "content": LOOPY}]}
        # OpenAI samples by default (fresh seed): ignore_eos, or an early EOS ends it "stop".
        r = await c.post("/v1/chat/completions", json={**body, "max_tokens": 8, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        r = await c.post("/generate", json=gen(), headers={"x-specserve-pool": "gpu"})
        assert r.status_code == 422
        assert "no pool named 'gpu'; the pools are chat, code" in r.json()["error"]

    call(contexts, go)


def test_bad_input_gets_serves_4xx_against_the_pools_limits(
    fleet: tuple[FleetContexts, Any],
) -> None:
    contexts, _ = fleet

    async def go(c: httpx.AsyncClient) -> None:
        r = await c.post("/generate", json=gen(speculate=2))  # chat pool: N=0
        assert r.status_code == 422
        assert "between 0 and 0 (the server's --speculate)" in r.json()["error"]
        r = await c.post("/generate", json=gen(speculate=2), headers={"x-specserve-pool": "code"})
        assert r.status_code == 200
        long = {"inputs": "fox " * 200, "parameters": {"max_new_tokens": 4}}
        r = await c.post("/generate", json=long)
        assert r.status_code == 422 and "the limit is 64 (--max-input-tokens)" in r.text
        r = await c.post("/v1/completions", json={"prompt": "fox " * 200})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        headers = {"x-specserve-pool": "code", "content-type": "application/json"}
        r = await c.post("/generate", content=b"{not json", headers=headers)
        assert r.status_code == 400

    call(contexts, go)


def test_streams_through_the_pool_handles(fleet: tuple[FleetContexts, Any]) -> None:
    contexts, _ = fleet

    async def go(c: httpx.AsyncClient) -> None:
        code = {"x-specserve-pool": "code"}
        r = await c.post("/generate_stream", json=gen(20), headers=code)
        events = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        assert len(events) == 20 and "error" not in events[-1]
        assert events[-1]["details"]["drafted_tokens"] > 0
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True}
        body["ignore_eos"] = True  # sampled with a fresh seed: an early EOS would end it "stop"
        r = await c.post("/v1/chat/completions", json=body)
        lines = [x[5:].strip() for x in r.text.splitlines() if x.startswith("data:")]
        assert lines[-1] == "[DONE]"
        finish = [json.loads(x)["choices"][0]["finish_reason"] for x in lines[1:-1]]
        assert finish[-1] == "length"

    call(contexts, go)


def test_metrics_and_info_per_pool(fleet: tuple[FleetContexts, Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    contexts, _ = fleet

    async def go(c: httpx.AsyncClient) -> tuple[str, dict[str, Any]]:
        await c.post("/generate", json=gen(), headers={"x-specserve-pool": "code"})
        return (await c.get("/metrics")).text, (await c.get("/info")).json()

    text, info = call(contexts, go)
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def value(name: str, **labels: str) -> float:
        return sum(
            s.value for s in samples if s.name == name and labels.items() <= s.labels.items()
        )

    assert value("specserve_requests_total", pool="code", outcome="success") >= 1
    assert value("specserve_spec_drafted_tokens_total", pool="code") > 0
    assert value("specserve_spec_drafted_tokens_total", pool="chat") == 0
    replicas = {s.labels.get("replica") for s in samples if s.name == "specserve_batch_size"}
    assert len(replicas) == 2 and None not in replicas  # one engine per pool, each labelled
    assert set(info["pools"]) == {"chat", "code"}
    code = info["pools"]["code"]
    assert code["settings"]["speculate"] == 4 and len(code["replicas"]) == 1
    assert code["engine"]["speculation"]["speculate"] == 4
    assert info["pools"]["chat"]["engine"]["speculation"]["proposer"] is None


def test_admission_auth_and_body_limits_as_serve(fleet: tuple[FleetContexts, Any]) -> None:
    contexts, _ = fleet
    guard = ServerSettings(model_id="fleet", api_key="sekrit", max_body_bytes=1000)
    auth = {"Authorization": "Bearer sekrit", "x-specserve-pool": "code"}

    async def go(c: httpx.AsyncClient) -> None:
        assert (await c.post("/generate", json=gen())).status_code == 401
        r = await c.post("/generate", json={"inputs": "x" * 2000}, headers=auth)
        assert r.status_code == 413
        slow = gen(400, ignore_eos=True, speculate=0)
        # the code pool admits 2 requests at a time (max_concurrent_requests)
        results = await asyncio.gather(
            *(c.post("/generate", json=slow, headers=auth) for _ in range(3))
        )
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 200, 429], codes
        assert next(r for r in results if r.status_code == 429).headers["retry-after"] == "1"

    call(contexts, go, guard)


def test_live_settings_reach_the_pool(fleet: tuple[FleetContexts, Any]) -> None:
    contexts, handles = fleet
    config = contexts.config
    assert config is not None
    live = {**live_settings(config.pools["chat"]), "speculate": 3}

    async def go(c: httpx.AsyncClient) -> None:
        assert drafted(await c.post("/generate", json=gen())) == 0
        await handles["chat"].reconfigure.remote(live)
        contexts.refresh()
        assert drafted(await c.post("/generate", json=gen(speculate=3))) > 0
        await handles["chat"].reconfigure.remote({**live, "speculate": 0})
        contexts.refresh()
        assert drafted(await c.post("/generate", json=gen())) == 0

    call(contexts, go)
