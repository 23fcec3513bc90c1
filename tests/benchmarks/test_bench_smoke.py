"""Both benchmark commands, end to end on the real embedded model, at toy sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import engine_bench, spec_bench

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
    assert {"machine", "config", "summary", "runs", "calibration"} <= set(report)
    rows = report["summary"]
    assert [(r["workload"], r["n"]) for r in rows] == [
        (w, n) for w in workloads.split(",") for n in (0, 2)
    ]
    for row in rows:
        assert {"tok_s", "decode_tok_s", "speedup", "acceptance_rate", "tokens_per_row"} <= set(row)
        assert row["identical"] == row["requests"] == 1  # greedy speculation is lossless
        assert row["errors"] == 0
        assert row["accepted"] <= row["drafted"] <= row["proposed"]
        if row["n"] == 0:
            assert row["drafted"] == 0 and row["speedup"] == 1.0
    assert len(report["runs"]) == 4 * 2


def test_spec_bench_compares_proposers_policies_and_concurrency_in_one_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spec.json"
    argv = ["--new-tokens", "6", "--prompts-per-workload", "2", "--speculate", "0,2"]
    argv += ["--proposer", "suffix,medusa", "--policy", "static,adaptive"]
    argv += ["--concurrency", "1,2", "--workloads", "code-edit-multiturn", "--threads", "1"]
    assert spec_bench.main([*argv, "--json", str(path)]) == 0

    report = json.loads(path.read_text())
    rows = report["summary"]
    configs = [("none", "static", 0), ("suffix", "static", 2), ("suffix", "adaptive", 2),
               ("medusa", "static", 2), ("medusa", "adaptive", 2)]  # fmt: skip
    assert [(r["concurrency"], r["proposer"], r["policy"], r["n"]) for r in rows] == [
        (c, *cfg) for c in (1, 2) for cfg in configs
    ]
    assert all(r["identical"] == r["requests"] == 2 and r["errors"] == 0 for r in rows)
    medusa = [r for r in rows if r["proposer"] == "medusa" and r["policy"] == "static"]
    assert all(r["drafted"] > 0 for r in medusa)  # Medusa always proposes
    turns = [r for r in report["runs"] if r["proposer"] == "none" and r["concurrency"] == 1]
    assert [r["item_id"].split(":")[0] for r in turns] == [
        "code-edit-multiturn-0000.0", "code-edit-multiturn-0000.1"]  # fmt: skip
    assert set(report["calibration"]) == {"suffix", "medusa"}


def test_kv_pressure_bench_runs_both_cases(tmp_path: Path) -> None:
    from benchmarks import bench_kv_pressure

    path = tmp_path / "kv.json"
    assert bench_kv_pressure.main(["--threads", "1", "--scale", "0.05", "--json", str(path)]) == 0
    results = json.loads(path.read_text())["results"]
    assert [(r["case"], r["kv"]) for r in results][1::2] == [("a", "1GiB"), ("b", "1GiB")]
    for pressure, ample in zip(results[::2], results[1::2], strict=True):
        assert pressure["kv_tokens"] < ample["kv_tokens"] and ample["preemptions"] == 0
        assert pressure["most_per_request"] <= 1 and pressure["tokens"] == ample["tokens"] > 0


@pytest.mark.integration
def test_eagle_bench_times_drafting_against_a_target_step(tmp_path: Path) -> None:
    from benchmarks import bench_eagle

    path = tmp_path / "eagle.json"
    argv = ["--threads", "1", "--batches", "1,2", "--k", "3", "--repeats", "2", "--json", str(path)]
    assert bench_eagle.main(argv) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [(r["batch"], r["k"]) for r in rows] == [(1, 3), (2, 3)]
    for r in rows:
        assert r["draft_ms"] > 0 and r["target_step_ms"] > 0 and r["token_cost"] > 0
