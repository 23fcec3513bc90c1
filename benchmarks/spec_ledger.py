"""Where a speculating step's time goes at some concurrency, against N = 0, in process.

The adaptive policy weighs each extra verified row against the forward pass it lengthens
(`runner/cost.py`); the rest of what speculation costs a step (proposing, choosing the
prefixes, verifying and committing more tokens) is outside that model. This runs one engine
with the given proposer, its cells alternating between N = 0 and the adaptive policy at N
(`spec_cells.run_cell`: the requests through `--concurrency` slots, each cell from an empty
prefix cache and suffix index), and splits every step's wall time into

    propose (`engine.drafting.propose`), decide (`keep_prefixes`), forward (`ModelRunner.run`),
    verify (`Engine._verify_and_commit`: sampling, acceptance, commits, the proposer's sync),
    other (scheduling and the rest of `Engine.step`),

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
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

import specserve.engine.engine as engine_module
from benchmarks.ledger_report import PARTS, Ledger, Step, report, summarise
from benchmarks.machine import machine_info, machine_lines
from benchmarks.spec_bench import conversations
from benchmarks.spec_cells import Config, run_cell
from specserve.bench.workloads import resolve_workload
from specserve.config import EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.request import SamplingParams
from specserve.speculation.payoff import Payoff
from specserve.speculation.policy import expected_emitted
from specserve.speculation.proposer import Draft


def _timed(parts: dict[str, float], part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding the seconds each call takes to parts[part]."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[part] = parts.get(part, 0.0) + time.perf_counter() - started

    return timed


def _ledger_step(
    engine: Engine,
    ledger: Ledger,
    parts: dict[str, float],
    sizes: dict[str, int],
    step: Callable[[], Any],
) -> Callable[[], Any]:
    """`step`, appending a `Step` to `ledger` for each call.

    `parts` and `sizes` are filled during the call by the timed wrappers `recording`
    installs; they are cleared first so each `Step` holds its own step's, and whatever the named
    parts do not account for is "other". The extra rows are read off the policy's k counts
    before and after: each sequence-step that chose k adds k verified draft rows."""
    policy = engine.res.policy
    assert policy is not None

    def stepped() -> Any:
        parts.clear()
        sizes.clear()
        chosen = dict(policy.stats.k_chosen)
        in_flight = len(engine.scheduler.running) + len(engine.scheduler.waiting)
        started = time.perf_counter()
        outs = step()
        total = time.perf_counter() - started
        extra = sum(k * (n - chosen.get(k, 0)) for k, n in policy.stats.k_chosen.items())
        seconds = {p: parts.get(p, 0.0) for p in PARTS[:-1]}
        seconds["other"] = total - sum(seconds.values())
        fed = sizes.get("sequences", 0), sizes.get("rows", 0)
        asked = sizes.get("proposer_calls", 0) > 0
        ledger.steps.append(Step(seconds, *fed, in_flight, extra, asked))
        return outs

    return stepped


@contextmanager
def recording(engine: Engine, ledger: Ledger) -> Iterator[None]:
    """Times the parts of every `engine.step()` into `ledger` while active."""
    parts: dict[str, float] = {}
    sizes: dict[str, int] = {}
    policy = engine.res.policy
    assert policy is not None, "the ledger needs the adaptive policy's engine"
    propose, keep = engine_module.propose, engine_module.keep_prefixes
    run, verify, step, record = (
        engine.res.runner.run,
        engine._verify_and_commit,
        engine.step,
        policy.record,
    )

    def forward(items: Any) -> Any:
        sizes["sequences"] = len(items)
        sizes["rows"] = sum(len(item.token_ids) for item in items)
        return _timed(parts, "forward", run)(items)

    def recorded(draft: Draft, num_accepted: int) -> None:
        probs = policy.calibration.probabilities(draft.scores)
        predicted = expected_emitted(probs, len(draft.tokens)) - 1.0
        ledger.drafts.append((len(draft.tokens), num_accepted, predicted))
        record(draft, num_accepted)

    proposer = engine.res.proposer
    if proposer is not None:  # counts the calls that reach the proposer itself
        ask = proposer.propose

        def asked(*args: Any, **kwargs: Any) -> Any:
            sizes["proposer_calls"] = sizes.get("proposer_calls", 0) + 1
            return ask(*args, **kwargs)

        proposer.propose = asked  # type: ignore[method-assign]
    engine_module.propose = _timed(parts, "propose", propose)
    engine_module.keep_prefixes = _timed(parts, "decide", keep)
    engine.res.runner.run = forward  # type: ignore[method-assign]
    engine._verify_and_commit = _timed(parts, "verify", verify)  # type: ignore[method-assign]
    engine.step = _ledger_step(engine, ledger, parts, sizes, step)  # type: ignore[method-assign]
    policy.record = recorded  # type: ignore[method-assign]
    try:
        yield
    finally:
        engine_module.propose = propose
        engine_module.keep_prefixes = keep
        del engine.res.runner.run, engine._verify_and_commit, engine.step, policy.record
        if proposer is not None:
            del proposer.propose


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
