"""spec_bench's repeats: the median cell kept, each repeat's ratio paired with the N = 0 cell
of the same repeat. Pure functions over made-up cells: no model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import spec_bench
from benchmarks.spec_report import against_best, paired, summarise


def test_spec_bench_reports_the_median_repeat() -> None:
    def cell(key: str, tokens: int, wall: float) -> dict[str, object]:
        runs = [SimpleNamespace(item_id="x", tokens=[0] * tokens, total_s=wall)]
        return {"key": (key,), "runs": runs, "wall_s": wall, "counters": {}}

    cells = [cell("a", 10, 1.0), cell("b", 5, 1.0), cell("a", 30, 1.0), cell("a", 20, 1.0)]
    kept = spec_bench.median_cells(cells)
    assert [(c["key"], c["repeat_tok_s"]) for c in kept] == [
        (("a",), [10.0, 30.0, 20.0]),
        (("b",), [5.0]),
    ]
    assert kept[0]["runs"] is cells[3]["runs"]  # the 20 tok/s repeat: the middle one
    two = spec_bench.median_cells([cell("a", 30, 1.0), cell("a", 10, 1.0)])
    assert two[0]["runs"] is not None and two[0]["repeat_tok_s"] == [30.0, 10.0]
    assert sum(len(r.tokens) for r in two[0]["runs"]) == 10  # the lower of the middle two


def test_spec_bench_pairs_each_repeat_with_the_n0_cell_of_the_same_repeat() -> None:
    """The machine drifts between repeats: the per-repeat ratio divides by the N = 0 cell run
    beside it, not by the median N = 0 cell."""

    def cell(n: int, tokens: int, wall: float) -> dict[str, object]:
        runs = [SimpleNamespace(item_id="x", tokens=[0] * tokens, decode_s=1.0, prompt_tokens=1)]
        runs[0].total_s = 100 / tokens  # its latency: longer the fewer tokens a second
        runs[0].draft_steps, runs[0].finish_reason = 0, "length"
        counters = dict.fromkeys(("drafted", "accepted", "steps", "spec_steps", "proposed"), 0)
        key = ("w", 16, "p", "adaptive", n)
        return {"key": key, "runs": runs, "wall_s": wall, "counters": {**counters, "trimmed": 0}}

    # repeats in run order: N = 0 at 100, 50, 80 tok/s; the proposer at 95, 52, 76
    rates = [(0, 100), (4, 95), (0, 50), (4, 52), (0, 80), (4, 76)]
    cells = spec_bench.median_cells([cell(n, tokens, 1.0) for n, tokens in rates])
    rows = summarise(cells)
    mine = next(r for r in rows if r["n"] == 4)
    assert mine["paired_speedups"] == [0.95, 52 / 50, 0.95]
    assert paired(mine) == "0.95 (0.95-1.04)"
    assert mine["speedup"] == 76 / 80  # the median cells' ratio, as before
    assert mine["worst_request"] == pytest.approx(76 / 80)  # its one request against N = 0's


def test_the_best_other_proposer_is_taken_per_repeat() -> None:
    hybrid = {"repeat_tok_s": [100.0, 90.0, 120.0]}
    suffix = {"repeat_tok_s": [110.0, 60.0, 100.0]}
    eagle = {"repeat_tok_s": [80.0, 100.0, 100.0]}
    # repeat by repeat: 100/110, 90/100, 120/100
    assert against_best(hybrid, [suffix, eagle]) == "0.91 (0.90-1.20)"


def test_the_worst_request_is_its_median_over_the_repeats() -> None:
    """One request slow in one repeat (the machine, not the proposer) is not the worst
    request: each request's ratio is its median over the repeats, each repeat against the
    N = 0 cell beside it."""

    def cell(n: int, seconds: dict[str, float]) -> dict[str, object]:
        runs = []
        for item, s in seconds.items():
            run = SimpleNamespace(item_id=item, tokens=[0] * 10, decode_s=1.0, prompt_tokens=1)
            run.total_s, run.draft_steps, run.finish_reason = s, 0, "length"
            runs.append(run)
        counters = dict.fromkeys(("drafted", "accepted", "steps", "spec_steps", "proposed"), 0)
        key = ("w", 1, "p", "adaptive", n)
        counters["trimmed"] = 0
        return {"key": key, "runs": runs, "wall_s": sum(seconds.values()), "counters": counters}

    same = {"a": 1.0, "b": 1.0}
    repeats = [
        (cell(0, same), cell(4, same)),
        (cell(0, same), cell(4, {"a": 2.0, "b": 0.8})),  # the median repeat; a at 0.5 here only
        (cell(0, same), cell(4, {"a": 1.0, "b": 2.2})),  # b at 0.45 here only
    ]
    cells = spec_bench.median_cells([c for pair in repeats for c in pair])
    assert next(c for c in cells if c["key"][4] == 4)["runs"] is repeats[1][1]["runs"]
    mine = next(r for r in summarise(cells) if r["n"] == 4)
    assert mine["worst_request"] == pytest.approx(1.0)  # a: 1.0, 0.5, 1.0; b: 1.0, 1.25, 0.45
