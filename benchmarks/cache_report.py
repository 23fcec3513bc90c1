"""Prefix caching on against off, from two `specserve bench` runs over the same workloads.

For each workload and concurrency: median TTFT of first requests (the first turn of a
conversation, the first question over a document set: ids ending `.0`) and of later ones
(`.1`, `.2`, ...; nothing to reuse in a workload without such ids), tokens/s and goodput, each
side by side with the ratio cache-on over cache-off.

Usage: python -m benchmarks.cache_report --on DIR --off DIR   (each holding a results.json)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

LATER = re.compile(r"\.([1-9][0-9]*)(:|$)")


def cells(results: Path) -> dict[tuple[str, float], dict[str, Any]]:
    """(workload, concurrency) -> {ttft_first, ttft_later, tok_s, goodput} of N=0 cells."""
    data = json.loads((results / "results.json").read_text())
    slo = data["slo"]
    out = {}
    for cell in data["cells"]:
        key = cell["key"]
        if key.get("speculate", 0) != 0:
            continue
        ok = [r for r in cell["records"] if r["ok"] and r["ttft"] is not None]
        first = [r["ttft"] for r in ok if not LATER.search(r["item_id"])]
        later = [r["ttft"] for r in ok if LATER.search(r["item_id"])]
        good = [r for r in ok if meets(r, slo)]
        dur = max(cell["duration_s"], 1e-9)
        out[(key["workload"], key["load"])] = {
            "ttft_first": statistics.median(first) if first else None,
            "ttft_later": statistics.median(later) if later else None,
            "tok_s": sum(r["output_tokens"] for r in ok) / dur,
            "goodput": len(good) / dur,
            "requests": len(ok),
        }
    return out


def meets(r: dict[str, Any], slo: dict[str, float]) -> bool:
    gaps = r["gaps"]
    itl = sum(gaps) / len(gaps) if gaps else 0.0
    return bool(r["ttft"] <= slo["ttft_s"] and itl <= slo["itl_s"])


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--on", type=Path, required=True)
    p.add_argument("--off", type=Path, required=True)
    args = p.parse_args()
    on, off = cells(args.on), cells(args.off)
    by_workload: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for key in sorted(on.keys() & off.keys()):
        by_workload[key[0]].append(key)
    print("| workload | concurrency | TTFT first, off / on (s) | TTFT later, off / on (s) | "
          "later TTFT off/on | tok/s off / on | goodput off / on (req/s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for workload, keys in by_workload.items():
        for key in keys:
            a, b = off[key], on[key]
            print(
                f"| {workload} | {key[1]:g} | {fmt(a['ttft_first'])} / {fmt(b['ttft_first'])} | "
                f"{fmt(a['ttft_later'])} / {fmt(b['ttft_later'])} | "
                f"{ratio(a['ttft_later'], b['ttft_later'])} | {fmt(a['tok_s'], 1)} / "
                f"{fmt(b['tok_s'], 1)} ({ratio(b['tok_s'], a['tok_s'])}) | "
                f"{fmt(a['goodput'], 3)} / {fmt(b['goodput'], 3)} |"
            )


if __name__ == "__main__":
    main()
