"""`bench_serving`'s cells: one side's numbers at one thread count and concurrency, summarised
from its requests' token stamps, and the table against the in-process side."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.machine import machine_lines, markdown_table


@dataclass(frozen=True)
class Cell:
    side: str  # one of bench_serving.SIDES
    threads: int
    concurrency: int
    requests: int
    tokens: int
    aggregate_tok_s: float
    e2e_tok_s: float  # median per request
    decode_tok_s: float | None  # median per request, after the first token
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    client_cpu_ms: float | None  # the load generator's CPU time per token (HTTP sides)
    loop_cpu_ms: float | None = None  # the server's event-loop thread's CPU time per token
    # median over waves of (this side's tok/s / the in-process side's) in the same wave
    paired: float | None = None


def summarise(
    side: str,
    threads: int,
    conc: int,
    wall: float,
    cpu: float | None,
    runs: list[tuple[float, list[float]]],
    loop_cpu: float | None = None,
) -> Cell:
    """runs: per request, (send time, token arrival times); a non-streaming run has one stamp
    per token, all at the finish."""
    tokens = sum(len(stamps) for _, stamps in runs)
    e2e = statistics.median(len(st) / (st[-1] - t0) for t0, st in runs)
    streamed = side != "HTTP non-streaming"
    decode = itl50 = itl99 = None
    if streamed:
        decode = statistics.median((len(st) - 1) / (st[-1] - st[0]) for _, st in runs)
        gaps = sorted(b - a for _, st in runs for a, b in itertools.pairwise(st))
        itl50 = 1000 * gaps[len(gaps) // 2]
        itl99 = 1000 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    client = None if cpu is None else 1000 * cpu / tokens
    loop = None if loop_cpu is None else 1000 * loop_cpu / tokens
    return Cell(
        side, threads, conc, len(runs), tokens, tokens / wall, e2e, decode, itl50, itl99, client,
        loop,
    )  # fmt: skip


def report(info: dict[str, Any], cells: list[Cell]) -> str:
    base = {(c.threads, c.concurrency): c for c in cells if c.side == "in process"}
    rows = []
    for c in cells:
        ref = base[(c.threads, c.concurrency)]
        rate = (lambda x: x.e2e_tok_s) if c.concurrency == 1 else (lambda x: x.aggregate_tok_s)
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        tail = (
            "-"
            if c.itl_p99_ms is None or not c.itl_p50_ms
            else f"{c.itl_p99_ms / c.itl_p50_ms:.2f}"
        )
        rows.append([
            str(c.threads), str(c.concurrency), c.side, f"{c.aggregate_tok_s:.1f}",
            f"{c.e2e_tok_s:.1f}", fmt(c.decode_tok_s), fmt(c.itl_p50_ms), fmt(c.itl_p99_ms),
            tail,
            "-" if c.client_cpu_ms is None else f"{c.client_cpu_ms:.2f}",
            "-" if c.loop_cpu_ms is None else f"{c.loop_cpu_ms:.3f}",
            f"{rate(c) / rate(ref):.2f}x",
            "-" if c.paired is None else f"{c.paired:.2f}x",
        ])  # fmt: skip
    header = [
        "threads", "concurrency", "side", "aggregate tok/s", "e2e tok/s per request",
        "decode tok/s", "ITL p50 ms", "ITL p99 ms", "p99 / p50", "client CPU ms/token",
        "server loop CPU ms/token", "/ in process", "paired / in process",
    ]  # fmt: skip
    return machine_lines(info) + "\n\n" + markdown_table(header, rows)
