"""Reasoning and calls split out of a chat reply (server/reasoning.py, server/chat_reply.py):
whole and streamed in pieces of every size, the stream's chunks agreeing with the whole reply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specserve.outputs import RequestOutput
from specserve.request import FinishReason, SamplingParams
from specserve.server.chat_reply import ReplyStream, reply_message
from specserve.server.openai_stream import ChatChunks
from specserve.server.params import Prepared
from specserve.server.reasoning import Reasoning, ReasoningStream, split
from specserve.server.tool_formats import HERMES
from specserve.server.tools import NO_TOOLS, ToolPlan, tool_plan

CALL = '<tool_call>\n{"name": "f", "arguments": {"a": "</think>"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(
    ("text", "inside", "want"),
    [
        ("<think>Hm, 2+2.</think>\n\nIt is 4.", False, ("Hm, 2+2.", "It is 4.")),
        ("\n<think>a</think>b", False, ("a", "b")),
        ("Hm.\n</think>\n\n4", True, ("Hm.\n", "4")),
        ("Hm, still thinking", True, ("Hm, still thinking", "")),  # cut short
        ("<think>cut", False, ("cut", "")),
        ("Just 4. <think>", False, (None, "Just 4. <think>")),
    ],
)  # fmt: skip
def test_split_whole_and_in_pieces(text: str, inside: bool, want: tuple[Any, str]) -> None:
    assert split(text, inside) == want
    for size in (1, 2, 3, 7):
        stream = ReasoningStream(inside)
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        fed = [stream.feed(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]
        reasoning = "".join(r for r, _ in fed)
        assert (reasoning if want[0] is not None else None, "".join(c for _, c in fed)) == want


def feed_all(stream: ReplyStream, text: str, size: int) -> list[Any]:
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    return [stream.feed(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_reasoning_then_calls_whole_and_streamed(size: int) -> None:
    plan = tool_plan(TOOLS, "required", HERMES, think="block")
    text = f"<think>Call f.</think>\n\n{CALL}\n{CALL}"
    message, is_calls = reply_message(text, plan, Reasoning(False))
    assert is_calls and message.content is None and message.reasoning_content == "Call f."
    assert message.tool_calls and len(message.tool_calls) == 2
    fed = feed_all(ReplyStream(plan, Reasoning(False)), text, size)
    assert "".join(p.reasoning for p in fed) == "Call f." and not any(p.content for p in fed)
    deltas = [d for p in fed for d in p.calls]
    starts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["function"]) for d in starts] == [
        (0, {"name": "f", "arguments": ""}),
        (1, {"name": "f", "arguments": ""}),
    ]
    for i, call in enumerate(message.tool_calls):
        pieces = [d["function"]["arguments"] for d in deltas if d["index"] == i]
        assert "".join(pieces) == call["function"]["arguments"] == '{"a": "</think>"}'
    assert fed[-1].is_calls and not any(p.is_calls for p in fed[:-1])


def test_text_under_auto_streams_as_content() -> None:
    plan = tool_plan(TOOLS, "auto", HERMES)
    fed = feed_all(ReplyStream(plan, None), "Hello there", 1)
    assert "".join(p.content for p in fed) == "Hello there" and not any(p.calls for p in fed)
    assert reply_message("Hello there", plan, None) == (
        reply_message("Hello there", NO_TOOLS, None)
    )
    assert not fed[-1].is_calls


def test_a_call_cut_short_is_not_calls() -> None:
    plan = tool_plan(TOOLS, "required", HERMES)
    message, is_calls = reply_message(CALL[:-5], plan, None)
    assert not is_calls and message.content == CALL[:-5]
    assert not feed_all(ReplyStream(plan, None), CALL[:-5], 3)[-1].is_calls


def output(text: str, finished: bool) -> RequestOutput:
    reason = FinishReason.STOP if finished else None
    return RequestOutput("r", [1], text, finished, reason, 3, 1)


def chunks_of(plan: ToolPlan, reasoning: Reasoning | None, texts: list[str]) -> list[Any]:
    prep = Prepared([1, 2, 3], SamplingParams(max_new_tokens=8), plan, reasoning)
    chunks = ChatChunks("r", 0, "m", 1, prep, False, lambda entries: None)
    out = []
    for i, text in enumerate(texts):
        for c in chunks(0, output(text, i == len(texts) - 1)):
            out.append(json.loads(c if isinstance(c, str) else c.model_dump_json()))
    return [c["choices"][0] for c in out]


def test_the_chat_stream_sends_reasoning_content_then_calls() -> None:
    plan = tool_plan(TOOLS, "required", HERMES, think="inside")
    choices = chunks_of(plan, Reasoning(True), ["Hm", ".</thi", "nk>\n\n", CALL[:30], CALL[30:]])
    deltas = [c["delta"] for c in choices]
    assert "".join(d["reasoning_content"] or "" for d in deltas) == "Hm."
    assert not any(d["content"] for d in deltas)
    calls = [tc for d in deltas for tc in d["tool_calls"] or []]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "f"
    assert choices[-1]["finish_reason"] == "tool_calls"
    plain = chunks_of(NO_TOOLS, Reasoning(False), ["<think>a</think>", "b"])
    assert [(c["delta"]["reasoning_content"], c["delta"]["content"]) for c in plain[:2]] == [
        ("a", None),
        (None, "b"),
    ]
    assert plain[-1]["finish_reason"] == "stop"


def test_one_tool_call_delta_a_chunk() -> None:
    """Two calls whose headers and arguments come out of one output: a chunk each, as OpenAI
    sends them (clients merge a chunk's tool_calls into their snapshot by index: the openai
    SDK's stream helper and instructor's partials lost arguments sent beside their header)."""
    plan = tool_plan(TOOLS, "required", HERMES, think="block")
    choices = chunks_of(plan, Reasoning(False), [f"<think>Hm.</think>\n\n{CALL}\n{CALL}"])
    deltas = [c["delta"] for c in choices]
    assert [d["reasoning_content"] for d in deltas if d["reasoning_content"]] == ["Hm."]
    assert deltas[0]["reasoning_content"] == "Hm."
    calls = [d["tool_calls"] for d in deltas if d["tool_calls"]]
    assert all(len(c) == 1 for c in calls) and len(calls) == 4  # header, arguments; twice
    assert [c[0]["index"] for c in calls] == [0, 0, 1, 1]
    assert [c[0]["function"]["arguments"] for c in calls] == ["", '{"a": "</think>"}'] * 2
    assert choices[-1]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_json_that_begins_as_calls_do_ends_as_content(size: int) -> None:
    """Our own syntax's calls and a response_format's JSON both open with `{`: a reply that
    turns out not to be a call goes out as content when it ends, streamed or whole."""
    plan = tool_plan(TOOLS, "auto", reply={"type": "object"})
    text = '{"name": "Tom", "age": 3}'
    fed = feed_all(ReplyStream(plan, None), text, size)
    assert "".join(p.content for p in fed) == text and not any(p.calls for p in fed)
    message, is_calls = reply_message(text, plan, None)
    assert not is_calls and message.content == text
