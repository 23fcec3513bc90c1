"""Map config.json architectures to our modules and build a model from an HF-style directory."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from specserve.config import Numerics
from specserve.kernels import ggml
from specserve.models.block_linear import attach_blocks
from specserve.models.families import ARCHITECTURES, model_class  # noqa: F401 (re-exported)
from specserve.models.gguf_blocks import BLOCKS_FILE, check_matmul, load_blocks
from specserve.models.llama import LlamaForCausalLM
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
) -> LlamaForCausalLM:
    """Instantiate the decoder for `model_dir` and load its safetensors weights.

    With `gguf_blocks`, a model converted from GGUF that runs on the CPU in float32 takes its
    projections and embeddings as the stored Q4_1/Q8_0 blocks when the kernels build; their
    float32 copies are then never read. The block projections multiply in `numerics`.
    """
    cfg = read_config(model_dir)
    cls = model_class(cfg)
    with torch.device("meta"):
        model = cls(cls.arch_from_hf(cfg))
    model = model.to_empty(device=device).to(dtype)
    # to_empty leaves buffers uninitialised and breaks weight tying: rebuild both.
    arch = model.arch
    model.rotary = type(model.rotary)(arch.head_dim, arch.rope_theta, arch.max_position).to(device)
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    covered: set[str] = set()
    on_cpu_fp32 = device.type == "cpu" and dtype == torch.float32
    if gguf_blocks and on_cpu_fp32 and ggml.library() is not None:
        blocks = load_blocks(model_dir)
        problem = check_matmul(model_dir, blocks, q8=numerics == "q8") if blocks else None
        if problem is not None:
            logger.warning("GGUF block kernels off, running float32 weights: %s", problem)
            model.block_kernel_fallback = problem
        elif blocks:
            covered = attach_blocks(model, blocks, numerics)
            if NativeStack.supports(model):
                model.native_stack = NativeStack(model)
            logger.info("%d weight tensors run as GGUF blocks (%s)", len(covered), numerics)
    model.load_hf_weights(_iter_safetensors(model_dir, dtype, skip=covered))
    return model.eval()


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's own *.safetensors: not Medusa heads, not the derived GGUF blocks."""
    files = sorted(model_dir.glob("*.safetensors"))
    return [p for p in files if not p.name.startswith("medusa_") and p.name != BLOCKS_FILE]


def _iter_safetensors(model_dir: Path, dtype: torch.dtype, skip: set[str] | None = None) -> Any:
    files = weight_files(model_dir)
    if not files:
        raise ValueError(f"no *.safetensors files in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                if skip is None or name not in skip:
                    yield name, f.get_tensor(name).to(dtype)
