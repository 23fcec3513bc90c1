"""The online calibration: tested positions only, buckets converge to observed acceptance."""

from __future__ import annotations

import random

import pytest

from specserve.speculation.calibration import Calibration, PerSequenceMean


def test_records_tested_positions_only() -> None:
    cal = Calibration(num_buckets=10)
    # tokens 1-2 accepted, token 3 rejected, token 4 never tested
    cal.record([0.95, 0.85, 0.15, 0.05], num_accepted=2)
    assert cal.tested == [0, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    assert cal.accepted == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    cal.record([0.05, 0.05], num_accepted=2)  # a fully accepted draft: all tested
    assert cal.tested[0] == 2 and cal.accepted[0] == 2


def test_untested_confidence_starts_optimistic_then_follows_observation() -> None:
    cal = Calibration(prior_weight=4.0)
    assert cal.probability(0.0) == pytest.approx(0.5)
    assert cal.probability(1.0) == pytest.approx(1.0)
    rng = random.Random(0)
    for _ in range(2000):  # the proposer says 0.9, yet only 30% land
        cal.record([0.9], num_accepted=int(rng.random() < 0.3))
    assert cal.probability(0.9) == pytest.approx(0.3, abs=0.03)
    assert cal.probability(0.1) == pytest.approx(0.55)  # other buckets untouched


def test_table_reports_predicted_and_observed() -> None:
    cal = Calibration(num_buckets=4)
    cal.record([0.6, 0.7], num_accepted=1)
    rows = cal.table()
    assert [(r.low, r.high) for r in rows] == [(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)]
    assert rows[2].tested == 2 and rows[2].accepted == 1 and rows[2].observed == 0.5
    assert rows[2].mean_confidence == pytest.approx(0.65)
    assert rows[0].observed is None and rows[0].tested == 0
    assert 0.5 < rows[2].calibrated < 0.83


def test_bucket_edges() -> None:
    cal = Calibration(num_buckets=10)
    assert [cal.bucket(c) for c in (0.0, 0.099, 0.1, 0.999, 1.0, 1.5, -1.0)] == [
        0,
        0,
        1,
        9,
        9,
        9,
        0,
    ]


def test_a_new_sequence_starts_from_what_the_source_gained_lately_not_below_exploring() -> None:
    gained = PerSequenceMean(prior=1.0, rate=0.5, explore=0.1, shared_rate=0.5)
    assert gained.mean(7) == 1.0  # nothing recorded: the prior
    gained.record(0, 0.2)
    assert gained.mean(0) == pytest.approx(0.6) and gained.mean(7) == pytest.approx(0.6)
    for _ in range(6):
        gained.record(1, -1.0)  # the source stopped paying
    assert gained.mean(1) < -0.9
    assert gained.mean(7) == 0.1  # a new sequence still explores a little
    gained.release(0)
    assert gained.mean(0) == 0.1 and len(gained) == 1
