"""Issue 3's benchmark: speculation at batch 1 against N = 0, on real-text workloads.

One engine per proposer (``--proposer ngram,medusa`` compares several in one run) is built with
the largest N of ``--speculate``; each request caps its own k with ``SamplingParams(speculate=N)``,
so every N runs on the same loaded model, and N = 0, which never calls a proposer, runs once per
prompt as the common baseline. For each prompt every (proposer, N) runs back to back (the order
rotates from prompt to prompt), so machine noise falls on all of them alike.

Per (workload, proposer, N), summed over its prompts:

- tok/s: generated tokens / wall time from submit to last token (prefill included);
  decode tok/s: (generated - 1) / (first token -> last token);
- acc/step: accepted drafts per decode step (a step emits acc + 1 tokens);
  acc/draft step: accepted per step that verified drafts; acceptance: accepted / drafted;
- speedup: tok/s over N = 0's in the same run;
- identical: prompts whose tokens equal N = 0's (greedy speculation must be lossless).

    python -m specserve.bench.spec_bench [--speculate 0,1,2,3,5,8] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from specserve.bench.machine import machine_info
from specserve.bench.spec_report import Run, render, summarise
from specserve.bench.workload_items import WorkloadItem, encode_item
from specserve.bench.workloads import build_workload
from specserve.config import PROPOSERS, EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.engine.request import SamplingParams

MODULE = "specserve.bench.spec_bench"
WORKLOADS = ("code-edit", "summarize", "chat-creative")


def run_one(engine: Engine, ids: list[int], params: SamplingParams) -> dict[str, Any]:
    """Generate one request alone; engine-wide counter deltas are then this request's."""
    stats, prop = engine.stats, engine.stats.proposer
    steps0, drafts0, per_pos0 = stats.steps, prop.drafts, list(prop.accepted_per_position)
    tokens: list[int] = []
    start = time.perf_counter()
    first, prefill_steps, last = None, 0, None
    engine.add_request(ids, params)
    while engine.has_work():
        for out in engine.step():
            tokens += out.new_token_ids
            last = out
        if first is None and tokens:
            first, prefill_steps = time.perf_counter(), stats.steps - steps0
    end = time.perf_counter()
    assert first is not None and last is not None and last.finished
    per_pos = prop.accepted_per_position
    return {
        "prompt_tokens": len(ids),
        "tokens": tokens,
        "total_s": end - start,
        "decode_s": end - first,
        "steps": stats.steps - steps0,
        "prefill_steps": prefill_steps,
        "draft_steps": prop.drafts - drafts0,
        "drafted": last.drafted_tokens,
        "accepted": last.accepted_tokens,
        "accepted_per_position": [
            c - (per_pos0[i] if i < len(per_pos0) else 0) for i, c in enumerate(per_pos)
        ],
    }


def configurations(proposers: list[str], ns: list[int]) -> list[tuple[str, int]]:
    """(proposer, N) pairs: the shared N = 0 baseline first, then every proposer's N > 0."""
    return [("none", 0)] + [(p, n) for p in proposers for n in ns if n > 0]


def sweep(
    engines: dict[str, Engine], items: list[WorkloadItem], ns: list[int], args: argparse.Namespace
) -> list[Run]:
    """Every configuration for each prompt in turn, the order rotated by one per prompt."""
    runs = []
    configs = configurations(list(engines), ns)
    baseline = next(iter(engines.values()))  # N = 0 never calls the proposer
    for j, item in enumerate(items):
        ids = encode_item(baseline, item)
        for proposer, n in configs[j % len(configs) :] + configs[: j % len(configs)]:
            engine = engines.get(proposer, baseline)
            params = SamplingParams(
                max_new_tokens=args.new_tokens, ignore_eos=args.ignore_eos, speculate=n
            )
            run = Run(item.workload, item.id, proposer, n, **run_one(engine, ids, params))
            runs.append(run)
            rate = len(run.tokens) / run.total_s
            print(
                f"[spec_bench {j + 1}/{len(items)}] {item.id} {proposer} N={n}: "
                f"{len(run.tokens)} tokens, {rate:.1f} tok/s, "
                f"accepted {run.accepted}/{run.drafted}",
                file=sys.stderr,
            )
    return runs


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--speculate", default="0,1,2,3,5,8", help="comma list of N; must include 0")
    p.add_argument(
        "--proposer",
        default=None,
        help=f"comma list of {', '.join(PROPOSERS)}, compared in one run; "
        "default: draft with --draft-model, else ngram",
    )
    p.add_argument(
        "--draft-model", default=None, help="HF directory or .gguf sharing the tokenizer"
    )
    p.add_argument("--ngram-max", type=int, default=4)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list")
    p.add_argument("--prompts-per-workload", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--ignore-eos", action="store_true", help="always generate --new-tokens")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0, help="workload seed (which texts)")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    args = p.parse_args(argv)
    args.proposers = (args.proposer or ("draft" if args.draft_model else "ngram")).split(",")
    unknown = [p for p in args.proposers if p not in PROPOSERS]
    if unknown or len(set(args.proposers)) != len(args.proposers):
        p.error(f"--proposer must list distinct names from {PROPOSERS}, got {args.proposer!r}")
    try:
        args.ns = sorted({int(n) for n in args.speculate.split(",")})
    except ValueError:
        p.error(f"--speculate must be a comma list of integers, got {args.speculate!r}")
    if args.ns[0] != 0:
        p.error("--speculate must include 0, the baseline every speedup is measured against")
    if args.new_tokens < 2 or args.prompts_per_workload < 1:
        p.error("need --new-tokens >= 2 and --prompts-per-workload >= 1")
    return args


def build_engine(args: argparse.Namespace, proposer: str) -> Engine:
    """One engine for every N: speculate = the largest N; requests cap their own k."""
    try:
        spec = SpecConfig(
            speculate=args.ns[-1],
            proposer=proposer,  # type: ignore[arg-type]
            draft_model=args.draft_model,
            ngram_max=args.ngram_max,
        )
        scheduler = SchedulerConfig(max_running_requests=1)  # batch 1; sizes the KV pool to one
        config = EngineConfig(
            device=args.device, num_threads=args.threads, scheduler=scheduler, spec=spec
        )
        return Engine(config)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    info = machine_info(MODULE, argv)
    torch.set_num_threads(args.threads)
    engines = {p: build_engine(args, p) for p in args.proposers}
    items = [
        item
        for name in args.workloads.split(",")
        for item in build_workload(name, args.prompts_per_workload, args.seed)
    ]
    for engine in engines.values():
        warm = encode_item(engine, items[0])
        for n in (0, args.ns[-1]):
            run_one(engine, warm, SamplingParams(max_new_tokens=4, ignore_eos=True, speculate=n))
    runs = sweep(engines, items, args.ns, args)
    rows = summarise(runs, configurations(args.proposers, args.ns))
    print(render(args, info, rows))
    if args.json is not None:
        config_out = {k: v for k, v in vars(args).items() if k not in ("json", "ns", "proposer")}
        runs_out = [asdict(r) for r in runs]
        report = {"machine": info, "config": config_out, "summary": rows, "runs": runs_out}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
