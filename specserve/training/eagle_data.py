"""EAGLE training's data: the continuations collected from the base (or read back from
`--data`, keyed by the base and the options collecting reads), and their pairs (f_p, x_p) as
padded `Batch`es (eagle_train.py's module docstring, step 1)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.speculation.eagle_head import NO_POSITION, fingerprint
from specserve.training.medusa_data import IGNORE, Continuation, collect, training_prompts
from specserve.training.medusa_options import TrainOptions


@dataclass(frozen=True)
class Batch:
    features: torch.Tensor  # [B, T, H]: f_p
    embeddings: torch.Tensor  # [B, T, H]: e(x_p)
    targets: torch.Tensor  # [B, T] index of x_{p+1} in the draft vocab; IGNORE: none
    # [B, T, H]: f_{p+1}, the target's feature that chose x_{p+1} (its distribution is the
    # soft target, and the feature the head's output stands in for); zero where unknown
    teacher: torch.Tensor
    positions: torch.Tensor  # [B, T]; NO_POSITION past the sequence


def continuations(
    engine: Any, base_dir: Path, opts: TrainOptions, data: Path | None, progress: bool
) -> list[Continuation]:
    """Collected continuations, read from `data` when it holds ones for this base and options."""
    key = data_key(base_dir, opts)
    if data is not None and data.is_file():
        saved = torch.load(data, weights_only=True)
        if saved.get("key") == key:
            return [Continuation(**c) for c in saved["items"]]
    conts = collect(engine, training_prompts(engine, opts), opts, progress)
    if data is not None:
        items = [dataclasses.asdict(c) for c in conts]
        torch.save({"key": key, "items": items}, data)
    return conts


def data_key(base_dir: Path, opts: TrainOptions) -> dict[str, Any]:
    """What decides the collected continuations: the base and the options collecting reads."""
    collecting = (
        "prompts",
        "new_tokens",
        "heldout_every",
        "max_prompt_tokens",
        "seed",
        "workloads",
    )
    return {"base": fingerprint(base_dir), **{f: repr(getattr(opts, f)) for f in collecting}}


def chunks(conts: list[Continuation], n: int) -> list[list[Continuation]]:
    ordered = sorted(conts, key=lambda c: len(c.tokens))  # similar lengths pad little
    return [ordered[i : i + n] for i in range(0, len(ordered), n)]


@torch.no_grad()
def batch_of(conts: list[Continuation], vocab: torch.Tensor, embed: torch.nn.Module) -> Batch:
    """Pairs (f_p, x_p) for p < len - 1 of each continuation, padded to one length."""
    t = max(len(c.tokens) - 1 for c in conts)
    h = conts[0].hidden.shape[-1]
    features = torch.zeros(len(conts), t, h)
    embeddings = torch.zeros(len(conts), t, h)
    targets = torch.full((len(conts), t), IGNORE, dtype=torch.long)
    teacher = torch.zeros(len(conts), t, h)
    positions = torch.full((len(conts), t), NO_POSITION, dtype=torch.long)
    for b, c in enumerate(conts):
        n = len(c.tokens) - 1
        ids = torch.tensor(c.tokens)
        features[b, :n] = c.hidden[:n].float()
        embeddings[b, :n] = embed(ids[:n]).float()
        nxt = ids[1:]
        pos = torch.searchsorted(vocab, nxt).clamp(max=len(vocab) - 1)
        targets[b, :n] = torch.where(vocab[pos] == nxt, pos, IGNORE)
        positions[b, :n] = torch.arange(n)
        teacher[b, : n - 1] = c.hidden[1:n].float()
    return Batch(features, embeddings, targets, teacher, positions)
