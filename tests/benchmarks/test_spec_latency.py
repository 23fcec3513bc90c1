"""spec_latency: first-token seconds split by prompt length, per side. Made-up runs, no model."""

from __future__ import annotations

from typing import Any

from benchmarks.spec_latency import latency_rows


def _run(n: int, prompt: int, total: float, decode: float, workload: str = "w") -> dict[str, Any]:
    proposer = "ngram" if n else "none"
    cell = {"workload": workload, "concurrency": 16, "proposer": proposer, "n": n}
    return cell | {"prompt_tokens": prompt, "total_s": total, "decode_s": decode}


def test_first_tokens_are_split_at_the_short_length_per_side() -> None:
    runs = [
        _run(4, 40, 3.0, 2.5),  # first token after 0.5 s
        _run(4, 60, 4.0, 2.0),  # 2.0 s
        _run(4, 900, 10.0, 4.0),  # 6.0 s
        _run(0, 40, 12.0, 3.0),  # 9.0 s
        _run(0, 900, 14.0, 5.0),  # 9.0 s
        _run(0, 40, 99.0, 1.0, workload="other"),
    ]
    assert latency_rows(runs, "w", short=100) == [
        ["16", "N=0", "2", "9.00 / 9.00", "9.00 / 9.00", "13.00"],
        ["16", "ngram N=4", "3", "1.25 / 2.00", "6.00 / 6.00", "5.67"],
    ]
    assert latency_rows(runs, "w", short=60)[1][3:5] == ["0.50 / 0.50", "4.00 / 6.00"]
