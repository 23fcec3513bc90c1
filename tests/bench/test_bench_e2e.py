"""A short sweep (N in {0, 2} x concurrency {1, 2} x one workload) against a real server."""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specserve.bench.cli import add_bench_parsers
from specserve.bench.workload_items import ChatMessage, WorkloadItem, write_workload
from specserve.speculation import profile as pf
from tests import http

TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    cache = tmp_path_factory.mktemp("cache")
    env = os.environ | {"OMP_WAIT_POLICY": "PASSIVE", "SPECSERVE_CACHE": str(cache)}
    cmd = [
        sys.executable,
        "-m",
        "specserve.cli",
        "serve",
        "--model",
        str(tiny_llama),
        "--num-threads",
        "1",
        "--port",
        str(port),
        "--speculate",
        "2",
    ]
    log = cache / "server.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if http.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specserve")
    add_bench_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.command_line = "specserve " + " ".join(argv)
    code: int = args.func(args)
    return code


def test_short_sweep_writes_results_report_plots_and_profile(
    server: str,
    tiny_llama: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    workload = tmp_path / "tiny.jsonl"
    write_workload(
        workload,
        [
            WorkloadItem("p0", "tiny", prompt="def add(a, b):\n    return a + b\n\ndef add(a, b):"),
            WorkloadItem("c0", "tiny", messages=(ChatMessage("user", TEXT),)),
        ],
    )
    out = tmp_path / "out"
    code = run(
        [
            "bench",
            "--url",
            server,
            "--workload",
            str(workload),
            "--speculate",
            "2",
            "--concurrency",
            "1,2",
            "--num-requests",
            "4",
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
        ]
    )
    assert code == 0

    results = json.loads((out / "results.json").read_text())
    cells = results["cells"]
    assert [(c["key"]["speculate"], c["key"]["load"]) for c in cells] == [
        (0, 1.0),
        (2, 1.0),
        (0, 2.0),
        (2, 2.0),
    ]
    records = [r | {"n": c["key"]["speculate"]} for c in cells for r in c["records"]]
    assert len(records) == 16 and all(r["ok"] for r in records), records
    assert {r["route"] for r in records} == {"generate_stream", "chat"}
    assert all(r["ttft"] > 0 and r["output_tokens"] >= 1 for r in records)
    assert all(r["drafted"] == 0 for r in records if r["n"] == 0)
    assert sum(r["drafted"] for r in records if r["n"] == 2) > 0
    # Greedy speculation is lossless: each prompt yields as many tokens at N = 2 as at N = 0.
    lengths = {(r["item_id"], r["n"]): r["output_tokens"] for r in records}
    assert lengths[("p0", 0)] == lengths[("p0", 2)] and lengths[("c0", 0)] == lengths[("c0", 2)]

    text = (out / "report.md").read_text()
    assert "## tiny" in text and "**Recommendation**" in text and "## Contention" in text
    for metric in ("itl", "throughput", "goodput"):
        assert (out / f"tiny-{metric}.png").read_bytes()[:4] == b"\x89PNG"

    profile = pf.load_profile(out / "speculation-profile.json")
    assert set(profile["workloads"]) == {"tiny"}
    assert profile["command"].startswith("specserve bench")
    target = pf.target_fingerprint(tiny_llama, tmp_path / "cache")
    assert pf.check_profile(profile, target, pf.proposer_fingerprint("ngram")) == []
    assert pf.check_profile(
        profile, target | {"weights_sha256": "x"}, pf.proposer_fingerprint("ngram")
    )

    capsys.readouterr()
    assert run(["diagnose", "--url", server, "--interval", "0", "--samples", "1", "--json"]) == 0
    diagnosis = json.loads(capsys.readouterr().out)
    assert diagnosis["reading"]["drafted"] > 0 and diagnosis["diagnosis"]["verdict"]


def test_sweep_refuses_n_above_the_servers(server: str, tmp_path: Path) -> None:
    code = run(
        [
            "bench",
            "--url",
            server,
            "--workload",
            "chat-creative",
            "--speculate",
            "4",
            "--num-requests",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 2
