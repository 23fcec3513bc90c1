"""Medusa-1 training by self-distillation: the base is frozen and the heads learn its own output.

1. Collect: the base greedily continues workload prompts (stdlib code edits, news articles,
   HumanEval, creative chat) in our engine, batched. A recording proposer keeps the hidden state
   `sync` hands it each step: h_p, the final-normed row that chose output token x_p.
2. Train: head i at h_p predicts x_{p+i+1}, the token i+1 places after the base's own next
   token, with cross-entropy through the base's frozen lm_head (shared, so only the residual
   blocks learn). Softmax and drafts range over the draft vocabulary: every token the base
   emitted in the training continuations (what it actually says; a few thousand ids). That is
   the proposer's argmax set too, so training matches drafting, and both cost a fraction of
   the full lm_head. Prompts are split into train and held-out sets, never positions.
3. Report per-head top-1 accuracy of the drafts on the held-out split (a target outside the
   draft vocabulary counts as a miss) and the mean accepted length a top-1 chain would reach
   there: sum over i of P(heads 0..i all right).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.progress import Progress

from specserve.speculation.medusa import MedusaConfig, MedusaHeads, fingerprint, save_medusa
from specserve.training.medusa_data import (
    IGNORE,
    HeadData,
    collect,
    draft_vocab,
    head_data,
    recording_engine,
    split_heldout,
    training_prompts,
    vocab_head,
)
from specserve.training.medusa_options import TrainOptions, TrainReport

logger = logging.getLogger(__name__)


def train_medusa(
    base_dir: Path,
    out_dir: Path,
    heads: int = 4,
    layers: int = 1,
    options: TrainOptions | None = None,
    base_name: str | None = None,
    progress: bool = True,
) -> TrainReport:
    """Collect, train, evaluate and write a TGI-layout checkpoint (shared lm_head) to `out_dir`."""
    opts = options or TrainOptions()
    if opts.num_threads is not None:
        torch.set_num_threads(opts.num_threads)
    started = time.perf_counter()
    engine = recording_engine(base_dir, opts)
    conts = collect(engine, training_prompts(engine, opts), opts, progress)
    collect_s = time.perf_counter() - started
    train_set, held_set = split_heldout(conts, opts)
    vocab = draft_vocab(train_set)
    train = head_data(train_set, heads, vocab)
    held = head_data(held_set, heads, vocab)
    lm_head = vocab_head(engine.model.lm_head, vocab)
    model = MedusaHeads(engine.model.arch.hidden_size, heads, layers)
    model.draft_vocab = vocab
    loss_before = heldout_loss(model, lm_head, held)
    started = time.perf_counter()
    fit(model, lm_head, train, opts, progress)
    train_s = time.perf_counter() - started
    report = _report(model, lm_head, train, held, len(vocab), loss_before, (collect_s, train_s))
    cfg = MedusaConfig(
        heads,
        layers,
        base_model_name_or_path=base_name or str(base_dir),
        base_fingerprint=fingerprint(base_dir),
        extra={"training": {**rounded(report.as_dict()), "options": dataclasses.asdict(opts)}},
    )
    save_medusa(model, out_dir, cfg)
    return report


def _report(
    model: MedusaHeads,
    lm_head: torch.nn.Linear,
    train: HeadData,
    held: HeadData,
    vocab_size: int,
    loss_before: list[float],
    seconds: tuple[float, float],
) -> TrainReport:
    """The trained heads on the held-out positions: loss, accuracy per head, the accepted
    length a chain of them would reach (overall and per workload), and the time taken to
    collect and to train."""
    accuracy, chain = heldout_accuracy(model, lm_head, held)
    collect_s, train_s = seconds
    return TrainReport(
        train_positions=len(train.workloads),
        heldout_positions=len(held.workloads),
        draft_vocab_size=vocab_size,
        loss_before=loss_before,
        loss_after=heldout_loss(model, lm_head, held),
        accuracy=accuracy,
        mean_accepted=_mean_accepted(chain),
        mean_accepted_by_workload={
            w: _mean_accepted(chain[[x == w for x in held.workloads]])
            for w in sorted(set(held.workloads))
        },
        collect_s=round(collect_s, 1),
        train_s=round(train_s, 1),
    )


# ------------------------------------------------------------------------------------ train
def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # logits [B, heads, vocab], targets [B, heads] -> per-head mean CE [heads]
    ce = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")
    valid = (targets != IGNORE).float()
    return (ce * valid).sum(0) / valid.sum(0).clamp(min=1)


def fit(
    model: MedusaHeads,
    lm_head: torch.nn.Module,
    data: HeadData,
    opts: TrainOptions,
    progress: bool = True,
) -> None:
    for p in lm_head.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=0.0)
    n = len(data.workloads)
    steps_per_epoch = math.ceil(n / opts.batch_size)
    total = steps_per_epoch * opts.epochs
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, opts.lr, total_steps=total, pct_start=0.1)
    gen = torch.Generator().manual_seed(opts.seed)
    model.train()
    with Progress(disable=not progress) as bar:
        task = bar.add_task("training heads", total=total)
        for _ in range(opts.epochs):
            for idx in torch.randperm(n, generator=gen).split(opts.batch_size):
                logits = model.logits(data.hidden[idx], lm_head)
                loss = _loss(logits, data.targets[idx]).sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                bar.update(task, advance=1, description=f"training heads (loss {loss:.2f})")
    model.eval()


@torch.no_grad()
def _heldout(
    model: MedusaHeads, lm_head: torch.nn.Module, data: HeadData
) -> tuple[torch.Tensor, torch.Tensor]:
    # -> per-head summed CE [heads], correct [N, heads] (False where the target is IGNORE)
    ce = torch.zeros(model.num_heads)
    correct = []
    for idx in torch.arange(len(data.workloads)).split(512):
        logits, targets = model.logits(data.hidden[idx], lm_head), data.targets[idx]
        ce += _loss(logits, targets) * (targets != IGNORE).sum(0)
        correct.append(logits.argmax(-1) == targets)
    return ce, torch.cat(correct)


def heldout_loss(model: MedusaHeads, lm_head: torch.nn.Module, data: HeadData) -> list[float]:
    """Per-head CE over the draft vocabulary (targets outside it left out)."""
    ce, _ = _heldout(model, lm_head, data)
    return (ce / (data.targets != IGNORE).sum(0).clamp(min=1)).tolist()


def heldout_accuracy(
    model: MedusaHeads, lm_head: torch.nn.Module, data: HeadData
) -> tuple[list[float], torch.Tensor]:
    """Per-head top-1 accuracy over targets that exist, and the chain matrix [N, heads]: heads
    0..i all right (a draft of i+1 tokens accepted in full)."""
    _, correct = _heldout(model, lm_head, data)
    acc = (correct.sum(0) / data.valid.sum(0).clamp(min=1)).tolist()
    return acc, correct.int().cumprod(dim=1)


def _mean_accepted(chain: torch.Tensor) -> float:
    return float(chain.float().sum(1).mean()) if len(chain) else 0.0


def rounded(d: dict[str, Any]) -> dict[str, Any]:
    def r(v: Any) -> Any:
        if isinstance(v, float):
            return round(v, 4)
        if isinstance(v, list):
            return [r(x) for x in v]
        if isinstance(v, dict):
            return {k: r(x) for k, x in v.items()}
        return v

    return {k: r(v) for k, v in d.items()}
