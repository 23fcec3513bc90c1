"""Medusa heads: TGI-layout checkpoints and their coupling to one base checkpoint.

Head i maps the base's final-normed hidden state h_t (the row whose logits chose token t+1) to
logits for token t+i+2, so one h yields the top-1 chain [head_0(h), head_1(h), ...] after the
base's own next token. A head is `medusa_num_layers` residual blocks x + silu(W x + b), then an
lm_head: its own, or the base's (shared, so the artifact holds only the blocks).

Checkpoint directory (the layout TGI reads)::

    config.json                  {"medusa_num_heads": H, "medusa_num_layers": L,
                                  "base_model_name_or_path": str,
                                  "base_fingerprint": {"config": hex, "weights": hex} | absent}
    medusa_lm_head.safetensors   "{i}.{j}.linear.weight" [hidden, hidden], "{i}.{j}.linear.bias"
                                 [hidden] for i < H, j < L; "{i}.{L}.weight" [vocab, hidden]
                                 for every head, or for none (shared base lm_head); optional
                                 "draft_vocab" [K] int64 (ours, see MedusaHeads)

The heads may also sit beside the base's weights (its config.json then carries the medusa_*
keys). `resolve_medusa` picks the heads and N; `MedusaProposer.load` (medusa_proposer.py)
checks the coupling with `check_fingerprint`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from specserve.hashing import cached_sha256
from specserve.models.loader import gguf_source
from specserve.models.registry import model_class, read_config, weight_files

logger = logging.getLogger(__name__)

HEADS_FILE = "medusa_lm_head.safetensors"
CONFIG_FILE = "config.json"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / "medusa"

Fingerprint = dict[str, str]


# ------------------------------------------------------------------------------------ modules
class ResBlock(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # the block starts as the identity
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., hidden]
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """Head i is module "{i}": `num_layers` ResBlocks as "{i}.{j}", then, unless the base
    lm_head is shared, its own lm_head as "{i}.{num_layers}". State-dict keys are TGI's.

    `draft_vocab` (optional, ours; TGI ignores the tensor) lists the token ids the proposer may
    draft: argmax over those rows only. Drafts are only proposals, so this cannot change
    outputs; with a shared lm_head it cuts the heads' cost by vocab / len(draft_vocab).
    """

    draft_vocab: torch.Tensor | None  # [K] int64, sorted

    def __init__(
        self, hidden_size: int, num_heads: int, num_layers: int, vocab_size: int | None = None
    ) -> None:
        heads = []
        for _ in range(num_heads):
            head = nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers)))
            if vocab_size is not None:
                head.append(nn.Linear(hidden_size, vocab_size, bias=False))
            heads.append(head)
        super().__init__(heads)
        self.hidden_size, self.num_layers, self.vocab_size = hidden_size, num_layers, vocab_size
        self.shares_lm_head = vocab_size is None
        self.register_buffer("draft_vocab", None)

    @property
    def num_heads(self) -> int:
        return len(self)

    def states(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Residual stacks only: hidden [N, hidden] -> [N, num_heads, hidden]."""
        heads = cast(list[nn.Sequential], list(self)[: num_heads or len(self)])
        return torch.stack([head[: self.num_layers](hidden) for head in heads], dim=1)

    def logits(
        self, hidden: torch.Tensor, base_lm_head: nn.Module, num_heads: int | None = None
    ) -> torch.Tensor:  # hidden [N, hidden] -> [N, num_heads, vocab]
        if self.shares_lm_head:
            return base_lm_head(self.states(hidden, num_heads))
        heads = list(self)[: num_heads or len(self)]
        return torch.stack([head(hidden) for head in heads], dim=1)


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int
    base_model_name_or_path: str
    base_fingerprint: Fingerprint | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # kept as is (e.g. training summary)

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(
                f"need medusa_num_heads >= 1 and medusa_num_layers >= 0, "
                f"got {self.num_heads}, {self.num_layers}"
            )

    def to_json(self) -> dict[str, Any]:
        out = {
            **self.extra,
            "medusa_num_heads": self.num_heads,
            "medusa_num_layers": self.num_layers,
            "base_model_name_or_path": self.base_model_name_or_path,
        }
        if self.base_fingerprint is not None:
            out["base_fingerprint"] = self.base_fingerprint
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> MedusaConfig:
        known = ("medusa_num_heads", "medusa_num_layers", "base_model_name_or_path")
        return cls(
            num_heads=int(raw["medusa_num_heads"]),
            num_layers=int(raw.get("medusa_num_layers", 1)),
            base_model_name_or_path=str(raw.get("base_model_name_or_path", "")),
            base_fingerprint=raw.get("base_fingerprint"),
            extra={k: v for k, v in raw.items() if k not in (*known, "base_fingerprint")},
        )


# --------------------------------------------------------------------------- checkpoint I/O
def is_heads_dir(path: Path) -> bool:
    if not ((path / HEADS_FILE).is_file() and (path / CONFIG_FILE).is_file()):
        return False
    return "medusa_num_heads" in read_config(path)


def read_medusa_config(heads_dir: Path) -> MedusaConfig:
    if not is_heads_dir(heads_dir):
        raise ValueError(
            f"{heads_dir} is not a Medusa checkpoint: expected {CONFIG_FILE} with "
            f"medusa_num_heads and {HEADS_FILE}"
        )
    return MedusaConfig.from_json(read_config(heads_dir))


def load_medusa(heads_dir: Path) -> tuple[MedusaHeads, MedusaConfig]:
    """Heads in float32 on the CPU, mapped from TGI tensor names; strict about names."""
    cfg = read_medusa_config(heads_dir)
    tensors = load_file(str(heads_dir / HEADS_FILE))
    draft_vocab = tensors.pop("draft_vocab", None)
    n, layers = cfg.num_heads, cfg.num_layers
    own = [f"{i}.{layers}.weight" in tensors for i in range(n)]
    if any(own) and not all(own):
        raise ValueError(f"{heads_dir}: some heads have their own lm_head and some do not")
    first = tensors.get("0.0.linear.weight") if layers else tensors.get(f"0.{layers}.weight")
    if first is None:
        raise ValueError(f"{heads_dir / HEADS_FILE} has no tensors for head 0")
    vocab = tensors[f"0.{layers}.weight"].shape[0] if all(own) else None
    heads = MedusaHeads(first.shape[-1], n, layers, vocab)
    heads.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    if draft_vocab is not None:
        heads.draft_vocab = draft_vocab.long()
    return heads.eval(), cfg


def save_medusa(
    heads: MedusaHeads, out_dir: Path, cfg: MedusaConfig, dtype: torch.dtype = torch.float16
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
        for k, v in heads.state_dict().items()
    }
    save_file(state, str(out_dir / HEADS_FILE), metadata={"format": "pt"})
    (out_dir / HEADS_FILE).chmod(0o644)
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_json(), indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------ fingerprint
def fingerprint(model_dir: Path) -> Fingerprint:
    """What decides a base checkpoint's hidden states, hashed (sha256, 16 hex digits each).

    config: the architecture as our decoder reads it (`ModelArch.identity`: class + fields), so
    formatting and bookkeeping keys (transformers_version, dtype, ...) do not count. weights:
    a GGUF's bytes; for a checkpoint, every tensor's name, dtype, shape and bytes in name order,
    so sharding and file metadata do not count.
    Medusa files and GGUF blocks beside the weights are excluded.
    """
    cfg = read_config(model_dir)
    arch = model_class(cfg).arch_from_hf(cfg).identity()
    config = hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()
    source = gguf_source(model_dir)
    if source is not None:  # a GGUF read in place: its bytes
        return {"config": config[:16], "weights": cached_sha256(source, model_dir.parent)[:16]}
    files = weight_files(model_dir)
    stamps = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return {"config": config[:16], "weights": _tensors_sha256(stamps)[:16]}


@functools.cache
def _tensors_sha256(stamps: tuple[tuple[str, int, int], ...]) -> str:
    where: dict[str, str] = {}  # tensor name -> file
    for path, _, _ in stamps:
        with safe_open(path, framework="pt") as f:
            where.update((name, path) for name in f.keys())  # noqa: SIM118 - not a dict
    h = hashlib.sha256()
    for name in sorted(where):
        with safe_open(where[name], framework="pt") as f:
            t = f.get_tensor(name)
        h.update(f"{name}\0{t.dtype}\0{list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def check_fingerprint(heads_dir: Path, cfg: MedusaConfig, base_dir: Path, force: bool) -> None:
    """Refuse heads trained for another base (ValueError), unless `force` (then warn)."""
    if cfg.base_fingerprint is None:
        logger.warning(
            "Medusa heads %s record no base_fingerprint: cannot check they were trained for %s",
            heads_dir,
            base_dir,
        )
        return
    actual = fingerprint(base_dir)
    if cfg.base_fingerprint == actual:
        return
    msg = (
        f"Medusa heads {heads_dir} were trained for base fingerprint {cfg.base_fingerprint} "
        f"({cfg.base_model_name_or_path}), but the loaded base {base_dir} has fingerprint "
        f"{actual}; retrain them (specserve train-medusa) or pass --force-medusa"
    )
    if not force:
        raise ValueError(msg)
    logger.warning("%s (--force-medusa: loading them anyway; acceptance may be poor)", msg)
