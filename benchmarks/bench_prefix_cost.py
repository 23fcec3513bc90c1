"""What prefix caching costs where nothing can be reused: the same engine with the cache on and
off, one process, on prompts that share no block.

Each round sends `--batch` fresh prompts at once (random token ids from a seeded generator, so
no two share even their first token block and no prompt is ever sent twice) to an engine with
prefix caching off and then to one with it on (the order alternates per round), greedy with
EOS ignored. Wall time per round per side, the median and on/off ratio, the cache's hit tokens
(must be 0) and whether both sides' tokens are equal.

Usage (repo root): python -m benchmarks.bench_prefix_cost [--threads 2] [--rounds 5]
    [--batch 16] [--prompt-tokens 384] [--new-tokens 32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from benchmarks.machine import machine_info, machine_lines, markdown_table
from specserve.cli import build_parser
from specserve.cli_args import engine_config_from_args
from specserve.engine.engine import Engine
from specserve.request import FinishReason, SamplingParams


def engine(cache: bool, threads: int) -> Engine:
    flags = ["serve", "--speculate", "0", "--num-threads", str(threads)]
    return Engine(engine_config_from_args(build_parser().parse_args(flags + (
        [] if cache else ["--no-prefix-caching"]))))  # fmt: skip


def timed(eng: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    ids = [eng.add_request(p, params) for p in prompts]
    out: dict[str, list[int]] = {i: [] for i in ids}
    while eng.has_work():
        for o in eng.step():
            if o.finish_reason == FinishReason.ERROR:
                raise RuntimeError(f"request failed: {o.error}")
            out[o.request_id] += o.new_token_ids
    return time.perf_counter() - started, [out[i] for i in ids]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="torch threads of both engines")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each side once per round")
    p.add_argument("--batch", type=int, default=16, help="prompts sent at once per round")
    p.add_argument("--prompt-tokens", type=int, default=384, help="tokens per prompt")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt")
    p.add_argument("--json", default=None, help="write the raw results here")
    args = p.parse_args(argv)
    info = machine_info("benchmarks.bench_prefix_cost", sys.argv[1:] if argv is None else argv)
    engines = {"off": engine(False, args.threads), "on": engine(True, args.threads)}
    vocab = engines["off"].tokenizer.vocab_size
    gen = torch.Generator().manual_seed(0)
    timed(engines["off"], [[1, 2, 3]], 2), timed(engines["on"], [[4, 5, 6]], 2)  # warm-up
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    equal = True
    for r in range(args.rounds):
        prompts = torch.randint(0, vocab, (args.batch, args.prompt_tokens), generator=gen).tolist()
        tokens = {}
        for side in ("off", "on") if r % 2 == 0 else ("on", "off"):
            s, tokens[side] = timed(engines[side], prompts, args.new_tokens)
            seconds[side].append(s)
        equal = equal and tokens["on"] == tokens["off"]
    hits = engines["on"].res.allocator.stats.hit_tokens
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(machine_lines(info), "\n")
    rows = [
        [side, " / ".join(f"{s:.2f}" for s in seconds[side]), f"{med[side]:.2f}"]
        for side in ("off", "on")
    ]
    print(markdown_table(["prefix cache", "s per round", "median s"], rows))
    print(
        f"\non / off (median): {med['on'] / med['off']:.3f}; cache hit tokens on the 'on' side: "
        f"{hits}; tokens equal on both sides: {'yes' if equal else 'NO'}; "
        f"{args.rounds} rounds x {args.batch} prompts x {args.prompt_tokens} tokens, "
        f"{args.new_tokens} new"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "seconds": seconds, "hit_tokens": hits, "equal": equal}, f)
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
