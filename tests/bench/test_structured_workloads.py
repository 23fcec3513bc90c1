"""The structured workloads (extract-json, tool-calls) and the check every reply of theirs gets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specserve.bench.structured_workloads import ARTICLE_SCHEMA, TOOLS, check_reply
from specserve.bench.workloads import build_workload

ARTICLE = {
    "headline": "Storm closes the port",
    "people": ["Ann Lee"],
    "places": ["Sydney"],
    "organisations": [],
    "topic": "disaster",
    "summary": "A storm closed the port.",
}


def call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "index": 0,
        "id": "c0",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def test_extract_items_ask_for_the_article_schema() -> None:
    [item] = build_workload("extract-json", 1, seed=0)
    fields = item.request_fields()
    assert fields["response_format"]["json_schema"]["schema"] == ARTICLE_SCHEMA
    assert item.messages is not None and item.messages[-1].content in item.text


def test_tool_items_alternate_required_and_auto() -> None:
    items = build_workload("tool-calls", 4, seed=0)
    assert [i.request_fields()["tool_choice"] for i in items] == ["required", "auto"] * 2
    assert all(i.request_fields()["tools"] == TOOLS for i in items)


def test_a_reply_that_validates_passes_and_one_that_does_not_fails() -> None:
    [item] = build_workload("extract-json", 1, seed=0)
    assert check_reply(item, json.dumps(ARTICLE), [], "stop") is None
    missing = {k: v for k, v in ARTICLE.items() if k != "topic"}
    assert "'topic' is a required property" in (
        check_reply(item, json.dumps(missing), [], "stop") or ""
    )
    assert "not JSON" in (check_reply(item, '{"headline": "Sto', [], "stop") or "")
    assert "token limit" in (check_reply(item, json.dumps(ARTICLE), [], "length") or "")


@pytest.mark.parametrize(
    ("index", "calls", "text", "problem"),
    [
        (0, [call("get_weather", {"city": "Quito", "unit": "celsius"})], "", None),
        (0, [], "It is sunny.", "no tool call"),  # required: a call or a failure
        (1, [], "It is sunny.", None),  # auto: text is an answer too
        (1, [], '{"name": "get_weather", "argu', "token limit"),  # auto: a call, cut
        (0, [call("get_time", {"city": "Quito"})], "", "not an offered tool"),
        (0, [call("get_weather", {"city": "Quito", "unit": "kelvin"})], "", "'kelvin' is not one"),
        (1, [call("search_news", '{"query": "x", "max_res')], "", "not JSON"),
    ],
)
def test_tool_calls_are_checked_against_the_tools(
    index: int, calls: list[dict[str, Any]], text: str, problem: str | None
) -> None:
    item = build_workload("tool-calls", 2, seed=0)[index]
    finish = "tool_calls" if calls else "length" if text.startswith("{") else "stop"
    got = check_reply(item, text, calls, finish)
    assert got == problem if problem is None else problem in (got or "")
