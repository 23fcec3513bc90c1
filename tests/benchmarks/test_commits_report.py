"""benchmarks/commits_report.py pairs bench_commits.sh's files: each speculating cell over its
own N = 0 cell, each round's after over its before."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.commits_report import _rounds, eagle_lines, ledger_lines


def _ledger(path: Path, rounds: list[tuple[float, float]]) -> None:
    cells = []
    for r, (off, on) in enumerate(rounds):
        cells.append({"workload": "w", "round": r, "side": "N=0", "tok_s": off, "steps": 64})
        cells.append({"workload": "w", "round": r, "side": "x", "tok_s": on, "steps": 40 + r,
                      "propose_ms_when_asked": 0.5 + r})  # fmt: skip
    path.write_text(json.dumps({"cells": cells}))


def test_ledger_cells_over_their_own_rounds_n0(tmp_path: Path) -> None:
    _ledger(tmp_path / "L-before-1.json", [(100.0, 110.0), (50.0, 60.0)])
    _ledger(tmp_path / "L-after-1.json", [(200.0, 200.0), (100.0, 130.0)])
    lines = ledger_lines(_rounds(tmp_path, "L"))
    assert "| w | before: x | 1.150 (1.10-1.20, n=2) | 40 (64) | 1.00 |" in lines
    assert "| w | after: x | 1.150 (1.00-1.30, n=2) | 40 (64) | 1.00 |" in lines


def test_eagle_rounds_after_over_before(tmp_path: Path) -> None:
    for r, (before, after) in enumerate([(2.0, 1.0), (4.0, 3.0), (1.0, 1.0)], start=1):
        for side, ms in (("before", before), ("after", after)):
            rows = [{"batch": 1, "draft_ms": ms, "in_situ_draft_ms": 2 * ms}]
            (tmp_path / f"E-{side}-{r}.json").write_text(json.dumps({"rows": rows}))
    lines = eagle_lines(_rounds(tmp_path, "E"))
    assert lines[2] == "| 1 | back to back | 2.00 | 1.00 | 0.750 (0.50-1.00, n=3) |"
    assert lines[3] == "| 1 | after a target step | 4.00 | 2.00 | 0.750 (0.50-1.00, n=3) |"
