"""Latency by prompt length from spec_bench's JSON: each cell's (median repeat's) requests split
at --short prompt tokens, first-token seconds (submit -> first token) p50 and max per side, and
the mean end-to-end latency. The scheduler's prefill order shows here, not in tok/s.

    python -m benchmarks.spec_latency bench-out/1205h/ngram-c16.json [more.json ...] \\
        [--workload third-party] [--short 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.machine import markdown_table


def _first_token_s(run: dict[str, Any]) -> float:
    return float(run["total_s"] - run["decode_s"])


def _p50_max(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def latency_rows(runs: list[dict[str, Any]], workload: str, short: int) -> list[list[str]]:
    """One row per (concurrency, proposer, N) of `workload`: requests, short prompts' first
    token p50 / max, long ones' p50 / max, mean latency (seconds)."""
    cells: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        if r["workload"] == workload:
            cells.setdefault((r["concurrency"], r["proposer"], r["n"]), []).append(r)
    rows = []
    for (conc, proposer, n), cell in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        first_short = [_first_token_s(r) for r in cell if r["prompt_tokens"] < short]
        first_long = [_first_token_s(r) for r in cell if r["prompt_tokens"] >= short]
        mean = statistics.mean(r["total_s"] for r in cell)
        label = "N=0" if n == 0 else f"{proposer} N={n}"
        firsts = [_p50_max(first_short), _p50_max(first_long)]
        rows.append([str(conc), label, str(len(cell)), *firsts, f"{mean:.2f}"])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", type=Path, help="spec_bench --json files")
    p.add_argument("--workload", default="third-party", help="the workload's name in the runs")
    p.add_argument("--short", type=int, default=100, help="prompts under this many tokens")
    args = p.parse_args(argv)
    header = ["c", "config", "requests", f"first token < {args.short} tok: p50 / max (s)"]
    header += [f"first token >= {args.short} tok: p50 / max (s)", "mean latency (s)"]
    for path in args.json:
        report = json.loads(path.read_text())
        print(f"### {path} (commit {report['machine'].get('commit', '?')})")
        print(markdown_table(header, latency_rows(report["runs"], args.workload, args.short)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
