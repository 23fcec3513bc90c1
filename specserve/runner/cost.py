"""Profiled step cost c(T): seconds for one target forward pass scoring T tokens."""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass

from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator


@dataclass(frozen=True)
class CostCurve:
    """Piecewise-linear, non-decreasing interpolation of measured (T, seconds) points."""

    tokens: tuple[int, ...]  # increasing grid of T
    seconds: tuple[float, ...]  # non-decreasing

    def __call__(self, num_tokens: int) -> float:
        t, c = self.tokens, self.seconds
        if num_tokens <= t[0]:
            return c[0]
        i = bisect_left(t, num_tokens)
        if i == len(t):  # extrapolate with the last segment's slope
            i = len(t) - 1
        slope = (c[i] - c[i - 1]) / (t[i] - t[i - 1])
        return c[i - 1] + slope * (num_tokens - t[i - 1])

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
        grid = sorted(points)
        seconds, running = [], 0.0
        for t in grid:  # a step never gets cheaper with more tokens: take the running max
            running = max(running, points[t])
            seconds.append(running)
        return cls(tuple(grid), tuple(seconds))


def cost_grid(max_tokens: int) -> list[int]:
    grid, t = [], 1
    while t < max_tokens:
        grid.append(t)
        t *= 2
    return [*grid, max_tokens]


def profile_cost(
    runner: ModelRunner, allocator: BlockAllocator, max_tokens: int, repeats: int = 3
) -> CostCurve:
    """Time forward passes scoring 1..max_tokens tokens on free KV blocks. Every scored row
    gets logits, as in a speculative step where each of the k+1 positions is verified."""
    points: dict[int, float] = {}
    table: list[int] = []
    allocator.grow(table, max_tokens)
    try:
        runner.run([RunItem([0] * 8, 0, table, 1)])  # warm-up
        for t in cost_grid(max_tokens):
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                runner.run([RunItem([0] * t, 0, table, t)])
                times.append(time.perf_counter() - started)
            points[t] = sorted(times)[len(times) // 2]
    finally:
        allocator.free(table)
    return CostCurve.from_points(points)
