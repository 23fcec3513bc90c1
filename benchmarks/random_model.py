"""Random-weight checkpoints (HF layout) in the shapes of real models, for timing anywhere.

Real weights cannot travel to every machine; a step's cost depends only on the shapes, so
benchmarks of cost (not of acceptance) can run on random weights of the same architecture.

    python -m benchmarks.random_model --shape llama-1b --out /tmp/llama-1b
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

WEIGHTS_FILE = "model.safetensors"
_MARKER = "random-model.json"  # what was written, so a matching directory is reused

_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

SHAPES: dict[str, dict[str, Any]] = {
    # tests/tiny.py's llama: a few MB, for CPU tests of the benchmark itself.
    "tiny": _LLAMA
    | {
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    # SmolLM2-135M-Instruct (the embedded model's config.json).
    "smollm2-135m": _LLAMA
    | {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    # Llama-3.2-1B's dimensions. Its llama3 RoPE scaling is left out (we serve only default
    # RoPE); that changes the rotation angles, not the cost of a step.
    "llama-1b": _LLAMA
    | {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    # gemma-3-270m's config.json: five sliding layers (window 512, RoPE base 10,000) in six,
    # one KV head of 256, a 262k vocabulary tied to the embedding.
    "gemma3-270m": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 262144,
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 256,
        "sliding_window": 512,
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)
        ],
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 1,
    },
}


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of `config`'s model, read off a meta-device instance."""
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)  # stored once, as the embedding
    return shapes


def write_random_model(
    config: dict[str, Any],
    out_dir: Path,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> Path:
    """Write config.json + model.safetensors with N(0, 0.02) matrices and unit norms (weight 0
    where the norm scales by 1 + weight, as Gemma's do).

    Tensors are drawn on `device` (a GPU draws a billion values in milliseconds) and stored as
    `dtype`; loaders convert to the dtype they run in. An existing directory written from the
    same config, seed and dtype is reused.
    """
    from safetensors.torch import save_file

    record = {"config": config, "seed": seed, "dtype": str(dtype)}
    marker = out_dir / _MARKER
    if marker.is_file() and json.loads(marker.read_text()) == record:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    unit = 0.0 if config["model_type"].startswith("gemma") else 1.0
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in tensor_shapes(config).items():
        if name.endswith("norm.weight"):
            tensor = torch.full(shape, unit, dtype=dtype)
        else:
            drawn = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            tensor = drawn.mul_(0.02).to(dtype).cpu()
        tensors[name] = tensor
    save_file(tensors, str(out_dir / WEIGHTS_FILE))
    (out_dir / "config.json").write_text(json.dumps(config | {"dtype": _dtype_name(dtype)}))
    marker.write_text(json.dumps(record))
    return out_dir


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.random_model")
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", default="cpu", help="where the random values are drawn")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    path = write_random_model(SHAPES[args.shape], args.out, args.seed, dtype, args.device)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
