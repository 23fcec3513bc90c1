"""Each family as a GGUF (#53 item 2): a tiny checkpoint written as llama.cpp's converter
writes it (its tensor names and metadata, q/k permuted for llama, Gemma's norms as 1 + w, Llama
3's RoPE as rope_freqs) loads, from the header's description alone (models/gguf_config.py), to
the checkpoint's logits; and its tensors as Q8_0 blocks to them within the q8 error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from specserve.kernels import ggml
from specserve.models.gguf_config import UnsupportedGGUF, config_from_gguf
from specserve.models.gguf_file import GGUFFile
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from tests.gguf_files import T, write_gguf
from tests.kernels.expect import require
from tests.tiny import make_model_dir

CPU = torch.device("cpu")
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,  # Llama 3.x's: what a GGUF's factors imply
}
# name -> (tests/tiny.py family, GGUF architecture, config overrides)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama3": ("llama", "llama", {"rope_parameters": LLAMA3}),
    "qwen3": ("qwen3", "qwen3", {}),
    "gemma3": ("gemma3", "gemma3", {}),
    "phi3": ("phi3", "phi3", {}),
}
IDS = [5, 77, 12, 250, 9, 31, 140, 2, 66, 18, 201, 44, 3, 90, 17]  # past Gemma's window of 8


def logits(model: Any) -> torch.Tensor:  # [len(IDS), vocab]
    runner = ModelRunner(model, 8, 4, CPU)
    return runner.run([RunItem(IDS, 0, [3, 0, 5, 1, 4, 2, 7, 6], num_logits=len(IDS))]).logits


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_family_as_gguf_gives_the_checkpoints_logits(case: str, tmp_path: Path) -> None:
    family, arch, config = CASES[case]
    hf = make_model_dir(tmp_path / "hf", family, seed=4, config=config)
    want = logits(build_model(hf, CPU, numerics="exact"))
    gguf = write_gguf(hf, tmp_path / f"{case}.gguf", lambda _: T.F32, arch=arch)
    model_dir = resolve_model_dir(str(gguf), tmp_path / "cache")
    dense = build_model(model_dir, CPU, gguf_blocks=False, numerics="exact")
    torch.testing.assert_close(logits(dense), want, atol=1e-4, rtol=1e-4)
    require(ggml.library, "GGUF block kernels")
    q8_file = write_gguf(hf, tmp_path / f"{case}-q8.gguf", lambda _: T.Q8_0, arch=arch)
    q8 = logits(build_model(resolve_model_dir(str(q8_file), tmp_path / "cache"), CPU))
    torch.testing.assert_close(q8, want, atol=0.05 * float(want.abs().max()), rtol=0.0)


def test_rope_freqs_that_are_not_llama3s_are_refused(tmp_path: Path) -> None:
    """A RoPE the description cannot say is refused, never dropped."""
    hf = make_model_dir(tmp_path / "hf", "llama", config={"rope_parameters": LLAMA3})
    gguf = write_gguf(hf, tmp_path / "x.gguf", lambda _: T.F32)
    config_from_gguf(GGUFFile(gguf))  # as written: Llama 3's
    raw = bytearray(gguf.read_bytes())
    g = GGUFFile(gguf)
    at = g.tensors["rope_freqs.weight"].offset
    raw[at : at + 4] = torch.tensor([3.0]).numpy().tobytes()  # one factor off
    (tmp_path / "y.gguf").write_bytes(bytes(raw))
    with pytest.raises(UnsupportedGGUF, match=r"not Llama 3\.x.s"):
        config_from_gguf(GGUFFile(tmp_path / "y.gguf"))


def _gemma3_header(path: Path, layers: int, hidden: int, **extra: float) -> GGUFFile:
    """A Gemma 3 GGUF with its shape keys and no tensors, as llama.cpp's converter writes them
    (it writes no attention.scale)."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "gemma3")
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(4 * hidden)
    w.add_head_count(32)
    w.add_head_count_kv(16)
    w.add_key_length(128)
    w.add_uint32("gemma3.attention.sliding_window", 1024)
    w.add_uint32("gemma3.vocab_size", 262144)
    for name, value in extra.items():
        w.add_float32(f"gemma3.{name}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return GGUFFile(path)


def test_gemma3_attention_scale_and_local_base_as_llama_cpp_reads_them(tmp_path: Path) -> None:
    # the 27B (62 layers): hidden / heads = 168, as its config.json says, not head_dim (128)
    cfg = config_from_gguf(_gemma3_header(tmp_path / "27b.gguf", 62, 5376))
    assert cfg["query_pre_attn_scalar"] == 168
    cfg = config_from_gguf(_gemma3_header(tmp_path / "12b.gguf", 48, 3840))
    assert cfg["query_pre_attn_scalar"] == 128 and cfg["rope_local_base_freq"] == 10_000.0
    odd = _gemma3_header(tmp_path / "swa.gguf", 48, 3840, **{"rope.freq_base_swa": 20_000.0})
    assert config_from_gguf(odd)["rope_local_base_freq"] == 20_000.0
