"""spec_bench's report: one row per (workload, proposer, N) over its prompts, and the tables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from specserve.bench.machine import machine_lines, markdown_table


@dataclass(frozen=True)
class Run:
    """One request at one N."""

    workload: str
    item_id: str
    proposer: str  # "none" for the N = 0 baseline
    n: int
    prompt_tokens: int
    tokens: list[int]  # generated ids
    total_s: float  # submit -> last token
    decode_s: float  # first token -> last token
    steps: int  # engine steps (forward passes) of this request
    prefill_steps: int  # steps up to and including the one that emitted the first token
    draft_steps: int  # steps that verified at least one draft
    drafted: int
    accepted: int
    accepted_per_position: list[int]  # [i]: draft steps that accepted more than i drafts


def summarise(runs: list[Run], configs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """One row per (workload, proposer, N), over that workload's prompts."""
    ref = {r.item_id: r.tokens for r in runs if r.n == 0}
    rows = []
    for workload in dict.fromkeys(r.workload for r in runs):
        base: dict[str, float] = {}
        for proposer, n in configs:
            group = [
                r for r in runs if r.workload == workload and (r.proposer, r.n) == (proposer, n)
            ]
            row = _row(group, ref)
            base = base or row
            row["speedup"] = row["tok_s"] / base["tok_s"]
            row["decode_speedup"] = row["decode_tok_s"] / base["decode_tok_s"]
            rows.append({"workload": workload, "proposer": proposer, "n": n, **row})
    return rows


def _row(group: list[Run], ref: dict[str, list[int]]) -> dict[str, Any]:
    generated = sum(len(r.tokens) for r in group)
    decode_steps = sum(r.steps - r.prefill_steps for r in group)
    drafted, accepted = sum(r.drafted for r in group), sum(r.accepted for r in group)
    draft_steps = sum(r.draft_steps for r in group)
    width = max((len(r.accepted_per_position) for r in group), default=0)
    return {
        "prompts": len(group),
        "prompt_tokens_mean": sum(r.prompt_tokens for r in group) / len(group),
        "generated": generated,
        "tok_s": generated / sum(r.total_s for r in group),
        "decode_tok_s": (generated - len(group)) / sum(r.decode_s for r in group),
        "decode_steps": decode_steps,
        "tokens_per_step": (generated - len(group)) / max(decode_steps, 1),
        "accepted_per_step": accepted / max(decode_steps, 1),
        "accepted_per_draft_step": accepted / draft_steps if draft_steps else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "accepted_per_position": [
            sum(r.accepted_per_position[i] for r in group if i < len(r.accepted_per_position))
            for i in range(width)
        ],
        "identical": sum(r.tokens == ref.get(r.item_id) for r in group),
    }


_COLUMNS: tuple[tuple[str, str, str], ...] = (  # (header, row key, format)
    ("proposer", "proposer", "s"),
    ("N", "n", "d"),
    ("tok/s", "tok_s", ".1f"),
    ("speedup", "speedup", ".2f"),
    ("decode tok/s", "decode_tok_s", ".1f"),
    ("decode speedup", "decode_speedup", ".2f"),
    ("tokens/step", "tokens_per_step", ".2f"),
    ("acc/step", "accepted_per_step", ".2f"),
    ("acc/draft step", "accepted_per_draft_step", ".2f"),
    ("acceptance", "acceptance_rate", ".2f"),
)


def _cells(row: dict[str, Any]) -> list[str]:
    cells = [format(row[key], fmt) for _, key, fmt in _COLUMNS]
    return [*cells, f"{row['identical']}/{row['prompts']}"]


def render(args: argparse.Namespace, info: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    header = [h for h, _, _ in _COLUMNS] + ["identical"]
    parts = [
        f"## spec_bench: SmolLM2-135M fp32, batch 1, proposers {', '.join(args.proposers)}, "
        f"{args.new_tokens} new tokens, {args.prompts_per_workload} prompts per workload, "
        f"{args.threads} threads\n\n{machine_lines(info)}"
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        best = max(mine, key=lambda r: r["speedup"])
        table = [_cells(r) for r in mine]
        parts.append(
            f"### {workload} (mean prompt {mine[0]['prompt_tokens_mean']:.0f} tokens; "
            f"best: {best['proposer']} N = {best['n']}, {best['speedup']:.2f}x)\n\n"
            f"{markdown_table(header, table)}"
        )
    return "\n\n".join(parts)
