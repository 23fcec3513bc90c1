"""The speculation policy seen from outside (an adaptive server with the suffix proposer): /info
shows the policy, gates, the profiled and live cost, the calibration and the suffix index;
/metrics exports the chosen k, gated steps, predicted speedup and calibration, and they move;
POST /reset_suffix_cache empties the cross-request index."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specserve.server.info import speculation_info
from specserve.speculation.objective import Rated
from tests import http
from tests.engine.helpers import make_engine
from tests.server.conftest import Server, idle, start_server, wait_for
from tests.server.test_metrics import COPY_PROMPT

K_COUNT = "specserve_spec_k_chosen_count"
GATED = 'specserve_spec_gated_steps_total{reason="max_batch"}'
SPEEDUP = "specserve_spec_predicted_speedup"


@pytest.fixture(scope="module")
def adaptive_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("logs") / "adaptive-server.log"
    flags = ["--model", str(tiny_model), "--speculate", "3", "--speculation-policy", "adaptive"]
    flags += ["--proposer", "suffix", "--suffix-cache-tokens", "5000"]
    flags += ["--speculate-max-batch", "1", "--max-running-requests", "4"]
    flags += ["--max-total-tokens", "4096", "--kv-cache-bytes", "16000000"]
    server = start_server(flags, log)
    yield server
    server.stop()


def test_info_shows_policy_gates_and_cost_curve(adaptive_server: Server) -> None:
    info = http.get(adaptive_server.url + "/info").json()
    spec = info["speculation"]
    assert spec["policy"] == "adaptive" and spec["speculate"] == 3
    assert spec["max_batch"] == 1 and spec["max_tokens"] is None
    assert info["max_running_requests"] == 4
    curve = spec["cost_curve"]
    assert len(curve["tokens"]) == len(curve["seconds"]) >= 2
    assert curve["tokens"] == sorted(curve["tokens"]) and curve["tokens"][-1] == 4 * (3 + 1)
    assert curve["seconds"] == sorted(curve["seconds"]) and curve["seconds"][0] > 0
    assert set(curve["fit"]) == {"intercept_s", "per_token_s"}
    assert curve["context"] >= 1 and curve["profile_s"] > 0
    assert {"per_seq_key_s", "per_row_key_s", "per_prefill_token_s"} <= set(curve)
    assert spec["proposer"] == "suffix" and spec["suffix_cache"]["capacity"] == 5000
    assert len(spec["calibration"]) == 10


def test_info_shows_live_cost_calibration_and_the_index_and_reset_empties_it(
    adaptive_server: Server,
) -> None:
    url = adaptive_server.url
    # "static": its drafts are verified whole, so the calibration is tested whatever the
    # adaptive policy would decide from this (busy) machine's step times.
    params = {"max_new_tokens": 24, "ignore_eos": True, "speculation_policy": "static"}
    body = {"inputs": COPY_PROMPT, "parameters": params}
    assert http.post(url + "/generate", json=body).status_code == 200
    spec = http.get(url + "/info").json()["speculation"]
    live = spec["live_cost"]
    assert live["decode_steps"] > 0 and live["cells"]
    cell = live["cells"][0]
    assert cell["steps"] > 0 and cell["observed_s"] > 0 and cell["profiled_s"] > 0
    assert sum(b["tested"] for b in spec["calibration"]) > 0
    assert spec["proposed_tokens"] > 0
    cache = spec["suffix_cache"]
    assert cache["tokens"] >= 24 and cache["requests"] >= 1 and cache["bytes"] > 0
    text = http.get(url + "/metrics").text
    assert "specserve_spec_calibration_tested_total" in text
    assert "specserve_spec_calibration_probability" in text
    reset = http.post(url + "/reset_suffix_cache")
    assert reset.status_code == 200 and reset.json() == {"reset": True}
    assert http.get(url + "/info").json()["speculation"]["suffix_cache"]["tokens"] == 0


def test_policy_metrics_parse(adaptive_server: Server) -> None:
    text = http.get(adaptive_server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["specserve_spec_k_chosen"].type == "histogram"
    buckets = [
        s.labels["le"]
        for s in families["specserve_spec_k_chosen"].samples
        if s.name.endswith("_bucket")
    ]
    assert buckets == ["0", "1", "2", "3", "+Inf"]
    assert families["specserve_spec_gated_steps"].type == "counter"
    reasons = {s.labels["reason"] for s in families["specserve_spec_gated_steps"].samples}
    assert reasons == {"max_batch", "max_tokens"}
    assert families[SPEEDUP].type == "gauge"


def test_policy_metrics_move_after_requests(adaptive_server: Server) -> None:
    url = adaptive_server.url
    before = idle(url)
    body = {"inputs": COPY_PROMPT, "parameters": {"max_new_tokens": 30, "ignore_eos": True}}
    assert http.post(url + "/generate", json=body).status_code == 200
    alone = idle(url)
    assert alone[K_COUNT] > before[K_COUNT]  # one count per sequence per decode step
    assert alone[GATED] == before[GATED]  # one running sequence: the max-batch gate stays open
    assert alone[SPEEDUP] >= 1.0  # k=0 is always a candidate, so the chosen k is never worse

    # A second request while a long one runs: two sequences exceed --speculate-max-batch 1.
    long_body = {"inputs": COPY_PROMPT, "parameters": {"max_new_tokens": 1500, "ignore_eos": True}}
    long_run = threading.Thread(
        target=http.post, args=(url + "/generate",), kwargs={"json": long_body, "timeout": 120}
    )
    long_run.start()
    wait_for(url, lambda m: m["specserve_batch_size"] == 1)
    assert http.post(url + "/generate", json=body, timeout=120).status_code == 200
    long_run.join()
    after = idle(url)
    assert after[GATED] > alone[GATED]
    assert (
        after['specserve_spec_k_chosen_bucket{le="0"}']
        > alone['specserve_spec_k_chosen_bucket{le="0"}']
    )


def test_info_and_metrics_show_the_payoff_of_proposing(adaptive_server: Server) -> None:
    url = adaptive_server.url
    body = {"inputs": COPY_PROMPT, "parameters": {"max_new_tokens": 30, "ignore_eos": True}}
    assert http.post(url + "/generate", json=body).status_code == 200
    spec = http.get(url + "/info").json()["speculation"]
    # whether this machine's step times let the policy propose is not this test's to decide:
    # the classes' content is checked in process below
    assert isinstance(spec["payoff"], list) and spec["unpaid_steps"] >= 0
    families = {f.name: f for f in text_string_to_metric_families(http.get(url + "/metrics").text)}
    assert families["specserve_spec_unpaid_steps"].type == "counter"


def test_info_reports_each_payoff_class(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, speculate=2, policy="adaptive")
    policy = engine.res.policy
    assert policy is not None
    policy.payoff.record(1, 1, 0.001, Rated([1], 2.0, 0.004, 1.0, 0.003))
    policy.payoff.record(5, 5, 0.002, Rated([], 5.0, 0.010, 5.0, 0.010))
    policy.stats.unpaid_steps = 7
    assert speculation_info(engine).proposer_call_ms is None  # no call measured yet
    policy.proposing.add(0.002)
    info = speculation_info(engine)
    assert info.unpaid_steps == 7 and info.proposer_call_ms == pytest.approx(2.0)
    assert [(c.min_batch, c.steps) for c in info.payoff] == [(1, 1), (4, 1)]
    assert info.payoff[0].paid == pytest.approx((2.0 / 0.005) / (1.0 / 0.003))
    assert info.payoff[1].paid == pytest.approx(0.010 / 0.012)
