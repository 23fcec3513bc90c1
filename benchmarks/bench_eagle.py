"""What drafting with the EAGLE head costs, against a target step, in process.

For B sequences at once (each with 64 verified positions in the head's cache), one step's
proposer work as the engine runs it: `sync` with one new feature row, then `propose` of k
tokens (the pending pair, then k - 1 chain steps). Beside it, the target's own decode step (one
row per sequence at a 256-token context) on the same machine. The ratio per drafted token is
what `speculation/eagle_proposer.py` charges the head (HEAD_TOKEN_COST). The same drafting
with the head's layer as torch operations (the path for heads not on GGUF blocks) runs beside
it, batch by batch. And the native drafting again with the target's decode step run (untimed)
before each drafting step, as in the engine: that step streams every weight through the caches,
after which each of drafting's framework calls costs several times what it costs back to back;
the engine's proposer pays this one.

    python -m benchmarks.bench_eagle [--threads 2] [--batches 1,16] [--k 4] [--json PATH]
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
from specserve.speculation import eagle_proposer, eagle_state
from specserve.speculation.eagle_head import eagle_head_dir
from specserve.speculation.eagle_proposer import EagleProposer

MODULE = "benchmarks.bench_eagle"
HISTORY = 64


def draft_ms(
    proposer: EagleProposer,
    batch: int,
    k: int,
    repeats: int,
    between: Callable[[], object] | None = None,
) -> list[float]:
    """ms per step of proposer work (sync one row + propose k) for `batch` sequences;
    `between`, untimed, before each step (the target's forward: the caches as the engine
    leaves them for its proposer)."""
    hidden = proposer.head.shape.hidden_size
    vocab = proposer.vocab.tolist()
    seqs = [Seq(i, f"r{i}", [1, 2, 3], SamplingParams()) for i in range(batch)]
    for s in seqs:
        s.output_ids = vocab[:HISTORY]
        proposer.sync(s, torch.randn(HISTORY, hidden))
        proposer.propose([s], [k])
    times = []
    for step in range(repeats + 3):
        if between is not None:
            between()
        started = time.perf_counter()
        for s in seqs:
            s.output_ids.append(vocab[step % len(vocab)])
            proposer.sync(s, torch.randn(1, hidden))
        drafts = proposer.propose(seqs, [k] * batch)
        if step >= 3:  # warm-up steps
            times.append(1e3 * (time.perf_counter() - started))
        assert all(len(d.tokens) == k for d in drafts)
    return times


def target_step(runner: ModelRunner, allocator: BlockAllocator) -> Callable[[], object]:
    """A one-row decode step of the target at a 256-token context (its KV filled once), to run
    before each drafting step: it streams every weight, and leaves the caches as the engine's
    step leaves them for its proposer (each framework call then costs several times what it
    costs back to back)."""
    table: list[int] = []
    allocator.grow(table, 257)
    runner.run([RunItem(list(range(1, 257)), 0, table, 0)])
    return lambda: runner.run([RunItem([5], 256, table, 1)])


def proposers(model_dir: Path, model: Any) -> tuple[EagleProposer, EagleProposer]:
    """The shipped head twice: on its native layer and on torch ops, both drafting every chain
    to k on every step (what k drafted tokens cost, whatever they would gain)."""
    head_dir = eagle_head_dir(model_dir, None)
    if head_dir is None:
        raise SystemExit("error: no EAGLE head for the default model")
    proposer = EagleProposer.load(head_dir, model, model_dir)
    torch_path = EagleProposer.load(head_dir, model, model_dir)
    torch_path.native = None
    eagle_state.CONTINUE_ABOVE = 0.0  # every chain to k: the cost of k drafted tokens
    eagle_proposer.HEAD_TOKEN_COST = (
        0.0  # every step drafted, whatever its drafts on random features
    )
    return proposer, torch_path


def print_table(info: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print(machine_lines(info))
    print()
    print(
        "| B | k | drafting ms/step | ms per drafted token | torch path, ms per drafted token "
        "| torch path / native | target step ms | token cost "
        "| after a target step: drafting ms/step | token cost |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['batch']} | {r['k']} | {r['draft_ms']:.2f} | {r['draft_ms_per_token']:.3f} | "
            f"{r['torch_path_ms_per_token']:.3f} | "
            f"{r['torch_path_ms_per_token'] / r['draft_ms_per_token']:.2f}x | "
            f"{r['target_step_ms']:.2f} | {r['token_cost']:.3f} | "
            f"{r['in_situ_draft_ms']:.2f} | {r['in_situ_token_cost']:.3f} |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,16")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(MODULE, argv)
    batches = [int(b) for b in args.batches.split(",")]
    model_dir = resolve_model_dir(None)
    model = build_model(model_dir, torch.device("cpu"))
    proposer, torch_path = proposers(model_dir, model)
    blocks = max(batches) * (256 // 16 + 2)
    runner = ModelRunner(model, blocks, 16, torch.device("cpu"), kv_dtype="float16")
    targets = measure_verify_cost(
        runner, BlockAllocator(blocks, 16), batches, [0], 256, repeats=args.repeats
    )
    between = target_step(runner, BlockAllocator(blocks, 16))
    rows = []
    for batch, target in zip(batches, targets, strict=True):
        ms = statistics.median(draft_ms(proposer, batch, args.k, args.repeats))
        torch_ms = statistics.median(draft_ms(torch_path, batch, args.k, args.repeats))
        in_situ = statistics.median(draft_ms(proposer, batch, args.k, args.repeats, between))
        per_token, tokens = ms / (batch * args.k), batch * args.k
        share = target.ms_step / batch  # one sequence's share of the target's step
        rows.append(
            {
                "batch": batch,
                "k": args.k,
                "draft_ms": round(ms, 3),
                "draft_ms_per_token": round(per_token, 4),
                "torch_path_ms_per_token": round(torch_ms / tokens, 4),
                "target_step_ms": round(target.ms_step, 3),
                # a drafted token's cost in target steps of one sequence (the step's share)
                "token_cost": round(per_token / share, 4),
                "in_situ_draft_ms": round(in_situ, 3),
                "in_situ_token_cost": round(in_situ / tokens / share, 4),
            }
        )
    print_table(info, rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
