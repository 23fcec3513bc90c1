"""Where speculation's time goes at a workload's concurrency (#56): one engine as `spec_bench`
builds it (a proposer, the adaptive policy, N <= 4), its requests run with speculation off and on
in turn, each run from an emptied prefix cache and proposer cache, and per run the seconds of
each engine phase (propose, decide, forward, verify, other) summed over its steps, with the
steps taken, the rows scored and, of those, the prompt rows (prompt tokens computed: fewer than
the prompts hold where the prefix cache served some).

    python -m benchmarks.phase_totals --proposer medusa --workload code-edit --concurrency 16
        [--requests 16] [--rounds 2] [--new-tokens 128] [--threads 2]

What it shows: whether speculation's cost is the proposer's calls, the policy, or the forward
pass's extra rows, and whether the accepted tokens saved steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import torch

from benchmarks.machine import machine_info, machine_lines
from benchmarks.spec_bench import build_engine, load_workloads, parse_args
from benchmarks.spec_cells import encode_item
from specserve.engine.engine import Engine
from specserve.engine.observer import PHASES, EngineObserver, StepTiming
from specserve.engine.plan import is_decode
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams


class Totals(EngineObserver):
    """Seconds per phase, steps, scored rows and prompt rows, summed over a run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.rows = 0
        self.prompt_rows = 0

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        self.steps += 1
        for phase in PHASES:
            self.seconds[phase] += timing.seconds[phase]
        self.seconds["other"] += timing.other
        if timing.plan is not None:
            seqs = timing.plan.seqs
            self.rows += sum(p.work.num_tokens + len(p.draft_tokens) for p in seqs)
            self.prompt_rows += sum(p.work.num_tokens for p in seqs if not is_decode(p.work))


def run(
    engine: Engine, prompts: list[list[int]], n: int, concurrency: int, new_tokens: int
) -> tuple[float, Totals]:
    """The prompts `concurrency` at a time with speculate = n: wall seconds and the totals."""
    totals = Totals()
    engine.observers.add(totals)
    engine.reset_proposer_cache()
    engine.reset_prefix_cache()
    start = time.perf_counter()
    for i in range(0, len(prompts), concurrency):
        for prompt in prompts[i : i + concurrency]:
            params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, speculate=n)
            engine.add_request(prompt, params)
        while engine.has_work():
            engine.step()
    wall = time.perf_counter() - start
    engine.observers.remove(totals)
    return wall, totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proposer", default="ngram")
    p.add_argument("--workload", default="code-edit", help="a built-in name or a .jsonl")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench_args = parse_args(
        ["--threads", str(args.threads), "--proposer", args.proposer, "--policy", "adaptive",
         "--speculate", "0,4", "--concurrency", str(args.concurrency), "--prompts-per-workload",
         str(args.requests), "--workloads", args.workload, "--new-tokens", str(args.new_tokens)]
    )  # fmt: skip
    engine = build_engine(bench_args, args.proposer)
    items = next(iter(load_workloads(bench_args).values()))[: args.requests]
    prompts = [encode_item(engine, item) for item in items]
    for n in (0, 4):  # warm-up: kernels built, the cost profile's first corrections
        run(engine, prompts, n, args.concurrency, args.new_tokens)
    print(machine_lines(machine_info("benchmarks.phase_totals", argv or sys.argv[1:])))
    names = [*PHASES, "other"]
    print(f"\n{args.proposer}, {args.workload}, {len(prompts)} requests {args.concurrency} at a "
          f"time, {args.new_tokens} new tokens, seconds summed over each run:\n")  # fmt: skip
    print("| N | round | wall | steps | rows | prompt rows | " + " | ".join(names) + " |")
    print("|---:|---:|---:|---:|---:|---:|" + "---:|" * len(names))
    for r in range(args.rounds):
        for n in (0, 4):
            wall, t = run(engine, prompts, n, args.concurrency, args.new_tokens)
            cells = " | ".join(f"{t.seconds[name]:.2f}" for name in names)
            rows = f"{t.rows} | {t.prompt_rows}"
            print(f"| {n} | {r + 1} | {wall:.2f} | {t.steps} | {rows} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
