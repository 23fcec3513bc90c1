"""Benchmark requests and their file format.

A workload file is JSONL, one request per line::

    {"id": str, "workload": str, "prompt": str | null,
     "messages": [{"role": "system" | "user" | "assistant", "content": str}] | null,
     "follows": str,                                                        # optional
     "response_format": {...}, "tools": [...], "tool_choice": ...}          # optional, chat

The last three are sent as they are in the OpenAI chat request (structured outputs and tool
calls); the bench checks each reply against them (`structured_workloads.check_reply`).

Exactly one of ``prompt`` (raw completion; no template) and ``messages`` (chat; the server
applies the model's chat template) is set. ``id`` is unique within a file.

``follows`` makes a chat item the next turn of a conversation: it names an earlier item, and
the request sent is that item's messages, the reply it actually got (as an assistant message),
then this item's own messages. A conversation's turns are sent one after another, each after
the previous reply is complete (`conversations`, `with_history`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specserve.engine.engine import Engine

MAX_PROMPT_CHARS = 5000  # ~1500 SmolLM2 tokens; the 8k context leaves room for the reply
ROLES = frozenset({"system", "user", "assistant"})
STRUCTURED = ("response_format", "tools", "tool_choice")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class WorkloadItem:
    """One benchmark request; exactly one of ``prompt`` / ``messages`` is set."""

    id: str
    workload: str
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    follows: str | None = None  # id of the previous turn of its conversation (chat only)
    # STRUCTURED keys of the chat request, as JSON text of an object (hashable); None: plain
    structured: str | None = None

    def __post_init__(self) -> None:
        if not self.id or not self.workload:
            raise ValueError("'id' and 'workload' must be non-empty strings")
        if self.follows is not None and (self.messages is None or self.follows == self.id):
            raise ValueError("'follows' needs 'messages' and another item's id")
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' and 'messages' must be set")
        if self.structured is not None and self.messages is None:
            raise ValueError(f"{', '.join(STRUCTURED)} need 'messages'")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("'prompt' is empty")
        if self.messages is not None:
            if not self.messages:
                raise ValueError("'messages' is empty")
            bad = [m.role for m in self.messages if m.role not in ROLES]
            if bad:
                raise ValueError(f"unknown role {bad[0]!r}; expected one of {sorted(ROLES)}")

    @property
    def text(self) -> str:
        """All prompt text, for size checks."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.content for m in self.messages or ())

    def to_json(self) -> str:
        messages = None if self.messages is None else [vars(m) for m in self.messages]
        record = {"id": self.id, "workload": self.workload, "prompt": self.prompt}
        record["messages"] = messages  # type: ignore[assignment]
        if self.follows is not None:
            record["follows"] = self.follows
        record.update(self.request_fields())
        return json.dumps(record, ensure_ascii=False)

    def request_fields(self) -> dict[str, Any]:
        """The structured-output and tool fields this chat request carries."""
        return {} if self.structured is None else dict(json.loads(self.structured))

    @classmethod
    def from_json(cls, line: str) -> WorkloadItem:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"invalid JSON: {e}") from None
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        extra = set(record) - {"id", "workload", "prompt", "messages", "follows", *STRUCTURED}
        if extra:
            raise ValueError(f"unknown keys {sorted(extra)}")
        for key in ("id", "workload"):
            _expect(isinstance(record.get(key), str), f"'{key}' must be a string")
        prompt = record.get("prompt")
        _expect(prompt is None or isinstance(prompt, str), "'prompt' must be a string or null")
        raw = record.get("messages")
        _expect(raw is None or isinstance(raw, list), "'messages' must be a list or null")
        messages = None if raw is None else tuple(_message(m) for m in raw)
        follows = record.get("follows")
        _expect(follows is None or isinstance(follows, str), "'follows' must be a string")
        fields = {k: record[k] for k in STRUCTURED if record.get(k) is not None}
        structured = json.dumps(fields, sort_keys=True) if fields else None
        return cls(record["id"], record["workload"], prompt, messages, follows, structured)


def _expect(ok: bool, problem: str) -> None:
    if not ok:
        raise ValueError(problem)


def _message(raw: Any) -> ChatMessage:
    ok = isinstance(raw, dict) and set(raw) == {"role", "content"}
    _expect(ok, "each message must be an object with exactly 'role' and 'content'")
    _expect(all(isinstance(v, str) for v in raw.values()), "message fields must be strings")
    return ChatMessage(raw["role"], raw["content"])


def load_workload(path: str | Path) -> list[WorkloadItem]:
    """Parse a JSONL workload; blank lines are skipped, any other bad line raises."""
    items: list[WorkloadItem] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                items.append(WorkloadItem.from_json(line))
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate ids")
    check_conversations(items, str(path))
    return items


def check_conversations(items: Sequence[WorkloadItem], where: str = "workload") -> None:
    """Each `follows` names an earlier item, and no turn is followed twice."""
    seen: set[str] = set()
    followed: set[str] = set()
    for item in items:
        if item.follows is not None:
            if item.follows not in seen:
                raise ValueError(f"{where}: {item.id!r} follows {item.follows!r}, no earlier item")
            if item.follows in followed:
                raise ValueError(f"{where}: {item.follows!r} is followed by two items")
            followed.add(item.follows)
        seen.add(item.id)


def conversations(items: Sequence[WorkloadItem]) -> list[list[WorkloadItem]]:
    """Items as units that are sent in order: a conversation's turns together (a lone item is
    a conversation of one), ordered by their first turn."""
    check_conversations(items)
    units: list[list[WorkloadItem]] = []
    unit_of: dict[str, list[WorkloadItem]] = {}
    for item in items:
        unit = unit_of[item.follows] if item.follows is not None else []
        if item.follows is None:
            units.append(unit)
        unit.append(item)
        unit_of[item.id] = unit
    return units


def with_history(item: WorkloadItem, history: tuple[ChatMessage, ...]) -> WorkloadItem:
    """`item` as sent: the conversation so far, then its own messages."""
    if not history:
        return item
    assert item.messages is not None
    return replace(item, messages=history + item.messages, follows=None)


def next_history(sent: WorkloadItem, reply: str) -> tuple[ChatMessage, ...]:
    """The conversation after `sent` (as sent, history included) got `reply`."""
    return (*(sent.messages or ()), ChatMessage("assistant", reply))


def write_workload(path: str | Path, items: Sequence[WorkloadItem]) -> None:
    Path(path).write_text("".join(item.to_json() + "\n" for item in items), encoding="utf-8")


def encode_item(engine: Engine, item: WorkloadItem) -> list[int]:
    """Prompt ids as a server would build them: chat through the model's template, raw
    prompts as they are."""
    if item.messages is not None:
        return engine.encode_chat([{"role": m.role, "content": m.content} for m in item.messages])
    assert item.prompt is not None
    return engine.encode(item.prompt)
