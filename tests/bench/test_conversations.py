"""Conversation workloads: `follows` chains, their file format, and both benches feeding each
turn the reply the previous one actually got."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from specserve.bench.loadgen import Budget, GenSettings, run_cell
from specserve.bench.records import CellKey
from specserve.bench.reuse_workloads import TURNS
from specserve.bench.workload_items import (
    ChatMessage,
    WorkloadItem,
    conversations,
    load_workload,
    with_history,
    write_workload,
)
from specserve.bench.workloads import build_workload


def chat(item_id: str, text: str, follows: str | None = None) -> WorkloadItem:
    return WorkloadItem(item_id, "w", messages=(ChatMessage("user", text),), follows=follows)


def test_conversations_group_turns_in_order() -> None:
    items = [chat("a0", "x"), chat("b0", "y"), chat("a1", "x2", "a0"), chat("a2", "x3", "a1")]
    assert [[i.id for i in u] for u in conversations(items)] == [["a0", "a1", "a2"], ["b0"]]
    sent = with_history(items[2], (ChatMessage("user", "x"), ChatMessage("assistant", "r")))
    assert [m.role for m in sent.messages or ()] == ["user", "assistant", "user"]


@pytest.mark.parametrize(
    ("items", "problem"),
    [
        ([chat("a1", "x", "a0"), chat("a0", "y")], "no earlier item"),
        ([chat("a0", "x"), chat("a1", "y", "a0"), chat("a2", "z", "a0")], "followed by two"),
    ],
)
def test_bad_chains_are_refused(tmp_path: Path, items: list[WorkloadItem], problem: str) -> None:
    path = tmp_path / "bad.jsonl"
    write_workload(path, items)
    with pytest.raises(ValueError, match=problem):
        load_workload(path)


def test_follows_round_trips_and_needs_messages(tmp_path: Path) -> None:
    items = [chat("a0", "x"), chat("a1", "y", "a0")]
    write_workload(tmp_path / "c.jsonl", items)
    assert load_workload(tmp_path / "c.jsonl") == items
    assert "follows" not in json.loads((tmp_path / "c.jsonl").read_text().splitlines()[0])
    with pytest.raises(ValueError, match="follows"):
        WorkloadItem("p", "w", prompt="raw", follows="a0")


def test_multiturn_builder_chains_turns_of_one_file() -> None:
    items = build_workload("code-edit-multiturn", 2 * TURNS, seed=0)
    units = conversations(items)
    assert [len(u) for u in units] == [TURNS, TURNS]
    for unit in units:
        assert len({i.id.split(":")[1] for i in unit}) == 1  # the same file throughout
        assert "Here is the Python module" in unit[0].text
        assert all("Here is" not in i.text and i.follows for i in unit[1:])


def test_doc_qa_shares_documents_and_repeats_questions() -> None:
    items = build_workload("doc-qa", 6, seed=0)
    docs = {i.text.split("Question:")[0] for i in items}
    assert len(docs) == 1
    questions = [i.text.split("Question: ")[1] for i in items]
    assert any(q.endswith(questions[0]) and q != questions[0] for q in questions)


def test_loadgen_sends_each_turn_with_the_reply_it_got() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        reply = f"reply{len(bodies)}"
        chunks = [
            {"choices": [{"delta": {"content": reply[:3]}}]},
            {"choices": [{"delta": {"content": reply[3:]}, "finish_reason": "length"}]},
            {"usage": {"completion_tokens": 2}},
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    items = [chat("a0", "first"), chat("a1", "second", "a0")]

    async def go() -> list[object]:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            key = CellKey("w", 0, "closed", 1)
            records, _ = await run_cell(client, items, key, Budget(1), GenSettings())
            return list(records)

    records = asyncio.run(go())
    assert [r.item_id for r in records] == ["a0", "a1"]  # type: ignore[attr-defined]
    assert bodies[1]["messages"] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply1"},
        {"role": "user", "content": "second"},
    ]
    assert records[0].reply == "reply1" and records[1].reply is None  # type: ignore[attr-defined]
