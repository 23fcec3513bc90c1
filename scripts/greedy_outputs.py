"""Greedy outputs of every built-in workload, with speculation off and with each proposer.

A restructuring must not change what the model says: run this before and after, then compare
the two files with ``--compare``. Each record holds the token ids and the log-probability of
every emitted token, so a single changed bit shows.

    python scripts/greedy_outputs.py --out /tmp/before.json
    python scripts/greedy_outputs.py --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from specserve.bench.workload_items import encode_item
from specserve.bench.workloads import BUILDERS, build_workload
from specserve.config import EngineConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.request import SamplingParams

SETTINGS: dict[str, SpecConfig] = {
    "off": SpecConfig(),
    "ngram": SpecConfig(speculate=4, proposer="ngram"),
    "suffix": SpecConfig(speculate=4, proposer="suffix"),
    "medusa": SpecConfig(speculate=3, proposer="medusa"),
    "adaptive": SpecConfig(speculate=5, proposer="ngram", policy="adaptive"),
}


def run(setting: str, items_per_workload: int, max_tokens: int) -> dict[str, object]:
    engine = Engine(replace(EngineConfig(), spec=SETTINGS[setting]))
    params = SamplingParams(max_new_tokens=max_tokens, ignore_eos=True, logprobs=0)
    ids: dict[str, str] = {}
    for name in BUILDERS:
        for item in build_workload(name, items_per_workload, seed=0):
            ids[engine.add_request(encode_item(engine, item), params)] = f"{name}/{item.id}"
    tokens: dict[str, list[int]] = {key: [] for key in ids.values()}
    logprobs: dict[str, list[float]] = {key: [] for key in ids.values()}
    drafted = accepted = 0
    while engine.has_work():
        for out in engine.step():
            key = ids[out.request_id]
            tokens[key] += out.new_token_ids
            logprobs[key] += [lp.logprob for lp in out.logprobs or []]
            if out.finished:
                drafted += out.drafted_tokens
                accepted += out.accepted_tokens
    return {"tokens": tokens, "logprobs": logprobs, "drafted": drafted, "accepted": accepted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path, help="an earlier output of this script")
    parser.add_argument("--items", type=int, default=2, help="items per workload")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = {s: run(s, args.items, args.max_tokens) for s in args.settings}
    args.out.write_text(json.dumps(results))
    for s, r in results.items():
        print(f"{s}: {len(r['tokens'])} requests, drafted {r['drafted']}, accepted {r['accepted']}")  # type: ignore[arg-type]
    base = results.get("off")
    for s, r in results.items():
        if base is not None and (r["tokens"], r["logprobs"]) != (base["tokens"], base["logprobs"]):
            print(f"MISMATCH: {s} differs from speculation off")
            return 1
    if args.compare:
        before = json.loads(args.compare.read_text())
        for s, r in results.items():
            if (
                before.get(s, {}).get("tokens") != r["tokens"]
                or before[s]["logprobs"] != r["logprobs"]
            ):
                print(f"MISMATCH: {s} differs from {args.compare}")
                return 1
        print(f"identical to {args.compare}: tokens and logprobs, every setting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
