"""Mixed traffic on one machine: one `specserve serve` with one global speculation setting
against a fleet (`specserve fleet up`, e.g. from `fleet plan`), side by side in one run.

Every traffic class runs at the same time at its own fixed concurrency (closed loop), on both
sides in turn, each side alone on the machine: code edits, creative chat and a bulk stream by
default. Requests carry `x-specserve-workload: WORKLOAD` (the routes `fleet plan` writes; `serve`
ignores it) and no per-request speculation cap, so each side's own settings decide. Per class:
goodput against the SLO, ITL and TTFT percentiles, tokens/s. And what Ray costs: start-up
time (launch -> every class answered), resident memory of the whole process tree, and the
per-request overhead (median latency of one-token requests, sequential).

    python -m benchmarks.bench_fleet --fleet-config fleet.yaml --serve-args "--speculate 4" \\
        --duration 60 --out bench-out/fleet
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.machine import machine_info, machine_lines, markdown_table
from specserve.bench import loadgen, report
from specserve.bench.records import Cell, CellKey, cells_to_json
from specserve.bench.workloads import resolve_workload
from specserve.fleet.plan import WORKLOAD_HEADER


@dataclass(frozen=True)
class TrafficClass:
    name: str
    workload: str
    concurrency: int
    max_new_tokens: int


def parse_class(text: str) -> TrafficClass:
    name, workload, conc, *rest = text.split(":")
    return TrafficClass(name, workload, int(conc), int(rest[0]) if rest else 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(side: str, args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    exe = [sys.executable, "-m", "specserve.cli"]
    if side == "serve":
        cmd = [*exe, "serve", "--port", str(port), *shlex.split(args.serve_args)]
    else:
        cmd = [*exe, "fleet", "up", "--config", str(args.fleet_config), "--port", str(port)]
        cmd += ["--num-cpus", str(args.num_cpus)]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


def rss_mib(proc: subprocess.Popen[bytes]) -> float:
    """Resident memory of the process and everything it started (Ray's workers included)."""
    root = psutil.Process(proc.pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total / 2**20


async def wait_ready(url: str, classes: list[TrafficClass], proc: Any, timeout: float) -> None:
    """Until every class's route answers a one-token request (all pools up)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        pending = list(classes)
        while pending:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up (exit {proc.poll()})")
            c = pending[0]
            body = {"inputs": "hello", "parameters": {"max_new_tokens": 1}}
            try:
                r = await client.post("/generate", json=body, headers={WORKLOAD_HEADER: c.workload})
                if r.status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)


async def overhead(url: str, n: int) -> list[float]:
    """Seconds of `n` sequential one-token requests (the default route)."""
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for _ in range(n):
            started = time.perf_counter()
            r = await client.post(
                "/generate", json={"inputs": "hello", "parameters": {"max_new_tokens": 1}}
            )
            r.raise_for_status()
            times.append(time.perf_counter() - started)
    return times


async def mixed(url: str, classes: list[TrafficClass], args: argparse.Namespace) -> dict[str, Any]:
    """Every class at once for --duration seconds; per class: its cell."""

    async def one(c: TrafficClass) -> Cell:
        items = resolve_workload(c.workload, 64, args.seed)
        settings = loadgen.GenSettings(
            c.max_new_tokens, 0.0, args.seed, True, 600.0, per_request_cap=False
        )
        key = CellKey(c.name, 0, "closed", c.concurrency)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(
            base_url=url, timeout=600, limits=limits, headers={WORKLOAD_HEADER: c.workload}
        ) as client:
            budget = loadgen.Budget(None, args.duration)
            records, secs = await loadgen.run_cell(client, items, key, budget, settings)
        return Cell(key, secs, records)

    cells = await asyncio.gather(*(one(c) for c in classes))
    return {c.name: cell for c, cell in zip(classes, cells, strict=True)}


def run_side(side: str, args: argparse.Namespace, classes: list[TrafficClass]) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    proc = launch(side, args, port, args.out / f"{side}.log")
    try:
        asyncio.run(wait_ready(url, classes, proc, args.launch_timeout))
        startup = time.monotonic() - started
        lat = asyncio.run(overhead(url, args.overhead_requests))
        cells = asyncio.run(mixed(url, classes, args))
        memory = rss_mib(proc)
    finally:
        stop(proc)
    slo = report.Slo(args.slo_ttft, args.slo_itl)
    stats = {name: report.cell_stats(cell, slo) for name, cell in cells.items()}
    return {
        "startup_s": startup,
        "rss_mib": memory,
        "one_token_median_s": statistics.median(lat),
        "classes": {n: asdict(s) for n, s in stats.items()},
        "records": cells_to_json(list(cells.values())),
    }


def fmt(x: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def markdown(result: dict[str, Any], classes: list[TrafficClass]) -> str:
    serve, fleet = result["serve"], result["fleet"]
    header = ["class", "side", "done", "goodput req/s", "ITL p50 ms", "ITL p90 ms"]
    header += ["TTFT p50 ms", "tok/s", "goodput fleet/serve", "ITL p50 fleet/serve"]
    rows = []
    for c in classes:
        a, b = serve["classes"][c.name], fleet["classes"][c.name]
        for side, s in (("serve", a), ("fleet", b)):
            last = side == "fleet"
            rows.append(
                [
                    f"{c.name} ({c.workload}, c={c.concurrency})",
                    side,
                    str(s["completed"]),
                    fmt(s["goodput"], digits=2),
                    fmt(s["itl"]["p50"], 1e3),
                    fmt(s["itl"]["p90"], 1e3),
                    fmt(s["ttft"]["p50"], 1e3),
                    fmt(s["tok_s"]),
                    ratio(b["goodput"], a["goodput"]) if last else "",
                    ratio(b["itl"]["p50"], a["itl"]["p50"]) if last else "",
                ]
            )
    costs = []
    for key, label, scale in (
        ("startup_s", "start-up to every class answered, s", 1.0),
        ("rss_mib", "resident memory, process tree, MiB", 1.0),
        ("one_token_median_s", "one-token request, median ms", 1e3),
    ):
        a, b = serve[key] * scale, fleet[key] * scale
        costs.append([label, f"{a:.1f}", f"{b:.1f}", ratio(b, a)])
    cost_table = markdown_table(["cost", "serve", "fleet", "fleet / serve"], costs)
    return markdown_table(header, rows) + "\n\n" + cost_table + "\n"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fleet-config", type=Path, required=True)
    p.add_argument("--serve-args", default="--speculate 4", help="serve's one global setting")
    p.add_argument(
        "--class",
        dest="classes",
        action="append",
        metavar="NAME:WORKLOAD:C[:MAX]",
        help="repeatable (default code:code-edit:2, chat:chat-creative:2, bulk:summarize:4:128)",
    )
    p.add_argument("--duration", type=float, default=60.0, help="seconds of mixed traffic")
    p.add_argument("--overhead-requests", type=int, default=30)
    p.add_argument("--num-cpus", type=int, default=2, help="the fleet's Ray cluster CPUs")
    p.add_argument("--slo-ttft", type=float, default=3.0)
    p.add_argument("--slo-itl", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--launch-timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=Path("bench-out/fleet"))
    args = p.parse_args()
    specs = args.classes or ["code:code-edit:2", "chat:chat-creative:2", "bulk:summarize:4:128"]
    classes = [parse_class(c) for c in specs]
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine_info("benchmarks.bench_fleet", sys.argv[1:])}
    for side in ("serve", "fleet"):
        print(f"running {side} ...", file=sys.stderr, flush=True)
        result[side] = run_side(side, args, classes)
    (args.out / "fleet-bench.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    table = machine_lines(result["machine"]) + "\n\n" + markdown(result, classes)
    (args.out / "fleet-bench.md").write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
