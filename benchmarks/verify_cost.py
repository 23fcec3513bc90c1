"""Issue 3: verify cost against k at batch 1, 8 and 64.

One timed step is one target forward pass (`ModelRunner.run`, host-side batch building
included) in which each of B sequences, with ``--context`` tokens already in the paged KV
cache, scores k+1 positions (its last token and k drafts) and gets logits on every scored row,
as in a speculative verify step. KV blocks come from a `BlockAllocator`, as in the engine.
Times are medians over ``--repeats`` after ``--warmup`` untimed steps, bracketed by
`torch.cuda.synchronize` on a GPU. Weights are random (`benchmarks.random_model`) unless
``--model`` names a checkpoint directory: the cost of a step depends only on the shapes.

    python -m benchmarks.verify_cost --device cuda --model-shape smollm2-135m,llama-1b \\
        --dtypes float32,bfloat16 --batches 1,8,64 --ks 0,1,2,4,8 [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import machine_info, machine_lines, markdown_table
from benchmarks.random_model import SHAPES, write_random_model
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator, blocks_for

MODULE = "benchmarks.verify_cost"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Point:
    """The timing of one (batch, k) cell."""

    batch: int
    k: int
    tokens: int  # scored positions in the step: batch * (k + 1)
    ms_step: float  # median
    ms_min: float
    ms_max: float
    ms_per_seq: float  # ms_step / batch
    ratio_k0: float | None  # ms_step / ms_step at k = 0, same batch (None: k = 0 not measured)


@dataclass(frozen=True)
class ModelResult:
    model: str
    dtype: str
    points: list[Point]
    error: str | None = None  # why this model and dtype could not be measured


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(runner: ModelRunner, items: list[RunItem], warmup: int, repeats: int) -> list[float]:
    """Seconds per `runner.run(items)`, one entry per timed repeat."""
    rows = sum(i.num_logits for i in items)
    for _ in range(warmup):
        runner.run(items)
    times = []
    for _ in range(repeats):
        _sync(runner.device)
        started = time.perf_counter()
        out = runner.run(items)
        _sync(runner.device)
        times.append(time.perf_counter() - started)
        if out.logits.shape[0] != rows:
            raise AssertionError(f"expected logits on {rows} rows, got {out.logits.shape[0]}")
    return times


def measure_verify_cost(
    runner: ModelRunner,
    allocator: BlockAllocator,
    batches: Sequence[int],
    ks: Sequence[int],
    context: int,
    warmup: int = 3,
    repeats: int = 10,
    seed: int = 0,
) -> list[Point]:
    """Time a verify step for every (batch, k). Every block taken is freed before returning."""
    vocab = runner.model.arch.vocab_size
    gen = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    tables: list[list[int]] = [[] for _ in range(max(batches))]
    try:
        for table in tables:
            allocator.grow(table, context + max(ks) + 1)
            if context:  # fill the context's KV, one sequence per forward
                runner.run([RunItem(tokens(context), 0, table, 0)])
        seconds: dict[tuple[int, int], list[float]] = {}
        for batch in batches:
            for k in ks:
                items = [RunItem(tokens(k + 1), context, t, k + 1) for t in tables[:batch]]
                seconds[batch, k] = time_steps(runner, items, warmup, repeats)
    finally:
        for table in tables:
            allocator.free(table)
    points = []
    for (batch, k), times in seconds.items():
        ms = 1e3 * statistics.median(times)
        base = seconds.get((batch, 0))
        points.append(
            Point(
                batch=batch,
                k=k,
                tokens=batch * (k + 1),
                ms_step=ms,
                ms_min=1e3 * min(times),
                ms_max=1e3 * max(times),
                ms_per_seq=ms / batch,
                ratio_k0=ms / (1e3 * statistics.median(base)) if base else None,
            )
        )
    return points


def run_model(
    model_dir: Path, dtype: str, device: torch.device, args: argparse.Namespace
) -> list[Point]:
    """Load `model_dir` in `dtype`, size a KV pool for the largest batch, measure."""
    model = build_model(model_dir, device, DTYPES[dtype])
    span = args.context + max(args.ks) + 1
    if span > model.arch.max_position:
        raise ValueError(
            f"context {args.context} + k + 1 exceeds {model.arch.max_position} positions"
        )
    num_blocks = max(args.batches) * blocks_for(span, args.block_size)
    allocator = BlockAllocator(num_blocks, args.block_size)
    runner = ModelRunner(model, num_blocks, args.block_size, device)
    try:
        return measure_verify_cost(
            runner, allocator, args.batches, args.ks, args.context, args.warmup, args.repeats
        )
    finally:
        del runner, model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def render_points(points: Sequence[Point]) -> str:
    header = ["batch", "k", "tokens", "ms per step", "ms per sequence", "ratio to k=0"]
    rows = [
        [
            str(p.batch),
            str(p.k),
            str(p.tokens),
            f"{p.ms_step:.3f} ({p.ms_min:.3f}–{p.ms_max:.3f})",
            f"{p.ms_per_seq:.3f}",
            "–" if p.ratio_k0 is None else f"{p.ratio_k0:.2f}",
        ]
        for p in points
    ]
    return markdown_table(header, rows)


def render_header(info: dict[str, Any], args: argparse.Namespace) -> str:
    return (
        f"## verify_cost: one verify step, B sequences x (k+1) scored positions, logits on "
        f"every row; context {args.context} tokens, block size {args.block_size}, "
        f"median (min–max) of {args.repeats} after {args.warmup} warm-ups\n\n"
        f"{machine_lines(info)}\n- device: {info['device']}"
    )


def render_result(result: ModelResult) -> str:
    body = f"FAILED: {result.error}" if result.error else render_points(result.points)
    return f"\n### {result.model}, {result.dtype}\n\n{body}"


def _models(
    args: argparse.Namespace, work_dir: Path, device: torch.device
) -> Iterator[tuple[str, Path]]:
    """(label, checkpoint dir) per model; random checkpoints are written when their turn comes."""
    for path in args.model:
        yield path, Path(path)
    for shape in args.model_shape:
        # Drawn on the device (fast for a billion values), stored in bf16 (half the bytes).
        out = write_random_model(SHAPES[shape], work_dir / shape, args.seed, torch.bfloat16, device)
        yield f"{shape} (random weights)", out


def _csv(kind: type, choices: Sequence[str] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        values = [kind(v) for v in text.split(",") if v]
        bad = [v for v in values if choices is not None and v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"bad list {text!r}; choices: {choices}")
        return values

    return parse


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model-shape", type=_csv(str, sorted(SHAPES)), default=None,
                   help="comma list of random-weight shapes (default: smollm2-135m)")  # fmt: skip
    p.add_argument("--model", action="append", default=[], help="HF checkpoint dir (repeatable)")
    p.add_argument("--dtypes", type=_csv(str, sorted(DTYPES)), default=["float32"])
    p.add_argument("--batches", type=_csv(int), default=[1, 8, 64])
    p.add_argument("--ks", type=_csv(int), default=[0, 1, 2, 4, 8])
    p.add_argument("--context", type=int, default=512, help="tokens already cached per sequence")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--work-dir", type=Path, default=None, help="random checkpoints go here")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    args = p.parse_args(argv)
    if args.model_shape is None:
        args.model_shape = [] if args.model else ["smollm2-135m"]
    if min(args.batches) < 1 or min(args.ks) < 0 or args.context < 0 or args.repeats < 1:
        p.error("need batches >= 1, ks >= 0, --context >= 0 and --repeats >= 1")
    if args.warmup < 0 or args.block_size < 1:
        p.error("need --warmup >= 0 and --block-size >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was requested but no CUDA device is available")
    info = machine_info(MODULE, argv)
    info["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(render_header(info, args), flush=True)
    results: list[ModelResult] = []
    with tempfile.TemporaryDirectory(prefix="verify-cost-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        for name, model_dir in _models(args, work_dir, device):
            for dtype in args.dtypes:
                print(f"[verify_cost] {name} {dtype}", file=sys.stderr, flush=True)
                try:
                    result = ModelResult(name, dtype, run_model(model_dir, dtype, device, args))
                except (RuntimeError, ValueError) as exc:  # report it, go on with the rest
                    traceback.print_exc()
                    result = ModelResult(name, dtype, [], f"{type(exc).__name__}: {exc}")
                results.append(result)
                print(render_result(result), flush=True)
                if args.json is not None:  # rewritten after each model: a timeout keeps the rest
                    write_json(args.json, info, args, results)
    return 1 if any(r.error for r in results) else 0


def write_json(
    path: Path, info: dict[str, Any], args: argparse.Namespace, results: list[ModelResult]
) -> None:
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = {"machine": info, "config": config, "runs": [asdict(r) for r in results]}
    path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
