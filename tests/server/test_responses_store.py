"""Stored responses: bounded per tenant, least recently used first out, and invisible to other
tenants; over HTTP, another API key can neither read nor continue nor delete a response."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specserve.server.responses_schemas import ResponseObject
from specserve.server.responses_store import ResponseStore, Stored
from tests.server.conftest import TINY_FLAGS, Server, start_server

KEYS = ("responses-key-one", "responses-key-two")


def stored(rid: str) -> Stored:
    response = ResponseObject(id=rid, created_at=0, status="completed", model="m", output=[])
    return Stored(response, [{"role": "user", "content": rid}])


def test_each_tenant_keeps_its_most_recently_used() -> None:
    store = ResponseStore(per_tenant=2)
    for rid in ("a", "b"):
        store.put("t1", stored(rid))
    store.put("t2", stored("c"))
    assert store.get("t1", "a") is not None  # used: "b" is now the oldest of t1
    store.put("t1", stored("d"))
    assert store.get("t1", "b") is None
    assert [store.get("t1", r) is not None for r in ("a", "d")] == [True, True]
    assert store.get("t2", "c") is not None and len(store) == 3  # t1's puts evicted none of t2's


def test_another_tenant_finds_nothing() -> None:
    store = ResponseStore()
    store.put("t1", stored("a"))
    assert store.get("t2", "a") is None and store.get(None, "a") is None
    assert not store.delete("t2", "a") and store.get("t1", "a") is not None
    assert store.delete("t1", "a") and store.get("t1", "a") is None


@pytest.fixture(scope="module")
def keyed_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text("\n".join(KEYS) + "\n")
    path.chmod(0o600)
    log = tmp_path_factory.mktemp("logs") / "responses-tenants.log"
    server = start_server(
        ["--model", str(tiny_model), *TINY_FLAGS, "--api-key-file", str(path)], log
    )
    yield server
    server.stop()


def test_another_key_cannot_read_a_stored_response(keyed_server: Server) -> None:
    def call(method: str, path: str, key: str, body: object = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        url = keyed_server.url + "/v1/responses" + path
        return httpx.request(method, url, json=body, headers=headers, timeout=120)

    body = {"input": "hello", "max_output_tokens": 3}
    made = call("POST", "", KEYS[0], body)
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    assert call("GET", f"/{rid}", KEYS[0]).json()["output"] == made.json()["output"]
    assert call("GET", f"/{rid}", KEYS[1]).status_code == 404
    follow = call("POST", "", KEYS[1], {**body, "previous_response_id": rid})
    assert follow.status_code == 404 and "previous_response_id" in follow.text
    assert call("DELETE", f"/{rid}", KEYS[1]).status_code == 404
    assert call("POST", "", KEYS[0], {**body, "previous_response_id": rid}).status_code == 200
