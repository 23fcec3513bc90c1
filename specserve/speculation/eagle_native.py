"""The EAGLE head's decoder layer in one native call per drafting step (`kernels/decoder.c`, the
call the target's layers make), with the head's keys and values in a paged cache of its own.

Run as torch operations (eagle_padded.py), one chain step is some 35 framework calls (projections,
RoPE, concatenating the cache, building the window mask, repeating heads for GQA, SDPA), about
0.9 ms a drafted token at batch 1 on 2 cores: a fifth of a target step. Here it is the fused
input projection, one `decoder_layers` call over the head's layer, and the final norm; and for
greedy requests a drafting step is one call (`chain`, kernels/eagle_chain.c: the pairs verified
since the last call, then per token the scores, the pick, the fused input, the layer and the
norm), where its Python form cost ~10 framework calls for the pairs and ~15 a token, each
several times its warm cost right after the target's forward.

The cache: each drafting sequence owns a lane of `capacity` consecutive slots (whole blocks),
its logical position i holding the key of output position `base + i`, so the attention
kernel's own window (keys within `window` positions of the query) is the head's window. A lane
keeps the verified positions at logical 0..n-1; a chain's keys go after them and are written
over by the next call, which recomputes those positions from the target's true features. When
a lane would overflow, its last `window - 1` verified keys (all a later query can see) move to
its start. Lanes are reused as sequences finish; the cache doubles when all are taken.

Drafts only decide how much a step verifies, never what the request outputs: this path's
rounding differs from the torch path's (another attention kernel, RoPE in the kernel), and
tests hold the two to the same drafts within float tolerance, not bit for bit.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specserve.kernels import decoder, ggml
from specserve.models.block_linear import BlockLinear
from specserve.models.llama import ROPE_KERNEL_WIDTH
from specserve.speculation.eagle_head import EagleHead

BLOCK = 16  # slots per block of the head's cache


@dataclass
class Lane:
    """One sequence's slots: logical position i (output position base + i) at slot start + i."""

    index: int
    start: int
    base: int = 0
    n: int = 0  # verified positions held, at logical 0..n-1


@dataclass(frozen=True)
class Rows:
    """A step's new rows: per sequence, its lane, the output position of its first new row and
    how many rows it has (consecutive positions)."""

    lanes: list[Lane]
    firsts: list[int]
    counts: list[int]


class NativeHead:
    """The head's layer over lanes of its own cache (see the module docstring)."""

    def __init__(self, head: EagleHead) -> None:
        s = head.shape
        self.head = head
        self.window = s.window
        # After moving, a lane holds window - 1 verified keys; a call adds up to `window`
        # pending pairs (sync keeps no more) or a chain.
        self.capacity = -(-2 * s.window // BLOCK) * BLOCK
        self.max_chain = self.capacity - (s.window - 1)
        self._shape = decoder.Shape(
            s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.head_dim,
            s.rms_norm_eps, 1.0 / math.sqrt(s.head_dim), 1,
        )  # fmt: skip
        self._free: list[Lane] = []
        self._lanes = 0
        self.k_cache = torch.zeros(0)
        self.v_cache = torch.zeros(0)
        self._layer: ctypes.Array[decoder.Layer] | None = None
        self._cos = torch.zeros(0, s.head_dim)
        self._sin = torch.zeros(0, s.head_dim)
        self._grow(8)

    @staticmethod
    def supports(head: EagleHead) -> bool:
        """Whether every projection of the head is q8 blocks the layer kernel takes."""
        names = ("fc", "qkv", "o", "gate_up", "down")
        linears = [getattr(head, n) for n in names]
        return (
            ggml.library() is not None
            and all(isinstance(p, BlockLinear) and p.q8 and p.bias is None for p in linears)
            and head.qkv.out_features % ROPE_KERNEL_WIDTH == 0
            and head.shape.head_dim % 8 == 0
        )

    # ------------------------------------------------------------------------------ lanes
    def lane(self, first_position: int) -> Lane:
        if not self._free:
            self._grow(2 * self._lanes)
        lane = self._free.pop()
        lane.base, lane.n = first_position, 0
        return lane

    def release(self, lane: Lane) -> None:
        self._free.append(lane)

    def _grow(self, lanes: int) -> None:
        s = self.head.shape
        k = torch.zeros(s.num_kv_heads, lanes * self.capacity, s.head_dim)
        v = torch.zeros_like(k)
        if self._lanes:
            used = self._lanes * self.capacity
            k[:, :used], v[:, :used] = self.k_cache, self.v_cache
        self.k_cache, self.v_cache = k, v
        self._blocks = torch.arange(lanes * self.capacity // BLOCK, dtype=torch.int32)
        self._free += [Lane(i, i * self.capacity) for i in range(lanes - 1, self._lanes - 1, -1)]
        self._lanes = lanes
        head = self.head
        qkv, o, gate_up, down = (_blocks(p) for p in (head.qkv, head.o, head.gate_up, head.down))
        layer = decoder.Layer(
            head.input_norm.weight.data_ptr(), qkv.blocks.data_ptr(), None, o.blocks.data_ptr(),
            head.post_norm.weight.data_ptr(), gate_up.blocks.data_ptr(), down.blocks.data_ptr(),
            k.data_ptr(), v.data_ptr(), qkv.kind, o.kind, gate_up.kind, down.kind,
        )  # fmt: skip
        self._layer = (decoder.Layer * 1)(layer)

    def make_room(self, lane: Lane, first_position: int, rows: int) -> None:
        """Ready `lane` for `rows` new rows from output position `first_position`: a lane whose
        verified keys do not end just before it starts over; one that would overflow keeps its
        last window - 1 verified keys, moved to its start."""
        if lane.base + lane.n != first_position:
            lane.base, lane.n = first_position, 0
        if lane.n + rows <= self.capacity:
            return
        keep = min(lane.n, self.window - 1)
        src = slice(lane.start + lane.n - keep, lane.start + lane.n)
        dst = slice(lane.start, lane.start + keep)
        self.k_cache[:, dst] = self.k_cache[:, src].clone()
        self.v_cache[:, dst] = self.v_cache[:, src].clone()
        lane.base += lane.n - keep
        lane.n = keep

    # ----------------------------------------------------------------------------- layer
    def forward(self, x: torch.Tensor, rows: Rows) -> torch.Tensor:
        """The head's layer and final norm over x [T, H] (the fused inputs of the new rows, in
        `rows` order): their keys and values into the lanes, each attending to its lane's
        window. Returns the normalised outputs [T, H]; commits nothing (see `commit`).
        A drafting step at batch 1 runs this once a token right after the target's forward has
        evicted the caches, where each framework call costs several times its warm cost
        (bench_eagle): the index arrays go in one tensor, the block tables and RoPE rows are
        views where they can be."""
        slots: list[int] = []
        info: list[int] = []  # per lane: first row in x, rows, keys it sees (lane-logical)
        positions: list[int] = []
        for lane, first, count in zip(rows.lanes, rows.firsts, rows.counts, strict=True):
            at = first - lane.base  # logical position of the first new row
            if at < 0 or at + count > self.capacity:  # make_room was not called: never write
                raise RuntimeError(f"rows {at}..{at + count} outside a lane of {self.capacity}")
            info += (len(slots), count, at + count)
            slots += range(lane.start + at, lane.start + at + count)
            positions += range(first, first + count)
        index = torch.tensor(slots + info, dtype=torch.int64)  # slots, then info [B, 3]
        cos, sin = self._rope(positions)
        tables = self._lane_tables(rows.lanes)
        batch = decoder.Batch(
            index.data_ptr(), index.data_ptr() + 8 * len(slots), tables.data_ptr(),
            len(rows.lanes), tables.shape[1], BLOCK, self.window, self.k_cache.shape[1],
            self.k_cache.element_size(),
        )  # fmt: skip
        x = x.contiguous()
        assert self._layer is not None
        decoder.run_layers(self._layer, self._shape, decoder.batches(batch), x, [(cos, sin)])
        norm = self.head.norm
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)

    def _lane_tables(self, lanes: list[Lane]) -> torch.Tensor:
        """The block tables [B, blocks a lane] of `lanes` (int32): lane i owns blocks
        i * blocks .. (i + 1) * blocks - 1 of the head's cache."""
        blocks = self.capacity // BLOCK
        if len(lanes) == 1:
            first = lanes[0].index * blocks
            return self._blocks[first : first + blocks].view(1, blocks)
        which = torch.tensor([lane.index for lane in lanes], dtype=torch.int64)
        return self._blocks.view(-1, blocks)[which]

    @staticmethod
    def commit(rows: Rows) -> None:
        """The rows just run are verified positions: they stay in their lanes."""
        for lane, first, count in zip(rows.lanes, rows.firsts, rows.counts, strict=True):
            lane.n = first - lane.base + count

    def _rope(self, positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, D] at output positions, as the torch path computes them (float64 angles,
        rounded to float32), from a table that doubles as positions grow."""
        self._rope_rows(max(positions) + 1)
        n, first = len(positions), positions[0]
        if positions == list(range(first, first + n)):  # one lane's rows (batch 1): views
            return self._cos[first : first + n], self._sin[first : first + n]
        index = torch.tensor(positions, dtype=torch.int64)
        return self._cos[index], self._sin[index]

    def _rope_rows(self, top: int) -> None:
        """The RoPE tables cover output positions 0 .. top - 1 (doubling as they grow)."""
        if top > len(self._cos):
            size = max(top, 2 * len(self._cos), 1024)
            angles = torch.arange(size, dtype=torch.float64).unsqueeze(-1) * self.head.inv_freq
            emb = torch.cat([angles, angles], dim=-1)
            self._cos, self._sin = emb.cos().float(), emb.sin().float()

    # ----------------------------------------------------------------------------- chain
    def chain(
        self,
        g: torch.Tensor,  # [B, H] float32, newest verified outputs (rows with pending pairs:
        # any values); overwritten: the call's scratch
        rows: Rows,  # per sequence: lane, output position of its first row, its pending pairs
        pending: tuple[torch.Tensor, torch.Tensor] | None,  # [T, H] features, embeddings
        ks: list[int],  # the most tokens each may draft
        scores: BlockLinear,  # the draft vocabulary's lm_head rows
        embed: torch.Tensor,  # [K, H] the draft vocabulary's embeddings
        continue_above: float,  # a chain stops where its probability falls below this
    ) -> tuple[torch.Tensor, list[tuple[list[int], list[float]]]]:
        """The pending pairs, then greedy drafting for B sequences, in one native call
        (kernels/eagle_chain.c): what `forward` + `commit` and the proposer's pick do a call or
        a chain step at a time, with every step's scores, picks and layer outputs the same.
        Each lane needs room for its pending pairs and max(ks) rows (`make_room`); the pending
        pairs' keys stay in it (committed), the chain's are written over later. Returns every
        sequence's newest verified output [B, H] and, per sequence, the draft vocabulary's
        places drafted and their probabilities."""
        fc, head = _blocks(self.head.fc), self.head
        if not (scores.q8 and fc.q8) or embed.dtype != torch.float32:
            raise ValueError("the native chain runs q8 blocks and float32 embeddings")
        if embed.shape != (scores.out_features, scores.in_features) or not embed.is_contiguous():
            raise ValueError("the draft vocabulary's embeddings must match its lm_head rows")
        at = [first - lane.base for lane, first in zip(rows.lanes, rows.firsts, strict=True)]
        slots = [lane.start + a for lane, a in zip(rows.lanes, at, strict=True)]
        seqs = torch.tensor([slots, at, rows.firsts, ks, rows.counts], dtype=torch.int64)
        self._rope_rows(max(f + n for f, n in zip(rows.firsts, rows.counts, strict=True)) + max(ks))
        tables = self._lane_tables(rows.lanes)
        batch = decoder.Batch(
            0, 0, tables.data_ptr(), len(rows.lanes), tables.shape[1], BLOCK, self.window,
            self.k_cache.shape[1], self.k_cache.element_size(),
        )  # fmt: skip
        spec = decoder.Chain(
            scores.blocks.data_ptr(), embed.data_ptr(), fc.blocks.data_ptr(),
            head.norm.weight.data_ptr(), self._cos.data_ptr(), self._sin.data_ptr(),
            len(embed), len(self._cos), scores.kind, fc.kind, 1, head.norm.eps, continue_above,
        )  # fmt: skip
        feats, embeds = pending if pending is not None else (g[:0], g[:0])
        assert self._layer is not None
        last, places, probs, counts = decoder.run_chain(
            self._layer, self._shape, spec, batch, seqs, feats.contiguous(), embeds.contiguous(),
            g.contiguous(),
        )  # fmt: skip
        self.commit(rows)
        place_rows, prob_rows = places.tolist(), probs.tolist()
        drafted = [(place_rows[b][:n], prob_rows[b][:n]) for b, n in enumerate(counts.tolist())]
        return last, drafted


def _blocks(linear: object) -> BlockLinear:
    assert isinstance(linear, BlockLinear)  # NativeHead.supports checked it
    return linear
