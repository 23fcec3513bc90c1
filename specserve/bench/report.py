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

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specserve.bench.loadgen import Cell, CellKey, Mode, RequestRecord


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
def _grid(stats: Sequence[CellStats]) -> dict[tuple[str, float], dict[int, CellStats]]:
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
    for (workload, load), by_n in sorted(_grid(stats).items()):
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
    grid = _grid(stats)
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
            "best_by_load": {_fmt(ld): n for ld, n in r.best_by_load.items()},
            "notes": r.notes,
        }
        for w, r in recs.items()
    }


def _fmt(load: float) -> str:
    return str(int(load)) if float(load).is_integer() else f"{load:g}"


# -------------------------------------------------------------------------------- report.md
_COLUMNS = (
    "N",
    "ok/fail",
    "TTFT p50/p90/p99 (s)",
    "ITL p50/p90/p99 (ms)",
    "E2E p50/p90/p99 (s)",
    "gap p99 (ms)",
    "tok/s",
    "req/s",
    "goodput",
    "vs N=0: tok/s, ITL",
    "accept",
    "acc/step",
)


def markdown(
    stats: Sequence[CellStats],
    slo: Slo,
    recs: dict[str, Recommendation],
    contention: Sequence[Contention],
    meta: dict[str, Any],
) -> str:
    lines = [
        "# specserve bench",
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
        f"Model: {meta.get('model', '?')}; proposer: {meta.get('proposer', '?')}; "
        f"SLO: TTFT <= {slo.ttft_s} s, ITL <= {slo.itl_s * 1000:g} ms; "
        f"{meta.get('created', '')}",
        "",
        _fingerprint_line(meta),
        "",
        "ITL is each request's mean inter-token latency; percentiles are over requests. "
        "`gap p99` is over every raw gap between token events. Goodput is requests/s that "
        "met both SLOs.",
        "",
    ]
    flagged = {(c.workload, c.load, c.speculate) for c in contention}
    for workload in dict.fromkeys(s.key.workload for s in stats):
        lines += _workload_section(stats, workload, recs[workload], flagged)
    failed = [s for s in stats if s.failed]
    if failed:
        lines += ["## Failures", ""]
        lines += [
            f"- {s.key.workload} N={s.key.speculate} at {_fmt(s.key.load)}: {s.failed} "
            f"failed; first: {s.first_error}"
            for s in failed
        ] + [""]
    lines += ["## Contention", ""]
    lines += [
        f"- {c.workload} at {_fmt(c.load)}, N={c.speculate}: ITL x{c.itl_ratio:.2f} but "
        f"tok/s x{c.tok_s_ratio:.2f} against N=0"
        for c in contention
    ] or ["None found."]
    return "\n".join(lines) + "\n"


def _workload_section(
    stats: Sequence[CellStats],
    workload: str,
    r: Recommendation,
    flagged: set[tuple[str, float, int]],
) -> list[str]:
    """One table per load (a row per N), then the recommendation."""
    grid = _grid(stats)
    load_name = "concurrency" if r.mode == "closed" else "request rate"
    lines = [f"## {workload}", ""]
    for load in sorted(ld for w, ld in grid if w == workload):
        by_n = grid[workload, load]
        lines += [
            f"### {load_name} {_fmt(load)}",
            "",
            _row(_COLUMNS),
            _row(["---"] * len(_COLUMNS)),
        ]
        lines += [
            _stat_row(s, by_n.get(0), (workload, load, n) in flagged)
            for n, s in sorted(by_n.items())
        ]
        lines.append("")
    gate = (
        f"off above {load_name} {_fmt(r.gate_load)} "
        f"(`--speculate-max-batch {r.speculate_max_batch}`)"
        if r.gate_load is not None
        else "none: speculation is off"
        if r.speculate == 0
        else "none needed: speculation paid at every measured load"
    )
    best = ", ".join(f"{_fmt(ld)}: N={n}" for ld, n in r.best_by_load.items())
    return [
        *lines,
        f"**Recommendation**: `--speculate {r.speculate}`; gate: {gate}. "
        f"Best N by {load_name}: {best}.",
        *[f"- {note}" for note in r.notes],
        "",
    ]


def _fingerprint_line(meta: dict[str, Any]) -> str:
    target = meta.get("target")
    if not target:
        return (
            "**The profile is not fingerprinted** (the server's /info gave none and the "
            "model was not found here: pass --model), so servers cannot check it."
        )
    return (
        f"Measured on target config {str(target.get('config_sha256'))[:12]}, weights "
        f"{str(target.get('weights_sha256'))[:12]}; proposer "
        f"{json.dumps(meta.get('proposer_fingerprint'))}."
    )


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _stat_row(s: CellStats, base: CellStats | None, flagged: bool) -> str:
    vs = "-"
    if base is not None and s.key.speculate and base.tok_s and base.itl.p50 and s.itl.p50:
        vs = f"x{s.tok_s / base.tok_s:.2f}, x{s.itl.p50 / base.itl.p50:.2f}"
    return _row(
        [
            f"{s.key.speculate}{' ⚠ contention' if flagged else ''}",
            f"{s.completed}/{s.failed}",
            _pcts(s.ttft, 1, "{:.2f}"),
            _pcts(s.itl, 1000, "{:.1f}"),
            _pcts(s.e2e, 1, "{:.2f}"),
            _num(s.gap_p99, 1000, "{:.1f}"),
            f"{s.tok_s:.1f}",
            f"{s.req_s:.2f}",
            f"{s.goodput:.2f}",
            vs,
            _num(s.acceptance, 1, "{:.2f}"),
            _num(s.accepted_len, 1, "{:.2f}"),
        ]
    )


def _pcts(p: Pcts, scale: float, fmt: str) -> str:
    return "/".join(_num(v, scale, fmt) for v in (p.p50, p.p90, p.p99))


def _num(v: float | None, scale: float, fmt: str) -> str:
    return "-" if v is None else fmt.format(v * scale)


# ------------------------------------------------------------------------------------ plots
PLOTS = (
    ("itl", "ITL p50 (ms)", lambda s: None if s.itl.p50 is None else s.itl.p50 * 1000),
    ("throughput", "output tokens/s", lambda s: s.tok_s),
    ("goodput", "goodput (requests/s within SLO)", lambda s: s.goodput),
)


def plot(stats: Sequence[CellStats], out_dir: Any) -> list[str]:
    """One PNG per (workload, metric), one line per N; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    xlabel = "concurrency" if stats and stats[0].key.mode == "closed" else "request rate (req/s)"
    for workload in dict.fromkeys(s.key.workload for s in stats):
        mine = [s for s in stats if s.key.workload == workload]
        for metric, ylabel, value in PLOTS:
            fig, ax = plt.subplots(figsize=(6, 4))
            for n in sorted({s.key.speculate for s in mine}):
                pts = sorted((s.key.load, value(s)) for s in mine if s.key.speculate == n)
                xs, ys = [x for x, y in pts if y is not None], [y for _, y in pts if y is not None]
                ax.plot(xs, ys, marker="o", label=f"N={n}")
            ax.set_xscale("log", base=2)
            loads = sorted({s.key.load for s in mine})
            ax.set_xticks(loads, [_fmt(x) for x in loads])
            ax.minorticks_off()
            ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{workload}: {ylabel}")
            ax.grid(True, alpha=0.3)
            ax.legend()
            name = f"{workload}-{metric}.png"
            fig.savefig(out_dir / name, dpi=100, bbox_inches="tight")
            plt.close(fig)
            names.append(name)
    return names
