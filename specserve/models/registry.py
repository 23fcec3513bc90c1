"""Build a model from a local model directory: an HF checkpoint, or the GGUF one describes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from specserve.config import Numerics
from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models.block_linear import attach_blocks
from specserve.models.families import ARCHITECTURES, model_class  # noqa: F401 (re-exported)
from specserve.models.gguf_blocks import (
    BLOCKS_FILE,
    Reference,
    check_matmul,
    checkpoint_rows,
    load_blocks,
)
from specserve.models.gguf_weights import dequantised, read_weights, warn_expanded
from specserve.models.huge_pages import trim_heap
from specserve.models.llama import DecoderLM
from specserve.models.loader import gguf_source, open_gguf
from specserve.models.native_stack import NativeStack

logger = logging.getLogger(__name__)


def read_config(model_dir: Path) -> dict[str, Any]:
    with open(model_dir / "config.json") as f:
        cfg: dict[str, Any] = json.load(f)
    return cfg


def build_model(
    model_dir: Path,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    gguf_blocks: bool = True,
    numerics: Numerics = "q8",
    context: int | None = None,
) -> DecoderLM:
    """Instantiate the decoder for `model_dir` and load its weights: a checkpoint's safetensors,
    or the GGUF the directory describes (read in place, models/gguf_weights.py).

    With `gguf_blocks`, on the CPU in float32 where the kernels build, a GGUF's tensors of a
    type with a kernel run as block rows, multiplying in `numerics`; everything else (and
    everything elsewhere) runs as float32 expanded from the file. `context`: the context to
    serve (`--max-model-len`) where the description depends on it (LongRoPE's factors).
    """
    cfg = read_config(model_dir)
    cls = model_class(cfg)
    with torch.device("meta"):
        model = cls(cls.arch_from_hf(cfg, context))
    model = model.to_empty(device=device).to(dtype)
    # to_empty breaks weight tying (the RoPE tables are plain tensors: they survive it)
    arch = model.arch
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    blocks_here = gguf_blocks and device.type == "cpu" and dtype == torch.float32
    blocks_here = blocks_here and ggml.library() is not None
    source = gguf_source(model_dir)
    if source is not None:
        model.load_hf_weights(_gguf_weights(model, source, blocks_here, numerics, dtype))
        trim_heap()  # what reading, interleaving and packing the blocks left free
        return model.eval()
    covered: set[str] = set()
    blocks = load_blocks(model_dir) if blocks_here else {}
    if blocks:
        covered = _attach(model, blocks, checkpoint_rows(model_dir), numerics)
    model.load_hf_weights(_iter_safetensors(model_dir, dtype, skip=covered))
    return model.eval()


def _attach(
    model: DecoderLM,
    blocks: dict[str, tuple[BlockKind, torch.Tensor]],
    reference: Reference,
    numerics: Numerics,
) -> set[str]:
    """Swap block layers in where the start-up product check passes; the names they cover."""
    problem = check_matmul(reference, blocks, q8=numerics == "q8")
    if problem is not None:
        logger.warning("GGUF block kernels off, running float32 weights: %s", problem)
        model.block_kernel_fallback = problem
        return set()
    covered = attach_blocks(model, blocks, numerics)
    if NativeStack.supports(model):
        model.native_stack = NativeStack(model)
    else:
        logger.info("the layers run in Python, not in one native call: %s", model.native_refusal)
    logger.info("%d weight tensors run as GGUF blocks (%s)", len(covered), numerics)
    return covered


def _gguf_weights(
    model: DecoderLM, source: Path, blocks_here: bool, numerics: Numerics,
    dtype: torch.dtype,
) -> list[tuple[str, torch.Tensor]]:  # fmt: skip
    """The GGUF's block rows attached to `model` (now, before its weights load); what is
    left, as float32 (name, tensor)."""
    arch = model.arch
    read = read_weights(open_gguf(source), arch.num_heads, arch.num_kv_heads, blocks_here)
    blocks = read.blocks

    def reference(name: str, n: int) -> torch.Tensor:
        kind, rows = blocks[name]
        return dequantised(kind, rows[:n])

    covered = _attach(model, blocks, reference, numerics) if blocks else set()
    for name in blocks.keys() - covered:  # no block layer takes them: expanded here
        read.dense[name] = reference(name, blocks[name][1].shape[0])
        read.expanded[blocks[name][0].name] += 1
    model.weight_report = read.report(len(covered))
    warn_expanded(read, source.name)
    return [(name, tensor.to(dtype)) for name, tensor in read.dense.items()]


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's own *.safetensors: not Medusa heads, not the derived GGUF blocks."""
    files = sorted(model_dir.glob("*.safetensors"))
    return [p for p in files if not p.name.startswith("medusa_") and p.name != BLOCKS_FILE]


def source_files(model_dir: Path) -> list[Path]:
    """The files a model's weights are read from: the GGUF a directory describes, or the
    checkpoint's own safetensors."""
    source = gguf_source(model_dir)
    return [source] if source is not None else weight_files(model_dir)


def _iter_safetensors(model_dir: Path, dtype: torch.dtype, skip: set[str] | None = None) -> Any:
    files = weight_files(model_dir)
    if not files:
        raise ValueError(f"no *.safetensors files in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                if skip is None or name not in skip:
                    yield name, f.get_tensor(name).to(dtype)
