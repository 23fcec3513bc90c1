"""Where a speculating step's time goes at some concurrency, against N = 0, in process.

The adaptive policy weighs each extra verified row against the forward pass it lengthens
(`runner/cost.py`); the rest of what speculation costs a step (proposing, choosing the
prefixes, verifying and committing more tokens) is outside that model. This runs one engine
with the given proposer, its cells alternating between N = 0 and the adaptive policy at N
(`spec_cells.run_cell`: the requests through `--concurrency` slots, each cell from an empty
prefix cache and suffix index), and splits every step's wall time into

    propose (`engine.drafting.propose`), decide (`keep_prefixes`), forward (`ModelRunner.run`),
    verify (sampling, acceptance, commits, the proposer's sync),
    other (scheduling and the rest of `Engine.step`),

as the engine's observer reports them (`engine/observer.py`, `StepTiming`),

with the extra rows verified and the calibrated prediction of the drafts
verified against what was accepted. Propose per step mixes what one call of the proposer costs
with how often the policy asks for one (the payoff closes where proposing has not paid); the
steps whose proposer was asked, and the median propose time of those, separate the two. It also
counts the drain: steps run with fewer requests in
flight than the slots, once no request is left to fill them. With every request the same length
(`--new-tokens`, EOS ignored), N = 0 runs its requests in lockstep and never drains before the
last wave, while any accepted draft staggers the finishes; the drain steps say how much of a
cell's time that takes; `--lengths` spreads the requests' lengths instead (the same on both
sides), as traffic does. `--compare-payoff` adds a third side: the adaptive policy with its
payoff (speculation/payoff.py) never closing, as before it existed; every adaptive cell reports
its steps not proposed because proposing had not paid, and the payoff's classes at its end.

    python -m benchmarks.spec_ledger [--threads 2] [--proposer hybrid] [--n 4]
        [--workloads chat-creative,summarize] [--concurrency 16] [--requests 48]
        [--new-tokens 128 | --lengths 64-192] [--rounds 3] [--compare-payoff] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.ledger_report import Ledger, Step, report, summarise
from benchmarks.machine import machine_info, machine_lines
from benchmarks.spec_bench import conversations
from benchmarks.spec_cells import Config, run_cell
from specserve.bench.workloads import resolve_workload
from specserve.config import EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.engine.observer import EngineObserver, StepTiming
from specserve.outputs import RequestOutput
from specserve.request import SamplingParams
from specserve.request import Sequence as SeqView
from specserve.speculation.objective import expected_emitted
from specserve.speculation.payoff import Payoff
from specserve.speculation.policy import SpeculationPolicy
from specserve.speculation.proposer import Draft


class _LedgerObserver(EngineObserver):
    """Appends a `Step` to `ledger` for each engine step, and each verified draft (not forced
    by a grammar) with the policy's calibrated prediction of it, read before the policy
    learns from it. The extra rows are read off the policy's k counts before and after a
    step: each sequence-step that chose k adds k verified draft rows."""

    def __init__(self, engine: Engine, ledger: Ledger) -> None:
        self.engine, self.ledger = engine, ledger
        self.chosen: dict[int, int] = {}
        self.in_flight = 0

    def _policy(self) -> SpeculationPolicy:
        policy = self.engine.res.policy
        assert policy is not None, "the ledger needs the adaptive policy's engine"
        return policy

    def on_step_start(self) -> None:
        self.chosen = dict(self._policy().stats.k_chosen)
        scheduler = self.engine.scheduler
        self.in_flight = len(scheduler.running) + len(scheduler.waiting)

    def on_verified(self, seq: SeqView, draft: Draft, num_accepted: int) -> None:
        if draft.forced:
            return
        probs = self._policy().calibration.probabilities(draft.scores)
        predicted = expected_emitted(probs, len(draft.tokens)) - 1.0
        self.ledger.drafts.append((len(draft.tokens), num_accepted, predicted))

    def on_step_end(self, timing: StepTiming, outputs: list[RequestOutput]) -> None:
        k_chosen = self._policy().stats.k_chosen
        extra = sum(k * (n - self.chosen.get(k, 0)) for k, n in k_chosen.items())
        seconds = dict(timing.seconds) | {"other": timing.other}
        sequences = rows = 0
        asked = False
        if (plan := timing.plan) is not None:
            sequences, rows = len(plan.seqs), plan.num_tokens
            # the proposer is asked when some sequence has draft slots (`drafting.propose`)
            proposer = self.engine.res.proposer
            asked = proposer is not None and any(p.reserved > 0 for p in plan.scheduled)
        self.ledger.steps.append(Step(seconds, sequences, rows, self.in_flight, extra, asked))


@contextmanager
def recording(engine: Engine, ledger: Ledger) -> Iterator[None]:
    """Times the parts of every `engine.step()` into `ledger` while active (see
    `engine/observer.py` for the parts)."""
    assert engine.res.policy is not None, "the ledger needs the adaptive policy's engine"
    observer = _LedgerObserver(engine, ledger)
    engine.observers.add(observer)
    try:
        yield
    finally:
        engine.observers.remove(observer)


@contextmanager
def payoff_off(engine: Engine, off: bool) -> Iterator[None]:
    """With `off`, the engine's policy runs with a payoff that never closes (and its own
    payoff back after)."""
    policy = engine.res.policy
    assert policy is not None
    kept = policy.payoff
    if off:
        policy.payoff = Payoff(min_steps=sys.maxsize)
    try:
        yield
    finally:
        policy.payoff = kept


def spread_lengths(ids: list[str], lo: int, hi: int, seed: int) -> dict[str, int]:
    """Per request, max_new_tokens evenly spread over lo..hi in an order fixed by `seed`: every
    side of a comparison gets the same lengths, and with lo < hi the requests do not finish in
    lockstep."""
    if lo == hi:
        return dict.fromkeys(ids, lo)
    order = np.random.default_rng(seed).permutation(len(ids))
    span = np.linspace(lo, hi, num=len(ids)).round().astype(int)
    return {ids[i]: int(span[j]) for j, i in enumerate(order)}


def _lengths(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    out = int(lo), int(hi or lo)
    if not 2 <= out[0] <= out[1]:
        raise argparse.ArgumentTypeError(f"expected LO-HI with 2 <= LO <= HI, got {text!r}")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = SpecConfig(speculate=args.n, proposer=args.proposer, policy="adaptive")
    config = EngineConfig(
        num_threads=args.threads,
        scheduler=SchedulerConfig(max_running_requests=args.concurrency),
        spec=spec,
    )
    engine = Engine(config)
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    lo, hi = args.lengths or (args.new_tokens, args.new_tokens)
    adaptive = Config(args.proposer, "adaptive", args.n)
    sides = [(Config("none", "static", 0), False, "N=0"), (adaptive, False, adaptive.label)]
    if args.compare_payoff:
        sides.append((adaptive, True, f"{adaptive.label}, payoff off"))
    cells: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        units = conversations(resolve_workload(workload, args.requests, args.seed))
        lengths = spread_lengths([i.id for u in units for i in u], lo, hi, args.seed)
        run_cell(engine, units[:2], adaptive, args.concurrency, params, lengths)  # warm-up
        for r in range(args.rounds):
            for side, off, label in sides if r % 2 == 0 else sides[::-1]:
                ledger = Ledger()
                with recording(engine, ledger), payoff_off(engine, off):
                    runs, wall, counted = run_cell(
                        engine, units, side, args.concurrency, params, lengths
                    )
                    payoff = engine.res.policy.payoff.table()  # type: ignore[union-attr]
                tokens = sum(len(x.tokens) for x in runs)
                cell = summarise(ledger, args.concurrency, tokens, wall)
                cell |= {"unpaid_steps": counted["unpaid_steps"], "payoff": payoff}
                cells.append({"workload": workload, "round": r, "side": label, **cell})
                print(f"{workload} round {r} {label}: {cell['tok_s']:.1f} tok/s", flush=True)
    return {"cells": cells}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spec_ledger", description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--proposer", default="hybrid")
    p.add_argument("--n", type=int, default=4, help="the adaptive side's cap")
    p.add_argument("--workloads", default="chat-creative,summarize")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--requests", type=int, default=48, help="requests a workload, through the slots"
    )
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument(
        "--lengths",
        type=_lengths,
        help="LO-HI: each request's max_new_tokens spread evenly over LO..HI (the same on both "
        "sides) instead of --new-tokens for all, so that N = 0 does not run in lockstep",
    )
    p.add_argument("--rounds", type=int, default=3, help="N = 0 and adaptive cells, alternating")
    p.add_argument(
        "--compare-payoff",
        action="store_true",
        help="a third side: the adaptive policy with a payoff that never closes",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.n < 1 or args.concurrency < 1 or args.requests < 1 or args.rounds < 1:
        p.error("need --n, --concurrency, --requests and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info("benchmarks.spec_ledger", argv)
    result = {"machine": info, "args": vars(args) | {"json": str(args.json)}, **run(args)}
    print(machine_lines(info) + "\n\n" + report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
