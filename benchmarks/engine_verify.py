"""Verify cost of the embedded model as the engine runs it, in process, side by side.

One sequence with ~256 tokens of context scores k + 1 rows in one step (`verify_cost`'s
measurement: `ModelRunner.run`, fp16 KV cache, the native layer stack), on each side: a
numerics (q8, exact), PLAIN_ROWS (q8 on the GGUF row layout, before rows were interleaved
eight at a time), Q8_AVX2 (q8 with the AVX2 kernels forced: on a CPU with AVX512-VNNI, the
path it would take without it; the same numbers bit for bit) or SMALL_PAGES (q8 with each
weight tensor and the KV cache where torch allocates them, on 4 KiB pages, instead of on
the huge pages of `models/huge_pages.py`; the same numbers bit for bit). Used by `bench_llamacpp`'s
verify part, and on its own:

    python -m benchmarks.engine_verify [--threads 2] [--sides "q8,q8 AVX2,exact"]
        [--ks 0,1,2,3,4,5,6,7,8] [--context 256] [--rounds 6] [--attention] [--json FILE]

`--attention` also times the paged attention kernel alone for the same k + 1 rows: the
model's layers' calls over a random fp16 cache of the same context (its share of a row's cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.llamacpp_report import verify_table
from benchmarks.machine import machine_info, machine_lines
from benchmarks.verify_cost import Point, time_steps
from specserve.config import Numerics
from specserve.kernels import attention, ggml
from specserve.models.block_linear import plain_rows
from specserve.models.huge_pages import small_pages
from specserve.models.llama import DecoderLM
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model, read_config
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator

PLAIN_ROWS = "q8, plain rows"  # a side of engine_verify_costs: the kernel before interleaving
Q8_AVX2 = "q8 AVX2"  # a side: q8 with the AVX2 kernels forced (the narrower path where VNNI runs)
SMALL_PAGES = "q8 4K pages"  # a side: q8 with the weights and KV cache off huge pages


def _kernels(side: str) -> AbstractContextManager[None]:
    return ggml.forced_q8("avx2") if side == Q8_AVX2 else nullcontext()


def engine_verify_costs(
    sides: Sequence[str], ks: list[int], context: int = 256, rounds: int = 3
) -> dict[str, list[Point]]:
    """In process, batch 1: ms of a step scoring k + 1 rows, as the engine runs it, for each
    side (a numerics, PLAIN_ROWS, Q8_AVX2 or SMALL_PAGES). Every side's model is loaded and
    its context prefilled first; then, `rounds` times, each k is timed on every side, the sides
    taking turns step by step (two warm-up steps each, then five), so that a slow spell on the
    machine lands on all sides alike. A cell is the median of its 5 * rounds steps."""
    blocks = (context + max(ks) + 1) // 16 + 2
    gen = torch.Generator().manual_seed(0)
    setups: dict[str, tuple[ModelRunner, list[int]]] = {}
    for side in sides:
        numerics: Numerics = "q8" if side in (PLAIN_ROWS, Q8_AVX2, SMALL_PAGES) else side  # type: ignore[assignment]
        layout = plain_rows() if side == PLAIN_ROWS else nullcontext()
        with layout, small_pages() if side == SMALL_PAGES else nullcontext():
            model = build_model(resolve_model_dir(None), torch.device("cpu"), numerics=numerics)
            runner = ModelRunner(model, blocks, 16, torch.device("cpu"), kv_dtype="float16")
        table: list[int] = []
        BlockAllocator(blocks, 16).grow(table, context + max(ks) + 1)
        prompt = torch.randint(0, model.arch.vocab_size, (context,), generator=gen).tolist()
        with _kernels(side):
            runner.run([RunItem(prompt, 0, table, 0)])
        setups[side] = (runner, table)
    seconds: dict[tuple[str, int], list[float]] = {(side, k): [] for side in sides for k in ks}
    for _ in range(rounds):
        for k in ks:
            drafts = torch.randint(0, 1000, (k + 1,), generator=gen).tolist()
            for step in range(7):  # two warm-up steps, then five timed, the sides alternating
                for side, (runner, table) in setups.items():
                    with _kernels(side):
                        item = RunItem(drafts, context, table, k + 1)
                        timed = time_steps(runner, [item], warmup=0, repeats=1)
                    if step >= 2:
                        seconds[side, k] += timed
    out = {}
    for side in sides:
        ms = [1e3 * statistics.median(seconds[side, k]) for k in ks]
        base = ms[ks.index(0)] if 0 in ks else None
        out[side] = [
            Point(1, k, k + 1, m, 1e3 * min(seconds[side, k]), 1e3 * max(seconds[side, k]), m,
                  m / base if base else None)
            for k, m in zip(ks, ms, strict=True)
        ]  # fmt: skip
    return out


def attention_costs(ks: list[int], context: int, repeats: int = 101) -> list[tuple[int, float]]:
    """Median ms of the embedded model's attention alone (one paged-kernel call per layer) for
    k + 1 query rows of one sequence over `context` cached keys (fp16, random values)."""
    arch = DecoderLM.arch_from_hf(read_config(resolve_model_dir(None)))
    heads, kv_heads, dim, block = arch.num_heads, arch.num_kv_heads, arch.head_dim, 16
    blocks = (context + max(ks) + 1) // block + 2
    gen = torch.Generator().manual_seed(1)
    k_cache = torch.randn(kv_heads, blocks * block, dim, generator=gen).half()
    v_cache = torch.randn(kv_heads, blocks * block, dim, generator=gen).half()
    tables = torch.arange(blocks, dtype=torch.int32).view(1, -1)
    out = []
    for k in ks:
        q = torch.randn(k + 1, heads, dim, generator=gen)
        result = torch.empty_like(q)
        seqs = torch.tensor([[0, k + 1, context + k + 1]])
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(arch.num_layers):
                attention.paged_attention(
                    q, k_cache, v_cache, result, seqs, tables, block, dim**-0.5, None
                )
            times.append(time.perf_counter() - start)
        out.append((k, 1e3 * statistics.median(times)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sides", default=f"q8,{Q8_AVX2},exact", help="comma-separated sides")
    p.add_argument("--ks", default="0,1,2,3,4,5,6,7,8")
    p.add_argument("--context", type=int, default=256, help="tokens already in the cache")
    p.add_argument("--rounds", type=int, default=6, help="passes over every (k, side)")
    p.add_argument("--attention", action="store_true", help="also the attention kernel alone")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    known = ("q8", "exact", PLAIN_ROWS, Q8_AVX2, SMALL_PAGES)
    if unknown := [side for side in sides if side not in known]:
        raise SystemExit(f"unknown sides {unknown}; known: {known}")
    info = machine_info("benchmarks.engine_verify", sys.argv[1:])
    print(machine_lines(info) + "\n")
    verify = engine_verify_costs(sides, [int(k) for k in args.ks.split(",")], args.context,
                                 args.rounds)  # fmt: skip
    print(verify_table(verify, args.context))
    if args.attention:
        rows = attention_costs([int(k) for k in args.ks.split(",")], args.context)
        print(f"\nattention alone (every layer's kernel call), {args.context} tokens of context:\n")
        print("| rows | ms | / 1 row |\n|---:|---:|---:|")
        for k, ms in rows:
            print(f"| {k + 1} | {ms:.2f} | {ms / rows[0][1]:.2f}x |")
    if args.json:
        points = {side: [asdict(p) for p in pts] for side, pts in verify.items()}
        Path(args.json).write_text(json.dumps({"machine": info, "verify": points}, indent=1))


if __name__ == "__main__":
    main()
