"""Each request against itself, speculation off and on back to back (#56: "no single request
below 0.9x"), one request at a time.

`spec_bench` runs a whole workload per side, so the two runs of one request lie a cell apart
(10-60 s), and a 0.3-2 s request carries whatever the machine did in between: 10-30 % here. This
runs each request's two sides one after the other (N = 0 then N = 4, the order turned every
pair), `--pairs` times, and reports the median of its paired ratios (N = 0 seconds / N = 4
seconds, submit to last token: > 1 is faster with speculation).

Every run starts from an emptied prefix cache and proposer cache (`spec_cells.run_cell`), so a
request's N = 4 side drafts only from its own prompt and output: the suffix index learns
nothing across requests here, which is what `spec_bench` measures. The policy's learned state
carries over from request to request, as in a server. A conversation's turns run as one unit,
each turn carrying the reply it got.

    python -m benchmarks.spec_pairs --proposer eagle [--workloads NAMES|FILE.jsonl]
        [--prompts-per-workload 6] [--pairs 5] [--new-tokens 128] [--json P]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.machine import machine_info, machine_lines
from benchmarks.spec_bench import build_engine, load_workloads, parse_args
from benchmarks.spec_cells import Config, run_cell
from benchmarks.spec_report import Run
from specserve.bench.workload_items import conversations
from specserve.engine.engine import Engine
from specserve.request import SamplingParams

MODULE = "benchmarks.spec_pairs"


def pair_ratios(off: list[dict[str, float]], on: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per request, its ratio in each pair: off seconds / on seconds (`off`, `on`: per pair,
    item id -> seconds)."""
    ratios: dict[str, list[float]] = {}
    for a, b in zip(off, on, strict=True):
        for item, seconds in b.items():
            if item in a and seconds > 0:
                ratios.setdefault(item, []).append(a[item] / seconds)
    return ratios


def summary_row(workload: str, ratios: dict[str, list[float]], runs: list[Run]) -> dict[str, Any]:
    """A workload's line: the median and the worst of its requests' median ratios, what the
    N = 4 side drafted and accepted over every pair, and whether every run's output equals the
    first N = 0 run's of the same request."""
    medians = {item: statistics.median(r) for item, r in ratios.items()}
    worst = min(medians, key=medians.__getitem__)
    reference: dict[str, list[int]] = {}
    for r in runs:
        if r.n == 0:
            reference.setdefault(r.item_id, r.tokens)
    spec = [r for r in runs if r.n]
    return {
        "workload": workload,
        "requests": len(medians),
        "median": statistics.median(medians.values()),
        "worst": medians[worst],
        "worst_item": worst,
        "worst_pairs": ratios[worst],
        "below_0_9": sorted(item for item, m in medians.items() if m < 0.9),
        "drafted": sum(r.drafted for r in spec),
        "accepted": sum(r.accepted for r in spec),
        "identical": all(r.tokens == reference.get(r.item_id) for r in runs),
        "errors": sum(r.finish_reason == "error" for r in runs),
    }


def run_pairs(
    engine: Engine, units: list[list[Any]], proposer: str, pairs: int, params: SamplingParams
) -> tuple[dict[str, list[float]], list[Run]]:
    """Every unit's two sides back to back, `pairs` times, the order turned each pair (and
    from one unit to the next)."""
    sides = [Config("none", "static", 0), Config(proposer, "adaptive", 4)]
    off: list[dict[str, float]] = [{} for _ in range(pairs)]
    on: list[dict[str, float]] = [{} for _ in range(pairs)]
    runs: list[Run] = []
    for u, unit in enumerate(units):
        for p in range(pairs):
            for config in sides if (u + p) % 2 == 0 else sides[::-1]:
                done, _, _ = run_cell(engine, [unit], config, 1, params)
                (on if config.n else off)[p].update({r.item_id: r.total_s for r in done})
                runs += done
    return pair_ratios(off, on), runs


def render(rows: list[dict[str, Any]], proposer: str, pairs: int) -> str:
    lines = [
        f"\n{proposer} (adaptive, N <= 4) against N = 0, each request's two sides back to back,"
        f" {pairs} pairs; ratio = N = 0 seconds / N = 4 seconds, per request its median over"
        " the pairs:\n",
        "| workload | requests | median request | worst request (its pairs) | below 0.9 |"
        " accepted / drafted | identical | errors |",
        "| --- | ---: | ---: | --- | --- | ---: | --- | ---: |",
    ]
    for r in rows:
        pairs_text = ", ".join(f"{x:.2f}" for x in r["worst_pairs"])
        lines.append(
            f"| {r['workload']} | {r['requests']} | {r['median']:.2f} | {r['worst']:.2f}"
            f" {r['worst_item']} ({pairs_text}) | {len(r['below_0_9'])} |"
            f" {r['accepted']} / {r['drafted']} | {'yes' if r['identical'] else 'NO'} |"
            f" {r['errors']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--proposer", default="ngram")
    p.add_argument("--workloads", default="code-edit,workloads/third-party-free.jsonl")
    p.add_argument("--prompts-per-workload", type=int, default=6)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="write the rows and every pair's ratios here")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be >= 1, got {args.pairs}")
    torch.set_num_threads(args.threads)
    bench_args = parse_args(
        ["--threads", str(args.threads), "--proposer", args.proposer, "--policy", "adaptive",
         "--speculate", "0,4", "--prompts-per-workload", str(args.prompts_per_workload),
         "--workloads", args.workloads, "--new-tokens", str(args.new_tokens)]
    )  # fmt: skip
    engine = build_engine(bench_args, args.proposer)
    workloads = load_workloads(bench_args)
    params = SamplingParams(max_new_tokens=args.new_tokens)
    first = conversations(next(iter(workloads.values())))[:1]
    for config in (Config("none", "static", 0), Config(args.proposer, "adaptive", 4)):
        run_cell(engine, first, config, 1, params)  # warm-up: kernels, the profile's corrections
    print(machine_lines(machine_info(MODULE, argv)))
    rows, every = [], {}
    for name, items in workloads.items():
        ratios, runs = run_pairs(engine, conversations(items), args.proposer, args.pairs, params)
        rows.append(summary_row(name, ratios, runs))
        every[name] = ratios
        print(f"[spec_pairs] {name}: {rows[-1]['median']:.2f} median", file=sys.stderr)
    print(render(rows, args.proposer, args.pairs))
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(MODULE, argv), "rows": rows, "ratios": every}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
