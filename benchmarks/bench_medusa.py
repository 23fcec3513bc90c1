"""What a Medusa proposal costs, against a target step, in process (issue 56 item 5).

The shipped heads on the embedded default model, loaded as `specserve serve --proposer medusa`
loads them (`MedusaProposer.load`): for B sequences, one `propose` of k tokens from the hidden
state `sync` left (every head asked: the chain's cost at k). Beside it the same heads on float32
torch operations (the path where the block kernels are unavailable), and the target's own
decode step (one row per sequence at a 256-token context, and with k drafted rows verified).
"In situ" repeats the proposal with the target's decode step run (untimed) before each one, as
the engine runs it: that step streams every weight through the caches.

    python -m benchmarks.bench_medusa [--threads 2] [--batches 1,16] [--k 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import machine_info, machine_lines
from benchmarks.verify_cost import measure_verify_cost
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model
from specserve.request import SamplingParams
from specserve.request import Sequence as Seq
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.speculation.medusa_proposer import MedusaProposer
from specserve.speculation.medusa_resolve import shipped_heads_for

MODULE = "benchmarks.bench_medusa"


def propose_ms(
    proposer: MedusaProposer,
    batch: int,
    k: int,
    repeats: int,
    between: Callable[[], object] | None = None,
) -> list[float]:
    """ms per `propose` of k tokens for `batch` sequences synced on random hidden states;
    `between`, untimed, before each call."""
    hidden = proposer.heads.hidden_size
    seqs = [Seq(i, f"r{i}", [1, 2, 3], SamplingParams()) for i in range(batch)]
    times = []
    for step in range(repeats + 3):
        for s in seqs:
            proposer.sync(s, torch.randn(hidden))
        if between is not None:
            between()
        started = time.perf_counter()
        drafts = proposer.propose(seqs, [k] * batch)
        if step >= 3:  # warm-up calls
            times.append(1e3 * (time.perf_counter() - started))
        assert all(len(d.tokens) == k for d in drafts)
    return times


def target_step(runner: ModelRunner, allocator: BlockAllocator) -> Callable[[], object]:
    """A one-row decode step of the target at a 256-token context (its KV filled once): it
    streams every weight, leaving the caches as the engine's step leaves them for its proposer."""
    table: list[int] = []
    allocator.grow(table, 257)
    runner.run([RunItem(list(range(1, 257)), 0, table, 0)])
    return lambda: runner.run([RunItem([5], 256, table, 1)])


def proposers(model_dir: Path, model: Any) -> dict[str, MedusaProposer]:
    """The shipped heads as the server loads them, and on float32 torch operations."""
    heads_dir = shipped_heads_for(model_dir)
    if heads_dir is None:
        raise SystemExit("error: no shipped Medusa heads for the default model")
    served = MedusaProposer.load(heads_dir, model, model_dir)
    out = {"served": served}
    if getattr(served, "blocks", None) is not None:  # q8 heads: the float path beside them
        out["float32"] = MedusaProposer.load(heads_dir, model, model_dir, blocks=False)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,16")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(MODULE, argv)
    batches = [int(b) for b in args.batches.split(",")]
    model_dir = resolve_model_dir(None)
    model = build_model(model_dir, torch.device("cpu"))
    heads = proposers(model_dir, model)
    blocks = max(batches) * (256 // 16 + 2)
    runner = ModelRunner(model, blocks, 16, torch.device("cpu"), kv_dtype="float16")
    targets = measure_verify_cost(
        runner, BlockAllocator(blocks, 16), batches, [0, args.k], 256, repeats=args.repeats
    )
    step = {(t.batch, t.k): t.ms_step for t in targets}
    between = target_step(runner, BlockAllocator(blocks, 16))
    rows = []
    with torch.inference_mode():
        for batch in batches:
            row: dict[str, Any] = {"batch": batch, "k": args.k}
            row["target_step_ms"] = round(step[batch, 0], 3)
            row["verify_step_ms"] = round(step[batch, args.k], 3)
            for name, proposer in heads.items():
                ms = statistics.median(propose_ms(proposer, batch, args.k, args.repeats))
                row[f"{name}_ms"] = round(ms, 3)
                row[f"{name}_share"] = round(ms / step[batch, 0], 4)
            ms = statistics.median(
                propose_ms(heads["served"], batch, args.k, args.repeats, between)
            )
            row["served_in_situ_ms"] = round(ms, 3)
            row["served_in_situ_share"] = round(ms / step[batch, 0], 4)
            rows.append(row)
    print(machine_lines(info))
    print()
    names = sorted({k for r in rows for k in r} - {"batch", "k"})
    print("| B | k | " + " | ".join(names) + " |")
    print("| --- | --- |" + " --- |" * len(names))
    for r in rows:
        print(f"| {r['batch']} | {r['k']} | " + " | ".join(str(r.get(n, "")) for n in names) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
