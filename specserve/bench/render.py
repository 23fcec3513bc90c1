"""Bench outputs for people: report.md tables and the PNG plots (matplotlib, Agg backend).
The maths and definitions they show live in `report.py`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from specserve.bench.report import (
    CellStats,
    Contention,
    Pcts,
    Recommendation,
    Slo,
    fmt_load,
    grid_by_load,
)

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
            f"- {s.key.workload} N={s.key.speculate} at {fmt_load(s.key.load)}: {s.failed} "
            f"failed; first: {s.first_error}"
            for s in failed
        ] + [""]
    lines += ["## Contention", ""]
    lines += [
        f"- {c.workload} at {fmt_load(c.load)}, N={c.speculate}: ITL x{c.itl_ratio:.2f} but "
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
    grid = grid_by_load(stats)
    load_name = "concurrency" if r.mode == "closed" else "request rate"
    lines = [f"## {workload}", ""]
    for load in sorted(ld for w, ld in grid if w == workload):
        by_n = grid[workload, load]
        lines += [
            f"### {load_name} {fmt_load(load)}",
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
        f"off above {load_name} {fmt_load(r.gate_load)} "
        f"(`--speculate-max-batch {r.speculate_max_batch}`)"
        if r.gate_load is not None
        else "none: speculation is off"
        if r.speculate == 0
        else "none needed: speculation paid at every measured load"
    )
    best = ", ".join(f"{fmt_load(ld)}: N={n}" for ld, n in r.best_by_load.items())
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
            ax.set_xticks(loads, [fmt_load(x) for x in loads])
            ax.minorticks_off()
            ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{workload}: {ylabel}")
            ax.grid(True, alpha=0.3)
            ax.legend()
            name = f"{workload}-{metric}.png"
            fig.savefig(out_dir / name, dpi=100, bbox_inches="tight")
            plt.close(fig)
            names.append(name)
    return names
