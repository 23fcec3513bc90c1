"""Both benchmark commands, end to end on the real embedded model, at toy sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.bench import engine_bench, spec_bench

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_engine_bench_writes_every_metric(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    argv = ["--threads", "1", "--repeats", "1", "--new-tokens", "4", "--prompt-tokens", "32"]
    assert (
        engine_bench.main([*argv, "--batch", "2", "--hf-attn", "eager", "--json", str(path)]) == 0
    )

    report = json.loads(path.read_text())
    assert {"machine", "config", "sides", "summary"} <= set(report)
    assert {"date", "cpu", "torch", "command"} <= set(report["machine"])
    assert set(report["sides"]) == set(report["summary"]) == {"ours", "ours-dense", "hf-eager"}
    blocks, dense = report["sides"]["ours"], report["sides"]["ours-dense"]
    assert blocks["streamed_weight_mib"] < dense["streamed_weight_mib"] / 4  # Q4_1 vs float32
    for side in report["sides"].values():
        assert [len(t) for t in side["batch1_tokens"]] == [4]
        assert side["batch_tokens_generated"] == 2 * 4
        assert side["peak_rss_mib"] >= side["peak_rss_generating_mib"] > 0
    assert report["sides"]["ours"]["kv_pool_mib"] > 0
    hf = report["summary"]["hf-eager"]
    for key in ("batch1_decode_tok_s", "batch_aggregate_tok_s", "batch1_prefill_ms"):
        assert report["summary"]["ours"][key] > 0
        assert hf[f"ours_advantage_{key}"] > 0
    assert report["summary"]["ours"]["batch1_pct_of_bound"] > 0
    assert hf["batch1_tokens_matching_ours"] == 4
    assert report["summary"]["ours-dense"]["batch1_tokens_matching_ours"] == 4


def test_spec_bench_is_lossless_and_writes_every_metric(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    workloads = "code-edit,summarize,chat-creative,code-complete"  # code-complete: raw prompt
    argv = ["--new-tokens", "4", "--prompts-per-workload", "1", "--speculate", "0,2"]
    assert (
        spec_bench.main([*argv, "--threads", "1", "--workloads", workloads, "--json", str(path)])
        == 0
    )

    report = json.loads(path.read_text())
    assert {"machine", "config", "summary", "runs"} <= set(report)
    rows = report["summary"]
    assert [(r["workload"], r["n"]) for r in rows] == [
        (w, n) for w in workloads.split(",") for n in (0, 2)
    ]
    for row in rows:
        assert {"tok_s", "decode_tok_s", "speedup", "accepted_per_step", "acceptance_rate"} <= set(
            row
        )
        assert row["identical"] == row["prompts"] == 1  # greedy speculation is lossless
        assert row["accepted"] <= row["drafted"]
        if row["n"] == 0:
            assert row["drafted"] == 0 and row["speedup"] == 1.0
    assert len(report["runs"]) == 4 * 2


def test_spec_bench_compares_proposers_in_one_run(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    argv = ["--new-tokens", "6", "--prompts-per-workload", "1", "--speculate", "0,2"]
    argv += ["--proposer", "ngram,medusa", "--workloads", "chat-creative", "--threads", "1"]
    assert spec_bench.main([*argv, "--json", str(path)]) == 0

    report = json.loads(path.read_text())
    rows = report["summary"]
    assert [(r["proposer"], r["n"]) for r in rows] == [("none", 0), ("ngram", 2), ("medusa", 2)]
    assert all(r["identical"] == 1 for r in rows)  # both lossless against the shared baseline
    assert rows[2]["drafted"] > 0  # Medusa always proposes
    assert len(report["runs"]) == 3


def test_kv_pressure_bench_runs_both_cases(tmp_path: Path) -> None:
    from scripts import bench_kv_pressure

    path = tmp_path / "kv.json"
    assert bench_kv_pressure.main(["--threads", "1", "--scale", "0.05", "--json", str(path)]) == 0
    results = json.loads(path.read_text())["results"]
    assert [(r["case"], r["kv"]) for r in results][1::2] == [("a", "1GiB"), ("b", "1GiB")]
    for pressure, ample in zip(results[::2], results[1::2], strict=True):
        assert pressure["kv_tokens"] < ample["kv_tokens"] and ample["preemptions"] == 0
        assert pressure["most_per_request"] <= 1 and pressure["tokens"] == ample["tokens"] > 0
