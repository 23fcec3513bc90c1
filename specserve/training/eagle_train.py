"""EAGLE head training by self-distillation, with the chain unrolled as drafting runs it.

1. Collect: the base greedily continues workload prompts in our engine and a recording proposer
   keeps f_p, the final-normed row that chose output token x_p (medusa_data.collect: the same
   passes and prompts as Medusa's). `--data FILE` keeps them for the next run, keyed by the
   base and the options collecting reads; their pairs (f_p, x_p) go into padded `Batch`es
   (eagle_data.py).
2. Train: a continuation is one sequence of pairs (f_p, x_p). Depth 0 reads the true features
   and predicts x_{p+1}; depth j reads, at position p, the head's own depth j-1 output at p-1 in
   place of f_p and attends to true keys at positions <= p-j plus the chain's own keys, one per
   depth: exactly what the proposer sees j tokens into a draft (EAGLE-3's training-time test).
   Loss per depth: cross-entropy over the draft vocabulary, through the target's frozen lm_head
   rows, against the target's own distribution there (softmax of f_{p+1}'s logits: soft
   targets), plus a smooth-L1 pull of the head's output toward f_{p+1} (EAGLE's feature loss:
   the output is the next depth's feature); depth j weighted 0.8^j. Prompts are split into
   train and held-out sets, never positions.
3. Report per depth: held-out top-1 accuracy and mean top-1 probability (the head's confidence,
   before online calibration), and the mean accepted length of a chain of `depths` drafts.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.progress import Progress

from specserve.speculation.eagle_head import (
    NO_POSITION,
    EagleConfig,
    EagleHead,
    HeadShape,
    fingerprint,
    save_eagle,
)
from specserve.training.eagle_data import Batch, batch_of, chunks, continuations
from specserve.training.medusa_data import (
    IGNORE,
    draft_vocab,
    recording_engine,
    split_heldout,
    vocab_head,
)
from specserve.training.medusa_options import TrainOptions
from specserve.training.medusa_train import rounded

DEPTH_WEIGHT = 0.8


@dataclass(frozen=True)
class EagleReport:
    train_positions: int
    heldout_positions: int
    draft_vocab_size: int
    parameters: int
    accuracy: list[float]  # held-out top-1 per depth
    confidence: list[float]  # held-out mean top-1 probability per depth
    mean_accepted: float  # of a chain of len(accuracy) drafts
    mean_accepted_by_workload: dict[str, float]
    collect_s: float
    train_s: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def train_eagle(
    base_dir: Path,
    out_dir: Path,
    options: TrainOptions | None = None,
    depths: int = 4,
    intermediate_size: int = 768,
    window: int = 128,
    sequences_per_step: int = 2,
    data: Path | None = None,
    base_name: str | None = None,
    progress: bool = True,
) -> EagleReport:
    """Collect (or read `data`), train, evaluate and write the head to `out_dir`."""
    opts = options or TrainOptions()
    if opts.num_threads is not None:
        torch.set_num_threads(opts.num_threads)
    started = time.perf_counter()
    engine = recording_engine(base_dir, opts)
    conts = continuations(engine, base_dir, opts, data, progress)
    collect_s = time.perf_counter() - started
    train_set, held_set = split_heldout(conts, opts)
    model = engine.model
    vocab = draft_vocab(train_set)
    scores = vocab_head(model.lm_head, vocab)  # frozen: [..., H] -> [..., K]
    head = EagleHead(HeadShape.for_target(model.arch, intermediate_size, window))
    head.draft_vocab = vocab
    _initialise(head, model)
    train = [
        batch_of(chunk, vocab, model.embed_tokens)
        for chunk in chunks(train_set, sequences_per_step)
    ]
    started = time.perf_counter()
    _fit(head, scores, train, depths, opts, progress)
    train_s = time.perf_counter() - started
    held = [(c.workload, batch_of([c], vocab, model.embed_tokens)) for c in held_set]
    report = _evaluate(head, scores, held, depths, vocab, collect_s, train_s)
    report = dataclasses.replace(report, train_positions=sum(len(c.tokens) - 1 for c in train_set))
    cfg = EagleConfig(
        head.shape,
        base_model_name_or_path=base_name or str(base_dir),
        base_fingerprint=fingerprint(base_dir),
        extra={"training": {**rounded(report.as_dict()), "options": dataclasses.asdict(opts)}},
    )
    save_eagle(head, out_dir, cfg)
    return report


# ------------------------------------------------------------------------------------ model
def _initialise(head: EagleHead, model: Any) -> None:
    """Start as the identity on the feature: fc passes f_p through, the layer adds nothing
    (zero o and down), the output norm is the target's."""
    h = head.shape.hidden_size
    with torch.no_grad():
        head.fc.weight[:, :h].copy_(torch.eye(h))
        head.fc.weight[:, h:].mul_(0.1)
        head.o.weight.zero_()
        head.down.weight.zero_()
        head.norm.weight.copy_(model.norm.weight.detach().float())


def unrolled(head: EagleHead, batch: Batch, depths: int) -> list[torch.Tensor]:
    """The head's outputs [B, T, H] at depths 0..depths-1 (see the module docstring)."""
    pos = batch.positions
    q_pos = pos.clamp(min=0)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    features = batch.features
    for j in range(depths):
        x = head.fuse(features, batch.embeddings)
        q, k, v = head.qkv_at(x, q_pos)
        keys.append(k)
        values.append(v)
        # true keys at <= p - j (and in the window); depth i's key at p - j + i
        true = head.window_mask(q_pos - j, pos) & (
            pos.unsqueeze(1) > (q_pos - head.shape.window).unsqueeze(2)
        )
        chain = [(pos.unsqueeze(1) == (q_pos - j + i).unsqueeze(2)) for i in range(1, j + 1)]
        allowed = torch.cat([true, *chain], dim=2)
        no_key = ~allowed.any(-1, keepdim=True)  # padded or p < j: its output is not scored
        masks.append(allowed | no_key)
        out = head.finish(x, head.attend(q, torch.cat(keys, 2), torch.cat(values, 2), masks[-1]))
        outs.append(out)
        features = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
    return outs


def depth_targets(batch: Batch, j: int) -> torch.Tensor:
    """Targets of depth j: IGNORE where the chain would start before position 0."""
    t = batch.targets.clone()
    t[:, :j] = IGNORE
    return t


def _fit(
    head: EagleHead,
    scores: torch.nn.Module,
    batches: list[Batch],
    depths: int,
    opts: TrainOptions,
    progress: bool,
) -> None:
    opt = torch.optim.AdamW(head.parameters(), lr=opts.lr, weight_decay=0.0)
    total = len(batches) * opts.epochs
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, opts.lr, total_steps=total, pct_start=0.1)
    gen = torch.Generator().manual_seed(opts.seed)
    head.train()
    with Progress(disable=not progress) as bar:
        task = bar.add_task("training the EAGLE head", total=total)
        for _ in range(opts.epochs):
            for i in torch.randperm(len(batches), generator=gen).tolist():
                batch = batches[i]
                loss = torch.zeros(())
                with torch.no_grad():
                    soft = scores(batch.teacher).softmax(-1)  # [B, T, K]
                known = batch.teacher.abs().sum(-1) > 0  # f_{p+1} recorded
                for j, out in enumerate(unrolled(head, batch, depths)):
                    scored = known & (depth_targets(batch, j) != IGNORE)
                    if scored.any():
                        ce = F.cross_entropy(scores(out[scored]), soft[scored])
                        reg = F.smooth_l1_loss(out[scored], batch.teacher[scored])
                        loss = loss + DEPTH_WEIGHT**j * (ce + reg)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                bar.update(task, advance=1, description=f"training the EAGLE head ({loss:.2f})")
    head.eval()


@torch.no_grad()
def _evaluate(
    head: EagleHead,
    scores: torch.nn.Module,
    held: list[tuple[str, Batch]],
    depths: int,
    vocab: torch.Tensor,
    collect_s: float,
    train_s: float,
) -> EagleReport:
    right = torch.zeros(depths)
    conf = torch.zeros(depths)
    count = torch.zeros(depths)
    chains: dict[str, list[float]] = {}
    for workload, batch in held:
        correct = []  # per depth [T] bool, at the position the depth scores
        for j, out in enumerate(unrolled(head, batch, depths)):
            logits = scores(out)[0]
            t = depth_targets(batch, j)[0]
            scored = t != IGNORE
            scored[:j] = False
            prob, top = torch.softmax(logits, -1).max(-1)
            hit = (top == t) & scored
            right[j] += hit.sum()
            conf[j] += prob[scored].sum()
            count[j] += scored.sum()
            correct.append(hit)
        n = int((batch.positions[0] != NO_POSITION).sum())
        for s in range(n):  # a chain from true features at s: depth j scores position s + j
            run = 0
            for j in range(depths):
                if s + j >= n or not bool(correct[j][s + j]):
                    break
                run += 1
            chains.setdefault(workload, []).append(run)
    every = [r for runs in chains.values() for r in runs]
    return EagleReport(
        train_positions=0,
        heldout_positions=len(every),
        draft_vocab_size=len(vocab),
        parameters=sum(p.numel() for p in head.parameters()),
        accuracy=(right / count.clamp(min=1)).tolist(),
        confidence=(conf / count.clamp(min=1)).tolist(),
        mean_accepted=sum(every) / max(1, len(every)),
        mean_accepted_by_workload={w: sum(r) / len(r) for w, r in sorted(chains.items())},
        collect_s=round(collect_s, 1),
        train_s=round(train_s, 1),
    )
