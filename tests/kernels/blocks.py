"""GGUF block rows packed in numpy from chosen codes, for the kernel tests: every kind's bytes
as ggml lays them out (ggml-common.h), and the same weights in the form the kernels share
(`subblocks.h`): w[j] = dv[j // 4] * q[j] (+ m) per 32 values. gguf-py's dequantisation of the
bytes checks the packing (`test_gguf_types.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specserve.kernels.ggml import QK, BlockKind

F16 = np.float16


@dataclass(frozen=True)
class Coded:
    """Block rows and what they encode, per 32-value sub-block sb of row n."""

    blocks: np.ndarray  # uint8 [N, row_bytes]
    q: np.ndarray  # int32 [N, K]: the integer quants
    dv: np.ndarray  # float32 [N, K // 4]: one scale per lane of four values
    m: np.ndarray | None  # float32 [N, K // 32]: the offsets (None: the kind has none)

    @property
    def torch_blocks(self) -> torch.Tensor:
        return torch.from_numpy(self.blocks.copy())

    def weights(self) -> np.ndarray:  # float32 [N, K], as gguf-py dequantises them
        w = np.repeat(self.dv, 4, axis=1) * self.q.astype(np.float32)
        return w if self.m is None else w + np.repeat(self.m, QK, axis=1)


# Quant ranges: (lowest, highest) code of each kind.
_RANGE = {
    BlockKind.Q4_0: (-8, 7), BlockKind.Q4_1: (0, 15), BlockKind.Q5_0: (-16, 15),
    BlockKind.Q5_1: (0, 31), BlockKind.Q8_0: (-128, 127), BlockKind.Q4_K: (0, 15),
    BlockKind.Q5_K: (0, 31), BlockKind.Q6_K: (-32, 31),
}  # fmt: skip


def coded_blocks(kind: BlockKind, n: int, k: int, seed: int = 0, scale: float = 0.05) -> Coded:
    """Random codes over each kind's whole range and finite fp16 scales, packed as `kind`."""
    rng = np.random.default_rng(seed)
    lo, hi = _RANGE[kind]
    q = rng.integers(lo, hi + 1, (n, k), dtype=np.int32)
    half = (rng.standard_normal((n, k // kind.block_values, 2)) * scale).astype(F16)
    pack = _K_PACKERS.get(kind)
    if pack is not None:
        return pack(q, half, rng)
    d, m = half[..., 0], half[..., 1]  # one block per 32 values
    dv = np.repeat(d.astype(np.float32), QK // 4, axis=1)
    offset = m.astype(np.float32) if kind in (BlockKind.Q4_1, BlockKind.Q5_1) else None
    head = [d[..., None].view(np.uint8)]
    if offset is not None:
        head.append(m[..., None].view(np.uint8))
    blocks = q.reshape(n, -1, QK) - lo  # unsigned codes
    if kind is BlockKind.Q8_0:
        body = [(blocks + lo).astype(np.int8).view(np.uint8)]
    else:
        nib = (blocks[..., :16] & 15) | (blocks[..., 16:] & 15) << 4
        body = [nib.astype(np.uint8)]
        if kind in (BlockKind.Q5_0, BlockKind.Q5_1):
            # bit j of qh: the fifth bit of value j
            qh = ((blocks.astype(np.int64) >> 4) << np.arange(QK)).sum(-1).astype("<u4")
            body.insert(0, qh[..., None].view(np.uint8))
    rows = np.concatenate([*(h.reshape(n, -1, 2) for h in head), *body], axis=-1)
    return Coded(rows.reshape(n, -1), q, dv, offset)


def _pack_q4_k(q: np.ndarray, half: np.ndarray, rng: np.random.Generator) -> Coded:
    return _pack_k(BlockKind.Q4_K, q, half, rng)


def _pack_q5_k(q: np.ndarray, half: np.ndarray, rng: np.random.Generator) -> Coded:
    return _pack_k(BlockKind.Q5_K, q, half, rng)


def _pack_k(kind: BlockKind, q: np.ndarray, half: np.ndarray, rng: np.random.Generator) -> Coded:
    """Q4_K / Q5_K: d, dmin; 6-bit scales and mins of 8 sub-blocks in 12 bytes; (qh); nibbles
    64 values per 32 bytes, the even sub-block in the low nibbles."""
    n, k = q.shape
    nsb = k // 256
    sc = rng.integers(0, 64, (n, nsb, 8), dtype=np.uint8)
    mn = rng.integers(0, 64, (n, nsb, 8), dtype=np.uint8)
    scales = np.concatenate(
        [sc[..., :4] | (sc[..., 4:] >> 4) << 6, mn[..., :4] | (mn[..., 4:] >> 4) << 6,
         (sc[..., 4:] & 15) | (mn[..., 4:] & 15) << 4], axis=-1,
    )  # fmt: skip
    sub = q.reshape(n, nsb, 8, QK).astype(np.uint8)
    nibbles = (sub[:, :, 0::2] & 15) | (sub[:, :, 1::2] & 15) << 4  # [n, nsb, 4, 32]
    parts = [half.view(np.uint8).reshape(n, nsb, 4), scales]
    if kind is BlockKind.Q5_K:
        parts.append(((sub >> 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(2, dtype=np.uint8))
    parts.append(nibbles.reshape(n, nsb, 128))
    d, dmin = half[..., 0].astype(np.float32), half[..., 1].astype(np.float32)
    dv = np.repeat((d[..., None] * sc.astype(np.float32)).reshape(n, -1), QK // 4, axis=1)
    m = -(dmin[..., None] * mn.astype(np.float32)).reshape(n, -1)
    return Coded(np.concatenate(parts, axis=-1).reshape(n, -1), q, dv, m)


def _pack_q6_k(q: np.ndarray, half: np.ndarray, rng: np.random.Generator) -> Coded:
    """Q6_K: ql[128] (per 128 values: sub-blocks 0, 1 in the low nibbles of 64 bytes, 2, 3 in
    the high ones), qh[64] (per 128 values: sub-block t's top two bits at bits 2t), int8
    scales[16] (one per 16 values), fp16 d."""
    n, k = q.shape
    nsb = k // 256
    u = (q + 32).reshape(n, nsb, 2, 4, QK).astype(np.uint8)  # [.., chunk, t, l]
    ql = np.concatenate([u[:, :, :, 0] & 15 | (u[:, :, :, 2] & 15) << 4,
                         u[:, :, :, 1] & 15 | (u[:, :, :, 3] & 15) << 4], axis=-1)  # fmt: skip
    qh = ((u >> 4) << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(3, dtype=np.uint8)
    sc = rng.integers(-128, 128, (n, nsb, 16), dtype=np.int8)
    d = half[..., :1]
    parts = [ql.reshape(n, nsb, 128), qh.reshape(n, nsb, 64), sc.view(np.uint8),
             d.view(np.uint8).reshape(n, nsb, 2)]  # fmt: skip
    dv = np.repeat((d.astype(np.float32) * sc.astype(np.float32)).reshape(n, -1), 4, axis=1)
    return Coded(np.concatenate(parts, axis=-1).reshape(n, -1), q, dv, None)


_K_PACKERS = {BlockKind.Q4_K: _pack_q4_k, BlockKind.Q5_K: _pack_q5_k, BlockKind.Q6_K: _pack_q6_k}


def width_for(kind: BlockKind, width: int) -> int:
    """`width` rounded up to whole blocks of `kind` (256 values for the K-quants)."""
    return -(-width // kind.block_values) * kind.block_values
