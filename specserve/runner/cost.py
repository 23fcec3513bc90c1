"""Step cost: seconds for one target forward pass of a given shape, profiled and kept honest.

A step's cost is modelled as

    c(step) = f(T) + g_seq * K + g_row * A + g_pre * P

with T the decode/verify rows (one per decode sequence plus its drafts), K = sum_s ctx_s the
cached keys of the decode sequences, A = sum_s rows_s * ctx_s the key reads of their rows, P the
prefill-chunk tokens beside them. f(T) (projections, logits on every scored row, per-step
overheads) is measured at start-up on real shapes (engine/cost_probe.py) and kept
non-decreasing; the attention coefficients come from the same shapes at two context lengths.

`LiveCost` keeps the model honest from the engine's own step timings: per (B, T) cell, and
overall, a running mean of observed / predicted seconds; a prediction is the model times the
cell's ratio once the cell has a few observations, else the overall ratio. Shapes the engine
never runs keep the profile's relative shape at the level the engine observes. A cell not seen
in the last `stale_after` decode steps falls back to the overall ratio too: a drafting cell
measured while the machine was busy would otherwise price drafts out, so that the shape that
would correct it is never run again (seen on a loaded machine: 125 of 166 steps not proposed
at 73 % acceptance).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

UNBOUNDED = 1 << 30  # prefill tokens where the profile saw no cost per prefill token


@dataclass(frozen=True)
class StepShape:
    """What one step scores, as the cost model sees it."""

    num_decode: int  # B: sequences with decode/verify rows
    rows: int  # T: their rows, drafts included
    context: int  # K: sum of their cached context lengths
    attention: int  # A: sum over them of rows * context
    prefill: int = 0  # P: prefill-chunk tokens in the same step

    @classmethod
    def of(cls, decode: Sequence[tuple[int, int]], prefill: int) -> StepShape:
        """A step whose decode sequences each score (rows, context), beside `prefill` chunk
        tokens."""
        return cls(
            num_decode=len(decode),
            rows=sum(r for r, _ in decode),
            context=sum(c for _, c in decode),
            attention=sum(r * c for r, c in decode),
            prefill=prefill,
        )


@dataclass(frozen=True)
class CostCurve:
    """Piecewise-linear, non-decreasing interpolation of measured (T, seconds) points."""

    tokens: tuple[int, ...]  # increasing grid of T
    seconds: tuple[float, ...]  # non-decreasing

    def __call__(self, num_tokens: int) -> float:
        t, c = self.tokens, self.seconds
        if len(t) == 1 or num_tokens <= t[0]:
            return c[0]
        i = bisect_left(t, num_tokens)
        if i == len(t):  # extrapolate with the last segment's slope
            i = len(t) - 1
        slope = (c[i] - c[i - 1]) / (t[i] - t[i - 1])
        return c[i - 1] + slope * (num_tokens - t[i - 1])

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.tokens, dtype=np.float64), np.asarray(self.seconds, np.float64)

    def many(self, num_tokens: np.ndarray) -> np.ndarray:  # [n] int -> [n] seconds
        t, c = self._arrays  # the policy calls this every step: built once
        x = np.asarray(num_tokens, dtype=np.float64)
        out = np.interp(x, t, c)
        if len(t) > 1:
            slope = (c[-1] - c[-2]) / (t[-1] - t[-2])
            out = np.where(x > t[-1], c[-1] + slope * (x - t[-1]), out)
        return out

    def linear_fit(self) -> tuple[float, float]:
        """Least-squares (intercept seconds, seconds per token) for display."""
        n = len(self.tokens)
        mx, my = sum(self.tokens) / n, sum(self.seconds) / n
        var = sum((x - mx) ** 2 for x in self.tokens)
        cov = sum((x - mx) * (y - my) for x, y in zip(self.tokens, self.seconds, strict=True))
        slope = cov / var if var else 0.0
        return my - slope * mx, slope

    @classmethod
    def from_points(cls, points: dict[int, float]) -> CostCurve:
        """Isotonic (pool-adjacent-violators) fit: a step never gets cheaper with more tokens,
        so a noisy point above its successors is averaged with them rather than copied over
        them (a running max would let one slow sample raise the whole tail)."""
        grid = sorted(points)
        blocks: list[list[float]] = []  # [sum, count] per pooled run
        for t in grid:
            blocks.append([points[t], 1.0])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                s, n = blocks.pop()
                blocks[-1][0] += s
                blocks[-1][1] += n
        seconds = [s / n for s, n in blocks for _ in range(int(n))]
        return cls(tuple(grid), tuple(seconds))


@dataclass(frozen=True)
class StepCostModel:
    """The profiled model of c(step); see the module docstring."""

    curve: CostCurve  # f(T): attention-free part
    per_seq_key: float  # g_seq: seconds per cached key of a decode sequence
    per_row_key: float  # g_row: seconds per (row, cached key) pair
    per_prefill_token: float  # g_pre
    context: int  # the cached context per sequence the profile ran at
    profile_seconds: float = 0.0  # how long profiling took

    def seconds(self, shape: StepShape) -> float:
        return float(self.many(shape, np.array([shape.rows]), np.array([shape.attention]))[0])

    def many(self, base: StepShape, rows: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """c for `base` with its rows and key reads replaced by each of `rows` / `attention`."""
        fixed = self.per_seq_key * base.context + self.per_prefill_token * base.prefill
        out = self.curve.many(rows) + fixed + self.per_row_key * attention
        return np.maximum(out, 1e-6)


class LiveCost:
    """The profiled model corrected by observed step times; see the module docstring."""

    def __init__(
        self, model: StepCostModel, alpha: float = 0.1, min_steps: int = 3, stale_after: int = 256
    ) -> None:
        self.model, self.alpha, self.min_steps = model, alpha, min_steps
        self.stale_after = stale_after
        self.decode = _Ratio()  # decode-only steps
        self.prefill = _Ratio()  # steps with a prefill chunk
        self.cells: dict[tuple[int, int], _Ratio] = {}  # (B, T) -> decode-only steps

    def predict(self, shape: StepShape) -> float:
        rows, attn = np.array([shape.rows]), np.array([shape.attention])
        return float(self.predict_rows(shape, rows, attn)[0])

    def predict_rows(self, base: StepShape, rows: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """Live seconds of `base` with each alternative row count (and key reads)."""
        raw = self.model.many(base, rows, attention)
        if base.prefill:
            return raw * self.prefill.value(1.0)
        default = self.decode.value(1.0)
        factors = [self._cell_factor(base.num_decode, int(t), default) for t in rows]
        return raw * np.asarray(factors)

    def prefill_within(self, base: StepShape, seconds: float) -> int:
        """The most prefill-chunk tokens beside `base`'s decode rows whose step is predicted to
        take at most `seconds`; 0 where those rows alone take longer. Live: the prefill steps'
        ratio to the profile (the decode steps' until one is seen)."""
        if self.model.per_prefill_token <= 0:
            return UNBOUNDED
        ratio = self.prefill.value(self.decode.value(1.0))
        rows, attention = np.array([base.rows]), np.array([base.attention])
        decode = float(self.model.many(replace(base, prefill=0), rows, attention)[0])
        return max(0, int((seconds / ratio - decode) / self.model.per_prefill_token))

    def _cell_factor(self, batch: int, rows: int, default: float) -> float:
        cell = self.cells.get((batch, rows))
        if cell is None or cell.n < self.min_steps or self.decode.n - cell.seen > self.stale_after:
            return default
        return cell.value(default)

    def observe(self, shape: StepShape, seconds: float) -> None:
        predicted = self.model.seconds(shape)
        ratio = seconds / predicted
        if shape.prefill:
            self.prefill.add(ratio, seconds, predicted, self.alpha)
            return
        self.decode.add(ratio, seconds, predicted, self.alpha)
        cell = self.cells.setdefault((shape.num_decode, shape.rows), _Ratio())
        cell.add(ratio, seconds, predicted, self.alpha)
        cell.seen = self.decode.n


@dataclass
class _Ratio:
    """Running mean (exponential after 1/alpha samples) of observed / predicted seconds."""

    n: int = 0
    ratio: float = 1.0
    observed: float = 0.0  # running mean of observed seconds
    predicted: float = 0.0  # running mean of the profile's predictions for the same steps
    seen: int = 0  # a cell's: the decode steps observed when it last was

    def add(self, ratio: float, observed: float, predicted: float, alpha: float) -> None:
        self.n += 1
        a = max(alpha, 1.0 / self.n)
        self.ratio += a * (ratio - self.ratio)
        self.observed += a * (observed - self.observed)
        self.predicted += a * (predicted - self.predicted)

    def value(self, default: float) -> float:
        return self.ratio if self.n else default
