"""`bench_llamacpp`'s tables: batch 1 per side, many requests at once, verify cost."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from benchmarks.machine import markdown_table

if TYPE_CHECKING:
    from benchmarks.bench_llamacpp import Result
    from benchmarks.llamacpp_load import LoadResult
    from benchmarks.verify_cost import Point


def first_difference(a: list[int], b: list[int]) -> int:
    """Tokens equal before the first difference (the shorter length if none)."""
    return next(
        (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def agreement(rs: list[Result], ref: dict[tuple[str, int], list[int]] | None) -> str:
    """'all/n (first difference at j)' against HF (ref None) or against llama.cpp's tokens."""
    agree = [
        r.hf_agree if ref is None else first_difference(r.tokens, ref[r.prompt, r.index])
        for r in rs
    ]
    full = sum(a == len(r.tokens) for a, r in zip(agree, rs, strict=True))
    return f"{full}/{len(rs)} (first difference at {min(agree)})"


def batch1_table(results: list[Result]) -> str:
    servers = list(dict.fromkeys(r.server for r in results))
    llama = {(r.prompt, r.index): r.tokens for r in results if r.server == "llama.cpp"}
    rows = []
    for label in ("short", "long"):
        base = [r for r in results if r.server == "llama.cpp" and r.prompt == label]
        base_decode = statistics.median(r.decode_tok_s for r in base)
        base_prefill = statistics.median(r.prompt_tokens / r.ttft_s for r in base)
        for server in servers:
            rs = [r for r in results if r.server == server and r.prompt == label]
            decode = statistics.median(r.decode_tok_s for r in rs)
            prefill = statistics.median(r.prompt_tokens / r.ttft_s for r in rs)
            tokens = statistics.median(r.prompt_tokens for r in rs)
            rows.append(
                [
                    f"{label} (~{tokens:.0f} tokens)", server, f"{decode:.1f}",
                    f"{decode / base_decode:.2f}x", f"{prefill:.0f}",
                    f"{prefill / base_prefill:.2f}x", agreement(rs, None),
                    "-" if server == "llama.cpp" else agreement(rs, llama),
                ]
            )  # fmt: skip
    header = [
        "prompts", "server", "decode tok/s", "decode / llama.cpp", "prefill tok/s",
        "prefill / llama.cpp", "= HF greedy (128)", "= llama.cpp greedy (128)",
    ]  # fmt: skip
    return "Batch 1, streaming, medians:\n\n" + markdown_table(header, rows)


def load_table(load: list[LoadResult], concurrency: int) -> str:
    rows = []
    for mix in dict.fromkeys(r.mix for r in load):
        sides = {r.server: r for r in load if r.mix == mix}
        base = sides["llama.cpp"]
        for r in sides.values():
            rows.append(
                [
                    f"{mix} (~{r.prompt_tokens / r.requests:.0f} tokens)", r.server,
                    f"{r.wall_s:.1f}", f"{r.tok_s:.1f}", f"{r.tok_s / base.tok_s:.2f}x",
                ]
            )  # fmt: skip
    header = ["prompts", "server", "wall s", "new tok/s (all)", "/ llama.cpp"]
    title = f"{concurrency} requests at once (llama-server -np {concurrency}), non-streaming:"
    return title + "\n\n" + markdown_table(header, rows)


def verify_table(verify: dict[str, list[Point]], context: int = 256) -> str:
    ks = [p.k for p in next(iter(verify.values()))]
    rows = [
        [numerics] + [f"{p.ms_step:.2f} ({p.ratio_k0 or 1:.2f})" for p in pts]
        for numerics, pts in verify.items()
    ]
    title = f"Verify cost in process, batch 1, ~{context} tokens of context: ms per step (/ k = 0):"
    return title + "\n\n" + markdown_table(["numerics"] + [f"k={k}" for k in ks], rows)
