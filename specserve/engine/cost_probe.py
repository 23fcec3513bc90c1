"""Start-up profile of the step cost model (runner/cost.py) on the shapes the engine runs.

Shapes: B decode sequences, each with `context` cached tokens, scoring k+1 rows each (logits on
every row, as in verification), for B in powers of two up to the running limit (at most 32:
beyond, f(T) extrapolates) and k in {0, 1, 2, 4, N}; one shape per distinct T = B(k+1), the one
with the most sequences. First, though, up to four sequences at k = 0 and k = N at `context`
and at a longer one (the attention terms), and one decode row beside a prefill chunk (the
prefill term). Shapes are measured in increasing T until `budget_s` is spent (f extrapolates past
the last one measured), then every one again, round robin, `repeats` times in all or until
1.5 `budget_s`; each keeps its fastest time (noise from other processes only ever adds time).
The attention terms come from differences of those times, the noisiest figures here: they are
bounded to MAX_ATTENTION_SHARE of any profiled step.
"""

from __future__ import annotations

import logging
import time

from specserve.runner.cost import CostCurve, StepCostModel
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.scheduler.window_blocks import WindowBlocks

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
    repeats: int = 3,
    window: WindowBlocks | None = None,
) -> StepCostModel:
    """The step cost model for this runner, measured on the shapes of the module docstring
    within about `budget_s` seconds (logged). `window`: the sliding layers' pool, where the
    runner keeps one."""
    started = time.perf_counter()
    shapes = probe_shapes(max_seqs, max_drafts, max_tokens)
    timer = _Timer(runner, allocator, window)
    widest = max(b for b, _ in shapes)
    context = max(1, min(context, timer.room(widest) - max_drafts - 1))
    shapes = [(b, k) for b, k in shapes if timer.room(b) >= context + k + 1]
    timer.decode(shapes[0][0], shapes[0][1], context)  # warm-up, not kept
    timer.best.clear()
    attention = _attention_shapes(timer, min(4, widest), context, max_drafts)
    for b, k, ctx in attention:
        timer.decode(b, k, ctx)
    chunk = min(64, max_tokens - 1, timer.room(2) - 1)
    if chunk >= 1:
        timer.decode(1, 0, context, prefill=chunk)
    for i, (b, k) in enumerate(shapes):
        if i >= 2 and time.perf_counter() - started > budget_s:
            break
        timer.decode(b, k, context)
    timer.again(repeats - 1, started + 1.5 * budget_s)
    at_ref = {(b, k): s for (b, k, ctx, pre), s in timer.best.items() if ctx == context and not pre}
    g_seq, g_row = _attention_terms(timer.best, attention, max_drafts)
    g_seq, g_row = _bounded_attention(at_ref, g_seq, g_row, context)
    pre = 0.0
    if chunk >= 1:
        with_chunk = timer.best[1, 0, context, chunk]
        pre = max(0.0, (with_chunk - at_ref[1, 0]) / chunk)
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


def _attention_shapes(
    timer: _Timer, b: int, context: int, max_drafts: int
) -> list[tuple[int, int, int]]:
    """(B, k, context) shapes whose times give the attention terms: b sequences at k = 0 and
    k = N, at `context` and up to 4x longer; none where there are no drafts or no room."""
    longer = min(4 * context, timer.room(b) - max_drafts - 1)
    if max_drafts == 0 or longer <= context:
        return []
    return [(b, 0, context), (b, 0, longer), (b, max_drafts, context), (b, max_drafts, longer)]


def _attention_terms(
    best: dict[tuple[int, int, int, int], float],
    shapes: list[tuple[int, int, int]],
    max_drafts: int,
) -> tuple[float, float]:
    """(g_seq, g_row) from the `_attention_shapes` times:
    delta_0 = b dC (g_seq + g_row), delta_N = b dC (g_seq + (N+1) g_row)."""
    if not shapes:
        return 0.0, 0.0
    (b, _, context), (_, _, longer) = shapes[0], shapes[1]
    d_ctx = b * (longer - context)
    d0 = (best[b, 0, longer, 0] - best[b, 0, context, 0]) / d_ctx
    dn = (best[b, max_drafts, longer, 0] - best[b, max_drafts, context, 0]) / d_ctx
    g_row = max(0.0, (dn - d0) / max_drafts)
    return max(0.0, d0 - g_row), g_row


# The most of a profiled step's time the attention terms may claim at the profile's context
# (a few hundred tokens: the projections dominate there on every model served). A larger
# share is noise in the differences they come from: a step timed while another process held
# the core made every short step's f(T) 1 us and a 20-row step 0.98 s (a loaded machine), and
# the adaptive policy then priced every draft out.
MAX_ATTENTION_SHARE = 0.5


def _bounded_attention(
    at_ref: dict[tuple[int, int], float], g_seq: float, g_row: float, context: int
) -> tuple[float, float]:
    """(g_seq, g_row) scaled down, both alike, until no profiled shape's attention at
    `context` exceeds MAX_ATTENTION_SHARE of its time."""
    share = max(
        (g_seq * b + g_row * b * (k + 1)) * context / seconds for (b, k), seconds in at_ref.items()
    )
    if share <= MAX_ATTENTION_SHARE:
        return g_seq, g_row
    logger.info("step-cost profile: attention terms %.0f %% of a step, scaled down", 100 * share)
    scale = MAX_ATTENTION_SHARE / share
    return g_seq * scale, g_row * scale


class _Timer:
    """Runs step shapes on scratch KV blocks; `best` keeps each shape's fastest time (noise
    from other processes only ever adds time)."""

    def __init__(
        self, runner: ModelRunner, allocator: BlockAllocator, window: WindowBlocks | None
    ) -> None:
        self.runner, self.allocator, self.window = runner, allocator, window
        self.best: dict[tuple[int, int, int, int], float] = {}  # (B, k, context, prefill)

    def room(self, batch: int) -> int:
        """Tokens each of `batch` scratch sequences can hold in the free blocks."""
        return (self.allocator.num_free // batch) * self.allocator.block_size

    def again(self, passes: int, deadline: float) -> None:
        """Each shape timed so far, `passes` more times round robin (a burst of load then
        costs one sample of several shapes, not every sample of one), until `deadline`."""
        for _ in range(passes):
            for shape in list(self.best):
                if time.perf_counter() > deadline:
                    return
                self.decode(*shape)

    def decode(self, batch: int, k: int, context: int, prefill: int = 0) -> float:
        items = [self._item(k + 1, context, k + 1) for _ in range(batch)]
        if prefill:
            items.append(self._item(prefill, 0, 1))
        try:
            started = time.perf_counter()
            self.runner.run(items)
            seconds = time.perf_counter() - started
        finally:
            for item in items:
                self.allocator.free(item.block_table)
                if self.window is not None and item.window_table is not None:
                    self.window.free(item.window_table)
        key = (batch, k, context, prefill)
        self.best[key] = min(seconds, self.best.get(key, float("inf")))
        return self.best[key]

    def _item(self, rows: int, start: int, logits: int) -> RunItem:
        """`rows` fed from `start` on scratch blocks (a window table where there is a pool)."""
        table: list[int] = []
        self.allocator.grow(table, start + rows)
        window = self.window.scratch(start, start + rows) if self.window is not None else None
        return RunItem([0] * rows, start, table, logits, window_table=window)
