"""step_stalls' summary: which slow steps waited for a CPU, and what ran beside them."""

from __future__ import annotations

import gc
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks.step_stalls import GcClock, Step, others_cpu_ns, own_wait_ns, summary


def test_summary_counts_slow_steps_and_the_waits_beside_them() -> None:
    steps = [Step(4.0, 0.0) for _ in range(97)] + [
        Step(9.0, 4.5, {"kdamond.0[81]": 4.4}),  # slow, waited
        Step(7.0, 0.0),  # slow, did not wait
        Step(6.5, 2.0, {"kdamond.0[81]": 2.1, "rcu[15]": 0.1}),  # slow, waited
    ]
    s = summary(steps, slow_factor=1.5)
    assert s["steps"] == 100 and s["p50_ms"] == 4.0
    assert s["slow_steps"] == 3 and s["slow_steps_with_wait"] == 2
    assert s["mean_wait_ms_slow"] == pytest.approx(6.5 / 3)
    assert s["steps_without_wait"] == 98
    assert s["p99_over_p50_without_wait"] == pytest.approx(7.0 / 4.0)
    assert s["cpu_ms_of_others_in_slow_steps"] == {"kdamond.0[81]": 6.5, "rcu[15]": 0.1}


@pytest.mark.skipif(
    not Path("/proc/self/schedstat").exists(), reason="this kernel keeps no schedstat"
)
def test_schedstat_reads_our_threads_and_the_other_tasks() -> None:
    assert isinstance(own_wait_ns(), int)
    child = subprocess.Popen(["sleep", "30"])  # another task, whatever else this machine runs
    try:
        others = others_cpu_ns()
    finally:
        child.kill()
        child.wait()
    assert any(name.endswith(f"[{child.pid}]") for name in others)  # named once it execs
    assert not any(name.endswith(f"[{os.getpid()}]") for name in others)


def test_gc_clock_times_collections_and_resets() -> None:
    clock = GcClock()
    try:
        clock.take()
        gc.collect()
        assert clock.take() > 0.0
        assert clock.take() == 0.0
    finally:
        clock.close()
    assert clock._note not in gc.callbacks


def test_summary_gives_the_spread_of_medians_by_position_and_by_request() -> None:
    steps = [Step(4.0 + r, 0.0, request=r, position=p) for r in range(2) for p in range(32)]
    s = summary(steps, slow_factor=1.5)
    assert s["median_ms_by_request"] == (4.0, 5.0)  # each request's own speed
    assert s["median_ms_by_position_of_16"] == (4.5, 4.5)  # positions alike
