"""This process's resident memory, as the engine benchmark reports it (Linux /proc)."""

from __future__ import annotations

import resource


def peak_rss_mib() -> float:
    """Peak RSS since start or since the last `reset_rss_peak`."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def status_mib(field: str) -> float:
    """A size field of /proc/self/status (VmRSS, VmHWM, ...) in MiB."""
    with open("/proc/self/status", encoding="utf-8") as f:
        line = next(ln for ln in f if ln.startswith(f"{field}:"))
    return int(line.split()[1]) / 1024


def reset_rss_peak() -> None:
    """Restart the peak (VmHWM = ru_maxrss) from the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
        f.write("5")
