"""spec_ledger's steps and cells: a step's time by part (`Step`), a cell's steps and verified
drafts (`Ledger`), their summary (`summarise`) and the table (`report`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PARTS = ("propose", "decide", "forward", "verify", "other")


@dataclass
class Step:
    """One engine step: wall seconds by part, and what it did."""

    seconds: dict[str, float]
    sequences: int  # sequences in the forward pass
    rows: int  # tokens it fed (prompt chunks, last tokens, drafts)
    in_flight: int  # requests admitted and unfinished when it started (running or waiting)
    extra_rows: int  # drafted tokens verified
    proposed: bool = False  # the proposer was asked for drafts (its `propose` ran)


@dataclass
class Ledger:
    steps: list[Step] = field(default_factory=list)
    # per verified draft: (tokens verified, tokens accepted, calibrated expected accepted)
    drafts: list[tuple[int, int, float]] = field(default_factory=list)


def _median_ms(seconds: np.ndarray) -> float | None:
    return 1e3 * float(np.median(seconds)) if seconds.size else None


def summarise(ledger: Ledger, slots: int, tokens: int, wall: float) -> dict[str, Any]:
    """A cell's ledger as per-step means (ms), rates and counts."""
    steps = ledger.steps
    ms = {p: 1e3 * statistics.fmean(s.seconds[p] for s in steps) for p in PARTS}
    extra = np.array([s.extra_rows for s in steps], dtype=np.float64)
    forward = np.array([s.seconds["forward"] for s in steps])
    # decode-only steps of a full batch: one row a sequence and its verified drafts
    full = np.array([s.sequences == slots and s.rows == slots + s.extra_rows for s in steps])
    # the first step with fewer requests in flight than slots: none was left to admit
    drain_at = next((i for i, s in enumerate(steps) if s.in_flight < slots), len(steps))
    verified = sum(d[0] for d in ledger.drafts)
    accepted = sum(d[1] for d in ledger.drafts)
    plain = full & (extra == 0)
    drafted = full & (extra > 0)
    # what one call of the proposer costs where it runs, apart from how often the policy asks
    asked = [s.seconds["propose"] for s in steps if s.proposed]
    return {
        "tok_s": tokens / wall,
        "steps": len(steps),
        "ms_per_step": ms,
        "ms_total": sum(ms.values()),
        "extra_rows_per_step": float(extra.mean()),
        "tokens_per_step": tokens / len(steps),
        "drain_steps": len(steps) - drain_at,
        "drain_share_of_time": sum(sum(s.seconds.values()) for s in steps[drain_at:])
        / sum(sum(s.seconds.values()) for s in steps),
        "forward_ms_full_no_drafts": 1e3 * float(np.median(forward[plain]))
        if plain.any()
        else None,
        "forward_ms_full_with_drafts": 1e3 * float(np.median(forward[drafted]))
        if drafted.any()
        else None,
        "extra_rows_full_with_drafts": float(np.median(extra[drafted])) if drafted.any() else None,
        "verified_drafts": len(ledger.drafts),
        "verified_tokens": verified,
        "accepted_tokens": accepted,
        "predicted_accepted": float(sum(d[2] for d in ledger.drafts)),
        "proposing_steps": len(asked),
        "propose_ms_when_asked": _median_ms(np.array(asked)),
    }


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def report(result: dict[str, Any]) -> str:
    cells = result["cells"]
    head = (
        "| workload | round | side | tok/s | ratio | steps | drain steps (time) | ms/step: "
        + " / ".join(PARTS)
        + " | extra rows/step | forward ms, full batch: no drafts / drafts (extra rows) "
        "| verified / accepted / predicted | not proposed: unpaid steps "
        "| proposing steps: propose ms (median) |"
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    base: dict[tuple[str, int], float] = {
        (c["workload"], c["round"]): c["tok_s"] for c in cells if c["side"] == "N=0"
    }
    for c in cells:
        ms = c["ms_per_step"]
        ratio = c["tok_s"] / base[(c["workload"], c["round"])]
        lines.append(
            f"| {c['workload']} | {c['round']} | {c['side']} | {c['tok_s']:.1f} | {ratio:.3f} "
            f"| {c['steps']} | {c['drain_steps']} ({100 * c['drain_share_of_time']:.0f}%) | "
            + " / ".join(f"{ms[p]:.2f}" for p in PARTS)
            + f" | {c['extra_rows_per_step']:.2f} | {_fmt(c['forward_ms_full_no_drafts'])} / "
            f"{_fmt(c['forward_ms_full_with_drafts'])} "
            f"({_fmt(c['extra_rows_full_with_drafts'], '.0f')}) "
            f"| {c['verified_tokens']} / {c['accepted_tokens']} / {c['predicted_accepted']:.0f} "
            f"| {c.get('unpaid_steps', '-')} "
            f"| {c.get('proposing_steps', '-')}: {_fmt(c.get('propose_ms_when_asked'))} |"
        )
    return "\n".join(lines)
