"""Bench maths and outputs: per-cell statistics, goodput, contention, the recommendation.

Definitions (client-side, per cell = one (workload, N, load)):

- TTFT: send -> first token. E2E: send -> end of stream.
- ITL of a request: its mean inter-token latency, (last token - first token) / (tokens - 1).
  Percentiles are taken over requests. A speculative step delivers several tokens at once, so the
  raw gaps between token events are bursty (near 0 inside a step); their p99 is kept separately
  as `gap_p99` (stalls), but the mean is what a reader of the stream experiences.
- A request meets the SLO if it completed, TTFT <= slo.ttft_s and ITL <= slo.itl_s (a one-token
  reply has no ITL and meets that half).
- tok/s, req/s, goodput: output tokens, completed requests, SLO-meeting requests, each divided by
  the cell's duration (first send -> last finish).
- acceptance: accepted / drafted over the cell's requests. Accepted length: accepted drafts per
  step that verified drafts, from per-request `spec_steps` when the server reports them, else
  from the server's counter deltas (exact when the bench is the only traffic).
- contention at (workload, load, N > 0): ITL p50 below N = 0's by more than `tol` while tok/s is
  also below N = 0's by more than `tol`.
- the objective at a load is goodput, or tok/s where no configuration met the SLO. N pays at a
  load if its objective beats N = 0's by more than `min_gain`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specserve.bench.records import Cell, CellKey, Mode, RequestRecord


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    itl_s: float


@dataclass(frozen=True)
class Pcts:
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Pcts:
        return cls(*(percentile(values, q) for q in (50, 90, 99)))


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def itl_mean(r: RequestRecord) -> float | None:
    if r.decode_s is None or r.output_tokens < 2:
        return None
    return r.decode_s / (r.output_tokens - 1)


def meets_slo(r: RequestRecord, slo: Slo) -> bool:
    itl = itl_mean(r)
    ttft_ok = r.ttft is not None and r.ttft <= slo.ttft_s
    return r.ok and ttft_ok and (itl is None or itl <= slo.itl_s)


@dataclass(frozen=True)
class CellStats:
    key: CellKey
    completed: int
    failed: int
    duration_s: float
    ttft: Pcts
    itl: Pcts
    e2e: Pcts
    gap_p99: float | None
    tok_s: float
    req_s: float
    goodput: float
    in_flight: float  # mean requests in flight (Little's law: sum of e2e / duration)
    acceptance: float | None = None
    accepted_len: float | None = None
    first_error: str | None = None


def cell_stats(cell: Cell, slo: Slo) -> CellStats:
    ok = [r for r in cell.records if r.ok]
    dur = max(cell.duration_s, 1e-9)
    return CellStats(
        key=cell.key,
        completed=len(ok),
        failed=len(cell.records) - len(ok),
        duration_s=cell.duration_s,
        ttft=Pcts.of([r.ttft for r in ok if r.ttft is not None]),
        itl=Pcts.of([x for r in ok if (x := itl_mean(r)) is not None]),
        e2e=Pcts.of([r.e2e for r in ok if r.e2e is not None]),
        gap_p99=percentile([g for r in ok for g in r.gaps], 99),
        tok_s=sum(r.output_tokens for r in ok) / dur,
        req_s=len(ok) / dur,
        goodput=sum(meets_slo(r, slo) for r in ok) / dur,
        in_flight=sum(r.e2e or 0.0 for r in cell.records) / dur,
        acceptance=_ratio(_sum(ok, "accepted"), _sum(ok, "drafted")),
        accepted_len=_accepted_len(ok, cell.server),
        first_error=next((f"{r.status}: {r.error}" for r in cell.records if not r.ok), None),
    )


def _sum(records: list[RequestRecord], name: str) -> float | None:
    values = [getattr(r, name) for r in records]
    return None if not values or None in values else float(sum(values))


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _accepted_len(ok: list[RequestRecord], server: dict[str, float]) -> float | None:
    per_request = _ratio(_sum(ok, "accepted"), _sum(ok, "spec_steps"))
    if per_request is not None:
        return per_request
    return _ratio(
        server.get("specserve_spec_accepted_tokens_total"),
        server.get("specserve_spec_drafts_total"),
    )


# ------------------------------------------------------------------------------ comparisons
def grid_by_load(stats: Sequence[CellStats]) -> dict[tuple[str, float], dict[int, CellStats]]:
    """(workload, load) -> N -> stats."""
    grid: dict[tuple[str, float], dict[int, CellStats]] = {}
    for s in stats:
        grid.setdefault((s.key.workload, s.key.load), {})[s.key.speculate] = s
    return grid


@dataclass(frozen=True)
class Contention:
    workload: str
    load: float
    speculate: int
    itl_ratio: float  # ITL p50 at N over N = 0's (< 1: faster stream)
    tok_s_ratio: float  # tok/s at N over N = 0's (< 1: less total throughput)


def find_contention(stats: Sequence[CellStats], tol: float = 0.02) -> list[Contention]:
    found = []
    for (workload, load), by_n in sorted(grid_by_load(stats).items()):
        base = by_n.get(0)
        if base is None or not base.itl.p50 or not base.tok_s:
            continue
        for n, s in sorted(by_n.items()):
            if n == 0 or s.itl.p50 is None:
                continue
            itl_r, tok_r = s.itl.p50 / base.itl.p50, s.tok_s / base.tok_s
            if itl_r < 1 - tol and tok_r < 1 - tol:
                found.append(Contention(workload, load, n, itl_r, tok_r))
    return found


@dataclass(frozen=True)
class Recommendation:
    workload: str
    mode: Mode
    best_by_load: dict[float, int]  # load -> N maximising the objective (0 unless N pays)
    speculate: int  # one N for the loads below the gate
    gate_load: float | None  # largest load up to which speculation pays; None: every load
    speculate_max_batch: int | None  # the gate as --speculate-max-batch; None: no gate
    notes: list[str] = field(default_factory=list)


def _objective(by_n: dict[int, CellStats]) -> dict[int, float]:
    if any(s.goodput > 0 for s in by_n.values()):
        return {n: s.goodput for n, s in by_n.items()}
    return {n: s.tok_s for n, s in by_n.items()}


def best_n(by_n: dict[int, CellStats], min_gain: float = 0.02) -> int:
    """argmax of the objective (ties: smaller N); 0 unless it beats N = 0 by > min_gain."""
    obj = _objective(by_n)
    best = max(sorted(obj), key=lambda n: obj[n])
    if best and 0 in obj and obj[best] <= obj[0] * (1 + min_gain):
        return 0
    return best


def recommend(stats: Sequence[CellStats], min_gain: float = 0.02) -> dict[str, Recommendation]:
    grid = grid_by_load(stats)
    out = {}
    for workload in dict.fromkeys(s.key.workload for s in stats):
        loads = sorted(load for w, load in grid if w == workload)
        best = {load: best_n(grid[workload, load], min_gain) for load in loads}
        leading = loads[: next((i for i, ld in enumerate(loads) if not best[ld]), len(loads))]
        notes = []
        if len(leading) < len(loads) and any(best[ld] for ld in loads[len(leading) :]):
            notes.append("speculation paid again above the gate: noisy or non-monotonic")
        if not leading:
            n, gate = 0, None
            notes.append("speculation did not pay at the lowest measured load")
        else:
            n = _one_n([grid[workload, ld] for ld in leading])
            gate = None if len(leading) == len(loads) else leading[-1]
        mode = stats[0].key.mode
        max_batch = None if gate is None else _batch(grid[workload, gate][best[gate]], mode)
        out[workload] = Recommendation(workload, mode, best, n, gate, max_batch, notes)
    return out


def _one_n(cells: list[dict[int, CellStats]]) -> int:
    """The N > 0 with the highest objective summed over loads, each normalised to its best."""
    score: dict[int, float] = {}
    for by_n in cells:
        obj = _objective(by_n)
        top = max(obj.values()) or 1.0
        for n, v in obj.items():
            if n:
                score[n] = score.get(n, 0.0) + v / top
    return max(sorted(score), key=lambda n: score[n])


def _batch(s: CellStats, mode: Mode) -> int:
    return int(s.key.load) if mode == "closed" else max(1, round(s.in_flight))


def profile_entries(recs: dict[str, Recommendation]) -> dict[str, dict[str, Any]]:
    return {
        w: {
            "speculate": r.speculate,
            "speculate_max_batch": r.speculate_max_batch,
            "mode": r.mode,
            "best_by_load": {fmt_load(ld): n for ld, n in r.best_by_load.items()},
            "notes": r.notes,
        }
        for w, r in recs.items()
    }


def fmt_load(load: float) -> str:
    return str(int(load)) if float(load).is_integer() else f"{load:g}"
