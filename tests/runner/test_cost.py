"""The step cost model: profiled on real shapes, kept honest by observed step times."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from specserve.engine.cost_probe import measure_step_cost, probe_shapes
from specserve.runner.cost import CostCurve, LiveCost, StepCostModel, StepShape
from tests.engine.helpers import make_engine


def shape(b: int, t: int, ctx: int = 100, prefill: int = 0) -> StepShape:
    return StepShape(b, t, b * ctx, t * ctx, prefill)


def linear_model() -> StepCostModel:
    curve = CostCurve((1, 33), (0.010, 0.010 + 32 * 0.001))
    return StepCostModel(
        curve, per_seq_key=1e-6, per_row_key=2e-6, per_prefill_token=1e-4, context=100
    )


def test_model_adds_attention_and_prefill_terms() -> None:
    m = linear_model()
    assert m.seconds(shape(1, 1, ctx=0)) == pytest.approx(0.010)
    assert m.seconds(shape(2, 4, ctx=100)) == pytest.approx(0.013 + 200e-6 + 400 * 2e-6)
    assert m.seconds(shape(2, 4, ctx=100, prefill=50)) == pytest.approx(
        m.seconds(shape(2, 4)) + 50 * 1e-4
    )


def test_live_cost_follows_observed_cells_and_keeps_the_profile_shape_elsewhere() -> None:
    live = LiveCost(linear_model(), min_steps=3)
    base = shape(4, 4)
    for _ in range(3):
        live.observe(base, 2 * live.model.seconds(base))  # this machine runs 2x the profile
    assert live.predict(base) == pytest.approx(2 * live.model.seconds(base))
    # an unobserved T at the same B: the overall decode ratio times the profile
    assert live.predict(shape(4, 8)) == pytest.approx(2 * live.model.seconds(shape(4, 8)))
    for _ in range(10):
        live.observe(shape(4, 8), 3 * live.model.seconds(shape(4, 8)))
    assert live.cells[4, 8].ratio == pytest.approx(3.0)
    assert live.predict(shape(4, 8)) == pytest.approx(3 * live.model.seconds(shape(4, 8)))
    # prefill steps have their own ratio and never move the decode cells
    live.observe(shape(4, 4, prefill=64), 0.5 * live.model.seconds(shape(4, 4, prefill=64)))
    assert live.prefill.ratio == pytest.approx(0.5) and live.cells[4, 4].n == 3
    rows = np.array([4, 8])
    both = live.predict_rows(base, rows, rows * 100)
    assert both.tolist() == pytest.approx([live.predict(base), live.predict(shape(4, 8))])


def test_a_cell_not_seen_for_a_while_falls_back_to_the_overall_ratio() -> None:
    """A drafting cell measured once while the machine was busy must not price drafts out for
    good: once the engine has run `stale_after` other decode steps, the cell is forgotten."""
    live = LiveCost(linear_model(), min_steps=3, stale_after=50)
    busy, plain = shape(1, 5), shape(1, 1)
    for _ in range(3):
        live.observe(busy, 10 * live.model.seconds(busy))
    assert live.predict(busy) == pytest.approx(10 * live.model.seconds(busy))
    for _ in range(50):
        live.observe(plain, live.model.seconds(plain))
    assert live.predict(busy) == pytest.approx(10 * live.model.seconds(busy))  # 50: still fresh
    live.observe(plain, live.model.seconds(plain))
    assert live.predict(busy) == pytest.approx(live.decode.ratio * live.model.seconds(busy))
    live.observe(busy, live.model.seconds(busy))  # seen again: its own ratio counts again
    assert live.cells[1, 5].n == 4 and live.predict(busy) == pytest.approx(
        live.cells[1, 5].ratio * live.model.seconds(busy)
    )


def test_prefill_within_a_target_solves_the_model_and_follows_observed_prefill_steps() -> None:
    live = LiveCost(linear_model())
    base = shape(2, 2)  # two decode rows at 100 cached tokens: 11.6 ms by the profile
    within = live.prefill_within(base, 0.030)
    assert within == int((0.030 - live.model.seconds(base)) / 1e-4)  # 184 tokens
    assert live.model.seconds(replace(base, prefill=within)) <= 0.030
    assert live.model.seconds(replace(base, prefill=within + 1)) > 0.030
    assert live.prefill_within(base, 0.005) == 0  # the decode rows alone are over it
    for _ in range(3):  # prefill steps here take twice the profile
        big = shape(2, 2, prefill=100)
        live.observe(big, 2 * live.model.seconds(big))
    assert live.prefill_within(base, 0.030) == int((0.015 - live.model.seconds(base)) / 1e-4)


def test_profile_shapes_cover_t_with_the_most_sequences() -> None:
    shapes = probe_shapes(max_seqs=4, max_drafts=3, max_tokens=64)
    rows = [b * (k + 1) for b, k in shapes]
    assert rows == sorted(set(rows)) and rows[-1] == 16
    assert (4, 0) in shapes and (2, 1) not in shapes  # T=4: four sequences, not two
    assert probe_shapes(64, 8, 64)[-1][0] <= 32
    assert all(b * (k + 1) <= 20 for b, k in probe_shapes(16, 4, 20))


def test_profile_on_a_tiny_model(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, num_blocks=128, max_running=4)
    alloc = engine.res.allocator
    model = measure_step_cost(engine.res.runner, alloc, 4, 3, 64, context=32, budget_s=5)
    assert alloc.num_free == alloc.num_blocks  # every scratch block returned
    assert model.curve.tokens[0] == 1 and model.curve.tokens[-1] == 16
    assert list(model.curve.seconds) == sorted(model.curve.seconds)
    assert model.curve.seconds[0] > 0 and model.context == 32
    assert model.per_seq_key >= 0 and model.per_row_key >= 0 and model.per_prefill_token >= 0
    assert model.profile_seconds > 0  # recorded; how long it may take is for a benchmark


def test_profile_fits_a_small_pool(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, num_blocks=12, block_size=4, max_running=16)  # 48 slots
    model = measure_step_cost(engine.res.runner, engine.res.allocator, 16, 2, 256, budget_s=5)
    assert model.context >= 1 and len(model.curve.tokens) >= 2
    assert engine.res.allocator.num_free == 12


class _Clock:
    """A fake perf_counter the fake runner advances: steps cost 1 ms + 0.1 ms a row + 0.1 us a
    (row, key) pair, and the `spikes`-th runs (counting from 0) take a second longer, as when
    another process holds the core."""

    def __init__(self, spikes: set[int]) -> None:
        self.now, self.calls, self.spikes = 0.0, 0, spikes

    def __call__(self) -> float:
        return self.now

    def run(self, items: list[Any]) -> None:
        rows = sum(len(item.token_ids) for item in items)
        keys = sum(len(item.token_ids) * item.start for item in items)
        self.now += 1e-3 + 1e-4 * rows + 1e-7 * keys + (1.0 if self.calls in self.spikes else 0)
        self.calls += 1


@pytest.mark.parametrize("spikes", [set(), {1, 2}, {5, 6}])
def test_a_burst_of_load_during_the_profile_costs_one_sample_not_the_curve(
    monkeypatch: pytest.MonkeyPatch, spikes: set[int]
) -> None:
    """Two runs in a row spiked, on the attention shapes (runs 1-4) or the curve's own: each
    shape keeps its fastest of three round-robin samples, so the fit is the clean one."""
    from specserve.engine import cost_probe
    from specserve.scheduler.kv_blocks import BlockAllocator

    clock = _Clock(spikes)
    monkeypatch.setattr(cost_probe.time, "perf_counter", clock)
    runner: Any = SimpleNamespace(run=clock.run)
    model = measure_step_cost(runner, BlockAllocator(512, 16), 4, 4, 64, budget_s=100)
    want = [1e-3 + 1e-4 * t for t in model.curve.tokens]
    assert list(model.curve.seconds) == pytest.approx(want, rel=1e-6)
    assert model.per_seq_key == pytest.approx(0, abs=1e-12)
    assert model.per_row_key == pytest.approx(1e-7, rel=1e-6)
    assert model.per_prefill_token == pytest.approx(1e-4, rel=1e-6)


def test_attention_terms_are_bounded_to_half_of_a_profiled_step() -> None:
    from specserve.engine.cost_probe import MAX_ATTENTION_SHARE, _bounded_attention

    at_ref = {(1, 0): 0.010, (1, 4): 0.020}  # one row, and five, at 256 cached tokens
    assert _bounded_attention(at_ref, 1e-6, 2e-6, 256) == (1e-6, 2e-6)  # 7.7 % of a step
    g_seq, g_row = _bounded_attention(at_ref, 1e-5, 1e-4, 256)  # noise: 9x a one-row step
    assert g_row / g_seq == pytest.approx(10)
    shares = [(g_seq * b + g_row * b * (k + 1)) * 256 / s for (b, k), s in at_ref.items()]
    assert max(shares) == pytest.approx(MAX_ATTENTION_SHARE)
