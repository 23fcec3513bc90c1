"""Speculation side by side in one process: proposers x policies x N x concurrency x workload.

One engine per proposer (``--proposer ngram,suffix,medusa``), built with the largest N of
``--speculate`` and, when ``--policy`` includes adaptive, the adaptive policy (its start-up
cost profile included). Every request carries its configuration: its cap N
(``SamplingParams.speculate``) and its policy (``speculation_policy``: a static request
verifies whole drafts even on an adaptive engine), so every configuration of a proposer runs on
the same loaded model, and N = 0, which never calls a proposer, once per cell as the common
baseline. Configurations: N = 0; for each proposer, static at every N > 0 of ``--speculate``,
and, with ``--policy`` adaptive, adaptive with the largest N as its cap.

A cell is (workload, concurrency, configuration): the workload's requests closed-loop at that
concurrency (conversations turn by turn, each turn carrying the reply it got), starting from an
empty cross-request cache (bench/spec_cells.py). For each (workload, concurrency) every
configuration runs back to back, the order rotating from one to the next, so machine noise falls
on all of them alike.

Per cell: tok/s (generated tokens / wall time, prefill included) and its ratio to N = 0
(with ``--repeats R``: every configuration runs R times, taking turns each time, and the
repeat with the median tok/s is reported, beside the range of all R);
acceptance (accepted / verified drafted tokens); accepted per draft step; tokens per scored
row; proposed and trimmed (proposed but not verified) tokens; identical: requests whose tokens
equal N = 0's (greedy speculation must be lossless); errors. Then adaptive against the best
static N, and each proposer's calibration: predicted (the proposer's mean confidence) vs
observed acceptance per bucket.

    python -m benchmarks.spec_bench [--proposer ngram,suffix] [--policy static,adaptive]
        [--speculate 0,1,2,3,5,8] [--concurrency 1,4,16] [--workloads NAMES|FILE.jsonl] [--json P]
        [--eagle HEAD_DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import machine_info
from benchmarks.spec_cells import Config, run_cell
from benchmarks.spec_report import cell_tok_s, render, summarise
from specserve.bench.workload_items import WorkloadItem, conversations, encode_item
from specserve.bench.workloads import resolve_workload
from specserve.cli_args import proposer_names
from specserve.config import POLICIES, EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.request import SamplingParams

MODULE = "benchmarks.spec_bench"
WORKLOADS = ("code-edit", "summarize", "chat-creative")


def configurations(args: argparse.Namespace) -> list[Config]:
    """N = 0 first, then per proposer its static N > 0 and its adaptive cap."""
    configs = [Config("none", "static", 0)]
    for p in args.proposers:
        if "static" in args.policies:
            configs += [Config(p, "static", n) for n in args.ns if n > 0]
        if "adaptive" in args.policies:
            configs.append(Config(p, "adaptive", args.ns[-1]))
    return configs


def sweep(
    engines: dict[str, Engine], workloads: dict[str, list[WorkloadItem]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every configuration for each (workload, concurrency), the order rotated by one each."""
    configs = configurations(args)
    baseline = next(iter(engines.values()))  # N = 0 never calls the proposer
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=args.ignore_eos)
    cells, j = [], 0
    for workload, items in workloads.items():
        units = conversations(items)
        for conc in args.concurrency:
            for _ in range(args.repeats):
                for config in configs[j % len(configs) :] + configs[: j % len(configs)]:
                    engine = engines.get(config.proposer, baseline)
                    runs, wall, counters = run_cell(engine, units, config, conc, params)
                    key = (workload, conc, config.proposer, config.policy, config.n)
                    cell = {"key": key, "runs": runs, "wall_s": wall, "counters": counters}
                    cells.append(cell)
                    rate = cell_tok_s(cell)
                    print(
                        f"[spec_bench] {workload} c={conc} {config.label}: {len(runs)} requests,"
                        f" {rate:.1f} tok/s, accepted {counters['accepted']}/{counters['drafted']}",
                        file=sys.stderr,
                    )
                j += 1
    cells = median_cells(cells)
    order = {(c.proposer, c.policy, c.n): i for i, c in enumerate(configs)}
    names = list(workloads)
    return sorted(cells, key=lambda c: (names.index(c["key"][0]), c["key"][1], order[c["key"][2:]]))


def median_cells(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per key, the repeat with the median tok/s (the lower of the middle two for an even
    count), carrying every repeat's tok/s as `repeat_tok_s` and each request's latency in every
    repeat as `repeat_request_s` (item id -> seconds), in run order."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for cell in cells:
        by_key.setdefault(cell["key"], []).append(cell)
    out = []
    for repeats in by_key.values():
        rates = [cell_tok_s(c) for c in repeats]
        order = sorted(range(len(repeats)), key=rates.__getitem__)
        latencies = [{r.item_id: r.total_s for r in c["runs"]} for c in repeats]
        kept = repeats[order[(len(order) - 1) // 2]]
        out.append({**kept, "repeat_tok_s": rates, "repeat_request_s": latencies})
    return out


def _csv_ints(p: argparse.ArgumentParser, flag: str, value: str) -> list[int]:
    try:
        return sorted({int(n) for n in value.split(",")})
    except ValueError:
        p.error(f"{flag} must be a comma list of integers, got {value!r}")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--speculate", default="0,1,2,3,5,8", help="comma list of N; must include 0")
    p.add_argument(
        "--proposer",
        default=None,
        help=f"comma list of {', '.join(proposer_names())}, compared in one run; "
        "default: draft with --draft-model, else ngram",
    )
    p.add_argument("--policy", default="static", help=f"comma list of {', '.join(POLICIES)}")
    p.add_argument("--concurrency", default="1", help="comma list of requests in flight")
    p.add_argument(
        "--draft-model", default=None, help="HF directory or .gguf sharing the tokenizer"
    )
    p.add_argument("--ngram-max", type=int, default=4)
    p.add_argument("--eagle", default=None, help="EAGLE head directory; default: the shipped")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list: names, .jsonl")
    p.add_argument("--prompts-per-workload", type=int, default=3, help="requests (built-ins)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every cell this many times (the configurations take turns each time) and "
        "report the median one by tok/s: this machine's speed drifts by 10-40%% from one "
        "cell to the next",
    )
    p.add_argument("--ignore-eos", action="store_true", help="always generate --new-tokens")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0, help="workload seed (which texts)")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    args = p.parse_args(argv)
    args.proposers = (args.proposer or ("draft" if args.draft_model else "ngram")).split(",")
    unknown = [p for p in args.proposers if p not in proposer_names()]
    if unknown or len(set(args.proposers)) != len(args.proposers):
        p.error(
            f"--proposer must list distinct names from {proposer_names()}, got {args.proposer!r}"
        )
    args.policies = args.policy.split(",")
    if not set(args.policies) <= set(POLICIES):
        p.error(f"--policy must list names from {POLICIES}, got {args.policy!r}")
    args.ns = _csv_ints(p, "--speculate", args.speculate)
    args.concurrency = _csv_ints(p, "--concurrency", args.concurrency)
    if args.ns[0] != 0 or len(args.ns) < 2:
        p.error("--speculate must include 0, the baseline every speedup is measured against")
    if args.concurrency[0] < 1 or args.new_tokens < 2 or args.prompts_per_workload < 1:
        p.error("need --concurrency >= 1, --new-tokens >= 2 and --prompts-per-workload >= 1")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def build_engine(args: argparse.Namespace, proposer: str) -> Engine:
    """One engine for every configuration of `proposer`: N = the largest N, adaptive if any
    configuration is (a static request then verifies whole drafts on it)."""
    try:
        spec = SpecConfig(
            speculate=args.ns[-1],
            proposer=proposer,
            draft_model=args.draft_model,
            ngram_max=args.ngram_max,
            eagle=args.eagle,
            policy="adaptive" if "adaptive" in args.policies else "static",
        )
        scheduler = SchedulerConfig(max_running_requests=max(args.concurrency))
        config = EngineConfig(
            device=args.device, num_threads=args.threads, scheduler=scheduler, spec=spec
        )
        return Engine(config)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc


def load_workloads(args: argparse.Namespace) -> dict[str, list[WorkloadItem]]:
    out: dict[str, list[WorkloadItem]] = {}
    for ref in args.workloads.split(","):
        for item in resolve_workload(ref, args.prompts_per_workload, args.seed):
            out.setdefault(item.workload, []).append(item)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    info = machine_info(MODULE, argv)
    torch.set_num_threads(args.threads)
    engines = {p: build_engine(args, p) for p in args.proposers}
    workloads = load_workloads(args)
    first = next(iter(workloads.values()))[0]
    for engine in engines.values():
        warm = encode_item(engine, first)
        for n in (0, args.ns[-1]):
            engine.add_request(warm, SamplingParams(max_new_tokens=4, ignore_eos=True, speculate=n))
            while engine.has_work():
                engine.step()
    cells = sweep(engines, workloads, args)
    rows = summarise(cells)
    calibrations = {
        name: [vars(b) for b in e.res.policy.calibration.table()]
        for name, e in engines.items()
        if e.res.policy is not None
    }
    print(render(args, info, rows, calibrations))
    if args.json is not None:
        skip = ("json", "ns", "proposer", "policies")
        config_out = {k: v for k, v in vars(args).items() if k not in skip}
        runs = [asdict(r) for c in cells for r in c["runs"]]
        report = {
            "machine": info,
            "config": config_out,
            "summary": rows,
            "runs": runs,
            "calibration": calibrations,
        }
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
