"""The serving path against the engine in process: the same requests, the same engine settings.

For each compute-thread count and concurrency, four sides run one after the other (never two
at once): the engine stepped in this process (as `LLM.generate` does), `specserve serve` over
HTTP streaming (`/generate_stream`, the engine's thread writing the events: server/direct.py),
a second server started with `--stream-from-loop` (its event loop writing them), and the first
server non-streaming (`/generate`). The sides take turns wave by wave, in a rotated order, so
that drift in the machine's speed during the run moves all of them alike. Every
request is a hand-written chat prompt (text no built-in workload uses) rendered by the model's
template, greedy, EOS ignored, 128 new tokens, speculation off, no prefix cache (each prompt is
sent more than once). A concurrency-c cell sends c requests at once, `--waves` times, and at
least often enough that each side serves `--min-requests` requests: a p99 over three batch-1
requests (381 gaps) is their fourth-largest gap, and which three requests ran, on a machine whose
speed drifts from one second to the next, moves it by more than the 1.5x target's margin.
Six waves by default: on this machine one 16-request wave ran 10-15% faster or slower than the
next on the same side (ad hoc), and three waves a side moved the ratio by as much.

Per side: aggregate tok/s (tokens / wall time of the waves), end-to-end tok/s per request
(tokens / (finish - send)), and where token times are seen (in process, streaming), decode
tok/s after the first token and the inter-token gaps' p50/p99. HTTP / in process is the ratio of
the end-to-end rate at concurrency 1 and of the aggregate at higher concurrency; "paired" is the
median over waves of a side's tokens / wall time in a wave against the in-process side's in the
same wave (seconds apart), which a machine whose speed drifts over the run moves less. Outputs
of all sides are compared token for token.

The load generator shares the machine with the server and uses no torch: streamed requests are
read from one thread that selects over their sockets, non-streaming ones go through httpx
(`benchmarks/serving_client.py`). Per HTTP side, the CPU per token of the load generator and of
the server's event-loop thread (the serving work the in-process side does not do; from
`/proc/PID/task/PID/schedstat`, so Linux only): both come out of the cores the engine computes
on. They move with the machine's speed as everything does, but say directly how much serving
work a token costs, where a ratio folds it into a gap of a few percent among the run's noise.
On the first server's streaming side most of that work runs on the engine's thread instead
(formatting and writing each event between two steps): it shows in the ratio, not there.

Usage (repo root): python -m benchmarks.bench_serving [--threads 1,2]
    [--concurrency 1,16] [--waves 6] [--min-requests 16] [--no-loop-writes] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.serving_client import NEW_TOKENS, Run, over_http
from benchmarks.serving_report import Cell, report, summarise

PORT = 8393

# Held out: no built-in workload uses these texts.
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a map in a bottle.",
    "Describe a thunderstorm over a wheat field from the point of view of a crow.",
    "Compose a letter from a retired astronaut to her younger self.",
    "Invent a festival held in a mountain village every seventh winter and describe it.",
    "Tell the tale of a clockmaker whose clocks all stop at the same minute.",
    "Write a monologue for a ferry captain on her last crossing.",
    "Describe a market in a city built on stilts above a lake.",
    "Write a fable about a fox that learns to count stars.",
    "Narrate a chess game between two old friends in a park in autumn.",
    "Describe the first morning of spring in a desert town.",
    "Write a diary entry of a cartographer lost in a forest of birches.",
    "Tell a bedtime story about a cloud that wanted to be a river.",
    "Describe a library that opens only during lunar eclipses.",
    "Write a poem in prose about a train station at midnight.",
    "Tell the story of a beekeeper who talks to her hives about the news.",
    "Describe a storm at sea from the deck of a fishing boat in 1890.",
]


def loop_cpu_s(pid: int) -> float:
    """CPU seconds the server's main thread (its event loop: `serve` runs uvloop there) has run,
    from the kernel's per-thread scheduler statistics."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def in_process(engine: Any, batch: list[str]) -> Run:
    """One wave: `batch` sent at once to the engine stepped in this process."""
    from specserve.request import SamplingParams

    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, temperature=0.0)
    sent = time.perf_counter()
    ids = {engine.add_request(t, params): t for t in batch}
    stamps: dict[str, list[float]] = {rid: [] for rid in ids}
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_work():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            stamps[out.request_id] += [now] * len(out.new_token_ids)
            tokens[out.request_id] += out.new_token_ids
    runs = [(sent, stamps[rid]) for rid in ids]
    return time.perf_counter() - sent, None, runs, {ids[rid]: tokens[rid] for rid in ids}


def start_server(
    threads: int, log: Path, port: int, flags: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    from benchmarks.bench_llamacpp import serve

    cmd = [
        sys.executable, "-m", "specserve.cli", "serve", "--port", str(port), "--num-threads",
        str(threads), "--speculate", "0", "--no-prefix-caching", "--max-concurrent-requests", "64",
        *flags,
    ]  # fmt: skip
    return serve(cmd, f"http://127.0.0.1:{port}", log)


def render(texts: list[str]) -> list[str]:
    from specserve.engine.resources import load_tokenizer
    from specserve.models.loader import resolve_model_dir

    tok = load_tokenizer(resolve_model_dir(None))
    chats = [[{"role": "user", "content": t}] for t in texts]
    return [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]


LOOP_WRITES = "HTTP streaming, loop writes"
SIDES = ("in process", "HTTP streaming", LOOP_WRITES, "HTTP non-streaming")


def run_threads(
    threads: int,
    concs: list[int],
    waves: int,
    min_requests: int,
    log: Path,
    sides: tuple[str, ...] = SIDES,
) -> list[Cell]:
    """Waves interleaved: each wave runs on every side back to back, the side order rotated
    from wave to wave, so that a machine getting slower or faster during the run moves all sides
    alike. The servers idle while the engine in this process runs, and the other way round.
    LOOP_WRITES is a second server, started with --stream-from-loop: its event loop writes
    every streamed event, where the first server's engine thread writes them (`sides` without
    it: a tree older than that flag)."""
    texts = render(PROMPTS)
    cells: list[Cell] = []
    outputs: dict[str, list[int]] = {}
    proc = start_server(threads, log, PORT)
    procs = {}
    if LOOP_WRITES in sides:
        procs[LOOP_WRITES] = start_server(
            threads, log.with_suffix(".loop.log"), PORT + 1, ("--stream-from-loop",)
        )
    url, loop_url = f"http://127.0.0.1:{PORT}", f"http://127.0.0.1:{PORT + 1}"
    try:
        engine = in_process_engine(threads)
        send = {
            "in process": lambda batch: in_process(engine, batch),
            "HTTP streaming": lambda batch: over_http(url, batch, True),
            LOOP_WRITES: lambda batch: over_http(loop_url, batch, True),
            "HTTP non-streaming": lambda batch: over_http(url, batch, False),
        }
        for side in sides:
            send[side](texts[:1])  # warm-up
        pids = {side: procs.get(side, proc).pid for side in sides}
        for conc in concs:
            n = max(waves, -(-min_requests // conc))
            cells += run_cell(threads, conc, n, texts, {s: send[s] for s in sides}, pids, outputs)
    finally:
        for server in (proc, *procs.values()):
            server.terminate()
            server.wait(timeout=60)
    return cells


def in_process_engine(threads: int) -> Any:
    """The engine the in-process side steps: the servers' settings (speculation off, no prefix
    cache), built in this process."""
    import torch

    from specserve.config import CacheConfig, EngineConfig, SpecConfig
    from specserve.engine.engine import Engine

    torch.set_num_threads(threads)
    config = EngineConfig(
        num_threads=threads, spec=SpecConfig(speculate=0), cache=CacheConfig(prefix_caching=False)
    )
    return Engine(config)


def run_cell(
    threads: int,
    conc: int,
    waves: int,
    texts: list[str],
    send: dict[str, Callable[[list[str]], Run]],
    pids: dict[str, int],
    outputs: dict[str, list[int]],
) -> list[Cell]:
    """One concurrency's waves on every side of `send` (see `run_threads`); each prompt's
    tokens checked against `outputs`, the first seen on any side."""
    sides = tuple(send)
    walls = dict.fromkeys(sides, 0.0)
    cpus: dict[str, float | None] = dict.fromkeys(sides)
    loops: dict[str, float | None] = dict.fromkeys(sides)
    runs: dict[str, list[tuple[float, list[float]]]] = {side: [] for side in sides}
    rates: dict[str, list[float]] = {side: [] for side in sides}  # per wave
    for w in range(waves):
        batch = texts[(w * conc) % len(texts) :][:conc] or texts[:conc]
        for side in sides[w % len(sides) :] + sides[: w % len(sides)]:
            pid = pids[side]
            loop_before = loop_cpu_s(pid)
            wall, cpu, wave_runs, wave_outputs = send[side](batch)
            walls[side] += wall
            rates[side].append(sum(len(st) for _, st in wave_runs) / wall)
            if cpu is not None:
                cpus[side] = (cpus[side] or 0.0) + cpu
                loops[side] = (loops[side] or 0.0) + loop_cpu_s(pid) - loop_before
            runs[side] += wave_runs
            for text, ids in wave_outputs.items():
                if outputs.setdefault(text, ids) != ids:
                    raise SystemExit(f"{side}: output differs for {text[:40]!r}")
    cells = []
    for side in sides:
        cell = summarise(side, threads, conc, walls[side], cpus[side], runs[side], loops[side])
        pairs = zip(rates[side], rates[SIDES[0]], strict=True)
        cells.append(replace(cell, paired=statistics.median(a / b for a, b in pairs)))
    return cells


def main() -> None:
    from benchmarks.machine import machine_info

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="compute threads, comma-separated")
    p.add_argument("--concurrency", default="1,16", help="comma-separated")
    p.add_argument("--waves", type=int, default=6, help="rounds of `concurrency` requests")
    p.add_argument(
        "--min-requests", type=int, default=16, help="at least this many requests per side and cell"
    )
    p.add_argument(
        "--no-loop-writes",
        action="store_true",
        help="leave out the --stream-from-loop server (for a tree older than that flag)",
    )
    p.add_argument("--json", default=None)
    p.add_argument("--logs", default="/tmp")
    args = p.parse_args()
    sides = tuple(s for s in SIDES if not (args.no_loop_writes and s == LOOP_WRITES))
    info = machine_info("benchmarks.bench_serving", sys.argv[1:])
    concs = [int(c) for c in args.concurrency.split(",")]
    cells = [
        cell
        for threads in (int(t) for t in args.threads.split(","))
        for cell in run_threads(
            threads,
            concs,
            args.waves,
            args.min_requests,
            Path(args.logs) / "bench-serving.log",
            sides,
        )
    ]
    print(report(info, cells))
    if args.json:
        data = {"machine": info, "cells": [asdict(c) for c in cells]}
        Path(args.json).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
