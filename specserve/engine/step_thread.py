"""How the engine's step thread runs (`AsyncEngine` starts it).

The engine should be built in the step thread (pass `AsyncEngine` a function that builds it):
OpenMP keeps a pool of worker threads per thread that runs parallel regions, and once the pools
hold more threads than there are cores libgomp stops letting idle workers spin, so every
parallel region then starts by waking a sleeping thread. Measured on 2 cores: the same
engine, built in the main thread and stepped in another, decoded ~40 tok/s against ~85 built
and stepped in one thread. So one thread runs every multi-threaded region, and the server's
other threads keep torch at one thread.

The step thread allocates from glibc's main malloc arena, like a single-threaded program
(`one_malloc_arena`, set before the thread starts). Measured on 2 cores, 16 requests over HTTP
against the same engine stepped in the benchmark's main thread, interleaved
(benchmarks/bench_serving.py, `MALLOC_ARENA_MAX=1` against the default, two runs each):
0.86-0.88x streaming and 0.87-0.93x non-streaming by default, 0.95x and 0.95-0.96x with one
arena. Why is not established: an engine stepped in a thread of a plain process, no server,
decodes as fast and takes as many page faults with one arena as without.
"""

from __future__ import annotations

import ctypes
import os

import torch

M_ARENA_MAX = -8  # glibc's mallopt parameter: how many malloc arenas the process may make


def one_malloc_arena() -> bool:
    """Have threads started from now on allocate from glibc's main arena (see the module
    docstring). False where the C library has no such setting (not glibc)."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False


def compute_takes_every_core() -> bool:
    """The compute threads take every core this process may run on: the step thread then
    keeps the event loop's work between steps (`AsyncEngine`)."""
    return torch.get_num_threads() >= len(os.sched_getaffinity(0))
