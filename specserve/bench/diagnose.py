"""`specserve diagnose --url URL`: what a running deployment is limited by, with the numbers.

For a fleet (its /info lists pools) every pool is judged on its own series, with its replicas'
batches added up.

It scrapes /metrics `--samples` times over `--interval` seconds (counters and histograms are
differenced between the first and last scrape, gauges averaged) and reads /info. With no
requests finishing in the window, it judges the totals since the server started instead.

Verdicts, first match wins:

1. capacity-bound: KV blocks >= 90% used, or preemptions, or 429s in the window;
2. throughput-bound: the batch is saturated (mean running >= 90% of the server's running
   limit, when /info reports one), or ITL misses its target at a batch above `--modest-batch`;
3. queue-bound: mean queue time is at least half of mean TTFT (or, without a queue histogram,
   requests are waiting on average) while the batch is not saturated;
4. latency-bound: ITL misses its target at a modest batch: the decode path itself is slow;
5. within targets.

For each it says whether speculation helps or hurts in that state.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from specserve.bench.bench_args import DEFAULT_URL

if TYPE_CHECKING:
    import httpx

Flat = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str) -> Flat:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def total(flat: Flat, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in flat.items() if n == name and want <= ls)


@dataclass(frozen=True)
class Reading:
    """What the window shows. Means are None where nothing was observed."""

    window_s: float | None  # None: totals since start
    finished: float  # successful requests
    rejected_429: float
    queue_s: float | None
    ttft_s: float | None
    itl_s: float | None
    batch: float  # mean running sequences
    waiting: float  # mean waiting requests
    kv_used: float  # fraction of KV blocks in use (mean)
    preemptions: float
    drafted: float
    accepted: float
    drafts: float  # sequence-steps that verified drafts
    spec_steps: float
    steps: float
    speculate: int  # the server's N
    max_running: int | None


def _mean(d: Flat, name: str) -> float | None:
    count = total(d, f"{name}_count")
    return total(d, f"{name}_sum") / count if count else None


def reading(scrapes: Sequence[Flat], info: dict[str, Any], window_s: float) -> Reading:
    first, last = scrapes[0], scrapes[-1]
    delta = {k: v - first.get(k, 0.0) for k, v in last.items()}
    finished = total(delta, "specserve_requests_total", outcome="success")
    d, window = (delta, window_s) if finished and len(scrapes) > 1 else (last, None)
    gauges = [
        (
            total(s, "specserve_batch_size"),
            total(s, "specserve_queue_size"),
            total(s, "specserve_kv_cache_blocks_used")
            / max(total(s, "specserve_kv_cache_blocks"), 1.0),
        )
        for s in scrapes
    ]
    batch, waiting, kv = (sum(g[i] for g in gauges) / len(gauges) for i in range(3))
    return Reading(
        window_s=window,
        finished=total(d, "specserve_requests_total", outcome="success"),
        rejected_429=total(d, "specserve_requests_total", outcome="overloaded"),
        queue_s=_mean(d, "specserve_request_queue_seconds"),
        ttft_s=_mean(d, "specserve_time_to_first_token_seconds"),
        itl_s=_mean(d, "specserve_inter_token_latency_seconds"),
        batch=batch,
        waiting=waiting,
        kv_used=kv,
        preemptions=total(d, "specserve_preemptions_total"),
        drafted=total(d, "specserve_spec_drafted_tokens_total"),
        accepted=total(d, "specserve_spec_accepted_tokens_total"),
        drafts=total(d, "specserve_spec_drafts_total"),
        spec_steps=total(d, "specserve_engine_steps_total", speculation="on"),
        steps=total(d, "specserve_engine_steps_total"),
        speculate=int((info.get("speculation") or {}).get("speculate", 0)),
        max_running=info.get("max_running_requests"),
    )


@dataclass(frozen=True)
class Targets:
    itl_s: float = 0.1
    ttft_s: float = 2.0
    modest_batch: int = 4


@dataclass(frozen=True)
class Diagnosis:
    verdict: str
    evidence: list[str]
    speculation: str


def diagnose(r: Reading, t: Targets) -> Diagnosis:
    ev: list[str] = [
        f"mean batch {r.batch:.1f}"
        + (f" of {r.max_running}" if r.max_running else "")
        + f", {r.waiting:.1f} waiting, KV {r.kv_used:.0%} used"
    ]
    ev += [
        f"mean {name} {v * 1000:.0f} ms"
        for name, v in (("queue time", r.queue_s), ("TTFT", r.ttft_s), ("ITL", r.itl_s))
        if v is not None
    ]
    if not r.finished and not r.steps:
        return Diagnosis("idle", ["no requests have finished"], "nothing to judge yet")
    saturated = bool(r.max_running) and r.batch >= 0.9 * (r.max_running or 0)
    slow = r.itl_s is not None and r.itl_s > t.itl_s
    queued = r.queue_s / r.ttft_s >= 0.5 if r.queue_s is not None and r.ttft_s else r.waiting >= 1
    if r.kv_used >= 0.9 or r.preemptions or r.rejected_429:
        verdict = "capacity-bound"
        ev.append(f"{r.preemptions:.0f} preemptions, {r.rejected_429:.0f} requests got 429")
    elif saturated or (slow and r.batch > t.modest_batch):
        verdict = "throughput-bound"
    elif queued:
        verdict = "queue-bound"
    elif slow:
        verdict = "latency-bound"
    else:
        verdict = "within targets"
    if slow:
        ev.append(f"ITL above the {t.itl_s * 1000:.0f} ms target")
    return Diagnosis(verdict, ev, speculation_advice(r, verdict))


def speculation_advice(r: Reading, verdict: str) -> str:
    if r.speculate == 0 or not r.drafted:
        state = "speculation is off" if r.speculate == 0 else "no drafts were verified"
        if verdict == "latency-bound":
            return (
                f"{state}; it should help here: the batch is small, so verifying drafts is "
                "nearly free. Measure N with `specserve bench` and restart with --speculate N"
            )
        return f"{state}; keep it off in this state: the step is not bandwidth-bound"
    rate, per_step = r.accepted / r.drafted, r.accepted / max(r.drafts, 1.0)
    numbers = (
        f"acceptance {rate:.0%}, {per_step:.2f} accepted per drafting step, "
        f"{r.drafted - r.accepted:.0f} rejected draft tokens, speculation in "
        f"{r.spec_steps / max(r.steps, 1.0):.0%} of steps"
    )
    if verdict in ("capacity-bound", "throughput-bound", "queue-bound"):
        return (
            f"hurts: {numbers}. Rejected drafts take batch compute, step tokens and KV "
            "slots from waiting requests; gate it (--speculate-max-batch) or use "
            "--speculation-policy adaptive"
        )
    if per_step < 0.5:
        return f"barely pays: {numbers}. Try a lower N or another proposer"
    return f"helps: {numbers}; each drafting step emits {1 + per_step:.2f} tokens"


# -------------------------------------------------------------------------------------- CLI
def add_diagnose_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="what a running server is limited by",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", default=DEFAULT_URL, help=f"the server ({DEFAULT_URL})")
    p.add_argument("--interval", type=float, default=10.0, help="seconds to watch (default 10)")
    p.add_argument("--samples", type=int, default=5, help="scrapes over the interval (default 5)")
    p.add_argument("--slo-itl", type=float, default=0.1, help="ITL target, s (default 0.1)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT target, s (default 2.0)")
    p.add_argument("--modest-batch", type=int, default=4, help="largest 'modest' batch (4)")
    p.add_argument("--api-key", help="bearer token, if the server wants one for /info")
    p.add_argument("--json", action="store_true", help="print the reading and verdict as JSON")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=30) as client:
            info = client.get("/info").raise_for_status().json()
            scrapes, started = [], time.monotonic()
            for i in range(max(args.samples, 1)):
                if i:
                    time.sleep(args.interval / max(args.samples - 1, 1))
                scrapes.append(parse_metrics(client.get("/metrics").raise_for_status().text))
    except httpx.HTTPError as exc:
        print(f"error: cannot read {args.url}: {exc}", file=sys.stderr)
        return 2
    window = time.monotonic() - started
    targets = Targets(args.slo_itl, args.slo_ttft, args.modest_batch)
    judged = {
        name: (r := reading(flats, pool_info, window), diagnose(r, targets))
        for name, flats, pool_info in per_pool(scrapes, info)
    }
    if args.json:
        out = {n: {"reading": asdict(r), "diagnosis": asdict(d)} for n, (r, d) in judged.items()}
        print(json.dumps(out.get("", {"pools": out}), indent=1))
        return 0
    for name, (r, d) in judged.items():
        span = f"the last {r.window_s:.0f} s" if r.window_s else "totals since start"
        who = f"{args.url} pool {name}" if name else args.url
        model = info.get("model_id") or (info["pools"][name].get("engine") or {}).get("model_id")
        print(f"{who} ({model}, N={r.speculate}), {span}: {d.verdict}")
        for line in d.evidence:
            print(f"  - {line}")
        print(f"speculation: {d.speculation}")
    return 0


def per_pool(
    scrapes: list[Flat], info: dict[str, Any]
) -> list[tuple[str, list[Flat], dict[str, Any]]]:
    """[("", scrapes, info)] for a server; for a fleet, one entry per pool: its series and its
    engine's /info, with the running limit of all its replicas together."""
    if "pools" not in info:
        return [("", scrapes, info)]
    out = []
    for name, pool in info["pools"].items():
        mine = [{k: v for k, v in s.items() if ("pool", name) in k[1]} for s in scrapes]
        engine = dict(pool.get("engine") or {})
        if engine.get("max_running_requests"):
            engine["max_running_requests"] *= max(len(pool.get("replicas") or []), 1)
        out.append((name, mine, engine))
    return out


# ----------------------------------------------------------- counters around a bench cell
SPEC_COUNTERS = (
    "specserve_spec_drafts_total",
    "specserve_spec_drafted_tokens_total",
    "specserve_spec_accepted_tokens_total",
    "specserve_preemptions_total",
    "specserve_generated_tokens_total",
)


async def scrape_counters(
    client: httpx.AsyncClient, labels: dict[str, str] | None = None
) -> dict[str, float]:
    """Sums of the speculation counters in /metrics over the series carrying `labels` (a fleet
    pool's: {"pool": name}); {} if unavailable."""
    import httpx

    try:
        resp = await client.get("/metrics", timeout=30)
        resp.raise_for_status()
        flat = parse_metrics(resp.text)
    except (httpx.HTTPError, ValueError):
        return {}
    present = {name for name, _ in flat}
    return {name: total(flat, name, **(labels or {})) for name in SPEC_COUNTERS if name in present}


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}
