"""All of the embedded model's projections at M activation rows: GGUF blocks against float32.

For each M, one pass over the 211 projection matrices of SmolLM2-135M (every layer's q/k/v,
o, gate/up, down, and the tied lm_head) five ways, side by side:
- q8: the block kernel in the q8 numerics (`--numerics q8`, the default; every M): each
  activation row quantised to int8 per 32 values, integer dot products, on the weights as
  `BlockLinear` holds them (rows interleaved eight at a time, `kernels/x8.h`), on the widest
  path the CPU has; where that is AVX512-VNNI, also "q8 AVX2": the same with AVX2 forced
  (bit-identical results, more instructions per row);
- q8 plain: the same numerics on the GGUF rows as stored (the kernel before interleaving);
- blocks: the block kernel in float32 (`--numerics exact` up to DIRECT_MAX_ROWS);
- decode + mm: decode each matrix to float32, then MKL (`BlockLinear`'s path above it);
- dense: MKL on float32 weights kept in memory (`--dense-weights`).
The matrices are not fused here (q, k, v separately), so absolute times are a little above the
engine's; the ratios are what matters.

With --decode N, instead: batch-1 greedy decode of N tokens in process (the `LLM` class, the
embedded model, speculation off) in each numerics, tok/s after the first token and ms per step,
best of --repeats; each with the layers in one native call (the default, `NativeStack`) and
with the Python layer loop (`python_layers()`), interleaved: the difference per step is the
framework overhead the native stack removes (outputs are bit-identical either way).

Usage (repo root, after the default model has been loaded once so its cache exists):
    python -m benchmarks.bench_blocks [--threads 2] [--rows 1,2,3,4,5,6,8,16,24,32,64]
        [--scalar] [--cpu-clock] [--decode 128]
    python -m benchmarks.bench_blocks --kinds [--threads 2] [--repeats 20]
--kinds: instead, the q8 product of one matrix per GGUF kind (random blocks with valid scales)
at M = 1 and 16, shapes N x K = 1536 x 768 and 576 x 1536 (K a multiple of the K-quants' 256;
both stay in the L3 cache) and 2048 x 8192 (a Llama-3.2-1B down projection, streamed from memory),
plain rows and, for each kind that has one, the interleaved form BlockLinear repacks them to
(*_X8), against Q4_1 as GGUF stores it and as interleaved (Q4_1_X8); "x8 / plain": an
interleaved kind's time over its plain kind's.
--scalar: the q8 column on the scalar reference instead of the vector path. --cpu-clock: time
by the process's CPU time instead of the wall clock (on a shared machine, with --threads 1, it
leaves out the time other processes held the core).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.machine import machine_info, machine_lines
from specserve.config import EngineConfig, Numerics
from specserve.kernels import ggml
from specserve.models.block_linear import BlockLinear
from specserve.models.gguf_weights import read_weights
from specserve.models.loader import gguf_source, open_gguf, resolve_model_dir
from specserve.models.registry import read_config


def best_of_turns(
    fns: Sequence[Callable[[], None]], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """Each fn's best time over `repeats` rounds in which every fn runs once in turn, so that
    a slow spell on a shared machine lands on all of them alike."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            started = clock()
            fn()
            best[i] = min(best[i], clock() - started)
    return best


# kind, blocks, float32 weight, and the blocks as the q8 numerics holds them (BlockLinear)
Item = tuple[ggml.BlockKind, torch.Tensor, torch.Tensor, BlockLinear]
Items = list[Item]


def on_blocks(items: Items, xs: dict[int, torch.Tensor]) -> None:
    for kind, rows, w, _ in items:
        ggml.matmul(xs[w.shape[1]], rows, kind)


def on_q8(items: Items, xs: dict[int, torch.Tensor]) -> None:
    for _, _, w, served in items:
        ggml.matmul(xs[w.shape[1]], served.blocks, served.kind, q8=True)


def on_q8_avx2(items: Items, xs: dict[int, torch.Tensor]) -> None:
    with ggml.forced_q8("avx2"):
        on_q8(items, xs)


def on_q8_plain(items: Items, xs: dict[int, torch.Tensor]) -> None:
    for kind, rows, w, _ in items:
        ggml.matmul(xs[w.shape[1]], rows, kind, q8=True)


def decoded(items: Items, xs: dict[int, torch.Tensor]) -> None:
    for kind, rows, w, _ in items:
        F.linear(xs[w.shape[1]], ggml.dequantize(rows, kind, w.shape[1]))


def on_dense(items: Items, xs: dict[int, torch.Tensor]) -> None:
    for _, _, w, _ in items:
        F.linear(xs[w.shape[1]], w)


def decode_rates(
    numerics: Numerics, tokens: int, threads: int, repeats: int
) -> tuple[float, float]:
    """Best batch-1 greedy decode rate (tok/s after the first token) over `repeats` runs, with
    the native layer stack and with the Python layers, runs interleaved."""
    from specserve import LLM
    from specserve.models.native_stack import python_layers
    from specserve.request import SamplingParams

    llm = LLM(config=EngineConfig(numerics=numerics, num_threads=threads))
    engine = llm.engine
    prompt = engine.encode_chat(
        [{"role": "user", "content": "Tell me a story about a lighthouse."}]
    )
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    llm.generate([prompt], SamplingParams(max_new_tokens=8))  # warm-up

    def rate() -> float:
        engine.add_request(prompt, params)
        engine.step()  # prefill and the first token
        started, produced = time.perf_counter(), 1
        while engine.has_work():
            produced += sum(len(out.new_token_ids) for out in engine.step())
        return (produced - 1) / (time.perf_counter() - started)

    native, python = [], []
    for _ in range(repeats):
        native.append(rate())
        with python_layers():
            python.append(rate())
    return max(native), max(python)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,2,3,4,5,6,8,16,24,32,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scalar", action="store_true", help="q8 on the scalar reference")
    p.add_argument("--cpu-clock", action="store_true", help="time by process CPU time")
    p.add_argument("--decode", type=int, default=0, help="tokens of batch-1 decode instead")
    p.add_argument("--kinds", action="store_true", help="one matrix per GGUF kind instead")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.decode:
        print_decode(args)
        return
    if args.kinds:
        print_kinds(args)
        return
    blocks = embedded_blocks()
    if not blocks or ggml.library() is None:
        raise SystemExit("no GGUF blocks or no block kernels on this machine")
    dense = {  # what --dense-weights runs: the same weights decoded once
        name: ggml.dequantize(rows, kind, rows.shape[1] // kind.block_bytes * kind.block_values)
        for name, (kind, rows) in blocks.items()
    }
    print(machine_lines(machine_info("benchmarks.bench_blocks", sys.argv[1:])) + "\n")
    print(f"{len(blocks)} matrices, {sum(b.numel() for _, b in blocks.values()) / 2**20:.0f} MiB "
          f"of blocks, {sum(w.numel() * 4 for w in dense.values()) / 2**20:.0f} MiB float32, "
          f"{args.threads} threads; best of {args.repeats} rounds, the columns in turn "
          f"(ms per pass, {'CPU time' if args.cpu_clock else 'wall clock'})\n")  # fmt: skip
    print_projections(args, blocks, dense)


def embedded_blocks() -> dict[str, tuple[ggml.BlockKind, torch.Tensor]]:
    """The embedded GGUF's projection matrices as their blocks, read in place."""
    model_dir = resolve_model_dir(None)
    path = gguf_source(model_dir)
    if path is None:
        raise SystemExit(f"{model_dir} is not a GGUF model's cache")
    config = read_config(model_dir)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    return read_weights(open_gguf(path), heads, kv_heads, keep_blocks=True).blocks


def print_decode(args: argparse.Namespace) -> None:
    """--decode: batch-1 decode with the native layer stack against the Python layers."""
    print(f"batch-1 decode, {args.threads} threads, best of {args.repeats}\n")
    print("| numerics | native stack tok/s | Python layers tok/s | native / Python | "
          "ms per step native | Python | overhead removed ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    modes: tuple[Numerics, ...] = ("q8", "exact")
    for numerics in modes:
        native, python = decode_rates(numerics, args.decode, args.threads, args.repeats)
        ms, ms_py = 1e3 / native, 1e3 / python
        print(f"| {numerics} | {native:.1f} | {python:.1f} | {native / python:.2f}x | "
              f"{ms:.2f} | {ms_py:.2f} | {ms_py - ms:.2f} |")  # fmt: skip


def print_projections(
    args: argparse.Namespace,
    blocks: dict[str, tuple[ggml.BlockKind, torch.Tensor]],
    dense: dict[str, torch.Tensor],
) -> None:
    """The table of all projections at each M of --rows, the columns taking turns."""
    vnni = ggml.q8_path() == "vnni" and not args.scalar
    print("| M | q8 | q8 plain | blocks | decode + mm | dense | q8 / M=1 | q8 plain / M=1 | "
          "blocks / M=1 | q8 plain / q8 | blocks / q8 |"
          + (" q8 AVX2 | q8 AVX2 / M=1 | q8 AVX2 / q8 |" if vnni else ""))  # fmt: skip
    print("|---" * (14 if vnni else 11) + "|")
    first: tuple[float, ...] | None = None
    items = [
        (kind, rows, dense[name], BlockLinear(rows, kind, dense[name].shape[1], None, "q8"))
        for name, (kind, rows) in blocks.items()
    ]
    fns = (on_q8, on_q8_plain, on_blocks, decoded, on_dense) + ((on_q8_avx2,) if vnni else ())
    for m in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(m, k) for k in {w.shape[1] for w in dense.values()}}
        passes = [partial(fn, items, xs) for fn in fns]
        with ggml.scalar_q8() if args.scalar else nullcontext():
            clock = time.process_time if args.cpu_clock else time.perf_counter
            t = [1e3 * seconds for seconds in best_of_turns(passes, args.repeats, clock)]
        t_q, t_p, t_b, t_d, t_f = t[:5]
        first = first or (t_q, t_p, t_b, *t[5:])
        avx2 = f" {t[5]:.1f} | {t[5] / first[3]:.2f} | {t[5] / t_q:.2f} |" if vnni else ""
        print(f"| {m} | {t_q:.1f} | {t_p:.1f} | {t_b:.1f} | {t_d:.1f} | {t_f:.1f} | "
              f"{t_q / first[0]:.2f} | {t_p / first[1]:.2f} | {t_b / first[2]:.2f} | "
              f"{t_p / t_q:.2f} | {t_b / t_q:.2f} |{avx2}")  # fmt: skip


# Where each kind's fp16 scales lie in its block: (first byte, how many halves).
_HALVES = {
    ggml.BlockKind.Q4_0: (0, 1), ggml.BlockKind.Q4_1: (0, 2), ggml.BlockKind.Q5_0: (0, 1),
    ggml.BlockKind.Q5_1: (0, 2), ggml.BlockKind.Q8_0: (0, 1), ggml.BlockKind.Q4_K: (0, 2),
    ggml.BlockKind.Q5_K: (0, 2), ggml.BlockKind.Q6_K: (208, 1),
}  # fmt: skip


def random_blocks(kind: ggml.BlockKind, n: int, k: int) -> torch.Tensor:
    """Random block bytes [n, row_bytes] whose fp16 scales are small finite numbers."""
    rows = torch.randint(0, 256, (n, k // kind.block_values, kind.block_bytes), dtype=torch.uint8)
    at, count = _HALVES[kind]
    halves = (torch.randn(n, k // kind.block_values, count) * 0.01).half()
    rows[:, :, at : at + 2 * count] = halves.view(torch.uint8)
    return rows.reshape(n, -1).contiguous()


def q8_product(x: torch.Tensor, blocks: torch.Tensor, kind: ggml.BlockKind) -> None:
    ggml.matmul(x, blocks, kind, q8=True)


def print_kinds(args: argparse.Namespace) -> None:
    """--kinds: the q8 product per GGUF kind at M = 1 and 16, plain and interleaved, against
    Q4_1 (plain and x8)."""
    kinds = [*ggml.GGUF_KINDS, *(kind.x8 for kind in ggml.GGUF_KINDS if kind.has_x8)]
    print(machine_lines(machine_info("benchmarks.bench_blocks", sys.argv[1:])) + "\n")
    print(f"q8 matmul, {args.threads} threads, q8 path {ggml.q8_path()}, best of "
          f"{args.repeats} rounds, the kinds in turn (us per product)\n")  # fmt: skip
    print("| N x K | kind | bits/weight | M=1 us | M=16 us | M=1 / Q4_1 | M=16 / Q4_1 | "
          "M=1 / Q4_1_X8 | M=16 / Q4_1_X8 | M=1 x8 / plain | M=16 x8 / plain |")  # fmt: skip
    print("|---" * 11 + "|")
    for n, k in ((1536, 768), (576, 1536), (2048, 8192)):
        plain = {kind: random_blocks(kind.plain, n, k) for kind in kinds}
        weights = {
            kind: ggml.repack_x8(rows, kind.plain, k) if kind.interleaved else rows
            for kind, rows in plain.items()
        }
        times = {}
        for m in (1, 16):
            x = torch.randn(m, k)
            passes = [partial(q8_product, x, weights[kind], kind) for kind in kinds]
            best = best_of_turns(passes, args.repeats)
            times[m] = {kind: 1e6 * t for kind, t in zip(kinds, best, strict=True)}
        q4_1, x8 = ggml.BlockKind.Q4_1, ggml.BlockKind.Q4_1_X8
        for kind in kinds:
            t1, t16 = times[1][kind], times[16][kind]
            bits = 8 * kind.block_bytes / kind.block_values
            own = (f"{t1 / times[1][kind.plain]:.2f} | {t16 / times[16][kind.plain]:.2f}"
                   if kind.interleaved else "|")  # fmt: skip
            print(f"| {n} x {k} | {kind.name} | {bits:.2f} | {t1:.0f} | {t16:.0f} | "
                  f"{t1 / times[1][q4_1]:.2f} | {t16 / times[16][q4_1]:.2f} | "
                  f"{t1 / times[1][x8]:.2f} | {t16 / times[16][x8]:.2f} | {own} |")  # fmt: skip


if __name__ == "__main__":
    main()
