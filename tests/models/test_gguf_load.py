"""A GGUF read in place (#52): tiny models the tests write as GGUFs of each type load to the
logits of the float32 weights the file encodes, with no float32 copy written to the cache; a
type without a kernel serves as float32 and says so; an unsupported architecture is refused
from the header before anything is written."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType

from specserve.kernels import ggml
from specserve.models.block_linear import BlockLinear, block_kinds
from specserve.models.gguf_file import GGUFFile
from specserve.models.gguf_weights import read_weights
from specserve.models.loader import ModelLoadError, resolve_model_dir
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from tests.gguf_files import T, write_gguf
from tests.kernels.expect import require
from tests.tiny import make_model_dir

CPU = torch.device("cpu")
TABLE = [3, 0, 5, 1, 4, 2, 7, 6]


def logits(model: Any, ids: list[int]) -> torch.Tensor:  # [len(ids), vocab]
    runner = ModelRunner(model, 8, 4, CPU)
    return runner.run([RunItem(ids, 0, TABLE, num_logits=len(ids))]).logits


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # rows of 256 values: whole K-quant blocks
    return make_model_dir(tmp_path_factory.mktemp("hf"), "llama", hidden=256, seed=5)


def mix(name: str) -> GGMLQuantizationType:
    """A mix of the types gguf-py quantises: Q8_0 embeddings and attention, Q4_1 MLP."""
    return T.Q4_1 if ".ffn_" in name else T.Q8_0


IDS = [5, 77, 12, 250, 9, 31, 140, 2, 66, 18, 201, 44]


def test_a_gguf_loads_to_transformers_logits(
    tiny_hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float32 expanded from the file (blocks off) = transformers' own GGUF load; the block
    kernels in the exact numerics within float32 summation error of it."""
    import transformers
    import transformers.modeling_utils

    # from_pretrained(gguf_file=...) asks for accelerate but does not use it on the CPU
    monkeypatch.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)

    gguf = write_gguf(tiny_hf, tmp_path / "tiny.gguf", mix)
    model_dir = resolve_model_dir(str(gguf), tmp_path / "cache")
    assert not list(model_dir.glob("*.safetensors"))  # nothing dequantised into the cache
    ours, theirs = (
        transformers.AutoTokenizer.from_pretrained(str(d)) for d in (model_dir, tiny_hf)
    )
    text = "<|im_start|>user\ndef add(a, b): the quick brown fox<|im_end|>"
    assert ours.encode(text) == theirs.encode(text)  # special tokens included
    chat = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(
        chat, tokenize=False
    )
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = ref(torch.tensor([IDS])).logits[0]
    dense = build_model(model_dir, CPU, gguf_blocks=False, numerics="exact")
    torch.testing.assert_close(logits(dense, IDS), want, atol=1e-4, rtol=1e-4)
    require(ggml.library, "GGUF block kernels")
    blocks = build_model(model_dir, CPU, numerics="exact")
    assert block_kinds(blocks) == ["Q4_1", "Q8_0"]
    report = blocks.weight_report
    assert report is not None and report.expanded == {}
    assert report.block_tensors == 2 * 7 + 2  # and the embeddings and output
    torch.testing.assert_close(logits(blocks, IDS), want, atol=1e-4, rtol=1e-4)


def test_q8_numerics_on_a_gguf_are_within_their_error(tiny_hf: Path, tmp_path: Path) -> None:
    require(ggml.library, "GGUF block kernels")
    model_dir = resolve_model_dir(str(write_gguf(tiny_hf, tmp_path / "t.gguf", mix)), tmp_path)
    exact = logits(build_model(model_dir, CPU, gguf_blocks=False, numerics="exact"), IDS)
    q8 = logits(build_model(model_dir, CPU), IDS)
    assert not torch.equal(q8, exact)  # another arithmetic ...
    torch.testing.assert_close(q8, exact, atol=0.05 * float(exact.abs().max()), rtol=0.0)
    assert (q8.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.9  # ... close to it


def test_a_type_without_a_kernel_serves_as_float32_and_says_so(
    tiny_hf: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Q2_K has no kernel here: it is expanded at load (a warning naming it, /info's report),
    and the model equals the float32 the file encodes."""
    require(ggml.library, "GGUF block kernels")

    def with_q2(name: str) -> GGMLQuantizationType:
        return T.Q2_K if name.endswith("ffn_down.weight") else mix(name)

    gguf = write_gguf(tiny_hf, tmp_path / "q2.gguf", with_q2)
    model_dir = resolve_model_dir(str(gguf), tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="specserve.models.gguf_weights"):
        model = build_model(model_dir, CPU, numerics="exact")
    assert "2 x Q2_K" in caplog.text, caplog.text
    report = model.weight_report
    assert report is not None and report.expanded == {"Q2_K": 2}
    assert report.bytes_by_type["Q2_K"] > 0
    assert not isinstance(model.layers[0].down_proj, BlockLinear)
    dense = build_model(model_dir, CPU, gguf_blocks=False, numerics="exact")
    torch.testing.assert_close(logits(model, IDS), logits(dense, IDS), atol=1e-4, rtol=1e-4)


def test_q_and_k_rows_come_back_in_transformers_order(tiny_hf: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    gguf = GGUFFile(write_gguf(tiny_hf, tmp_path / "t.gguf", lambda _: T.F32))
    read = read_weights(gguf, heads=4, kv_heads=2, keep_blocks=False)
    hf = load_file(str(tiny_hf / "model.safetensors"))
    for name in ("q_proj", "k_proj"):
        full = f"model.layers.1.self_attn.{name}.weight"
        assert torch.equal(read.dense[full], hf[full])
    raw = torch.from_numpy(gguf.array("blk.1.attn_q.weight").view("float32").copy())
    assert not torch.equal(raw, hf["model.layers.1.self_attn.q_proj.weight"])  # permuted there


def test_an_unsupported_architecture_is_refused_from_its_header(
    tiny_hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused from config and header, before the tokenizer is converted or a file is kept."""
    import transformers

    gguf = write_gguf(tiny_hf, tmp_path / "other.gguf", mix, arch="falcon")

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer was converted for a model that is refused")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_work)
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        resolve_model_dir(str(gguf), cache)
    assert not any(p.name.startswith(("gguf-", ".tmp-gguf-")) for p in cache.iterdir())


def test_a_gguf_is_fingerprinted_by_its_bytes(tiny_hf: Path, tmp_path: Path) -> None:
    """A speculation profile's target fingerprint covers the GGUF a directory describes."""
    from specserve.models.fingerprint import files_sha256, target_fingerprint

    cache = tmp_path / "cache"
    a = write_gguf(tiny_hf, tmp_path / "a.gguf", mix)
    b = write_gguf(tiny_hf, tmp_path / "b.gguf", lambda _: T.Q8_0)
    fa = target_fingerprint(resolve_model_dir(str(a), cache), cache)
    fb = target_fingerprint(resolve_model_dir(str(b), cache), cache)
    assert fa["weights_sha256"] == files_sha256([a], cache) != fb["weights_sha256"]
