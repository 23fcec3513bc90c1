"""select_pool over literal rule tables."""

from __future__ import annotations

import pytest

from specserve.fleet.config import parse_fleet
from specserve.fleet.routing import Router, UnknownPool

FLEET = {
    "default_pool": "chat",
    "pools": {"code": {}, "chat": {}, "bulk": {}},
    "routes": [
        {"header": {"X-Specserve-Pool": "*"}},
        {"header": {"x-tier": "batch"}, "pool": "bulk"},
        {"model": "smollm2-code", "pool": "code"},
        {"path": "/v1/completions", "pool": "code"},
    ],
}
ROUTER = Router.of(parse_fleet(FLEET, "test"))

CASES = [
    # (path, headers, model, pool)
    ("/generate", {}, None, "chat"),  # nothing matches: the default
    ("/generate", {"x-specserve-pool": "bulk"}, None, "bulk"),
    ("/v1/completions", {"x-specserve-pool": "chat"}, "smollm2-code", "chat"),  # header first
    ("/generate", {"x-tier": "batch"}, None, "bulk"),
    ("/generate", {"x-tier": "interactive"}, None, "chat"),  # another value: no match
    ("/v1/chat/completions", {"x-tier": "batch"}, "smollm2-code", "bulk"),  # rule order
    ("/v1/chat/completions", {}, "smollm2-code", "code"),
    ("/v1/chat/completions", {}, "other-model", "chat"),
    ("/v1/completions", {}, None, "code"),
    ("/v1/completions/", {}, None, "chat"),  # paths match exactly
    ("/generate", {}, "smollm2-code", "code"),  # TGI parameters.model
]


@pytest.mark.parametrize(("path", "headers", "model", "pool"), CASES)
def test_select_pool(path: str, headers: dict[str, str], model: str | None, pool: str) -> None:
    assert ROUTER.select_pool(path, headers, model) == pool


def test_unknown_pool_in_the_header_names_the_pools() -> None:
    with pytest.raises(UnknownPool, match="no pool named 'gpu'; the pools are bulk, chat, code"):
        ROUTER.select_pool("/generate", {"x-specserve-pool": "gpu"}, None)


def test_no_routes_means_the_default() -> None:
    router = Router.of(parse_fleet({"default_pool": "a", "pools": {"a": {}, "b": {}}}, "t"))
    assert router.select_pool("/v1/completions", {"x-specserve-pool": "b"}, "b") == "a"
