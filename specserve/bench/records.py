"""What a bench cell recorded: its key, one `RequestRecord` per request as the client saw it,
and the JSON form of a list of cells (results.json's `cells`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["closed", "open"]


@dataclass(frozen=True)
class CellKey:
    workload: str
    speculate: int  # the per-request cap N (or the launched server's N)
    mode: Mode
    load: float  # concurrency (closed) or request rate in req/s (open)


@dataclass
class RequestRecord:
    """One request as the client saw it. Times in seconds; `start` is from the cell's start."""

    item_id: str
    route: str  # "generate_stream" | "chat"
    start: float
    ok: bool = False
    status: int = 0
    error: str | None = None
    ttft: float | None = None  # send -> first token
    decode_s: float | None = None  # first token -> last token
    e2e: float | None = None  # send -> end of stream
    gaps: list[float] = field(default_factory=list)  # between token-carrying events
    output_tokens: int = 0
    drafted: int | None = None  # None: the route did not report it
    accepted: int | None = None
    spec_steps: int | None = None  # steps of this request that verified drafts
    finish_reason: str | None = None
    # the reply text, kept for a conversation turn that has a next and for a structured item
    reply: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # the deltas merged by index


@dataclass
class Cell:
    key: CellKey
    duration_s: float  # cell start -> last request finished
    records: list[RequestRecord]
    server: dict[str, float] = field(default_factory=dict)  # /metrics counter deltas


# ------------------------------------------------------------------------------ records
def cells_to_json(cells: list[Cell]) -> list[dict[str, Any]]:
    return [asdict(c) for c in cells]


def cells_from_json(raw: list[dict[str, Any]]) -> list[Cell]:
    return [
        Cell(
            CellKey(**c["key"]),
            c["duration_s"],
            [RequestRecord(**r) for r in c["records"]],
            c.get("server") or {},
        )
        for c in raw
    ]
