"""spec_bench's report: one row per (workload, concurrency, configuration), the side-by-side
ratios the targets name, and each proposer's calibration (predicted vs observed acceptance)."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.machine import machine_lines, markdown_table
from specserve.request import FinishReason


@dataclass(frozen=True)
class Run:
    """One request of one cell."""

    workload: str
    item_id: str
    proposer: str  # "none" for the N = 0 baseline
    n: int
    policy: str  # "static" | "adaptive"
    concurrency: int
    prompt_tokens: int
    tokens: list[int]  # generated ids
    total_s: float  # submit -> last token
    decode_s: float  # first token -> last token
    steps: int  # engine steps while it was in flight
    draft_steps: int  # its steps that verified at least one draft
    drafted: int  # its drafted tokens that were verified
    accepted: int
    finish_reason: str  # a FinishReason, "" for none


CellKey = tuple[str, int, str, str, int]  # (workload, concurrency, proposer, policy, N)


def cell_tok_s(cell: dict[str, Any]) -> float:
    """A cell's generated tokens per wall second, prefill included."""
    return sum(len(r.tokens) for r in cell["runs"]) / cell["wall_s"]


def summarise(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell (`cells`: key, runs, wall_s, counters), with speedups and identical
    outputs against the N = 0 cell of the same workload and concurrency."""
    base = {c["key"][:2]: c for c in cells if c["key"][4] == 0}
    rows = []
    for cell in cells:
        workload, conc, proposer, policy, n = cell["key"]
        ref = base.get((workload, conc))
        row = _row(cell, ref)
        rates = cell.get("repeat_tok_s", [row["tok_s"]])
        ref_rates = ref.get("repeat_tok_s", [cell_tok_s(ref)]) if ref else rates
        paired = [a / b for a, b in zip(rates, ref_rates, strict=True)]
        rows.append(
            {
                "workload": workload,
                "concurrency": conc,
                "proposer": proposer,
                "policy": policy,
                "n": n,
                **row,
                "repeat_tok_s": rates,
                "paired_speedups": paired,
            }
        )
    return rows


def request_ratios(cell: dict[str, Any], ref: dict[str, Any] | None) -> list[float]:
    """Each request against the same request at N = 0: its latency ratio (submit to last
    token). With repeats, the median over the repeats of that ratio, each repeat against the
    N = 0 cell run beside it: one 1-2 s request is as noisy as the machine (10-20 %), its
    median of three much less so."""
    if ref is None:
        return []
    mine = cell.get("repeat_request_s", [{r.item_id: r.total_s for r in cell["runs"]}])
    base = ref.get("repeat_request_s", [{r.item_id: r.total_s for r in ref["runs"]}])
    ratios: dict[str, list[float]] = {}
    for m, b in zip(mine, base, strict=True):
        for item, seconds in m.items():
            if item in b and seconds:
                ratios.setdefault(item, []).append(b[item] / seconds)
    return [statistics.median(r) for r in ratios.values()]


def _row(cell: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any]:
    runs: list[Run] = cell["runs"]
    counters = cell["counters"]
    generated = sum(len(r.tokens) for r in runs)
    tok_s = cell_tok_s(cell)
    decode_s = sum(r.decode_s for r in runs)
    drafted, accepted = counters["drafted"], counters["accepted"]
    decode_rows = max(counters["steps"] - counters["spec_steps"], 0) + counters["spec_steps"]
    ref_tokens = {r.item_id: r.tokens for r in ref["runs"]} if ref else {}
    ref_tok_s = cell_tok_s(ref) if ref else tok_s
    per_request = request_ratios(cell, ref)
    return {
        "requests": len(runs),
        "steps": counters["steps"],
        "prompt_tokens_mean": sum(r.prompt_tokens for r in runs) / max(len(runs), 1),
        "generated": generated,
        "wall_s": cell["wall_s"],
        "tok_s": tok_s,
        "speedup": tok_s / ref_tok_s if ref_tok_s else 0.0,
        "worst_request": min(per_request, default=1.0),
        "decode_tok_s": (generated - len(runs)) / decode_s if decode_s else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "proposed": counters["proposed"],
        "trimmed": counters["trimmed"],
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "accepted_per_draft_step": accepted / max(sum(r.draft_steps for r in runs), 1),
        "tokens_per_row": (accepted + decode_rows) / max(drafted + decode_rows, 1),
        "identical": sum(r.tokens == ref_tokens.get(r.item_id) for r in runs),
        "errors": sum(r.finish_reason == FinishReason.ERROR for r in runs),
    }


_COLUMNS: tuple[tuple[str, str, str], ...] = (  # (header, row key, format)
    ("c", "concurrency", "d"),
    ("tok/s", "tok_s", ".1f"),
    ("vs N=0", "speedup", ".2f"),
    ("worst request vs N=0", "worst_request", ".2f"),
    ("engine steps", "steps", "d"),
    ("decode tok/s/req", "decode_tok_s", ".1f"),
    ("acc/verified draft", "acceptance_rate", ".2f"),
    ("acc/draft step", "accepted_per_draft_step", ".2f"),
    ("tokens/scored row", "tokens_per_row", ".2f"),
    ("proposed", "proposed", "d"),
    ("trimmed", "trimmed", "d"),
)


def paired(row: dict[str, Any]) -> str:
    """The repeats' ratios to N = 0, each against the N = 0 cell of the same repeat (run next to
    it, so the machine's drift between repeats cancels)."""
    return median_range(row["paired_speedups"])


def median_range(ratios: list[float]) -> str:
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def label(row: dict[str, Any]) -> str:
    if row["n"] == 0:
        return "N=0"
    cap = f"adaptive<={row['n']}" if row["policy"] == "adaptive" else f"N={row['n']}"
    return f"{row['proposer']} {cap}"


def _cells(row: dict[str, Any]) -> list[str]:
    cells = [label(row)] + [format(row[key], fmt) for _, key, fmt in _COLUMNS]
    rates = row["repeat_tok_s"]
    spread = f"{min(rates):.1f}-{max(rates):.1f}"
    identical = f"{row['identical']}/{row['requests']}"
    return [*cells, spread, paired(row), identical, str(row["errors"])]


def side_by_side(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Per (workload, concurrency, proposer with an adaptive row): adaptive against N = 0, against
    the best static N of the same proposer, and, where several proposers ran, against the best
    other adaptive proposer of each repeat, all from the same run."""
    out = []
    for r in rows:
        if r["policy"] != "adaptive" or not r["n"]:
            continue
        same = [s for s in rows if s["workload"] == r["workload"]]
        same = [s for s in same if s["concurrency"] == r["concurrency"]]
        static = [s for s in same if s["proposer"] == r["proposer"] and s["policy"] == "static"]
        static = [s for s in static if s["n"]]
        best = max(static, key=lambda s: s["tok_s"], default=None)
        others = [s for s in same if s["policy"] == "adaptive" and s["n"]]
        others = [s for s in others if s["proposer"] != r["proposer"]]
        out.append(
            [
                r["workload"],
                str(r["concurrency"]),
                r["proposer"],
                f"{r['speedup']:.2f}x",
                paired(r),
                f"N={best['n']}: {best['speedup']:.2f}x" if best else "-",
                f"{r['tok_s'] / best['tok_s']:.2f}x" if best else "-",
                against_best(r, others) if others else "-",
            ]
        )
    return out


def against_best(row: dict[str, Any], others: list[dict[str, Any]]) -> str:
    """Per repeat, `row`'s tok/s over the fastest of `others` in that repeat: median (range)."""
    rates = zip(row["repeat_tok_s"], *(o["repeat_tok_s"] for o in others), strict=True)
    return median_range([mine / max(theirs) for mine, *theirs in rates])


def calibration_table(name: str, table: list[dict[str, Any]]) -> str:
    rows = [
        [
            f"{b['low']:.1f}-{b['high']:.1f}",
            str(b["tested"]),
            f"{b['mean_confidence']:.2f}",
            "-" if b["observed"] is None else f"{b['observed']:.2f}",
            f"{b['calibrated']:.2f}",
        ]
        for b in table
        if b["tested"]
    ]
    header = ["confidence", "tested", "predicted (mean)", "observed", "calibrated"]
    return f"### calibration: {name}\n\n{markdown_table(header, rows)}"


def render(
    args: argparse.Namespace,
    info: dict[str, Any],
    rows: list[dict[str, Any]],
    calibrations: dict[str, list[dict[str, Any]]],
) -> str:
    header = ["config"] + [h for h, _, _ in _COLUMNS] + ["tok/s of the repeats"]
    header += ["vs N=0 per repeat: median (range)", "identical", "errors"]
    parts = [
        f"## spec_bench: proposers {', '.join(args.proposers)}, policies {args.policy}, "
        f"concurrency {args.concurrency}, {args.new_tokens} new tokens, "
        f"{args.prompts_per_workload} requests per workload, {args.threads} threads, "
        f"{args.repeats} repeat(s) a cell (the median one by tok/s)\n\n"
        f"{machine_lines(info)}"
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        parts.append(
            f"### {workload} (mean prompt {mine[0]['prompt_tokens_mean']:.0f} tokens)\n\n"
            f"{markdown_table(header, [_cells(r) for r in mine])}"
        )
    pairs = side_by_side(rows)
    if pairs:
        head = ["workload", "c", "proposer", "adaptive vs N=0", "per repeat: median (range)"]
        head += ["best static", "adaptive / best", "vs the best other adaptive, per repeat"]
        parts.append(f"### adaptive side by side\n\n{markdown_table(head, pairs)}")
    parts += [calibration_table(name, table) for name, table in calibrations.items()]
    return "\n\n".join(parts)
