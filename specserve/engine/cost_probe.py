"""Start-up profile of the step cost model (runner/cost.py) on the shapes the engine runs.

Shapes: B decode sequences, each with `context` cached tokens, scoring k+1 rows each (logits on
every row, as in verification), for B in powers of two up to the running limit (at most 32:
beyond, f(T) extrapolates) and k in {0, 1, 2, 4, N}; one shape per distinct T = B(k+1), the one
with the most sequences. First, though, up to four sequences at k = 0 and k = N at `context`
and at a longer one (the attention terms), and one decode row beside a prefill chunk (the
prefill term). Each shape runs `repeats` times and
keeps its fastest (noise from other processes only ever adds time); shapes are measured in
increasing T until `budget_s` is spent, and f extrapolates past the last one measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from specserve.runner.cost import CostCurve, StepCostModel
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator

logger = logging.getLogger(__name__)

MAX_PROFILED_SEQS = 32


def probe_shapes(max_seqs: int, max_drafts: int, max_tokens: int) -> list[tuple[int, int]]:
    """(B, k) per distinct T = B(k+1) <= max_tokens, most sequences first, sorted by T."""
    batches = [b for b in (1, 2, 4, 8, 16, 32) if b <= min(max_seqs, MAX_PROFILED_SEQS)]
    ks = sorted({k for k in (0, 1, 2, 4, max_drafts) if 0 <= k <= max_drafts})
    by_rows: dict[int, tuple[int, int]] = {}
    for b in batches:
        for k in ks:
            t = b * (k + 1)
            if t <= max_tokens and (t not in by_rows or by_rows[t][0] < b):
                by_rows[t] = (b, k)
    return [by_rows[t] for t in sorted(by_rows)]


def measure_step_cost(
    runner: ModelRunner,
    allocator: BlockAllocator,
    max_seqs: int,
    max_drafts: int,
    max_tokens: int,
    context: int = 256,
    budget_s: float = 4.0,
    repeats: int = 2,
) -> StepCostModel:
    """The step cost model for this runner, measured on the shapes of the module docstring
    within about `budget_s` seconds (logged)."""
    started = time.perf_counter()
    shapes = probe_shapes(max_seqs, max_drafts, max_tokens)
    timer = _Timer(runner, allocator, repeats)
    widest = max(b for b, _ in shapes)
    context = max(1, min(context, timer.room(widest) - max_drafts - 1))
    shapes = [(b, k) for b, k in shapes if timer.room(b) >= context + k + 1]
    timer.decode(shapes[0][0], shapes[0][1], context)  # warm-up
    at_ref: dict[tuple[int, int], float] = {}  # (B, k) -> seconds at `context`

    def measure(b: int, k: int) -> float:
        if (b, k) not in at_ref:
            at_ref[b, k] = timer.decode(b, k, context)
        return at_ref[b, k]

    g_seq, g_row = _attention_terms(timer, measure, min(4, widest), context, max_drafts)
    pre = _prefill_term(timer, measure(1, 0), context, max_tokens)
    for i, (b, k) in enumerate(shapes):
        if i >= 2 and time.perf_counter() - started > budget_s:
            break
        measure(b, k)
    points = _attention_free(at_ref, g_seq, g_row, context)
    model = StepCostModel(
        curve=CostCurve.from_points(points),
        per_seq_key=g_seq,
        per_row_key=g_row,
        per_prefill_token=pre,
        context=context,
        profile_seconds=time.perf_counter() - started,
    )
    _log_profile(model, points)
    return model


def _log_profile(model: StepCostModel, points: dict[int, float]) -> None:
    logger.info(
        "profiled step cost in %.1f s at %d cached tokens per sequence: %s; %.2f us per "
        "sequence key, %.2f us per row key, %.2f ms per prefill token",
        model.profile_seconds,
        model.context,
        ", ".join(f"f({t})={s * 1e3:.1f}ms" for t, s in sorted(points.items())),
        model.per_seq_key * 1e6,
        model.per_row_key * 1e6,
        model.per_prefill_token * 1e3,
    )


def _attention_free(
    at_ref: dict[tuple[int, int], float], g_seq: float, g_row: float, context: int
) -> dict[int, float]:
    """f(T): what each measured (B, k) shape took less its attention terms at `context`,
    averaged over the shapes with the same T = B(k+1) rows."""
    free: dict[int, list[float]] = {}
    for (b, k), seconds in at_ref.items():
        t = b * (k + 1)
        free.setdefault(t, []).append(seconds - g_seq * b * context - g_row * t * context)
    return {t: max(sum(v) / len(v), 1e-6) for t, v in free.items()}


def _attention_terms(
    timer: _Timer, measure: Callable[[int, int], float], b: int, context: int, max_drafts: int
) -> tuple[float, float]:
    """(g_seq, g_row) from b sequences at k = 0 and k = N, at `context` and up to 4x longer:
    delta_0 = b dC (g_seq + g_row), delta_N = b dC (g_seq + (N+1) g_row)."""
    longer = min(4 * context, timer.room(b) - max_drafts - 1)
    if max_drafts == 0 or longer <= context:
        return 0.0, 0.0
    d_ctx = b * (longer - context)
    d0 = (timer.decode(b, 0, longer) - measure(b, 0)) / d_ctx
    dn = (timer.decode(b, max_drafts, longer) - measure(b, max_drafts)) / d_ctx
    g_row = max(0.0, (dn - d0) / max_drafts)
    return max(0.0, d0 - g_row), g_row


def _prefill_term(timer: _Timer, one_row: float, context: int, max_tokens: int) -> float:
    chunk = min(64, max_tokens - 1, timer.room(2) - 1)
    if chunk < 1:
        return 0.0
    return max(0.0, (timer.decode(1, 0, context, prefill=chunk) - one_row) / chunk)


class _Timer:
    """Runs one step shape on scratch KV blocks and returns its fastest time."""

    def __init__(self, runner: ModelRunner, allocator: BlockAllocator, repeats: int) -> None:
        self.runner, self.allocator, self.repeats = runner, allocator, repeats

    def room(self, batch: int) -> int:
        """Tokens each of `batch` scratch sequences can hold in the free blocks."""
        return (self.allocator.num_free // batch) * self.allocator.block_size

    def decode(self, batch: int, k: int, context: int, prefill: int = 0) -> float:
        tables: list[list[int]] = []
        items = []
        for _ in range(batch):
            tables.append(self._table(context + k + 1))
            items.append(RunItem([0] * (k + 1), context, tables[-1], k + 1))
        if prefill:
            tables.append(self._table(prefill))
            items.append(RunItem([0] * prefill, 0, tables[-1], 1))
        try:
            return _fastest(lambda: self.runner.run(items), self.repeats)
        finally:
            for table in tables:
                self.allocator.free(table)

    def _table(self, num_tokens: int) -> list[int]:
        table: list[int] = []
        self.allocator.grow(table, num_tokens)
        return table


def _fastest(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best
