"""Before against after from `scripts/bench_commits.sh`'s files: medians, and each round's ratio.

The script leaves OUTDIR/NAME-{before,after}-R.json, one pair per round. For `spec_ledger`
files: per workload and side other than N = 0, each cell's tok/s over its own N = 0 cell
(same file, workload and round), and the median propose time of the steps whose proposer was
asked; for `bench_eagle` files: per batch, the drafting ms a step back to back and after a
target step, and the after / before ratio of each round.

    python -m benchmarks.commits_report OUTDIR NAME
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _rounds(out: Path, name: str) -> dict[str, dict[int, dict[str, Any]]]:
    """{side: {round: parsed json}}."""
    found: dict[str, dict[int, dict[str, Any]]] = {"before": {}, "after": {}}
    for side, runs in found.items():
        for path in out.glob(f"{name}-{side}-*.json"):
            runs[int(path.stem.rsplit("-", 1)[1])] = json.loads(path.read_text())
    return found


def _spread(values: Iterable[float]) -> str:
    v = list(values)
    return f"{statistics.median(v):.3f} ({min(v):.2f}-{max(v):.2f}, n={len(v)})" if v else "-"


def ledger_lines(runs: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    lines = ["| workload | side | speculating / N = 0: median (range) | steps: median (N = 0) "
             "| propose ms when asked |"]  # fmt: skip
    lines.append("| --- | --- | --- | --- | --- |")
    for side, by_round in runs.items():
        ratios: dict[tuple[str, str], list[float]] = {}
        propose: dict[tuple[str, str], list[float]] = {}
        steps: dict[tuple[str, str], list[int]] = {}
        for data in by_round.values():
            cells = data["cells"]
            base = {(c["workload"], c["round"]): c for c in cells if c["side"] == "N=0"}
            for c in cells:
                if c["side"] == "N=0":
                    continue
                key = (c["workload"], c["side"])
                off = base[c["workload"], c["round"]]
                ratios.setdefault(key, []).append(c["tok_s"] / off["tok_s"])
                steps.setdefault(key, []).append(c["steps"])
                steps.setdefault((c["workload"], "N=0"), []).append(off["steps"])
                if c.get("propose_ms_when_asked") is not None:
                    propose.setdefault(key, []).append(c["propose_ms_when_asked"])
        for (workload, cell), r in sorted(ratios.items()):
            asked = propose.get((workload, cell), [])
            ms = f"{statistics.median(asked):.2f}" if asked else "-"
            n = f"{statistics.median(steps[workload, cell]):.0f} "
            n += f"({statistics.median(steps[workload, 'N=0']):.0f})"
            lines.append(f"| {workload} | {side}: {cell} | {_spread(r)} | {n} | {ms} |")
    return lines


def eagle_lines(runs: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    lines = ["| B | drafting ms a step | before: median | after: median | after / before a round |"]
    lines.append("| --- | --- | --- | --- | --- |")
    both = sorted(set(runs["before"]) & set(runs["after"]))
    rows = {s: {r: {x["batch"]: x for x in runs[s][r]["rows"]} for r in both} for s in runs}
    batches = sorted({b for r in both for b in rows["after"][r]})
    for b in batches:
        for key, label in (
            ("draft_ms", "back to back"),
            ("in_situ_draft_ms", "after a target step"),
        ):
            bef = [rows["before"][r][b][key] for r in both]
            aft = [rows["after"][r][b][key] for r in both]
            ratio = _spread(a / x for a, x in zip(aft, bef, strict=True))
            lines.append(
                f"| {b} | {label} | {statistics.median(bef):.2f} | {statistics.median(aft):.2f} "
                f"| {ratio} |"
            )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the OUTDIR given to bench_commits.sh")
    p.add_argument("name", help="the NAME given to bench_commits.sh")
    args = p.parse_args()
    runs = _rounds(args.out, args.name)
    if not runs["before"] or not runs["after"]:
        raise SystemExit(f"no {args.name}-before-*.json and -after-*.json files in {args.out}")
    first = next(iter(runs["after"].values()))
    print("\n".join(ledger_lines(runs) if "cells" in first else eagle_lines(runs)))


if __name__ == "__main__":
    main()
