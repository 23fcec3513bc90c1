"""Benchmark requests and their file format.

A workload file is JSONL, one request per line::

    {"id": str, "workload": str, "prompt": str | null,
     "messages": [{"role": "system" | "user" | "assistant", "content": str}] | null}

Exactly one of ``prompt`` (raw completion; no template) and ``messages`` (chat; the server
applies the model's chat template) is set. ``id`` is unique within a file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specserve.engine.engine import Engine

MAX_PROMPT_CHARS = 5000  # ~1500 SmolLM2 tokens; the 8k context leaves room for the reply
ROLES = frozenset({"system", "user", "assistant"})


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

    def __post_init__(self) -> None:
        if not self.id or not self.workload:
            raise ValueError("'id' and 'workload' must be non-empty strings")
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' and 'messages' must be set")
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
        return json.dumps({**record, "messages": messages}, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> WorkloadItem:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"invalid JSON: {e}") from None
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        extra = set(record) - {"id", "workload", "prompt", "messages"}
        if extra:
            raise ValueError(f"unknown keys {sorted(extra)}")
        for key in ("id", "workload"):
            _expect(isinstance(record.get(key), str), f"'{key}' must be a string")
        prompt = record.get("prompt")
        _expect(prompt is None or isinstance(prompt, str), "'prompt' must be a string or null")
        raw = record.get("messages")
        _expect(raw is None or isinstance(raw, list), "'messages' must be a list or null")
        messages = None if raw is None else tuple(_message(m) for m in raw)
        return cls(record["id"], record["workload"], prompt, messages)


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
    return items


def write_workload(path: str | Path, items: Sequence[WorkloadItem]) -> None:
    Path(path).write_text("".join(item.to_json() + "\n" for item in items), encoding="utf-8")


def encode_item(engine: Engine, item: WorkloadItem) -> list[int]:
    """Prompt ids as a server would build them: chat through the model's template, raw
    prompts as they are."""
    if item.messages is not None:
        return engine.encode_chat([{"role": m.role, "content": m.content} for m in item.messages])
    assert item.prompt is not None
    return engine.encode(item.prompt)
