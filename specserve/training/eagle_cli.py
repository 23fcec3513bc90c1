"""`specserve train-eagle`: fit an EAGLE-style head to a base checkpoint on the CPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specserve.models.loader import resolve_model_dir
from specserve.speculation.eagle_head import DEFAULT_DEPTH
from specserve.training.eagle_train import EagleReport, train_eagle
from specserve.training.medusa_cli import DEFAULT_BASE_NAME, add_collect_args, train_options
from specserve.training.medusa_options import TrainOptions

EPOCHS = 20
LR = 2e-3


def add_eagle_parser(subparsers: Any) -> None:
    """Register `train-eagle` on the `specserve` subcommand parser."""
    d = TrainOptions()
    p = subparsers.add_parser(
        "train-eagle",
        help="train an EAGLE-style head for a base checkpoint (self-distilled, chain unrolled)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--model", default=None, help="base: HF directory or .gguf; unset = embedded SmolLM2"
    )
    p.add_argument("--out", type=Path, required=True, help="head directory to write")
    p.add_argument(
        "--depths",
        type=int,
        default=DEFAULT_DEPTH,
        help="draft positions unrolled in training (and reported)",
    )
    p.add_argument("--intermediate-size", type=int, default=768, help="the layer's MLP width")
    p.add_argument("--window", type=int, default=128, help="positions the head's attention sees")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts, over all workloads")
    p.add_argument("--new-tokens", type=int, default=d.new_tokens, help="greedy tokens/prompt")
    p.add_argument("--epochs", type=int, default=EPOCHS, help="passes over the sequences")
    p.add_argument("--lr", type=float, default=LR, help="peak learning rate (one-cycle)")
    p.add_argument("--sequences-per-step", type=int, default=2, help="continuations per step")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="file keeping the collected continuations: read when it holds ones for this base "
        "and these options, else written",
    )
    add_collect_args(p)
    p.set_defaults(func=cmd_train_eagle)


def cmd_train_eagle(args: argparse.Namespace) -> int:
    try:
        options = train_options(args)
        if min(args.depths, args.window, args.intermediate_size, args.sequences_per_step) < 1:
            raise ValueError(
                "need --depths, --window, --intermediate-size, --sequences-per-step >= 1"
            )
        report = train_eagle(
            resolve_model_dir(args.model),
            args.out,
            options,
            depths=args.depths,
            intermediate_size=args.intermediate_size,
            window=args.window,
            sequences_per_step=args.sequences_per_step,
            data=args.data,
            base_name=args.model or DEFAULT_BASE_NAME,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(report, args.out)
    return 0


def print_report(report: EagleReport, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"held-out ({report.heldout_positions} positions)")
    for col in ("depth", "top-1 accuracy", "mean top-1 probability"):
        table.add_column(col, justify="right")
    for j, (acc, conf) in enumerate(zip(report.accuracy, report.confidence, strict=True)):
        table.add_row(str(j + 1), f"{acc:.3f}", f"{conf:.3f}")
    console = Console()
    console.print(table)
    by_workload = ", ".join(f"{w} {v:.2f}" for w, v in report.mean_accepted_by_workload.items())
    console.print(
        f"chain mean accepted length: {report.mean_accepted:.2f} ({by_workload})\n"
        f"{report.parameters / 1e6:.2f} M parameters, {report.draft_vocab_size} draft ids; "
        f"trained on {report.train_positions} positions; collect {report.collect_s:.0f} s, "
        f"train {report.train_s:.0f} s; wrote {out}"
    )
