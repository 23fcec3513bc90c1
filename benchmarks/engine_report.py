"""engine_bench's report: medians per side, ours against each other side, the markdown table."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from benchmarks.machine import machine_lines, markdown_table

# DESIGN.md "Machine facts": 540 MB of fp32 weights per token at ~37 GB/s streaming read.
BOUND_TOK_S = 68.0
STREAM_BYTES_S = 37e9

# (summary key, label, higher is better)
_METRICS = (
    ("batch1_prefill_ms", "batch-1 prefill (ms)", False),
    ("batch1_decode_tok_s", "batch-1 decode tok/s", True),
    ("batch_aggregate_tok_s", "batch-B aggregate tok/s", True),
    ("peak_rss_mib", "peak RSS, whole run (MiB)", False),
    ("rss_after_load_mib", "RSS after loading (MiB)", False),
    ("peak_rss_generating_mib", "peak RSS while generating (MiB)", False),
)


def summarise(sides: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Medians per side; for each HF side, how many times better ours is (> 1: ours wins)."""
    ref = sides["ours"]["batch1_tokens"][0]
    summary = {}
    for name, r in sides.items():
        decode = statistics.median(r["batch1_decode_tok_s"])
        summary[name] = {
            "batch1_prefill_ms": 1e3 * statistics.median(r["batch1_prefill_s"]),
            "batch1_decode_tok_s": decode,
            "batch1_pct_of_bound": 100 * decode / BOUND_TOK_S,
            "batch_aggregate_tok_s": statistics.median(r["batch_aggregate_tok_s"]),
            **{k: r[k] for k in ("peak_rss_mib", "rss_after_load_mib", "peak_rss_generating_mib")},
            "batch1_tokens_matching_ours": _common_prefix(ref, r["batch1_tokens"][0]),
        }
    ours = summary["ours"]
    for name in sides:
        if name != "ours":
            summary[name] |= {
                f"ours_advantage_{key}": ours[key] / summary[name][key]
                if up
                else summary[name][key] / ours[key]
                for key, _, up in _METRICS
            }
    return summary


def _common_prefix(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


def _spread(values: list[float], scale: float) -> str:
    lo, mid, hi = (scale * f(values) for f in (min, statistics.median, max))
    return f"{mid:.1f}" if len(values) < 2 else f"{mid:.1f} ({lo:.1f}–{hi:.1f})"


def _cell(side: dict[str, Any], key: str) -> str:
    if "rss" in key:
        return f"{side[key]:.0f}"
    raw = key.replace("_ms", "_s")
    return _spread(side[raw], 1e3 if raw != key else 1.0)


def _label(side: str) -> str:
    return "ours, dense weights" if side == "ours-dense" else f"HF {side.removeprefix('hf-')}"


def render(args: argparse.Namespace, info: dict[str, Any], sides: dict[str, Any]) -> str:
    summary = summarise(sides)
    hf = [s for s in sides if s != "ours"]
    header = ["metric", "ours"] + [c for s in hf for c in (_label(s), f"ours vs {_label(s)}")]
    rows = []
    for key, label, _ in _METRICS:
        row = [label.replace("batch-B", f"batch-{args.batch}"), _cell(sides["ours"], key)]
        for s in hf:
            row += [_cell(sides[s], key), f"{summary[s][f'ours_advantage_{key}']:.2f}x"]
        rows.append(row)
    match = [f"{summary[s]['batch1_tokens_matching_ours']}/{args.new_tokens}" for s in hf]
    rows.append(["batch-1 greedy tokens equal to ours", "", *[c for m in match for c in (m, "")]])
    ours = summary["ours"]
    streamed = sides["ours"]["streamed_weight_mib"]
    own_bound = STREAM_BYTES_S / (streamed * 2**20)
    return (
        f"## engine_bench: SmolLM2-135M fp32, {args.prompt_tokens}-token prompts, "
        f"{args.new_tokens} new tokens, greedy, {args.threads} threads, {args.repeats} repeats\n\n"
        f"{machine_lines(info)}\n\n{markdown_table(header, rows)}\n\n"
        "Cells: median (min–max) over repeats. 'ours vs HF' > 1 means ours is better "
        "(tok/s: ours / HF; ms and MiB: HF / ours).\n"
        f"Ours at batch 1 decodes at {ours['batch1_pct_of_bound']:.0f}% of the "
        f"{BOUND_TOK_S:.0f} tok/s weight-bandwidth bound of the float32 weights. It streams "
        f"{streamed:.0f} MiB of weights per token, for which the same {STREAM_BYTES_S / 1e9:.0f} "
        f"GB/s gives {own_bound:.0f} tok/s ({100 * ours['batch1_decode_tok_s'] / own_bound:.0f}% "
        f"of it). Ours: KV pool {sides['ours']['kv_pool_mib']:.0f} MiB, weights "
        f"{sides['ours']['weight_mib']:.0f} MiB."
    )
