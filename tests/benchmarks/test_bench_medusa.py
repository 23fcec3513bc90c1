"""benchmarks/bench_medusa.py runs and reports the heads' proposal against a target step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.integration
@pytest.mark.usefixtures("block_kernels")
def test_medusa_bench_times_the_heads_against_a_target_step(tmp_path: Path) -> None:
    from benchmarks import bench_medusa

    path = tmp_path / "medusa.json"
    argv = ["--threads", "1", "--batches", "1,2", "--k", "3", "--repeats", "2", "--json", str(path)]
    assert bench_medusa.main(argv) == 0
    rows = json.loads(path.read_text())["rows"]
    assert [(r["batch"], r["k"]) for r in rows] == [(1, 3), (2, 3)]
    for r in rows:
        assert r["served_ms"] > 0 and r["float32_ms"] > 0 and r["target_step_ms"] > 0
