"""What every benchmark report records about the run: machine, versions, commit, command;
tables."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch


def git_commit(where: Path = Path(__file__).parent) -> str | None:
    """The commit of the checkout `where` is in, "+dirty" when tracked files differ from it;
    None outside a git checkout. docs/benchmarks.md quotes it beside every number."""
    try:
        head = _git(where, "rev-parse", "--short", "HEAD")
        dirty = _git(where, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def _git(where: Path, *args: str) -> str:
    run = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, check=True)
    return run.stdout.strip()


def machine_info(module: str, argv: Sequence[str]) -> dict[str, Any]:
    """Date, CPU (the q8 kernels it runs, the kernel's THP mode), library versions, load, the
    commit and the exact command (`python -m module argv`)."""
    import transformers

    from specserve.kernels import ggml
    from specserve.models.huge_pages import thp_mode

    cpu = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "q8_kernels": ggml.q8_path() if ggml.library() is not None else None,
        "transparent_huge_pages": thp_mode(),
        "loadavg_1m": os.getloadavg()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "commit": git_commit(),
        "command": f"python -m {module} {shlex.join(argv)}".strip(),
    }


def machine_lines(info: dict[str, Any]) -> str:
    return (
        f"- date: {info['date']}\n- CPU: {info['cpu']} ({info['cpu_count']} logical cores, "
        f"q8 kernels {info.get('q8_kernels')}, transparent huge pages "
        f"{info.get('transparent_huge_pages')}), 1-min load at start {info['loadavg_1m']:.2f}\n"
        f"- torch {info['torch']}, transformers {info['transformers']}, "
        f"Python {info['python']}\n- commit: {info.get('commit')}\n"
        f"- command: `{info['command']}`"
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
