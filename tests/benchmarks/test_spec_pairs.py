"""spec_pairs: each request's paired ratios and a workload's line. Made-up runs, no model."""

from __future__ import annotations

import pytest

from benchmarks.spec_pairs import pair_ratios, summary_row
from benchmarks.spec_report import Run


def _run(item: str, n: int, seconds: float, tokens: list[int], drafted: int = 0) -> Run:
    return Run(
        workload="w", item_id=item, proposer="ngram" if n else "none", n=n, policy="adaptive",
        concurrency=1, prompt_tokens=10, tokens=tokens, total_s=seconds, decode_s=seconds,
        steps=len(tokens), draft_steps=0, drafted=drafted, accepted=drafted // 2,
        finish_reason="length",
    )  # fmt: skip


def test_each_pair_is_its_own_off_seconds_over_its_on_seconds() -> None:
    off = [{"a": 1.0, "b": 2.0}, {"a": 1.2, "b": 2.0}]
    on = [{"a": 0.5, "b": 2.5}, {"a": 1.5, "b": 1.0}]
    assert pair_ratios(off, on) == {"a": pytest.approx([2.0, 0.8]), "b": [0.8, 2.0]}


def test_the_worst_request_is_the_lowest_median_over_its_pairs() -> None:
    ratios = {"a": [0.5, 1.1, 1.2], "b": [0.95, 0.8, 0.85], "c": [1.0, 1.0, 1.3]}
    runs = [_run("a", 0, 1.0, [1, 2]), _run("a", 4, 1.0, [1, 2], drafted=6)]
    row = summary_row("w", ratios, runs)
    assert (row["worst_item"], row["worst"], row["median"]) == ("b", 0.85, 1.0)
    assert row["below_0_9"] == ["b"]
    assert (row["drafted"], row["accepted"], row["identical"], row["errors"]) == (6, 3, True, 0)


def test_any_run_whose_tokens_differ_from_the_first_off_run_is_not_identical() -> None:
    runs = [_run("a", 0, 1.0, [1, 2]), _run("a", 4, 1.0, [1, 2]), _run("a", 4, 1.0, [1, 3])]
    assert summary_row("w", {"a": [1.0]}, runs)["identical"] is False
    runs = [_run("a", 0, 1.0, [1, 2]), _run("a", 0, 1.0, [1, 3]), _run("a", 4, 1.0, [1, 2])]
    assert summary_row("w", {"a": [1.0]}, runs)["identical"] is False
