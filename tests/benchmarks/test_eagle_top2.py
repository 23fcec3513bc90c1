"""eagle_top2's estimate of a draft tree's rate from the measured numbers."""

from __future__ import annotations

import pytest

from benchmarks.eagle_top2 import estimate


def test_a_sibling_adds_its_rows_cost_and_only_the_second_choices_tokens() -> None:
    found = {"emitted_per_step": 1.0, "rows_per_step": 1.0, "verified_share": 0.5,
             "top1": 0.4, "top2": 0.6}  # fmt: skip
    est = estimate(found, [4.0, 5.0, 6.0])  # ms at 1, 2, 3 rows
    assert est["gain_per_step"] == pytest.approx(0.1)  # (0.6 - 0.4) on half the steps
    assert est["chain"] == pytest.approx(1.0 / 4.0)
    assert est["tree"] == pytest.approx(1.1 / 4.5)  # half a row more a step, interpolated
    assert est["tree_over_chain"] == pytest.approx((1.1 / 4.5) / 0.25)


def test_a_free_sibling_that_is_always_right_pays() -> None:
    found = {"emitted_per_step": 1.5, "rows_per_step": 2.0, "verified_share": 1.0,
             "top1": 0.0, "top2": 1.0}  # fmt: skip
    assert estimate(found, [5.0, 5.0, 5.0])["tree_over_chain"] == pytest.approx(2.5 / 1.5)
