"""Deeply nested `grammar` / `tools` values are a 4xx, never a 500 (issue 24, item 11): the
Unicode check walks a value without recursion."""

from __future__ import annotations

import httpx
import pytest

from specserve.server.schemas import check_unicode
from tests.server.conftest import Server


def test_check_unicode_walks_any_depth() -> None:
    deep: list[object] = ["ok"]
    for _ in range(100_000):
        deep = [deep, {"k": "v"}]
    assert check_unicode(deep) is deep
    bad: object = "\ud800"
    for _ in range(100_000):
        bad = {"a": [bad]}
    with pytest.raises(ValueError, match="lone surrogate U\\+D800"):
        check_unicode(bad)


@pytest.mark.parametrize(
    ("route", "template"),
    [
        ("/generate", '{"inputs": "hi", "parameters": {"grammar": {"a": %s}}}'),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "tools": [%s]}',
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi", "tool_calls": [{"a": %s}]}]}',
        ),
    ],
)
def test_deeply_nested_values_are_a_4xx(tiny_server: Server, route: str, template: str) -> None:
    # Up to the depth where the JSON parser itself gives up (a 400), through the depths where
    # the recursive check overflowed the stack (956 on the chat route, probed).
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=tiny_server.url, headers=headers) as client:
        for depth in range(900, 1001):
            body = template % ("[" * depth + "]" * depth)
            r = client.post(route, content=body.encode())
            assert 400 <= r.status_code < 500, (depth, r.text[:300])
