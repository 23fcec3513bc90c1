"""Where a verified row's time goes (#56 item 3): one request at a time through the engine on the
embedded model, speculation on (static n-gram drafts, so that both 1-row and (N+1)-row steps
occur), each step's phases from the engine observer grouped by the rows it scored, and a
cProfile of the same run for the functions outside the forward pass.

    python -m benchmarks.step_profile [--workload workloads/third-party.jsonl] [--items 4]
        [--speculate 4] [--max-tokens 128] [--threads 2] [--top 25]

Prints, per rows-per-step, the mean milliseconds of each phase (propose, decide, forward,
verify, other) and the forward's share; then the profile's top functions by own time, the
C forward and its callees excluded (they are the arithmetic).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
from collections import defaultdict

import torch

from benchmarks.machine import machine_info, machine_lines
from specserve.bench.workload_items import load_workload
from specserve.config import CacheConfig, EngineConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.engine.observer import PHASES, EngineObserver, StepTiming
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams


class ByRows(EngineObserver):
    """Each step's phases, keyed by the rows its single sequence scored."""

    def __init__(self) -> None:
        self.steps: dict[int, list[StepTiming]] = defaultdict(list)

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        plan = timing.plan
        if plan is None or len(plan.seqs) != 1:
            return
        seq = plan.seqs[0]
        if seq.work.num_tokens != 1:  # a prefill chunk
            return
        self.steps[1 + len(seq.draft_tokens)].append(timing)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a checkpoint or GGUF (default: the embedded)")
    p.add_argument("--workload", default="workloads/third-party.jsonl")
    p.add_argument("--items", type=int, default=4)
    p.add_argument("--speculate", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = Engine(
        EngineConfig(
            model=args.model,
            num_threads=args.threads,
            cache=CacheConfig(prefix_caching=False),
            spec=SpecConfig(speculate=args.speculate, proposer="ngram", policy="static"),
        )
    )
    observer = ByRows()
    items = [i for i in load_workload(args.workload) if i.messages][: args.items]
    chats = [[{"role": m.role, "content": m.content} for m in i.messages or ()] for i in items]
    prompts = [engine.encode_chat(chat) for chat in chats]
    params = SamplingParams(max_new_tokens=args.max_tokens, ignore_eos=True)
    run_one(engine, prompts[0], params)  # warm-up: kernels built, first-call costs paid
    engine.observers.add(observer)
    profile = cProfile.Profile()
    profile.enable()
    for prompt in prompts:
        run_one(engine, prompt, params)
    profile.disable()
    print(machine_lines(machine_info("benchmarks.step_profile", argv or sys.argv[1:])))
    print(
        f"\nworkload {args.workload}, {len(prompts)} requests one at a time, "
        f"speculate={args.speculate} (static n-gram), {args.threads} threads\n"
    )
    print("| rows | steps | total ms | " + " | ".join(PHASES) + " | other | forward share |")
    print("|---:|---:|---:|" + "---:|" * (len(PHASES) + 2))
    for rows in sorted(observer.steps):
        steps = observer.steps[rows]
        total = statistics.mean(t.total for t in steps) * 1e3
        phases = [statistics.mean(t.seconds[ph] for t in steps) * 1e3 for ph in PHASES]
        other = statistics.mean(t.other for t in steps) * 1e3
        cells = " | ".join(f"{v:.2f}" for v in [*phases, other])
        share = phases[PHASES.index("forward")] / total
        print(f"| {rows} | {len(steps)} | {total:.2f} | {cells} | {share:.0%} |")
    print("\nTop functions by own time (the whole timed run):\n")
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    return 0


def run_one(engine: Engine, prompt: list[int], params: SamplingParams) -> None:
    engine.add_request(prompt, params)
    while engine.has_work():
        engine.step()


if __name__ == "__main__":
    sys.exit(main())
