"""Speculation profiles: fingerprints, validation, and the stale-profile review trigger."""

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from specserve import hashing
from specserve.models.fingerprint import Fingerprint
from specserve.speculation import profile as pf


def model_dir(root: Path, weights: bytes = b"weights", config: str = '{"a": 1, "b": 2}') -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(config)
    (root / "model.safetensors").write_bytes(weights)
    return root


def profile_for(target: Fingerprint, proposer: Fingerprint | None, n: int = 4) -> dict[str, Any]:
    entries = {"code-edit": {"speculate": n, "speculate_max_batch": 4}}
    return pf.make_profile(entries, target, proposer, "specserve bench", {"ttft_s": 1.0})


def test_target_fingerprint_hashes_config_meaning_and_weight_bytes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = pf.target_fingerprint(model_dir(tmp_path / "a"), cache)
    reformatted = model_dir(tmp_path / "b", config='{\n  "b": 2,\n  "a": 1\n}')
    assert pf.target_fingerprint(reformatted, cache) == a
    assert (
        pf.target_fingerprint(model_dir(tmp_path / "c", weights=b"weightz"), cache)[
            "weights_sha256"
        ]
        != a["weights_sha256"]
    )
    assert (
        pf.target_fingerprint(model_dir(tmp_path / "d", config='{"a": 2}'), cache)["config_sha256"]
        != a["config_sha256"]
    )


def test_medusa_heads_belong_to_the_proposer_not_the_target(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    d = model_dir(tmp_path / "m")
    before = pf.target_fingerprint(d, cache)
    (d / "medusa_heads.safetensors").write_bytes(b"heads")
    assert pf.target_fingerprint(d, cache) == before
    heads = pf.proposer_fingerprint("medusa", d, cache)
    assert heads is not None and heads["artifact"]["weights_sha256"]
    assert pf.proposer_fingerprint("ngram") == {"kind": "ngram", "artifact": None}
    assert pf.proposer_fingerprint(None) is None
    with pytest.raises(ValueError, match="model directory"):
        pf.proposer_fingerprint("draft")


def test_file_hash_is_cached_by_path_size_and_mtime(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"abc")
    real = hashing.cached_sha256(f, cache)
    index_path = cache / "file-hashes.json"
    index = json.loads(index_path.read_text())
    index[str(f.resolve())]["sha256"] = "remembered"
    index_path.write_text(json.dumps(index))
    assert hashing.cached_sha256(f, cache) == "remembered"  # not rehashed
    stat = f.stat()
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert hashing.cached_sha256(f, cache) == real  # touched: rehashed


def test_check_profile_finds_every_mismatch(tmp_path: Path) -> None:
    target = {"config_sha256": "c1", "weights_sha256": "w1"}
    ngram = {"kind": "ngram", "artifact": None}
    profile = profile_for(target, ngram)
    assert pf.check_profile(profile, target, ngram) == []
    [weights] = pf.check_profile(profile, target | {"weights_sha256": "w2"}, ngram)
    assert "target checkpoint weights changed" in weights
    [kind] = pf.check_profile(profile, target, {"kind": "draft", "artifact": {"x": 1}})
    assert "'ngram'" in kind and "'draft'" in kind
    draft = {"kind": "draft", "artifact": {"weights_sha256": "d1"}}
    [artifact] = pf.check_profile(
        profile_for(target, draft), target, {"kind": "draft", "artifact": {"weights_sha256": "d2"}}
    )
    assert "artifact changed" in artifact
    assert "speculation is off" in pf.check_profile(profile, target, None)[0]
    # A profile that recommends N = 0 everywhere does not depend on the proposer.
    assert pf.check_profile(profile_for(target, ngram, n=0), target, None) == []
    # Nor does one whose applied workload is at N = 0 (a fleet pool for creative chat).
    mixed = pf.make_profile(
        {"code-edit": {"speculate": 4}, "chat-creative": {"speculate": 0}},
        target, ngram, "specserve bench", {"ttft_s": 1.0},
    )  # fmt: skip
    assert pf.check_profile(mixed, target, None, ["chat-creative"]) == []
    assert "speculation is off" in pf.check_profile(mixed, target, None, ["code-edit"])[0]
    assert "speculation is off" in pf.check_profile(mixed, target, None)[0]
    assert "cannot be verified" in pf.check_profile(profile_for({}, ngram), target, ngram)[0]


def test_mismatched_profile_warns_and_strict_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = {"config_sha256": "c1", "weights_sha256": "w1"}
    ngram = {"kind": "ngram", "artifact": None}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_for(target, ngram)))
    profile = pf.load_profile(path)
    loaded = target | {"weights_sha256": "retrained"}
    with caplog.at_level(logging.WARNING, logger="specserve.speculation.profile"):
        problems = pf.review_profile(profile, path, loaded, ngram)
    assert len(problems) == 1
    assert "is stale and must be re-measured" in caplog.text and str(path) in caplog.text
    with pytest.raises(pf.StaleProfileError, match="stale"):
        pf.review_profile(profile, path, loaded, ngram, strict=True)
    caplog.clear()
    assert pf.review_profile(profile, path, target, ngram, strict=True) == []
    assert caplog.text == ""


def test_load_profile_and_setting(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    p = profile_for({"config_sha256": "c", "weights_sha256": "w"}, None)
    p["workloads"]["summarize"] = {"speculate": 2, "speculate_max_batch": None}
    path.write_text(json.dumps(p))
    loaded = pf.load_profile(path)
    assert pf.profile_setting(loaded) == (4, 4)  # the default workload: the first
    assert pf.profile_setting(loaded, "summarize") == (2, None)
    with pytest.raises(ValueError, match="no workload 'chat'"):
        pf.profile_setting(loaded, "chat")
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a speculation profile"):
        pf.load_profile(path)
    p["workloads"]["summarize"]["speculate"] = -1
    path.write_text(json.dumps(p))
    with pytest.raises(ValueError, match="speculate >= 0"):
        pf.load_profile(path)
