"""ctypes side of `decoder.h`: the decoder stack's layers in one native call per step.

The structures mirror the C ones field for field; `models/native_stack.py` fills them from a
model whose projections are all GGUF blocks, and calls `run_layers` in place of the Python
layer loop.
"""

from __future__ import annotations

import ctypes

import torch

from specserve.kernels import ggml

_ptr, _i64, _i32, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float


class Layer(ctypes.Structure):
    """One layer's weights (block rows, norm weights, qkv bias), its K/V cache, and what it
    reads by index: its batch (0 full, 1 sliding) and its RoPE table (0 or 1)."""

    _fields_ = [
        ("norm1", _ptr),
        ("qkv", _ptr),
        ("qkv_bias", _ptr),
        ("o", _ptr),
        ("norm2", _ptr),
        ("gate_up", _ptr),
        ("down", _ptr),
        ("k_cache", _ptr),
        ("v_cache", _ptr),
        ("qkv_kind", _i32),
        ("o_kind", _i32),
        ("gate_up_kind", _i32),
        ("down_kind", _i32),
        ("q_norm", _ptr),
        ("k_norm", _ptr),
        ("attn_out_norm", _ptr),
        ("mlp_out_norm", _ptr),
        ("glu", _i32),
        ("kind", _i32),
        ("rope", _i32),
    ]


class Shape(ctypes.Structure):
    _fields_ = [
        ("hidden", _i64),
        ("inter", _i64),
        ("H", _i64),
        ("Hkv", _i64),
        ("D", _i64),
        ("eps", _f32),
        ("scale", _f32),
        ("q8", _i32),
        ("rotary", _i64),
    ]


class Batch(ctypes.Structure):
    """A step's ragged batch: slot per new row, [B, 3] sequence info, [B, max_blocks] tables."""

    _fields_ = [
        ("slots", _ptr),
        ("seq_info", _ptr),
        ("tables", _ptr),
        ("B", _i64),
        ("max_blocks", _i64),
        ("block_size", _i64),
        ("window", _i64),
        ("num_slots", _i64),
        ("esize", _i64),
    ]


def batches(full: Batch, sliding: Batch | None = None) -> ctypes.Array[Batch]:
    """The two batches `run_layers` takes: the full layers' and the sliding layers' (the same
    where only one kind of layer runs)."""
    return (Batch * 2)(full, sliding if sliding is not None else full)


class Ropes(ctypes.Structure):
    """The RoPE tables [T, D] a layer picks by its `rope` index (a second one may be NULL)."""

    _fields_ = [("cos", _ptr * 2), ("sin", _ptr * 2)]


def run_layers(
    layers: ctypes.Array[Layer],
    shape: Shape,
    batches: ctypes.Array[Batch],  # [2]: the full layers' and the sliding layers'
    x: torch.Tensor,  # [T, hidden] float32 contiguous: the residual stream, updated in place
    tables: list[tuple[torch.Tensor, torch.Tensor]],  # per RoPE table, cos, sin [T, rotary]
) -> None:
    lib = ggml.require()
    ropes = Ropes()
    for i, (cos, sin) in enumerate(tables):
        ropes.cos[i], ropes.sin[i] = cos.data_ptr(), sin.data_ptr()
    rc = lib.decoder_layers(
        layers, len(layers), ctypes.byref(shape), batches, x.data_ptr(), x.shape[0],
        ctypes.byref(ropes), torch.get_num_threads(),
    )  # fmt: skip
    if rc == -1:
        raise MemoryError("decoder stack could not allocate its buffers")
    if rc != 0:
        raise RuntimeError(f"decoder stack failed in layer {-2 - rc} (allocation or shapes)")


class Chain(ctypes.Structure):
    """What `eagle_chain` reads besides the head's layer (eagle_chain.h)."""

    _fields_ = [
        ("vocab_rows", _ptr),
        ("vocab_embed", _ptr),
        ("fc", _ptr),
        ("norm", _ptr),
        ("cos", _ptr),
        ("sin", _ptr),
        ("K", _i64),
        ("rope_rows", _i64),
        ("vocab_kind", _i32),
        ("fc_kind", _i32),
        ("q8", _i32),
        ("eps", _f32),
        ("continue_above", _f32),
    ]


def run_chain(
    layer: ctypes.Array[Layer],
    shape: Shape,
    chain: Chain,
    lanes: Batch,  # tables [B, blocks a lane]; slots and seq_info are the call's own
    seqs: torch.Tensor,  # [5, B] int64 contiguous: per sequence the slot, lane position and
    # output position of its first row, the most tokens to draft, its pending rows
    feats: torch.Tensor,  # [T, hidden] float32 contiguous: the pending rows' features
    embeds: torch.Tensor,  # [T, hidden]: their tokens' embeddings
    g: torch.Tensor,  # [B, hidden] float32 contiguous: the newest verified outputs (scratch)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pending rows, then the drafting chain, in one call: the newest verified output of
    every sequence [B, hidden], places [B, kmax] int32 (draft-vocabulary rows), their
    probabilities [B, kmax] and how many each sequence drafted [B]."""
    lib = ggml.require()
    b, kmax = g.shape[0], int(seqs[3].max())
    last = torch.empty_like(g)
    places = torch.empty(b, kmax, dtype=torch.int32)
    probs = torch.empty(b, kmax, dtype=torch.float32)
    counts = torch.empty(b, dtype=torch.int64)
    rc = lib.eagle_chain(
        layer, ctypes.byref(shape), ctypes.byref(chain), ctypes.byref(lanes), seqs.data_ptr(),
        feats.data_ptr(), embeds.data_ptr(), feats.shape[0], g.data_ptr(), last.data_ptr(),
        places.data_ptr(), probs.data_ptr(), counts.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if rc == -1:
        raise MemoryError("EAGLE chain could not allocate its buffers")
    if rc != 0:
        raise RuntimeError("EAGLE chain failed (rows outside a lane or the RoPE tables, or shapes)")
    return last, places, probs, counts
