"""`specserve bench`'s flags: the target server, the sweep, generation and judgement."""

from __future__ import annotations

from typing import Any

from specserve.bench.workloads import BUILDERS

DEFAULT_URL = "http://127.0.0.1:8080"


def add_target_args(target: Any) -> None:
    target.add_argument("--url", default=DEFAULT_URL, help=f"server to load ({DEFAULT_URL})")
    target.add_argument(
        "--launch",
        metavar="CMD",
        help="start CMD once per N (appending "
        "--port P --speculate N unless CMD has {port} / {speculate}) and load it",
    )
    target.add_argument(
        "--launch-timeout",
        type=float,
        default=300.0,
        help="seconds a launched server gets to answer /health (default 300)",
    )
    target.add_argument(
        "--model",
        help="the server's --model, to fingerprint the profile when "
        "/info does not report fingerprints (default: taken from /info)",
    )
    target.add_argument("--draft-model", help="the server's --draft-model, likewise")
    target.add_argument("--api-key", help="bearer token, if the server requires one")
    target.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="repeatable: a header on every request (a fleet routes by them)",
    )
    target.add_argument(
        "--pool",
        help="a fleet's pool to load: sends x-specserve-pool and reads that pool's /info "
        "and /metrics",
    )


def add_sweep_args(sweep: Any) -> None:
    sweep.add_argument(
        "--workload",
        action="append",
        metavar="NAME|FILE.jsonl",
        help=f"repeatable; names: {', '.join(BUILDERS)} (default: all)",
    )
    sweep.add_argument(
        "--speculate",
        type=parse_ints,
        metavar="N,N,...",
        help="per-request N values; 0 is always added (default: 0 and the server's N)",
    )
    loads = sweep.add_mutually_exclusive_group()
    loads.add_argument(
        "--concurrency",
        type=parse_ints,
        default=[1, 4, 16],
        metavar="C,C,...",
        help="closed loop: requests in flight (default 1,4,16)",
    )
    loads.add_argument(
        "--request-rate",
        type=parse_floats,
        metavar="R,R,...",
        help="open loop: Poisson arrivals, requests/s",
    )
    stop = sweep.add_mutually_exclusive_group()
    stop.add_argument("--num-requests", type=int, help="requests per cell (default 16)")
    stop.add_argument("--duration", type=float, help="seconds of sending per cell")
    sweep.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unrecorded requests per workload per server before its cells (default 1)",
    )


def add_judge_args(gen: Any, judge: Any) -> None:
    gen.add_argument("--max-new-tokens", type=int, default=128, help="(default 128)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--seed", type=int, default=0, help="request i of a cell uses seed + i")
    gen.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
    gen.add_argument("--request-timeout", type=float, default=600.0, help="seconds (default 600)")
    judge.add_argument("--slo-ttft", type=float, default=2.0, help="seconds (default 2.0)")
    judge.add_argument(
        "--slo-itl",
        type=float,
        default=0.1,
        help="seconds per token, a request's mean (default 0.1)",
    )
    judge.add_argument(
        "--min-gain",
        type=float,
        default=0.02,
        help="N must beat N=0's goodput by this fraction to be recommended (default 0.02)",
    )
    judge.add_argument(
        "--contention-tol",
        type=float,
        default=0.02,
        help="relative change that counts for the contention flag (default 0.02)",
    )


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]
