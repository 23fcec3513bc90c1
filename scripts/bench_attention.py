"""Step cost of the embedded model against the batch mix: ragged attention against the reference.

Calls `ModelRunner.run` directly (no scheduler, no sampling) with both attention paths, side by
side in one process, every configuration measured on each path in turn:
- the mixed step: 15 decode rows with 800 cached tokens each, one 512-token prefill chunk, and
  the two in one step, against the sum of the parts;
- a decode step (one row per sequence) against context length, at batch 1 and batch 16;
- a verify step (k + 1 rows for one sequence) against k, at 800 tokens of context.

Usage (repo root, after the default model has been loaded once so its cache exists):
    PYTHONPATH=. python scripts/bench_attention.py [--threads 2] [--repeats 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

from specserve.bench.machine import machine_info, machine_lines, markdown_table
from specserve.config import AttentionImpl
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator

BLOCK = 16
PATHS: tuple[AttentionImpl, ...] = ("reference", "auto")


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


class Steps:
    """Block tables for sequences of given lengths on one allocator, reused across runs."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator

    def table(self, num_tokens: int) -> list[int]:
        table: list[int] = []
        self.allocator.grow(table, num_tokens)
        return table

    def decode(self, ctx: int, rows: int = 1) -> RunItem:
        """One sequence scoring `rows` new tokens after ctx - rows cached ones."""
        return RunItem([1] * rows, ctx - rows, self.table(ctx), rows)

    def prefill(self, n: int) -> RunItem:
        return RunItem([1] * n, 0, self.table(n), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--contexts", default="64,256,1024,2048,4096")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    info = machine_info("scripts/bench_attention.py", sys.argv[1:])
    model = build_model(resolve_model_dir(None), torch.device("cpu"))
    contexts = [int(c) for c in args.contexts.split(",")]
    num_blocks = 16 * (max(contexts) // BLOCK + 1) + 64
    runners, steps = {}, {}
    for impl in PATHS:
        runner = ModelRunner(model, num_blocks, BLOCK, torch.device("cpu"), attention=impl)
        runners[impl], steps[impl] = runner, Steps(BlockAllocator(num_blocks, BLOCK))
    if not runners["auto"].ragged:
        raise SystemExit("the paged attention kernel does not run here: nothing to compare")

    def measure(make: Callable[[Steps], list[RunItem]]) -> dict[str, float]:
        out = {}
        for impl in PATHS:
            items = make(steps[impl])
            out[impl] = median_ms(lambda r=runners[impl], i=items: r.run(i), args.repeats)
            for item in items:
                steps[impl].allocator.free(list(item.block_table))
        return out

    results: dict[str, dict[str, float]] = {
        "15 decode rows x 800 cached": measure(lambda s: [s.decode(800) for _ in range(15)]),
        "one 512-token prefill chunk": measure(lambda s: [s.prefill(512)]),
        "both in one step": measure(
            lambda s: [*(s.decode(800) for _ in range(15)), s.prefill(512)]
        ),
    }
    for batch in (1, 16):
        for ctx in contexts:
            results[f"decode B={batch} ctx={ctx}"] = measure(
                lambda s, b=batch, c=ctx: [s.decode(c) for _ in range(b)]
            )
    for k in (0, 1, 2, 4, 8):
        results[f"verify k={k} ctx=800"] = measure(lambda s, k=k: [s.decode(800, k + 1)])
    report(info, results, contexts)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "ms": results}, f, indent=1)


def report(info: dict, results: dict[str, dict[str, float]], contexts: list[int]) -> None:
    print(machine_lines(info), "\n")
    rows = [[name, f"{ms['reference']:.1f}", f"{ms['auto']:.1f}",
             f"{ms['reference'] / ms['auto']:.2f}x"] for name, ms in results.items()]  # fmt: skip
    print(markdown_table(["step (median ms)", "reference", "ragged", "speed-up"], rows), "\n")
    parts = ("15 decode rows x 800 cached", "one 512-token prefill chunk")
    for impl in PATHS:
        mixed = results["both in one step"][impl]
        total = sum(results[name][impl] for name in parts)
        print(f"- {impl}: mixed step / sum of parts = {mixed:.1f} / {total:.1f} = "
              f"{mixed / total:.2f}")  # fmt: skip
    for batch in (1, 16):
        base = results[f"decode B={batch} ctx={contexts[0]}"]["auto"]
        for ctx in contexts[1:]:
            ratio = results[f"decode B={batch} ctx={ctx}"]["auto"] / base
            print(f"- ragged decode B={batch}: ctx {ctx} / ctx {contexts[0]} = {ratio:.2f}")
    base = results["verify k=0 ctx=800"]["auto"]
    for k in (1, 2, 4, 8):
        ratio = results[f"verify k={k} ctx=800"]["auto"] / base
        print(f"- ragged verify k={k} / k=0 = {ratio:.2f}")


if __name__ == "__main__":
    main()
