"""spec_ledger's summary of a cell's steps: parts per step, the drain, forward passes compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ledger_report import PARTS, Ledger, Step, report, summarise
from benchmarks.spec_ledger import recording, spread_lengths
from specserve.request import SamplingParams
from tests.engine.helpers import make_engine, run_all


def _step(
    forward: float,
    sequences: int,
    extra: int = 0,
    prefill: int = 0,
    in_flight: int = 4,
    propose: float | None = None,
) -> Step:
    """A step; with `propose`, one whose proposer was asked and took that long."""
    proposing = 0.001 * bool(extra) if propose is None else propose
    seconds = dict.fromkeys(PARTS, 0.0) | {"forward": forward, "propose": proposing}
    rows = sequences + extra + prefill
    return Step(seconds, sequences, rows, in_flight, extra, propose is not None)


def test_drain_starts_when_fewer_requests_are_in_flight_than_slots() -> None:
    # 4 in flight, two of them prefilling first (a step of 2), full steps (one with a prefill
    # chunk of a request that joined), then the drain
    steps = [_step(0.05, 2, prefill=30), _step(0.02, 4), _step(0.04, 4, prefill=60)]
    steps += [_step(0.03, 4, extra=2), _step(0.01, 3, in_flight=3), _step(0.01, 1, in_flight=1)]
    ledger = Ledger(steps, [(2, 1, 1.5)])
    cell = summarise(ledger, slots=4, tokens=20, wall=0.5)
    assert cell["steps"] == 6
    assert cell["drain_steps"] == 2
    assert cell["drain_share_of_time"] == pytest.approx(0.02 / 0.161)
    # decode-only full steps: 0.02 without drafts, 0.03 with 2 extra rows (prefill steps out)
    assert cell["forward_ms_full_no_drafts"] == pytest.approx(20.0)
    assert cell["forward_ms_full_with_drafts"] == pytest.approx(30.0)
    assert cell["extra_rows_full_with_drafts"] == 2
    assert cell["ms_per_step"]["propose"] == pytest.approx(1.0 / 6)
    assert cell["ms_total"] == pytest.approx(1e3 * 0.161 / 6)
    assert (cell["verified_tokens"], cell["accepted_tokens"]) == (2, 1)
    assert cell["tok_s"] == pytest.approx(40.0)


def test_a_cell_that_never_drains_or_drafts() -> None:
    cell = summarise(Ledger([_step(0.02, 4)] * 3), slots=4, tokens=12, wall=0.06)
    assert cell["drain_steps"] == 0 and cell["drain_share_of_time"] == 0.0
    assert cell["forward_ms_full_with_drafts"] is None
    row = report({"cells": [{"workload": "w", "round": 0, "side": "N=0", **cell}]})
    assert "| w | 0 | N=0 | 200.0 | 1.000 | 3 | 0 (0%) |" in row
    assert row.splitlines()[1].count("---") == row.splitlines()[0].count("|") - 1


def test_a_proposers_cost_per_call_counts_only_the_steps_that_asked_it() -> None:
    # asked twice (2 and 4 ms, drafts kept or not); two steps the policy did not ask
    steps = [_step(0.02, 4, extra=1, propose=0.002), _step(0.02, 4, propose=0.004)]
    steps += [_step(0.02, 4), _step(0.02, 4)]
    cell = summarise(Ledger(steps), slots=4, tokens=17, wall=0.1)
    assert cell["proposing_steps"] == 2
    assert cell["propose_ms_when_asked"] == pytest.approx(3.0)
    assert cell["ms_per_step"]["propose"] == pytest.approx(1.5)  # over every step
    row = report({"cells": [{"workload": "w", "round": 0, "side": "N=0", **cell}]})
    assert row.endswith("| 2: 3.00 |")
    never = summarise(Ledger(steps[2:]), slots=4, tokens=8, wall=0.05)
    assert never["proposing_steps"] == 0 and never["propose_ms_when_asked"] is None


def test_lengths_spread_evenly_and_the_same_for_every_side() -> None:
    ids = [f"r{i}" for i in range(9)]
    lengths = spread_lengths(ids, 64, 192, seed=0)
    assert sorted(lengths.values()) == [64, 80, 96, 112, 128, 144, 160, 176, 192]
    assert lengths == spread_lengths(ids, 64, 192, seed=0)
    assert [lengths[i] for i in ids] != sorted(lengths.values())  # not in request order
    assert spread_lengths(ids, 128, 128, seed=0) == dict.fromkeys(ids, 128)


def test_recording_fills_the_ledger_from_the_engines_observer(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, speculate=3, policy="adaptive")
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9]]
    ledger = Ledger()
    with recording(engine, ledger):
        run_all(engine, prompts, SamplingParams(max_new_tokens=24, ignore_eos=True))
    assert not engine.observers  # detached on the way out
    assert len(ledger.steps) >= engine.stats.steps > 0
    ran = [s for s in ledger.steps if s.sequences]
    assert len(ran) == engine.stats.steps
    for s in ledger.steps:
        assert list(s.seconds) == list(PARTS)
        assert all(v >= 0.0 for v in s.seconds.values())
        assert s.rows >= s.sequences + s.extra_rows and s.in_flight >= s.sequences
    assert all(s.seconds["forward"] > 0.0 for s in ran)
    assert any(s.proposed for s in ran) and any(s.extra_rows for s in ran)
    assert sum(d[0] for d in ledger.drafts) == engine.stats.proposer.drafted_tokens > 0
    assert all(0 <= a <= k and 0.0 <= p <= k for k, a, p in ledger.drafts)
    cell = summarise(ledger, slots=2, tokens=48, wall=1.0)
    assert cell["steps"] == len(ledger.steps)
