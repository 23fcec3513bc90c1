"""Step cost of the embedded model against the batch mix: the paged kernel (float32 and fp16 KV)
against the padded reference.

Calls `ModelRunner.run` directly (no scheduler, no sampling) with each path, side by side in one
process, every configuration measured on each path in turn:
- a prefill chunk from position 0 (64 and 1024 tokens; 512 below);
- one layer's attention alone for such a chunk: SDPA on the chunk's fresh K/V (what prefill
  chunks ran before every row went through the kernel) against the kernel over the cache;
- the mixed step: 15 decode rows with 800 cached tokens each, one 512-token prefill chunk, and
  the two in one step, against the sum of the parts;
- a decode step (one row per sequence) against context length, at batch 1 and batch 16;
- a verify step (k + 1 rows for one sequence) against k, at 800 tokens of context.

Usage (repo root, after the default model has been loaded once so its cache exists):
    python -m benchmarks.bench_attention [--threads 2] [--repeats 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.machine import machine_info, machine_lines, markdown_table
from specserve.config import AttentionImpl, KvDtype
from specserve.kernels import attention as kernel
from specserve.models.arch import ModelArch
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator

BLOCK = 16
# name -> (attention, KV dtype where the kernel reads the cache)
PATHS: dict[str, tuple[AttentionImpl, KvDtype]] = {
    "reference": ("reference", "float32"),
    "kernel f32": ("auto", "float32"),
    "kernel f16": ("auto", "float16"),
}


def interleaved_ms(
    ways: Mapping[str, Callable[[], object]], repeats: int, stat: str
) -> dict[str, float]:
    """Each way once per round, in turn, so a busy neighbour slows all of them alike; the first
    round warms up. `stat`: median, or min (the least disturbed run, on a shared machine)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats + 1):
        for name, fn in ways.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    pick = min if stat == "min" else statistics.median
    return {name: pick(t[1:]) * 1e3 for name, t in times.items()}


# Context of the decode rows in the fixed mixes (beside a prefill chunk, and verifying k drafts).
MIX_CONTEXT = 800


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


def build_paths(model: Any, max_context: int) -> tuple[dict[str, ModelRunner], dict[str, Steps]]:
    """A runner and its step builder per path of PATHS, with blocks for 16 sequences of
    `max_context` tokens and some to spare."""
    num_blocks = 16 * (max_context // BLOCK + 1) + 64
    runners, steps = {}, {}
    for name, (impl, kv_dtype) in PATHS.items():
        runner = ModelRunner(model, num_blocks, BLOCK, torch.device("cpu"), impl, kv_dtype)
        runners[name], steps[name] = runner, Steps(BlockAllocator(num_blocks, BLOCK))
    return runners, steps


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--stat", choices=("median", "min"), default="median")
    p.add_argument("--contexts", default="64,256,1024,2048,4096")
    p.add_argument("--prefills", default="64,1024")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    info = machine_info("benchmarks.bench_attention", sys.argv[1:])
    info["stat"] = args.stat
    model = build_model(resolve_model_dir(None), torch.device("cpu"))
    contexts = [int(c) for c in args.contexts.split(",")]
    prefills = [int(x) for x in args.prefills.split(",")]
    # the fixed mixes below decode at MIX_CONTEXT: blocks for them too, whatever --contexts says
    runners, steps = build_paths(model, max(*contexts, *prefills, MIX_CONTEXT))
    if not runners["kernel f16"].ragged:
        raise SystemExit("the paged attention kernel does not run here: nothing to compare")

    def measure(make: Callable[[Steps], list[RunItem]]) -> dict[str, float]:
        items = {name: make(steps[name]) for name in PATHS}
        ways = {name: partial(runners[name].run, items[name]) for name in PATHS}
        out = interleaved_ms(ways, args.repeats, args.stat)
        for name in PATHS:
            for item in items[name]:
                steps[name].allocator.free(list(item.block_table))
        return out

    def prefill(n: int) -> Callable[[Steps], list[RunItem]]:
        return lambda s: [s.prefill(n)]

    def decodes(ctx: int, batch: int, rows: int = 1) -> Callable[[Steps], list[RunItem]]:
        return lambda s: [s.decode(ctx, rows) for _ in range(batch)]

    results = {f"prefill {n} tokens": measure(prefill(n)) for n in prefills}
    results |= {
        f"15 decode rows x {MIX_CONTEXT} cached": measure(decodes(MIX_CONTEXT, 15)),
        "one 512-token prefill chunk": measure(prefill(512)),
        "both in one step": measure(
            lambda s: [*(s.decode(MIX_CONTEXT) for _ in range(15)), s.prefill(512)]
        ),
    }
    for n in (64, 512, 1024):
        results[f"one layer's attention, {n}-token chunk"] = chunk_attention_ms(
            model.arch, n, args.repeats, args.stat
        )
    for batch in (1, 16):
        for ctx in contexts:
            results[f"decode B={batch} ctx={ctx}"] = measure(decodes(ctx, batch))
    for k in (0, 1, 2, 4, 8):
        results[f"verify k={k} ctx={MIX_CONTEXT}"] = measure(decodes(MIX_CONTEXT, 1, k + 1))
    report(info, results, contexts)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "ms": results}, f, indent=1)


def chunk_attention_ms(arch: ModelArch, n: int, repeats: int, stat: str) -> dict[str, float]:
    """One layer's attention for an n-token chunk from position 0, each way in turn per repeat:
    SDPA, causal, on the chunk's fresh float32 K/V (the old prefill path; "reference" here), and
    the kernel over a float32 and an fp16 cache (the K/V write not counted on either side)."""
    heads, kv_heads, dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
    q = torch.randn(n, heads, dim)
    k, v = torch.randn(kv_heads, n, dim), torch.randn(kv_heads, n, dim)
    seqs, table = torch.tensor([[0, n, n]]), torch.arange(-(-n // BLOCK), dtype=torch.int32)[None]
    out = torch.empty_like(q)

    def sdpa() -> None:
        F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k[None], v[None], is_causal=True, scale=dim**-0.5,
            enable_gqa=True,
        )  # fmt: skip

    def paged(dtype: torch.dtype) -> Callable[[], None]:
        kc, vc = k.to(dtype), v.to(dtype)
        return lambda: kernel.paged_attention(q, kc, vc, out, seqs, table, BLOCK, dim**-0.5, None)

    ways = {"reference": sdpa, "kernel f32": paged(torch.float32)}
    ways["kernel f16"] = paged(torch.float16)
    return interleaved_ms(ways, repeats, stat)


def report(info: dict, results: dict[str, dict[str, float]], contexts: list[int]) -> None:
    print(machine_lines(info), "\n")
    rows = [[name, *(f"{ms[p]:.1f}" for p in PATHS), f"{ms['kernel f32'] / ms['kernel f16']:.2f}x"]
            for name, ms in results.items()]  # fmt: skip
    head = [f"step ({info['stat']} ms)", *PATHS, "f32 / f16"]
    print(markdown_table(head, rows), "\n")
    parts = (f"15 decode rows x {MIX_CONTEXT} cached", "one 512-token prefill chunk")
    for impl in PATHS:
        mixed = results["both in one step"][impl]
        total = sum(results[name][impl] for name in parts)
        print(f"- {impl}: mixed step / sum of parts = {mixed:.1f} / {total:.1f} = "
              f"{mixed / total:.2f}")  # fmt: skip
    for batch in (1, 16):
        base = results[f"decode B={batch} ctx={contexts[0]}"]["kernel f16"]
        for ctx in contexts[1:]:
            ratio = results[f"decode B={batch} ctx={ctx}"]["kernel f16"] / base
            print(f"- kernel f16 decode B={batch}: ctx {ctx} / ctx {contexts[0]} = {ratio:.2f}")
    base = results[f"verify k=0 ctx={MIX_CONTEXT}"]["kernel f16"]
    for k in (1, 2, 4, 8):
        ratio = results[f"verify k={k} ctx={MIX_CONTEXT}"]["kernel f16"] / base
        print(f"- kernel f16 verify k={k} / k=0 = {ratio:.2f}")


if __name__ == "__main__":
    main()
