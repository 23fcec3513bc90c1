"""`serve --speculation-profile`: the profile's N and gate are applied, and a profile measured on
other artifacts is reported stale (/info, gauge, log), or refused under --strict-profile."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specserve.cli_flags import parse_bool
from specserve.speculation.profile import make_profile, proposer_fingerprint, target_fingerprint
from tests import http
from tests.server.conftest import TINY_FLAGS, Server, scrape, server_env, start_server

STALE_GAUGE = "specserve_speculation_profile_stale"
WORKLOADS: dict[str, dict[str, Any]] = {
    "code-edit": {"speculate": 2, "speculate_max_batch": 3, "best_by_load": {}, "mode": "closed"},
    "chat": {"speculate": 3, "speculate_max_batch": None, "best_by_load": {}, "mode": "closed"},
}


def write_profile(path: Path, target: dict[str, Any], proposer: dict[str, Any] | None) -> Path:
    profile = make_profile(WORKLOADS, target, proposer, "specserve bench (test)", {})
    path.write_text(json.dumps(profile))
    return path


def serve_with(model: Path, profile: Path, work: Path, *extra: str) -> Server:
    """The tiny server (its --speculate 4 is overridden by the profile) with `profile`."""
    flags = ["--model", str(model), *TINY_FLAGS, "--speculation-profile", str(profile), *extra]
    env = {"SPECSERVE_CACHE": str(work / "cache")}  # file digests stay out of the user's cache
    return start_server(flags, work / f"{profile.stem}.log", env)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profile-review")


@pytest.fixture(scope="module")
def stale_profile(tiny_model: Path, work: Path) -> Path:
    target = target_fingerprint(tiny_model, work / "cache") | {"weights_sha256": "0" * 64}
    return write_profile(work / "stale.json", target, proposer_fingerprint("ngram"))


@pytest.fixture(scope="module")
def stale_server(tiny_model: Path, stale_profile: Path, work: Path) -> Iterator[Server]:
    server = serve_with(tiny_model, stale_profile, work)
    yield server
    server.stop()


def test_stale_profile_warns_and_reports(stale_server: Server) -> None:
    info = http.get(stale_server.url + "/info").json()
    prof = info["speculation_profile"]
    assert prof["stale"] is True and prof["workload"] == "code-edit"  # the default: the first
    assert any("weights changed" in p for p in prof["problems"]), prof["problems"]
    assert (prof["speculate"], prof["speculate_max_batch"]) == (2, 3)
    assert info["speculation"]["speculate"] == 2 and info["speculation"]["max_batch"] == 3
    assert scrape(stale_server.url)[STALE_GAUGE] == 1
    log = stale_server.log.read_text()
    assert "WARNING" in log and "is stale and must be re-measured" in log


def test_strict_profile_refuses_to_start(tiny_model: Path, stale_profile: Path, work: Path) -> None:
    env = server_env({"SPECSERVE_CACHE": str(work / "cache")})
    cmd = [sys.executable, "-m", "specserve.cli", "serve", "--num-threads", "1"]
    cmd += ["--model", str(tiny_model), "--speculation-profile", str(stale_profile)]
    done = subprocess.run(
        [*cmd, "--strict-profile"], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "is stale" in done.stderr and "target checkpoint weights changed" in done.stderr


def test_matching_profile_applies_its_workload(tiny_model: Path, work: Path) -> None:
    target = target_fingerprint(tiny_model, work / "cache")
    path = write_profile(work / "current.json", target, proposer_fingerprint("ngram"))
    server = serve_with(tiny_model, path, work, "--profile-workload", "chat")
    try:
        info = http.get(server.url + "/info").json()
        m = scrape(server.url)
    finally:
        server.stop()
    prof = info["speculation_profile"]
    assert prof["stale"] is False and prof["problems"] == [] and prof["workload"] == "chat"
    assert info["speculation"]["speculate"] == 3 and info["speculation"]["max_batch"] is None
    assert info["fingerprints"] == {"target": target, "proposer": proposer_fingerprint("ngram")}
    assert m[STALE_GAUGE] == 0


def test_no_profile_exports_no_stale_gauge(tiny_server: Server) -> None:
    assert STALE_GAUGE not in scrape(tiny_server.url)
    assert http.get(tiny_server.url + "/info").json()["speculation_profile"] is None


def test_parse_bool() -> None:
    assert parse_bool("1") and parse_bool("True") and not parse_bool("off")
    with pytest.raises(ValueError):
        parse_bool("maybe")
