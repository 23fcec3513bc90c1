"""step_profile on a tiny model: a row of phases per rows-per-step, 1-row and drafted steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import step_profile


def test_prints_phases_by_rows(
    tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text = "a b c d e f g a b c d e f g a b c d e f g " * 3
    workload = tmp_path / "w.jsonl"
    item = {"id": "x", "workload": "t", "messages": [{"role": "user", "content": text}]}
    workload.write_text(json.dumps(item) + "\n")
    argv = ["--model", str(tiny_llama), "--workload", str(workload), "--items", "1"]
    assert step_profile.main([*argv, "--max-tokens", "24", "--threads", "1", "--top", "5"]) == 0
    out = capsys.readouterr().out
    rows = [
        ln.split("|")[1].strip()
        for ln in out.splitlines()
        if ln.startswith("| ") and ln[2].isdigit()
    ]
    assert "1" in rows and len(rows) >= 2  # undrafted steps and steps that verified drafts
    assert "Top functions by own time" in out
