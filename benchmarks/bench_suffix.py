"""Cost of the suffix index (speculation/suffix_index.py) at 2k, 8k and 32k cached tokens.

Text: Python stdlib sources tokenized with the embedded SmolLM2 tokenizer (real token
statistics; common tokens such as indentation make the first compare's survivors many). The
global arena is filled as a server fills it: 16 requests in flight at a time append 1-5 tokens
per step each, interleaved, so chains are fragmented; full, it evicts the oldest request.

Per call, p50 / p99 over `--calls` calls:
- lookup hit: a query (a context's last 32 tokens) taken from text in the index, match plus a
  continuation of 8 tokens;
- lookup miss: a query from text not in the index;
- append: one step's 1-5 tokens of one request;
- own context: indexing a 2k-token prompt at once (a request's first draft);
and the arena's bytes at the bound (its capacity), independent of how full it is.

Usage (repo root): python -m benchmarks.bench_suffix [--calls 2000]
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path

import numpy as np

from specserve.speculation.suffix_index import TokenArena

SIZES = (2048, 8192, 32768)
QUERY, K = 32, 8


def corpus_tokens(limit: int) -> np.ndarray:  # [>= limit] int32
    from transformers import AutoTokenizer

    from specserve.models.loader import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(None)))
    out: list[int] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        out += tok.encode(path.read_text(encoding="utf-8", errors="replace"))
        if len(out) >= limit:
            break
    return np.asarray(out, dtype=np.int32)


def fill(capacity: int, text: np.ndarray, rng: np.random.Generator) -> list[float]:
    """A full arena built step by step; returns every append's microseconds."""
    arena = TokenArena(capacity)
    times, cursor, owner = [], 0, 0
    live: dict[int, int] = {}  # owner -> tokens left in its "output"
    while cursor < 2 * capacity:  # twice over: the second half runs with eviction
        while len(live) < 16:
            live[owner] = int(rng.integers(100, 600))
            owner += 1
        for o in list(live):
            m = int(rng.integers(1, 6))
            chunk = text[cursor % len(text) : cursor % len(text) + m]
            started = time.perf_counter()
            arena.append(o, chunk)
            times.append((time.perf_counter() - started) * 1e6)
            cursor += m
            live[o] -= m
            if live[o] <= 0:
                del live[o]
    fill.arena = arena  # type: ignore[attr-defined]
    return times


def lookups(
    arena: TokenArena, source: np.ndarray, calls: int, rng: np.random.Generator
) -> list[float]:
    times = []
    for _ in range(calls):
        at = int(rng.integers(QUERY, len(source)))
        query = source[at - QUERY : at]
        started = time.perf_counter()
        _, ends = arena.match(query)
        arena.continuation(ends, K, 0.1)
        times.append((time.perf_counter() - started) * 1e6)
    return times


def pct(xs: list[float]) -> str:
    return f"{np.percentile(xs, 50):.1f} / {np.percentile(xs, 99):.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    text = corpus_tokens(4 * SIZES[-1] + 4096)
    unseen = text[-4096:]  # never appended: misses (mostly)
    print(f"suffix index, query {QUERY} tokens, continuation {K}; µs per call, p50 / p99\n")
    print("| cached tokens | lookup hit | lookup miss | append (1-5 tokens) | bytes at the bound |")
    print("|---:|---:|---:|---:|---:|")
    for size in SIZES:
        appends = fill(size, text[: 2 * size], rng)
        arena: TokenArena = fill.arena  # type: ignore[attr-defined]
        live = text[size : 2 * size]  # the second pass: what the arena holds now
        hit, miss = lookups(arena, live, args.calls, rng), lookups(arena, unseen, args.calls, rng)
        print(
            f"| {arena.num_tokens} | {pct(hit)} | {pct(miss)} | {pct(appends)} | {arena.nbytes} |"
        )
    own = []
    for _ in range(50):
        started = time.perf_counter()
        TokenArena(4096, growable=True).append(0, text[:2048])
        own.append((time.perf_counter() - started) * 1e6)
    print(f"\nown context: indexing a 2048-token prompt, p50 / p99 µs: {pct(own)}")


if __name__ == "__main__":
    main()
