"""Deeply nested `grammar` / `tools` values are a 4xx, never a 500 (issue 24, item 11): the
Unicode check walks a value without recursion."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from specserve.grammar import grammar_text
from specserve.grammar_limits import schema_patterns
from specserve.request import GrammarSpec
from specserve.server.errors import ApiError
from specserve.server.grammars import schema_spec
from specserve.server.schemas import check_unicode
from specserve.server.tools import as_call, calls_text, parse_tools, tool_plan
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


DEEP = 100_000  # far past Python's recursion limit: a recursive parse or walk overflows


def test_schemas_and_arguments_nested_too_deep_are_refused_by_name() -> None:
    """Issue 54 item 4: json.loads raises RecursionError (not a decode error) on a schema or
    a tool call's arguments sent as a string nested ~100k deep, the recursive walk for a
    schema's patterns overflowed ~500 levels down, and a deeply nested call in the output made
    `as_call` raise. Each is now a 4xx naming the depth (or, for the output, text)."""
    deep_text = "[" * DEEP + "]" * DEEP
    deep_value: object = {}
    for _ in range(5000):
        deep_value = {"type": "object", "properties": {"a": deep_value}}
    with pytest.raises(ApiError, match="nested over 100 levels"):
        schema_spec(deep_text, "parameters.grammar.value")
    with pytest.raises(ApiError, match="nested over 100 levels"):
        schema_spec(deep_value, "response_format.json_schema.schema")
    with pytest.raises(ValueError, match="nested over 100 levels"):
        grammar_text(GrammarSpec("json_schema", deep_text))
    assert schema_patterns({"pattern": "a", "items": [deep_value, {"pattern": "b"}]}) == ["a", "b"]
    call = {"type": "function", "function": {"name": "f", "arguments": deep_text}}
    with pytest.raises(ApiError, match="nested over 100 levels"):
        calls_text([call], "messages[1].tool_calls")
    tool = {"type": "function", "function": {"name": "f", "parameters": deep_value}}
    with pytest.raises(ApiError, match="nested over 100 levels"):
        parse_tools([tool])
    plan = tool_plan([{"type": "function", "function": {"name": "f"}}], "required")
    reply = '{"name": "f", "arguments": {"a": ' + deep_text + "}}"
    assert as_call(reply, plan) is None  # too deep to be a call: the reply stays text
    assert as_call('{"name": "f", "arguments": {"a": [[1]]}}', plan) is not None


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/generate", {"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": "%s"}}}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": "%s"},
                },
            },
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": "%s"}}
                        ],
                    },
                    {"role": "user", "content": "and?"},
                ]
            },
        ),
    ],
)
def test_json_in_a_string_nested_too_deep_is_a_4xx(
    tiny_server: Server, route: str, body: dict[str, object]
) -> None:
    deep = 40_000  # the tiny server takes bodies up to 200 KB
    text = json.dumps(body).replace('"%s"', json.dumps("[" * deep + "]" * deep))
    r = httpx.post(
        tiny_server.url + route,
        content=text.encode(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert 400 <= r.status_code < 500, r.text[:300]
    assert "nested over 100 levels" in r.text


def test_the_fleet_ingress_reads_a_model_name_past_any_depth() -> None:
    """The ingress parses a body for its model name; one nested past the parser's depth is
    the route's to refuse (a 4xx there), not a 500 here."""
    from starlette.requests import Request

    from specserve.fleet.ingress import _model_of

    body = ("[" * DEEP + "]" * DEEP).encode()

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "headers": [], "path": "/generate"}
    assert asyncio.run(_model_of(Request(scope, receive))) is None
