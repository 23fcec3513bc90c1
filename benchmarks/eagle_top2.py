"""Would a draft tree pay on this CPU? The EAGLE head's second choice at depth 1, measured.

Issue 25's optional item: a small tree (the head's top 2 at the first position) verified in one
pass. A sibling at depth 1 adds one verified row to a step; it adds a token only when the head's
first choice there is wrong and its second right (the sibling is then accepted and the target's
pick after it emitted too). This runs the EAGLE proposer in process at batch 1, greedy, on
free text (chat-creative and the hand-written third-party-free prompts), records the head's top
2 at depth 1 at every proposal, and compares them with the token the target emitted there
(speculation never changes what it emits). Beside it, in the same process, the verify cost of k
+ 1 rows (`engine_verify_costs`), so the tree's rate can be estimated from measured numbers:

    rate(chain) = E / c(r),   rate(tree) = (E + g) / c(r + s)

with E the tokens emitted per step, r the rows scored per step, s the share of steps that
verified a draft (each would carry the sibling), g the sibling's gain per step (its hit rate
times the steps that proposed) and c(rows) the measured step cost. It leaves out the tree's own
costs (a tree mask in attention, the head's bookkeeping), so it is the tree's best case.

    python -m benchmarks.eagle_top2 [--threads 2] [--requests 8] [--new-tokens 128] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.engine_verify import engine_verify_costs
from benchmarks.machine import machine_info, machine_lines
from specserve.bench.workload_items import encode_item
from specserve.bench.workloads import build_workload, load_workload
from specserve.config import CacheConfig, EngineConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.request import SamplingParams
from specserve.speculation.eagle_head import eagle_head_dir
from specserve.speculation.eagle_proposer import EagleProposer

FREE_TEXT = Path(__file__).resolve().parents[1] / "workloads" / "third-party-free.jsonl"


class Top2Eagle(EagleProposer):
    """The EAGLE proposer, recording at depth 1 each chain's (sequence, output position, top-2
    ids) in `records`; it drafts as EagleProposer does."""

    records: list[tuple[Any, int, list[int]]]

    def _pick(self, g: torch.Tensor, chains: list[Any], j: int) -> torch.Tensor:
        if j == 0:
            top = self.vocab[self.vocab_logits(g).topk(2, dim=-1).indices]  # [B, 2] token ids
            for b, chain in enumerate(chains):
                self.records.append((chain.seq, len(chain.seq.output_ids), top[b].tolist()))
        return super()._pick(g, chains, j)


def run(threads: int, requests: int, new_tokens: int) -> dict[str, Any]:
    config = EngineConfig(
        num_threads=threads,
        spec=SpecConfig(speculate=4, proposer="eagle", policy="adaptive"),
        cache=CacheConfig(prefix_caching=False),
    )
    engine = Engine(config)
    head_dir = eagle_head_dir(engine.facts.model_dir, None)
    if head_dir is None:
        raise SystemExit(f"no shipped EAGLE head for {engine.facts.model_dir}")
    proposer = Top2Eagle.load(head_dir, engine.model, engine.facts.model_dir)
    assert isinstance(proposer, Top2Eagle)
    records = proposer.records = []
    engine.use_proposer(proposer)
    items = build_workload("chat-creative", requests, seed=0) + load_workload(str(FREE_TEXT))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    for item in items:
        engine.add_request(encode_item(engine, item), params)
        while engine.has_work():
            engine.step()
    stats, prop = engine.stats, engine.stats.proposer
    hits = [(out[pos] == top[0], out[pos] in top) for seq, pos, top in records
            if pos < len(out := seq.output_ids)]  # fmt: skip
    steps = stats.steps - len(items)  # decode steps: each request's prefill took one
    return {
        "requests": len(items),
        "proposals": len(hits),
        "top1": float(np.mean([h[0] for h in hits])),
        "top2": float(np.mean([h[1] for h in hits])),
        "decode_steps": steps,
        "emitted_per_step": (stats.tokens_emitted - len(items)) / steps,
        "rows_per_step": 1 + prop.drafted_tokens / steps,
        "verified_share": prop.drafts / steps,
    }


def estimate(found: dict[str, Any], ms: list[float]) -> dict[str, float]:
    """The chain's and the tree's rates (tokens per ms) from the measured E, r, s, g, c."""

    def cost(rows: float) -> float:  # ms of a step scoring `rows` rows, linear between k's
        return float(np.interp(rows, np.arange(1, len(ms) + 1), ms))

    e, r, s = found["emitted_per_step"], found["rows_per_step"], found["verified_share"]
    g = (found["top2"] - found["top1"]) * s
    chain, tree = e / cost(r), (e + g) / cost(r + s)
    return {"gain_per_step": g, "chain": chain, "tree": tree, "tree_over_chain": tree / chain}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=8, help="chat-creative requests (default 8)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    info = machine_info("benchmarks.eagle_top2", sys.argv[1:])
    found = run(args.threads, args.requests, args.new_tokens)
    ms = [pt.ms_step for pt in engine_verify_costs(["q8"], list(range(6)), rounds=2)["q8"]]
    est = estimate(found, ms)
    print(machine_lines(info) + "\n")
    print(f"{found['requests']} requests (chat-creative + third-party-free), batch 1, "
          f"greedy, EAGLE, N = 4 adaptive, {args.new_tokens} new tokens each\n")  # fmt: skip
    print("| proposals | head top-1 at depth 1 | top-2 | top-2 only | emitted / step | "
          "rows / step | steps verifying a draft |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    print(f"| {found['proposals']} | {found['top1']:.3f} | {found['top2']:.3f} | "
          f"{found['top2'] - found['top1']:.3f} | {found['emitted_per_step']:.3f} | "
          f"{found['rows_per_step']:.3f} | {found['verified_share']:.3f} |\n")  # fmt: skip
    print("Verify cost, q8, one sequence at 256 tokens of context, ms per step by rows: "
          + ", ".join(f"{k + 1}: {m:.2f}" for k, m in enumerate(ms)) + "\n")  # fmt: skip
    print(f"Estimated rate, tokens per ms: chain {est['chain']:.4f}, chain + a depth-1 sibling "
          f"{est['tree']:.4f} (gain {est['gain_per_step']:.3f} tokens a step): tree / chain "
          f"{est['tree_over_chain']:.3f}x, before the tree's own costs")  # fmt: skip
    if args.json:
        out = {"machine": info, "found": found, "verify_ms": ms, "estimate": est}
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
