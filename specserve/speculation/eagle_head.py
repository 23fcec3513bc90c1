"""An EAGLE-style drafting head: one decoder layer over the target's own features; its artifact
(read, written, checked against the base) and which head serves a base.

At output position p the head reads the pair (f_p, e(x_p)): f_p the target's final-normed
hidden state at the row that chose token x_p, e(x_p) that token's embedding in the target. It
fuses them (fc: 2H -> H), runs one decoder layer whose attention sees the head's earlier
positions (a window of `window` positions, RoPE at output positions), normalises, and scores
the next token with the target's own lm_head restricted to a draft vocabulary (so the head
ships no lm_head and a drafted token costs a small fraction of a target step).

Drafting is autoregressive: the head's normalised output g_p stands in for f_{p+1}, the target
feature it has not computed yet, so the next input is (g_p, e(drafted token)). Keys and values
of positions the target has verified are recomputed from its true features (`sync`); only the
current chain's positions use the head's own (eagle_proposer.py drafts, eagle_native.py runs
the layer in one native call). Training (training/eagle_train.py) unrolls the same chain
("training-time test", as EAGLE-3 does), so the head learns from its own predictions.

Artifact directory::

    config.json              {"eagle_head": {hidden_size, num_heads, num_kv_heads, head_dim,
                              intermediate_size, rms_norm_eps, rope_theta, window},
                              "base_model_name_or_path": str, "base_fingerprint": {...},
                              "training": {...}}
    eagle_head.safetensors   the layer's weights (fp16) and "draft_vocab" [K] int64
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from specserve.models.arch import ModelArch
from specserve.models.block_linear import BlockLinear
from specserve.models.llama import RMSNorm, apply_rope
from specserve.models.registry import read_config
from specserve.speculation.medusa import Fingerprint, fingerprint

logger = logging.getLogger(__name__)

HEAD_FILE = "eagle_head.safetensors"
CONFIG_FILE = "config.json"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / "eagle"
NO_POSITION = -1  # a key slot that holds nothing
DEFAULT_DEPTH = 4  # drafts per step when --speculate is unset: the depth training unrolls


@dataclass(frozen=True)
class HeadShape:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    window: int  # positions the attention sees, this one included

    @classmethod
    def for_target(cls, arch: ModelArch, intermediate_size: int, window: int) -> HeadShape:
        return cls(
            arch.hidden_size,
            arch.num_heads,
            arch.num_kv_heads,
            arch.head_dim,
            intermediate_size,
            arch.rms_norm_eps,
            arch.rope_theta,
            window,
        )


@dataclass(frozen=True)
class EagleConfig:
    shape: HeadShape
    base_model_name_or_path: str
    base_fingerprint: Fingerprint | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # kept as is (the training summary)

    def to_json(self) -> dict[str, Any]:
        out = {
            **self.extra,
            "eagle_head": asdict(self.shape),
            "base_model_name_or_path": self.base_model_name_or_path,
        }
        if self.base_fingerprint is not None:
            out["base_fingerprint"] = self.base_fingerprint
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EagleConfig:
        known = ("eagle_head", "base_model_name_or_path", "base_fingerprint")
        return cls(
            shape=HeadShape(**raw["eagle_head"]),
            base_model_name_or_path=str(raw.get("base_model_name_or_path", "")),
            base_fingerprint=raw.get("base_fingerprint"),
            extra={k: v for k, v in raw.items() if k not in known},
        )


class EagleHead(nn.Module):
    """fc(f, e) -> one pre-norm decoder layer (GQA attention with RoPE, SwiGLU MLP) -> norm.

    The pieces are separate methods so that drafting (eagle_proposer.py) and training's unrolled
    chain (its own attention mask) share every weight-bearing step."""

    draft_vocab: torch.Tensor  # [K] int64, sorted: the ids the head may draft
    inv_freq: torch.Tensor  # [D / 2] RoPE frequencies (float64)

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.shape = shape
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.input_norm = RMSNorm(h, shape.rms_norm_eps)
        self.qkv = nn.Linear(h, (shape.num_heads + 2 * shape.num_kv_heads) * d, bias=False)
        self.o = nn.Linear(shape.num_heads * d, h, bias=False)
        self.post_norm = RMSNorm(h, shape.rms_norm_eps)
        self.gate_up = nn.Linear(h, 2 * shape.intermediate_size, bias=False)
        self.down = nn.Linear(shape.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, shape.rms_norm_eps)
        inv_freq = 1.0 / shape.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("draft_vocab", torch.zeros(0, dtype=torch.long))

    def fuse(self, features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """[..., H] twice -> the layer's input [..., H]."""
        return self.fc(torch.cat([features, embeddings], dim=-1))

    def qkv_at(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, H], positions [B, T] -> q [B, heads, T, D], k and v [B, kv_heads, T, D]."""
        s = self.shape
        b, t, _ = x.shape
        qkv = _project(self.qkv, x, norm=self.input_norm)
        qkv = qkv.view(b, t, s.num_heads + 2 * s.num_kv_heads, s.head_dim)
        q, k, v = qkv.split([s.num_heads, s.num_kv_heads, s.num_kv_heads], dim=2)
        angles = positions.clamp(min=0).double().unsqueeze(-1) * self.inv_freq  # [B, T, D/2]
        emb = torch.cat([angles, angles], dim=-1).unsqueeze(2)  # [B, T, 1, D]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """q [B, heads, T, D], k/v [B, kv_heads, S, D], allowed [B, T, S] -> [B, T, heads * D]."""
        groups = self.shape.num_heads // self.shape.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.unsqueeze(1))
        return out.transpose(1, 2).flatten(2)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's input and its attention output -> the normalised feature [B, T, H]."""
        x = _project(self.o, attended, residual=x)
        x = _project(
            self.down, _project(self.gate_up, x, norm=self.post_norm), swiglu=True, residual=x
        )
        return self.norm(x)

    def window_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """[B, T] query and [B, S] key positions -> allowed [B, T, S]: a key that holds
        something, not after the query and within the window."""
        q, k = q_pos.unsqueeze(2), k_pos.unsqueeze(1)
        return (k != NO_POSITION) & (k <= q) & (k > q - self.shape.window)


def _project(
    linear: nn.Module,
    x: torch.Tensor,
    norm: RMSNorm | None = None,
    swiglu: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """residual + linear(swiglu or norm of x), in one block-kernel call when the proposer put
    the projection on GGUF blocks (drafting: fewer calls per token), else as torch ops."""
    if isinstance(linear, BlockLinear):
        rows = x.reshape(-1, x.shape[-1])
        res = residual.reshape(-1, residual.shape[-1]) if residual is not None else None
        out = linear.fused(rows, norm, "silu" if swiglu else None, res)
        if out is not None:
            return out.view(*x.shape[:-1], -1)
    if norm is not None:
        x = norm(x)
    if swiglu:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    y = linear(x)
    return y if residual is None else residual + y


# --------------------------------------------------------------------------- artifact I/O
def is_head_dir(path: Path) -> bool:
    if not ((path / HEAD_FILE).is_file() and (path / CONFIG_FILE).is_file()):
        return False
    return "eagle_head" in read_config(path)


def read_eagle_config(head_dir: Path) -> EagleConfig:
    if not is_head_dir(head_dir):
        raise ValueError(
            f"{head_dir} is not an EAGLE head: expected {CONFIG_FILE} with eagle_head and "
            f"{HEAD_FILE} (specserve train-eagle writes them)"
        )
    return EagleConfig.from_json(read_config(head_dir))


def load_eagle(head_dir: Path) -> tuple[EagleHead, EagleConfig]:
    """The head in float32 on the CPU; strict about tensor names."""
    cfg = read_eagle_config(head_dir)
    tensors = load_file(str(head_dir / HEAD_FILE))
    head = EagleHead(cfg.shape)
    vocab = tensors.pop("draft_vocab", None)
    if vocab is None or vocab.numel() == 0:
        raise ValueError(f"{head_dir / HEAD_FILE} has no draft_vocab")
    head.draft_vocab = vocab.long()
    tensors["draft_vocab"] = head.draft_vocab
    head.load_state_dict({k: v.float() if k != "draft_vocab" else v for k, v in tensors.items()})
    return head.eval(), cfg


def save_eagle(head: EagleHead, out_dir: Path, cfg: EagleConfig) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", torch.float16 if v.is_floating_point() else v.dtype).contiguous()
        for k, v in head.state_dict().items()
    }
    save_file(state, str(out_dir / HEAD_FILE), metadata={"format": "pt"})
    (out_dir / HEAD_FILE).chmod(0o644)
    (out_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_json(), indent=2, sort_keys=True) + "\n")


def check_base(head_dir: Path, cfg: EagleConfig, base_dir: Path, force: bool) -> None:
    """Refuse a head trained for another base (ValueError), unless `force` (then warn)."""
    actual = fingerprint(base_dir)
    if cfg.base_fingerprint == actual:
        return
    msg = (
        f"EAGLE head {head_dir} was trained for base fingerprint {cfg.base_fingerprint} "
        f"({cfg.base_model_name_or_path}), but the loaded base {base_dir} has fingerprint "
        f"{actual}; retrain it (specserve train-eagle) or pass --force-eagle"
    )
    if not force:
        raise ValueError(msg)
    logger.warning("%s (--force-eagle: loading it anyway; acceptance may be poor)", msg)


def shipped_head_for(model_dir: Path) -> Path | None:
    """The shipped head trained for exactly this base, if any."""
    candidates = [d for d in sorted(SHIPPED_DIR.glob("*")) if is_head_dir(d)]
    if not candidates:
        return None
    actual = fingerprint(model_dir)
    return next((d for d in candidates if read_eagle_config(d).base_fingerprint == actual), None)


def eagle_head_dir(model_dir: Path, eagle: str | None) -> Path | None:
    """Which head serves: `--eagle DIR`, else the shipped head trained for exactly this base
    (None: none)."""
    if eagle is not None:
        read_eagle_config(Path(eagle))  # a clear error when it is not a head directory
        return Path(eagle)
    return shipped_head_for(model_dir)
