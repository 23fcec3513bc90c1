"""Why some batch-1 decode steps run slow: each step's time beside how long this process's
threads waited for a CPU, and which other tasks on the machine ran during it.

The engine runs in this process (no server, nothing else of ours), one request at a time,
greedy, speculation off, EOS ignored. Around every step it reads the kernel's scheduler
statistics (`/proc/.../schedstat`: CPU time and run-queue wait, in ns) of each of this process's
threads and of every other task's leading thread (kernel threads included). A step counts as
slow above `--slow` times the median; for the slow ones the report gives the run-queue wait of
our threads and the tasks that took CPU time meanwhile. The compute threads' parallel regions
end at a barrier, so a thread that waits for a CPU holds up the whole step: where slow steps
line up with waits, the tail is the machine's, not the engine's. Python's garbage collections
are timed too (`gc.callbacks`): they stall the step in this thread; `--freeze-heap` first
freezes what loading left alive, as `specserve serve` does. The reads happen between
steps, outside the timed part; a task's other threads (beside its leading one) are not read.

Usage (repo root): python -m benchmarks.step_stalls [--threads 2] [--requests 8]
    [--new-tokens 128] [--slow 1.5] [--freeze-heap] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_serving import PROMPTS, render
from benchmarks.machine import machine_info, machine_lines


def _schedstat(path: str) -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on a run queue) of one task, or None once it has gone."""
    try:
        run, wait, _ = Path(path, "schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(run), int(wait)


def own_wait_ns() -> int:
    """Run-queue wait of every thread of this process, summed."""
    stats = (_schedstat(f"/proc/self/task/{t}") for t in os.listdir("/proc/self/task"))
    return sum(s[1] for s in stats if s is not None)


def others_cpu_ns() -> dict[str, int]:
    """CPU time of every other task's leading thread, by 'name[pid]'."""
    me, out = str(os.getpid()), {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != me and (s := _schedstat(f"/proc/{pid}")) is not None:
            try:
                out[f"{Path(f'/proc/{pid}/comm').read_text().strip()}[{pid}]"] = s[0]
            except OSError:
                continue
    return out


@dataclass
class Step:
    ms: float
    wait_ms: float  # our threads' run-queue wait during the step
    others: dict[str, float] = field(default_factory=dict)  # other tasks' CPU ms during it
    gc_ms: float = 0.0  # Python's garbage collections during it
    request: int = 0  # which request (in order) the step decoded for
    position: int = 0  # its decode step within that request (0: the first after prefill)


class GcClock:
    """Milliseconds Python's garbage collector ran since the last `take()` (gc.callbacks)."""

    def __init__(self) -> None:
        self._ms, self._started = 0.0, 0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self._ms += (time.perf_counter_ns() - self._started) / 1e6

    def take(self) -> float:
        ms, self._ms = self._ms, 0.0
        return ms

    def close(self) -> None:
        gc.callbacks.remove(self._note)


def run_steps(threads: int, requests: int, new_tokens: int, freeze: bool) -> list[Step]:
    """Decode steps (the first of each request, its prefill, left out), each with its stalls.
    `freeze`: the heap alive after loading is frozen first, as `specserve serve` does."""
    import torch

    from specserve.config import CacheConfig, EngineConfig, SpecConfig
    from specserve.engine.engine import Engine
    from specserve.request import SamplingParams

    torch.set_num_threads(threads)
    config = EngineConfig(
        num_threads=threads, spec=SpecConfig(speculate=0), cache=CacheConfig(prefix_caching=False)
    )
    engine = Engine(config)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0)
    texts, steps = render(PROMPTS), []
    if freeze:
        from specserve.server.startup import freeze_startup_heap

        freeze_startup_heap()
    clock = GcClock()
    for i in range(requests):
        engine.add_request(texts[i % len(texts)], params)
        prefill, position = True, 0
        while engine.has_work():
            wait0, others0 = own_wait_ns(), others_cpu_ns()
            clock.take()
            start = time.perf_counter_ns()
            engine.step()
            ms = (time.perf_counter_ns() - start) / 1e6
            gc_ms, wait, others = clock.take(), own_wait_ns() - wait0, others_cpu_ns()
            ran = {k: (v - others0[k]) / 1e6 for k, v in others.items() if v > others0.get(k, v)}
            if not prefill:
                steps.append(Step(ms, wait / 1e6, ran, gc_ms, i, position))
                position += 1
            prefill = False
    clock.close()
    return steps


def summary(steps: list[Step], slow_factor: float) -> dict[str, Any]:
    times = sorted(s.ms for s in steps)
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
    slow = [s for s in steps if s.ms > slow_factor * p50]
    waited = [s for s in slow if s.wait_ms >= 0.1]
    undisturbed = sorted(s.ms for s in steps if s.wait_ms < 0.1)
    ran: Counter[str] = Counter()
    for s in slow:
        ran.update(s.others)
    return {
        "steps": len(steps),
        "p50_ms": p50,
        "p99_ms": p99,
        "p99_over_p50": p99 / p50,
        "slow_factor": slow_factor,
        "slow_steps": len(slow),
        "slow_steps_with_wait": len(waited),
        "slow_steps_with_gc": sum(s.gc_ms >= 0.1 for s in slow),
        "gc_ms_total": sum(s.gc_ms for s in steps),
        "gc_ms_max": max(s.gc_ms for s in steps),
        "mean_wait_ms_slow": statistics.fmean(s.wait_ms for s in slow) if slow else 0.0,
        "mean_wait_ms_other": statistics.fmean(s.wait_ms for s in steps if s not in slow),
        "steps_without_wait": len(undisturbed),
        "p99_over_p50_without_wait": undisturbed[int(len(undisturbed) * 0.99)] / p50,
        "cpu_ms_of_others_in_slow_steps": dict(ran.most_common(6)),
        "median_ms_by_position_of_16": _median_range(steps, lambda s: s.position // 16),
        "median_ms_by_request": _median_range(steps, lambda s: s.request),
    }


def _median_range(steps: list[Step], key: Callable[[Step], int]) -> tuple[float, float]:
    """(lowest, highest) median step time over the groups `key` makes: whether slow steps
    gather at some position in a request, or in some requests (the machine's speed drifting)."""
    groups: dict[int, list[float]] = {}
    for s in steps:
        groups.setdefault(key(s), []).append(s.ms)
    medians = [statistics.median(v) for v in groups.values()]
    return min(medians), max(medians)


def report(info: dict[str, Any], summ: dict[str, Any], steps: list[Step]) -> str:
    slow_factor = summ["slow_factor"]
    lines = [
        f"## step_stalls: batch-1 decode steps in process and the CPU waits beside them\n\n"
        f"{machine_lines(info)}\n",
        "| steps | p50 ms | p99 ms | p99 / p50 | slow (> "
        f"{slow_factor}x p50) | slow with >= 0.1 ms waiting for a CPU | mean wait, slow / "
        "other steps (ms) | p99 / p50 of the steps that did not wait |",
        "|---|---|---|---|---|---|---|---|",
        f"| {summ['steps']} | {summ['p50_ms']:.2f} | {summ['p99_ms']:.2f} | "
        f"{summ['p99_over_p50']:.2f} | {summ['slow_steps']} | {summ['slow_steps_with_wait']} | "
        f"{summ['mean_wait_ms_slow']:.2f} / {summ['mean_wait_ms_other']:.3f} | "
        f"{summ['p99_over_p50_without_wait']:.2f} |",
        "\nOther tasks' CPU time during the slow steps (ms, most first): "
        + ", ".join(f"{k} {v:.1f}" for k, v in summ["cpu_ms_of_others_in_slow_steps"].items()),
        f"\nGarbage collections: {summ['gc_ms_total']:.1f} ms over all steps, the longest "
        f"{summ['gc_ms_max']:.2f} ms; slow steps with >= 0.1 ms of them: "
        f"{summ['slow_steps_with_gc']}",
        "\nMedian step time per 16 positions within a request: {:.2f}-{:.2f} ms; per request: "
        "{:.2f}-{:.2f} ms".format(
            *summ["median_ms_by_position_of_16"], *summ["median_ms_by_request"]
        ),
        "\n| slow step | ms | our threads' wait (ms) | garbage collection (ms) | others that ran "
        "(ms) |",
        "|---|---|---|---|---|",
    ]
    for i, s in enumerate(steps):
        if s.ms > slow_factor * summ["p50_ms"]:
            ran = ", ".join(f"{k} {v:.2f}" for k, v in Counter(s.others).most_common())
            lines.append(f"| {i} | {s.ms:.2f} | {s.wait_ms:.2f} | {s.gc_ms:.2f} | {ran or '-'} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--slow", type=float, default=1.5, help="a step is slow above this x p50")
    p.add_argument(
        "--freeze-heap",
        action="store_true",
        help="freeze what is alive after loading out of the garbage collector's reach first, "
        "as `specserve serve` does",
    )
    p.add_argument("--json", type=Path, help="write the summary and every step here")
    args = p.parse_args()
    info = machine_info("benchmarks.step_stalls", sys.argv[1:])
    steps = run_steps(args.threads, args.requests, args.new_tokens, args.freeze_heap)
    summ = summary(steps, args.slow)
    print(report(info, summ, steps))
    if args.json:
        doc = {"machine": info, "summary": summ, "steps": [asdict(s) for s in steps]}
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
