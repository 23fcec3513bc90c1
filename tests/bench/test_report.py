"""Bench maths on synthetic records with known answers (no server)."""

import json

import pytest

from specserve.bench import diagnose as dg
from specserve.bench import loadgen
from specserve.bench.loadgen import Budget
from specserve.bench.records import (
    Cell,
    CellKey,
    Mode,
    RequestRecord,
    cells_from_json,
    cells_to_json,
)
from specserve.bench.render import markdown, plot
from specserve.bench.report import (
    CellStats,
    Pcts,
    Slo,
    best_n,
    cell_stats,
    find_contention,
    itl_mean,
    meets_slo,
    percentile,
    recommend,
)

SLO = Slo(ttft_s=1.0, itl_s=0.1)


def rec(
    ttft: float = 0.5,
    tokens: int = 11,
    decode_s: float = 0.5,
    ok: bool = True,
    drafted: int | None = None,
    accepted: int | None = None,
    spec_steps: int | None = None,
) -> RequestRecord:
    """A completed request: `tokens` tokens, the first after `ttft`, the rest over `decode_s`."""
    return RequestRecord(
        "x",
        "generate_stream",
        0.0,
        ok=ok,
        status=200,
        ttft=ttft,
        decode_s=decode_s,
        e2e=ttft + decode_s,
        output_tokens=tokens,
        finish_reason="length" if ok else None,
        drafted=drafted,
        accepted=accepted,
        spec_steps=spec_steps,
    )


# ------------------------------------------------------------------------------- percentiles
def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)  # 1 + 0.9 * 3 = rank 2.7
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    assert Pcts.of([]) == Pcts(None, None, None)


def test_itl_is_the_mean_gap_after_the_first_token() -> None:
    assert itl_mean(rec(tokens=11, decode_s=0.5)) == pytest.approx(0.05)
    assert itl_mean(rec(tokens=1, decode_s=0.0)) is None


# ---------------------------------------------------------------------------------- goodput
@pytest.mark.parametrize(
    ("record", "met"),
    [
        (rec(ttft=1.0, tokens=11, decode_s=1.0), True),  # both exactly at the limit
        (rec(ttft=1.01), False),
        (rec(tokens=11, decode_s=1.01), False),  # ITL 0.101
        (rec(tokens=1, decode_s=0.0, ttft=0.2), True),  # no ITL: only TTFT counts
        (rec(ok=False), False),
        (RequestRecord("x", "chat", 0.0, ok=True, output_tokens=0), False),  # no token at all
    ],
)
def test_meets_slo(record: RequestRecord, met: bool) -> None:
    assert meets_slo(record, SLO) is met


def test_cell_stats_rates_goodput_and_acceptance() -> None:
    records = [
        rec(ttft=0.5, tokens=11, decode_s=0.5, drafted=10, accepted=6, spec_steps=5),  # meets
        rec(ttft=1.5, tokens=11, decode_s=0.5, drafted=10, accepted=4, spec_steps=5),  # TTFT
        rec(ttft=0.5, tokens=21, decode_s=3.0, drafted=20, accepted=10, spec_steps=10),  # ITL
        rec(ok=False, tokens=0),
    ]
    records[3].status, records[3].error = 422, "inputs: too long"
    s = cell_stats(Cell(CellKey("w", 2, "closed", 4), 4.0, records), SLO)
    assert (s.completed, s.failed, s.first_error) == (3, 1, "422: inputs: too long")
    assert s.tok_s == pytest.approx(43 / 4)
    assert s.req_s == pytest.approx(3 / 4)
    assert s.goodput == pytest.approx(1 / 4)
    assert s.acceptance == pytest.approx(20 / 40)
    assert s.accepted_len == pytest.approx(20 / 20)
    assert s.ttft.p50 == pytest.approx(0.5)
    assert s.itl.p50 == pytest.approx(0.05)  # ITLs 0.05, 0.05, 0.15
    assert s.in_flight == pytest.approx((1.0 + 2.0 + 3.5 + 1.0) / 4)


def test_accepted_length_falls_back_to_server_counters() -> None:
    records = [rec(drafted=8, accepted=6)]  # the route did not report spec_steps
    server = {"specserve_spec_accepted_tokens_total": 6.0, "specserve_spec_drafts_total": 4.0}
    s = cell_stats(Cell(CellKey("w", 2, "closed", 1), 1.0, records, server), SLO)
    assert s.accepted_len == pytest.approx(1.5)
    assert cell_stats(Cell(CellKey("w", 0, "closed", 1), 1.0, [rec()]), SLO).acceptance is None


# ------------------------------------------------------------------ contention, recommendation
def stat(
    n: int,
    load: float,
    goodput: float,
    tok_s: float = 100.0,
    itl: float = 0.05,
    workload: str = "w",
    mode: Mode = "closed",
    in_flight: float = 0.0,
) -> CellStats:
    p = Pcts(0.1, 0.2, 0.3)
    return CellStats(
        CellKey(workload, n, mode, load),
        5,
        0,
        10.0,
        p,
        Pcts(itl, itl, itl),
        p,
        None,
        tok_s,
        1.0,
        goodput,
        in_flight or load,
    )


def test_contention_needs_better_itl_and_worse_throughput() -> None:
    stats = [
        stat(0, 16, 1.0, tok_s=100, itl=0.050),
        stat(2, 16, 1.0, tok_s=90, itl=0.040),  # faster stream, less throughput: flagged
        stat(4, 16, 1.0, tok_s=110, itl=0.040),  # faster and more: fine
        stat(8, 16, 1.0, tok_s=99, itl=0.040),  # throughput within tolerance: fine
        stat(0, 1, 1.0, tok_s=50, itl=0.050),
        stat(2, 1, 1.0, tok_s=40, itl=0.060),  # slower and less: bad, but not contention
    ]
    [c] = find_contention(stats, tol=0.02)
    assert (c.load, c.speculate) == (16, 2)
    assert c.itl_ratio == pytest.approx(0.8)
    assert c.tok_s_ratio == pytest.approx(0.9)


def test_best_n_needs_a_gain_over_no_speculation() -> None:
    assert best_n({0: stat(0, 1, 1.0), 2: stat(2, 1, 1.5), 4: stat(4, 1, 1.5)}) == 2  # tie: small
    assert best_n({0: stat(0, 1, 1.0), 2: stat(2, 1, 1.01)}, min_gain=0.02) == 0
    assert best_n({0: stat(0, 1, 1.0), 2: stat(2, 1, 1.01)}, min_gain=0.0) == 2
    # No configuration met the SLO: tok/s decides.
    assert best_n({0: stat(0, 1, 0.0, tok_s=10), 2: stat(2, 1, 0.0, tok_s=20)}) == 2


def test_recommendation_gates_above_the_last_paying_load() -> None:
    stats = [
        stat(0, 1, 1.0),
        stat(2, 1, 1.8),
        stat(4, 1, 2.0),  # N=4 best
        stat(0, 4, 3.0),
        stat(2, 4, 4.0),
        stat(4, 4, 3.5),  # N=2 best
        stat(0, 16, 6.0),
        stat(2, 16, 5.0),
        stat(4, 16, 4.0),  # speculation hurts
    ]
    r = recommend(stats)["w"]
    assert r.best_by_load == {1: 4, 4: 2, 16: 0}
    assert r.gate_load == 4
    assert r.speculate_max_batch == 4
    # Normalised sums over loads 1 and 4: N=2: 0.9 + 1.0 = 1.9; N=4: 1.0 + 0.875 = 1.875.
    assert r.speculate == 2
    assert r.notes == []


def test_recommendation_edges() -> None:
    always = recommend([stat(0, 1, 1.0), stat(2, 1, 2.0), stat(0, 8, 1.0), stat(2, 8, 2.0)])
    assert (always["w"].speculate, always["w"].gate_load, always["w"].speculate_max_batch) == (
        2,
        None,
        None,
    )
    never = recommend([stat(0, 1, 2.0), stat(2, 1, 1.0), stat(0, 8, 1.0), stat(2, 8, 2.0)])
    assert (never["w"].speculate, never["w"].speculate_max_batch) == (0, None)
    assert any("again above" in note for note in never["w"].notes)
    open_loop = recommend(
        [
            stat(0, 0.5, 1.0, mode="open", in_flight=1.4),
            stat(2, 0.5, 2.0, mode="open", in_flight=2.6),
            stat(0, 2.0, 2.0, mode="open", in_flight=5.0),
            stat(2, 2.0, 1.0, mode="open"),
        ]
    )
    assert open_loop["w"].speculate_max_batch == 3  # round(mean in flight of the paying cell)


def test_markdown_and_plots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    stats = [stat(0, 1, 1.0, itl=0.05, tok_s=100), stat(2, 1, 1.2, itl=0.04, tok_s=90)]
    recs = recommend(stats)
    text = markdown(stats, SLO, recs, find_contention(stats), {"command": "specserve bench"})
    assert "⚠ contention" in text and "x0.90, x0.80" in text
    assert "`--speculate 2`" in text and "paid at every measured load" in text
    off = [stat(0, 1, 1.0), stat(2, 1, 0.5)]
    text = markdown(off, SLO, recommend(off), [], {})
    assert "`--speculate 0`; gate: none: speculation is off" in text
    names = plot(stats, tmp_path)
    assert sorted(names) == ["w-goodput.png", "w-itl.png", "w-throughput.png"]
    assert all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in names)


# ------------------------------------------------------------------------------ load generator
def test_request_bodies_carry_the_speculate_cap() -> None:
    from specserve.bench.workload_items import ChatMessage, WorkloadItem

    s = loadgen.GenSettings(max_new_tokens=8, temperature=0.7, seed=10)
    path, body = loadgen.request_for(WorkloadItem("a", "w", prompt="hi"), 2, s, index=3)
    assert path == "/generate_stream"
    want = {"speculate": 2, "seed": 13, "do_sample": True, "details": True, "max_new_tokens": 8}
    assert body["parameters"].items() >= want.items()
    chat = WorkloadItem("b", "w", messages=(ChatMessage("user", "hi"),))
    path, body = loadgen.request_for(chat, 0, loadgen.GenSettings(), index=0)
    assert path == "/v1/chat/completions"
    assert body["speculate"] == 0 and body["stream"] and body["stream_options"]["include_usage"]


def test_budget_and_results_round_trip() -> None:
    assert Budget(num_requests=2).allows(1, 1e9) and not Budget(num_requests=2).allows(2, 0)
    assert not Budget(duration_s=1.0).allows(10**6, 1.0)
    with pytest.raises(ValueError):
        Budget()
    cells = [Cell(CellKey("w", 2, "open", 0.5), 3.0, [rec(drafted=1, accepted=1)], {"a": 1.0})]
    raw = json.loads(json.dumps(cells_to_json(cells)))
    assert cells_from_json(raw) == cells


# ---------------------------------------------------------------------------------- diagnose
def reading(**kw: object) -> dg.Reading:
    base: dict[str, object] = dict(
        window_s=10.0,
        finished=10,
        rejected_429=0,
        queue_s=0.01,
        ttft_s=0.2,
        itl_s=0.05,
        batch=2.0,
        waiting=0.0,
        kv_used=0.2,
        preemptions=0,
        drafted=100,
        accepted=60,
        drafts=40,
        spec_steps=50,
        steps=100,
        speculate=4,
        max_running=64,
    )
    return dg.Reading(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "verdict"),
    [
        ({}, "within targets"),
        ({"kv_used": 0.95}, "capacity-bound"),
        ({"rejected_429": 3}, "capacity-bound"),
        ({"batch": 60.0}, "throughput-bound"),
        ({"itl_s": 0.2, "batch": 16.0}, "throughput-bound"),
        ({"queue_s": 0.5, "ttft_s": 0.6}, "queue-bound"),
        ({"itl_s": 0.2}, "latency-bound"),
        ({"finished": 0, "steps": 0}, "idle"),
    ],
)
def test_diagnosis_verdicts(change: dict[str, object], verdict: str) -> None:
    assert dg.diagnose(reading(**change), dg.Targets(itl_s=0.1)).verdict == verdict


def test_diagnosis_speculation_advice() -> None:
    assert dg.diagnose(reading(batch=60.0), dg.Targets()).speculation.startswith("hurts")
    assert dg.diagnose(reading(itl_s=0.2), dg.Targets()).speculation.startswith("helps")
    off = dg.diagnose(reading(itl_s=0.2, speculate=0, drafted=0), dg.Targets()).speculation
    assert "should help" in off


def test_reading_differences_two_scrapes() -> None:
    def scrape(ok: int, drafted: int, batch: int) -> dg.Flat:
        return dg.parse_metrics(
            f'specserve_requests_total{{route="/generate",outcome="success"}} {ok}\n'
            f'specserve_spec_drafted_tokens_total{{proposer="ngram"}} {drafted}\n'
            f"specserve_batch_size {batch}\nspecserve_kv_cache_blocks 10\n"
            "specserve_kv_cache_blocks_used 5\n"
        )

    r = dg.reading([scrape(5, 100, 2), scrape(9, 160, 4)], {"speculation": {"speculate": 2}}, 3.0)
    assert (r.finished, r.drafted, r.batch, r.kv_used, r.window_s) == (4, 60, 3.0, 0.5, 3.0)
