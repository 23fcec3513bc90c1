"""Throughput under KV pressure: issue 13's two reproductions beside the same requests with
ample KV, in one run, on the embedded model.

- (a) `serve --speculate 2 --num-threads 1 --kv-cache-bytes 92200000 --max-batch-tokens 512`,
  two requests at once with inputs "a " * 900 and 300 new tokens (a 2000-token pool);
- (b) default flags with `--kv-cache-bytes 256MiB` (a 5824-token pool), two 2700-token prompts
  (stdlib source text) x 500 new tokens.

Each case runs its two requests together through one engine (as two concurrent /generate calls
reach it), greedy with ignore_eos so every run does the same work, and again with ample KV
(`--kv-cache-bytes 1GiB`, everything else equal). The table gives wall time, preemptions, the
most any one request was preempted, and the pressure/ample time ratio; the greedy outputs of the
two runs must match (preemption is lossless).

Usage (repo root; `--scale 0.1` shrinks prompts, outputs and the small pool for a smoke run):
    python -m benchmarks.bench_kv_pressure [--threads 2] [--scale 1.0] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.machine import machine_info, machine_lines, markdown_table
from specserve.cli import build_parser
from specserve.cli_args import engine_config_from_args
from specserve.engine.engine import Engine
from specserve.engine.memory import parse_bytes
from specserve.request import FinishReason, SamplingParams

AMPLE = "1GiB"


@dataclass(frozen=True)
class Case:
    name: str
    flags: list[str]  # `serve` flags of the reproduction (the KV size among them)
    kv_bytes: str
    new_tokens: int


@dataclass(frozen=True)
class Result:
    case: str
    kv: str
    kv_tokens: int
    seconds: float
    preemptions: int
    most_per_request: int
    tokens: int
    outputs: list[list[int]]


CASES = [
    Case(
        "a",
        ["--speculate", "2", "--num-threads", "1", "--max-batch-tokens", "512"],
        "92200000",
        300,
    ),
    Case("b", [], "256MiB", 500),
]


def prompts_for(case: Case, engine: Engine, scale: float) -> list[list[int]]:
    if case.name == "a":
        return [engine.encode("a " * round(900 * scale))] * 2
    import difflib
    import inspect

    n = round(2700 * scale)
    texts = [inspect.getsource(difflib), inspect.getsource(argparse)]
    return [engine.encode(t)[:n] for t in texts]


def run(case: Case, kv_bytes: str, threads: int | None, scale: float) -> Result:
    flags = ["serve", *case.flags, "--kv-cache-bytes", kv_bytes]
    if threads is not None and "--num-threads" not in case.flags:
        flags += ["--num-threads", str(threads)]
    engine = Engine(engine_config_from_args(build_parser().parse_args(flags)))
    prompts = prompts_for(case, engine, scale)
    params = SamplingParams(max_new_tokens=round(case.new_tokens * scale), ignore_eos=True)
    started = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    outputs: dict[str, list[int]] = {i: [] for i in ids}
    most = 0
    while engine.has_work():
        sched = engine.scheduler
        most = max([most, *(s.num_preemptions for s in [*sched.running, *sched.waiting])])
        for out in engine.step():
            if out.finish_reason == FinishReason.ERROR:
                raise RuntimeError(f"{case.name}: request failed: {out.error}")
            outputs[out.request_id] += out.new_token_ids
    seconds = time.perf_counter() - started
    alloc = engine.res.allocator
    return Result(
        case=case.name,
        kv=kv_bytes,
        kv_tokens=alloc.num_blocks * alloc.block_size,
        seconds=seconds,
        preemptions=engine.scheduler.num_preemptions,
        most_per_request=most,
        tokens=sum(len(o) for o in outputs.values()),
        outputs=[outputs[i] for i in ids],
    )


def table(results: list[Result]) -> str:
    rows = []
    for pressure, ample in zip(results[::2], results[1::2], strict=True):
        for r in (pressure, ample):
            rows.append(
                [
                    r.case,
                    f"{r.kv} ({r.kv_tokens} tokens)",
                    f"{r.seconds:.1f}",
                    str(r.preemptions),
                    str(r.most_per_request),
                    str(r.tokens),
                    f"{r.tokens / r.seconds:.1f}",
                    f"{pressure.seconds / ample.seconds:.2f}x" if r is pressure else "1.00x",
                    "yes" if pressure.outputs == ample.outputs else "NO",
                ]
            )
    header = ["case", "KV cache", "s", "preemptions", "most per request", "tokens", "tok/s"]
    return markdown_table([*header, "time vs ample", "same output"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--threads", type=int, default=None, help="--num-threads where a case sets none (b)"
    )
    p.add_argument("--scale", type=float, default=1.0, help="scale prompts and outputs")
    p.add_argument("--cases", default="a,b", help="which reproductions: a, b or a,b")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    info = machine_info("benchmarks.bench_kv_pressure", sys.argv[1:])
    results = []
    for case in (c for c in CASES if c.name in args.cases.split(",")):
        threads = args.threads
        tight = str(round(parse_bytes(case.kv_bytes) * args.scale))  # the pressure scales too
        for kv in (case.kv_bytes if args.scale == 1 else tight, AMPLE):
            results.append(run(case, kv, threads, args.scale))
            gc.collect()
    print(machine_lines(info))
    print()
    print(table(results))
    if args.json is not None:
        rows = [asdict(r) | {"outputs": None} for r in results]
        args.json.write_text(json.dumps({"machine": info, "results": rows}, indent=2))
    same = all(a.outputs == b.outputs for a, b in zip(results[::2], results[1::2], strict=True))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
