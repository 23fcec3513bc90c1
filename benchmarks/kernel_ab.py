"""Two builds of the GGUF block library side by side in one process: a kernel change's cost.

Each case (a q8 product per interleaved and plain kind at M = 1 and 16, the exact product at
M = 1 and 4, dequantising interleaved rows; shapes N x K = 1536 x 768 and 576 x 1536) runs on
library A and library B in turn, best of --repeats by the thread's CPU time on one thread (on a
shared machine that leaves out the time other processes held the core). An A/A run (the same
file copied) shows the noise: within 0.3 % here.

Usage (repo root); A from another revision, built as that revision built it, e.g. before #57's
units:
    git archive REV specserve/kernels | tar -x -C /tmp/a
    gcc -O3 -mavx2 -mfma -mf16c -ffp-contract=off -fopenmp -fPIC -shared \\
        /tmp/a/specserve/kernels/ggml_blocks.c -o /tmp/a.so -lm
    python -m benchmarks.kernel_ab /tmp/a.so [B.so] [--repeats 30] [--only "M=16"]
B defaults to this checkout's library (built into the cache on first use).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from benchmarks.bench_blocks import best_of_turns, random_blocks
from specserve.kernels import build, ggml
from specserve.kernels.block_kinds import BlockKind

Case = tuple[str, Callable[[], object]]
Q8_KINDS = (
    BlockKind.Q4_1_X8, BlockKind.Q8_0_X8, BlockKind.Q4_K_X8, BlockKind.Q5_K_X8,
    BlockKind.Q6_K_X8, BlockKind.Q5_1_X8, BlockKind.Q4_1, BlockKind.Q6_K,
)  # fmt: skip


def bind(path: str) -> ctypes.CDLL:
    """The library at `path` with ggml.py's argument types."""
    lib = ctypes.CDLL(path)
    real = build.load
    build.load = lambda spec, logger: lib
    try:
        bound = ggml.library.__wrapped__()
    finally:
        build.load = real
    assert bound is not None
    return bound


def using(lib: ctypes.CDLL, case: Callable[[], object]) -> None:
    ggml.library = lambda: lib  # type: ignore[assignment]
    case()


def cases() -> list[Case]:
    out: list[Case] = []
    for n, k in ((1536, 768), (576, 1536)):
        for kind in Q8_KINDS:
            rows = random_blocks(kind.plain, n, k)
            w = ggml.repack_x8(rows, kind.plain, k) if kind.interleaved else rows
            for m in (1, 16):
                x = torch.randn(m, k)
                q8 = partial(ggml.matmul, x, w, kind, 1, True)
                out.append((f"q8 {kind.name} {n}x{k} M={m}", q8))
        for kind in (BlockKind.Q4_1, BlockKind.Q4_K):
            rows = random_blocks(kind, n, k)
            for m in (1, 4):
                x = torch.randn(m, k)
                exact = partial(ggml.matmul, x, rows, kind, 1)
                out.append((f"exact {kind.name} {n}x{k} M={m}", exact))
        x8 = ggml.repack_x8(random_blocks(BlockKind.Q4_K, n, k), BlockKind.Q4_K, k)
        dequant = partial(ggml.dequantize, x8, BlockKind.Q4_K_X8, k)
        out.append((f"dequant Q4_K_X8 {n}x{k}", dequant))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="library A (.so)")
    parser.add_argument("b", nargs="?", help="library B (.so); default: this checkout's")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--only", default="", help="run the cases whose name holds this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lib_b = bind(args.b) if args.b else ggml.library()
    if lib_b is None:
        raise SystemExit("the block kernels do not build here")
    lib_a = bind(args.a)
    print(f"A {args.a}, B {args.b or lib_b._name}: 1 thread, best of {args.repeats} (thread CPU)\n")
    print("| case | A us | B us | B / A |\n|---|---|---|---|")
    ratios = []
    for name, case in cases():
        if args.only not in name:
            continue
        a, b = best_of_turns(
            [partial(using, lib_a, case), partial(using, lib_b, case)], args.repeats,
            time.thread_time,
        )  # fmt: skip
        ratios.append(b / a)
        print(f"| {name} | {1e6 * a:.0f} | {1e6 * b:.0f} | {b / a:.3f} |", flush=True)
    print(f"\ngeometric mean B / A: {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    main()
