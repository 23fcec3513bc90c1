"""`specserve bench` (goodput sweep against a server) and `specserve diagnose` (a server's state).

    specserve bench --url http://127.0.0.1:8080 --workload code-edit --speculate 0,2,4
    specserve bench --request-rate 0.5,1,2 --duration 60 --slo-ttft 1 --slo-itl 0.05
    specserve bench --launch "specserve serve --num-threads 1" --speculate 0,4 ...  # restarts
    specserve bench --from-results bench-out/results.json --slo-itl 0.05 --out again

The sweep runs every (workload, load, N) cell in turn and writes to --out: results.json (raw
per-request records), report.md, one PNG per workload and metric, and speculation-profile.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specserve.bench import loadgen, render, report
from specserve.bench.bench_args import add_judge_args, add_sweep_args, add_target_args
from specserve.bench.diagnose import counter_delta, scrape_counters
from specserve.bench.launch import launched
from specserve.bench.loadgen import Budget, GenSettings
from specserve.bench.records import (
    Cell,
    CellKey,
    Mode,
    RequestRecord,
    cells_from_json,
    cells_to_json,
)
from specserve.bench.workload_items import WorkloadItem
from specserve.bench.workloads import BUILDERS, resolve_workload

logger = logging.getLogger("specserve.bench")


def add_bench_parsers(subparsers: Any) -> None:
    """Register `bench` and `diagnose` on the `specserve` subcommand parser."""
    from specserve.bench.diagnose import add_diagnose_parser

    p = subparsers.add_parser(
        "bench",
        help="goodput sweep over N x load x workload against a server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_args(p.add_argument_group("target"))
    add_sweep_args(p.add_argument_group("sweep"))
    add_judge_args(p.add_argument_group("generation"), p.add_argument_group("judgement"))
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output directory")
    p.add_argument(
        "--from-results",
        type=Path,
        metavar="RESULTS.json",
        help="no traffic: re-judge a previous run's records into --out",
    )
    p.set_defaults(func=cmd_bench)
    add_diagnose_parser(subparsers)


@dataclass
class Plan:
    workloads: dict[str, list[WorkloadItem]]
    speculate: list[int] | None  # None: 0 and the server's N
    mode: Mode
    loads: list[float]
    budget: Budget
    settings: GenSettings
    warmup: int
    headers: dict[str, str] = field(default_factory=dict)
    pool: str | None = None  # a fleet's pool: its /info and its series in /metrics
    infos: list[dict[str, Any]] = field(default_factory=list)  # /info of each server used


def plan_from_args(args: argparse.Namespace) -> Plan:
    budget = Budget(args.num_requests if args.num_requests or args.duration else 16, args.duration)
    size = budget.num_requests or 64
    workloads: dict[str, list[WorkloadItem]] = {}
    for ref in args.workload or list(BUILDERS):
        items = resolve_workload(ref, size, args.seed)
        for item in items:
            workloads.setdefault(item.workload, []).append(item)
    open_loop = args.request_rate is not None
    return Plan(
        workloads=workloads,
        speculate=sorted({0, *args.speculate}) if args.speculate else None,
        mode="open" if open_loop else "closed",
        loads=[float(x) for x in (args.request_rate if open_loop else args.concurrency)],
        budget=budget,
        settings=GenSettings(
            args.max_new_tokens, args.temperature, args.seed, args.ignore_eos, args.request_timeout
        ),
        warmup=args.warmup,
        headers=request_headers(args),
        pool=args.pool,
    )


def request_headers(args: argparse.Namespace) -> dict[str, str]:
    """--api-key, --header NAME:VALUE and --pool as the headers of every request."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header wants NAME:VALUE, got {item!r}")
        headers[name.strip()] = value.strip()
    if args.pool:
        headers["x-specserve-pool"] = args.pool
    return headers


def cmd_bench(args: argparse.Namespace) -> int:
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    command = getattr(args, "command_line", None) or "specserve " + shlex.join(sys.argv[1:])
    if args.from_results:
        saved = json.loads(args.from_results.read_text(encoding="utf-8"))
        cells, meta = cells_from_json(saved["cells"]), saved["meta"]
    else:
        try:
            plan = plan_from_args(args)
            cells = asyncio.run(_run_plan(plan, args))
        except (ValueError, RuntimeError, OSError, httpx.HTTPError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        meta = _meta(args, plan, command)
    _write_outputs(args, cells, meta)
    print(f"wrote {args.out}/results.json, report.md, *.png, speculation-profile.json")
    return 0


def _meta(args: argparse.Namespace, plan: Plan, command: str) -> dict[str, Any]:
    from specserve.speculation.profile import fingerprints

    info = plan.infos[-1] if plan.infos else {}
    target, proposer = fingerprints(info, args.model, args.draft_model)
    return {
        "command": command,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "url": args.url if not args.launch else None,
        "launch": args.launch,
        "model": info.get("model_id"),
        "proposer": (info.get("speculation") or {}).get("proposer"),
        "infos": plan.infos,
        "settings": vars(plan.settings),
        "target": target,
        "proposer_fingerprint": proposer,
    }


def _write_outputs(args: argparse.Namespace, cells: list[Cell], meta: dict[str, Any]) -> None:
    from specserve.hashing import write_json_atomically
    from specserve.speculation.profile import make_profile

    slo = report.Slo(args.slo_ttft, args.slo_itl)
    stats = [report.cell_stats(c, slo) for c in cells]
    recs = report.recommend(stats, args.min_gain)
    contention = report.find_contention(stats, args.contention_tol)
    out: Path = args.out
    results = {"meta": meta, "slo": vars(slo), "cells": cells_to_json(cells)}
    write_json_atomically(out / "results.json", results)
    (out / "report.md").write_text(
        render.markdown(stats, slo, recs, contention, meta), encoding="utf-8"
    )
    render.plot(stats, out)
    profile = make_profile(
        report.profile_entries(recs),
        meta.get("target"),
        meta.get("proposer_fingerprint"),
        meta["command"],
        vars(slo),
    )
    write_json_atomically(out / "speculation-profile.json", profile)


# ---------------------------------------------------------------------------------- running
async def _run_plan(plan: Plan, args: argparse.Namespace) -> list[Cell]:
    from rich.console import Console
    from rich.progress import Progress

    total = len(plan.workloads) * len(plan.loads) * (len(plan.speculate or [0, 1]))
    with Progress(console=Console(stderr=True)) as bar:
        task = bar.add_task("bench", total=total * (plan.budget.num_requests or 1))
        if not args.launch:
            return await _sweep(args.url, plan, plan.speculate, bar, task)
        if plan.speculate is None:
            raise ValueError("--launch needs --speculate: there is no server to ask for N")
        cells: list[Cell] = []
        for n in plan.speculate:
            async with launched(args.launch, n, args.launch_timeout, args.out) as url:
                cells += await _sweep(url, plan, [n], bar, task)
        return cells


async def _sweep(url: str, plan: Plan, ns: list[int] | None, bar: Any, task: Any) -> list[Cell]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=60, headers=plan.headers
    ) as client:
        info = pool_info((await client.get("/info")).raise_for_status().json(), plan.pool)
        plan.infos.append(info)
        server_n = int(info["speculation"]["speculate"])
        ns = ns if ns is not None else plan.speculate or sorted({0, server_n})
        if max(ns) > server_n:
            raise ValueError(
                f"--speculate {max(ns)} is above the server's N={server_n}; "
                "restart it with a larger --speculate, or use --launch"
            )
        cells = []
        for workload, items in plan.workloads.items():
            for i in range(plan.warmup):
                await loadgen.send(client, items[i % len(items)], max(ns), plan.settings, i, 0.0)
            for load in plan.loads:
                for n in ns:
                    key = CellKey(workload, n, plan.mode, load)
                    bar.update(task, description=f"{workload} N={n} load={load:g}")
                    cells.append(await _cell(client, items, key, plan, bar, task))
        return cells


async def _cell(
    client: Any, items: list[WorkloadItem], key: CellKey, plan: Plan, bar: Any, task: Any
) -> Cell:
    def done(_: RequestRecord) -> None:
        if plan.budget.num_requests:
            bar.advance(task)

    labels = {"pool": plan.pool} if plan.pool else {}
    # No cell drafts from, or reuses the prompts of, an earlier cell's replay of the same items.
    await client.post("/reset_suffix_cache")
    await client.post("/reset_prefix_cache")
    before = await scrape_counters(client, labels)
    records, duration = await loadgen.run_cell(client, items, key, plan.budget, plan.settings, done)
    after = await scrape_counters(client, labels)
    if not plan.budget.num_requests:
        bar.advance(task)
    return Cell(key, duration, records, counter_delta(before, after))


def pool_info(info: dict[str, Any], pool: str | None) -> dict[str, Any]:
    """The /info of what is loaded: a server's own, or a fleet pool's engine (`--pool`)."""
    if "pools" not in info:
        return info
    pools = info["pools"]
    if pool is None or pool not in pools:
        raise ValueError(f"this is a fleet: pass --pool, one of {', '.join(sorted(pools))}")
    engine = pools[pool].get("engine")
    if engine is None:
        raise ValueError(f"pool {pool!r} has no replica answering /info now")
    return dict(engine)
