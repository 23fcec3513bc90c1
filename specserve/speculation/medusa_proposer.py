"""`MedusaProposer`: drafts a top-1 chain from Medusa heads on the target's own hidden state."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specserve.config import SpecConfig
from specserve.models.block_linear import linear_weight
from specserve.models.fingerprint import Fingerprint, config_sha256, files_sha256
from specserve.models.llama import DecoderLM
from specserve.request import Sequence
from specserve.speculation.medusa import MedusaHeads, check_fingerprint, load_medusa
from specserve.speculation.medusa_blocks import BlockHeads
from specserve.speculation.medusa_resolve import resolve_medusa
from specserve.speculation.proposer import (
    Draft,
    HiddenRows,
    Loaded,
    Proposer,
    Registration,
)

logger = logging.getLogger(__name__)


class MedusaProposer(Proposer):
    """Top-1 chain from the heads, batched over sequences. Proposing costs only the heads: the
    hidden state comes from `sync`, i.e. from the target pass that verified the last step."""

    name = "medusa"

    def __init__(
        self,
        heads: MedusaHeads,
        base_lm_head: nn.Module,
        heads_dir: Path | None = None,
        blocks: bool = False,
    ) -> None:
        """`blocks`: the heads' forward on the q8 block kernel (`medusa_blocks.py`), where
        `BlockHeads.supports` them; else float torch operations."""
        self.heads, self.base_lm_head, self.heads_dir = heads, base_lm_head, heads_dir
        device = next(iter(heads.parameters()), torch.empty(0)).device  # no layers: the CPU
        self.blocks = (
            BlockHeads(heads, base_lm_head)
            if blocks and BlockHeads.supports(heads, device)
            else None
        )
        vocab = heads.draft_vocab
        # [hidden, K]: the shared lm_head's rows for the draft vocabulary, gathered once and
        # transposed (a few rows times a contiguous [in, out] matrix is the fast CPU GEMM)
        self._vocab_cols = (
            linear_weight(base_lm_head).detach()[vocab].T.contiguous()
            if vocab is not None and heads.shares_lm_head and self.blocks is None
            else None
        )
        # seq_id -> (num_tokens when synced, hidden [hidden_size] of the row that chose the last)
        self._last: dict[int, tuple[int, torch.Tensor]] = {}

    @classmethod
    def load(
        cls,
        heads_dir: Path,
        base: DecoderLM,
        base_dir: Path,
        force: bool = False,
        blocks: bool = True,
    ) -> MedusaProposer:
        """The heads in `heads_dir` for `base`, checked against it; `blocks`: on the q8 block
        kernel where it runs (the default), else float torch operations."""
        heads, cfg = load_medusa(heads_dir)
        arch = base.arch
        vocab = heads.vocab_size
        if heads.hidden_size != arch.hidden_size or vocab not in (None, arch.vocab_size):
            raise ValueError(
                f"Medusa heads {heads_dir} (hidden {heads.hidden_size}, vocab {vocab or 'shared'}) "
                f"do not fit base {base_dir} (hidden {arch.hidden_size}, vocab {arch.vocab_size})"
            )
        check_fingerprint(heads_dir, cfg, base_dir, force)
        param = next(base.parameters())
        proposer = cls(heads.to(param.device, param.dtype), base.lm_head, heads_dir, blocks)
        numerics = "q8 blocks" if proposer.blocks is not None else "float32"
        logger.info(
            "Medusa: %d heads x %d layers from %s (%s)",
            len(heads), cfg.num_layers, heads_dir, numerics,
        )  # fmt: skip
        return proposer

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        drafts = [Draft(tokens=[]) for _ in seqs]
        rows = [i for i, (s, k) in enumerate(zip(seqs, ks, strict=True)) if k and self._ready(s)]
        if not rows:
            return drafts
        hidden = torch.stack([self._last[seqs[i].seq_id][1] for i in rows])  # [B, hidden]
        n = min(max(ks[i] for i in rows), self.num_heads)
        with torch.inference_mode():
            top, prob = self._top1(hidden, n)  # [B, n] each
        for i, chain, conf in zip(rows, top.tolist(), prob.tolist(), strict=True):
            drafts[i] = Draft(tokens=chain[: ks[i]], confidence=conf[: ks[i]])
        return drafts

    def _top1(self, hidden: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, hidden] -> each head's top token [B, n] and its softmax probability [B, n]
        (over the draft vocabulary when the heads have one): the head's own confidence."""
        vocab = self.heads.draft_vocab
        if self.blocks is not None:
            logits = self.blocks.logits(hidden, n)
        elif vocab is None:
            logits = self.heads.logits(hidden, self.base_lm_head, n)
        elif self._vocab_cols is not None:
            logits = self.heads.states(hidden, n) @ self._vocab_cols
        else:
            logits = self.heads.logits(hidden, self.base_lm_head, n)[..., vocab]
        best, top = logits.max(-1)
        prob = 1.0 / torch.exp(logits.float() - best.float().unsqueeze(-1)).sum(-1)
        return (top if vocab is None else vocab[top]), prob

    def _ready(self, seq: Sequence) -> bool:
        last = self._last.get(seq.seq_id)
        return last is not None and last[0] == seq.num_tokens

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        self._last[seq.seq_id] = (seq.num_tokens, hidden.detach())  # kept as is (`sync`)

    def release(self, seq: Sequence) -> None:
        self._last.pop(seq.seq_id, None)


def medusa_proposer(
    model_dir: Path,
    base: DecoderLM,
    proposer: str,
    speculate: int,
    medusa: str | None = None,
    force: bool = False,
) -> MedusaProposer | None:
    """The Medusa proposer for `--proposer auto|medusa`; None means n-gram serves instead."""
    heads_dir = resolve_medusa(model_dir, proposer, speculate, medusa).heads_dir
    return None if heads_dir is None else MedusaProposer.load(heads_dir, base, model_dir, force)


# ------------------------------------------------------------------------ registration
def _build(loaded: Loaded) -> MedusaProposer | None:
    spec, target = loaded.config.spec, loaded.target
    if target is None:
        return None
    return medusa_proposer(
        target.model_dir,
        target.model,
        spec.proposer,
        spec.speculate,
        spec.medusa,
        spec.force_medusa,
    )


def _artifact_dir(settings: Mapping[str, Any], target_dir: Path, live: Proposer | None) -> Path:
    """The loaded heads' directory; else `--medusa`, else the target's (heads stored in its
    checkpoint)."""
    if isinstance(live, MedusaProposer) and live.heads_dir is not None:
        return live.heads_dir
    heads = settings.get("medusa")
    return Path(heads) if heads else target_dir


def _fingerprint(heads_dir: Path, cache_dir: Path | None) -> Fingerprint:
    """The heads: medusa_*.safetensors (+ config.json) in their own directory, or beside the
    target's weights."""
    heads = sorted(heads_dir.glob("medusa_*.safetensors"))
    config = heads_dir / "config.json"
    return {
        "config_sha256": config_sha256(config) if config.is_file() else None,
        "weights_sha256": files_sha256(heads, cache_dir),
    }


def _check_live(proposer: Proposer, spec: SpecConfig) -> None:
    assert isinstance(proposer, MedusaProposer)
    if spec.speculate > proposer.num_heads:
        raise ValueError(
            f"speculate {spec.speculate} is more than the {proposer.num_heads} Medusa heads"
        )


REGISTRATION = Registration(
    "medusa",
    _build,
    artifacts=("medusa", "force_medusa"),
    hidden=HiddenRows.LAST_ACCEPTED,
    auto=True,
    summary="Medusa heads (--medusa, the checkpoint's, or the shipped heads for the default "
    "model; n-gram when there are none)",
    artifact_dir=_artifact_dir,
    fingerprint=_fingerprint,
    check_live=_check_live,
)
