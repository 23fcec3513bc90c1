"""Per-call cost of ngram_propose, to hold next to a ~20 ms target forward pass.

Contexts (vocab 49152, k=5, ngram 1..4):
- no match: uniform random tokens, the suffix almost never recurs;
- match: a 64-token phrase repeated to fill the context, so the 4-gram suffix recurs L/64 times;
- worst: a 2-token alphabet, so about half of all positions survive the first compare.

Usage (repo root):
    python -m benchmarks.bench_ngram [--repeats 5] [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np

from specserve.speculation.ngram import ngram_propose

VOCAB = 49152
LENGTHS = (256, 1024, 4096)
K = 5


def contexts(length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:  # name -> [length]
    phrase = rng.integers(0, VOCAB, size=64)
    return {
        "no match": rng.integers(0, VOCAB, size=length),
        "match": np.resize(phrase, length),
        "worst (2-token alphabet)": rng.integers(0, 2, size=length),
    }


def micros_per_call(tokens: np.ndarray, calls: int, repeats: int) -> float:
    times = timeit.repeat(lambda: ngram_propose(tokens, K), number=calls, repeat=repeats)
    return statistics.median(times) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    rows = {length: contexts(length, rng) for length in LENGTHS}
    names = list(rows[LENGTHS[0]])
    print(f"ngram_propose, k={K}, median of {args.repeats} x {args.calls} calls, µs per call\n")
    print("| context | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for length, cases in rows.items():
        cells = [f"{micros_per_call(cases[n], args.calls, args.repeats):.1f}" for n in names]
        print(f"| {length} | " + " | ".join(cells) + " |")
    matched = {n: ngram_propose(rows[LENGTHS[-1]][n], K).size for n in names}
    print(f"\ntokens proposed at L={LENGTHS[-1]}: {matched}")


if __name__ == "__main__":
    main()
