"""Gemma 3's sliding-window layers keep only their window (scheduler/window_blocks.py): the same
outputs as a cache of every position, with prefix-cache hits, speculation and preemption, on
a tiny Gemma 3 as a GGUF (block weights: a row's numbers do not depend on its step's shape)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.config import CacheConfig, EngineConfig
from specserve.engine.engine import Engine
from specserve.models.native_stack import NativeStack, python_layers
from specserve.request import SamplingParams
from specserve.scheduler.kv_blocks import blocks_for
from specserve.scheduler.window_blocks import window_pool_blocks
from tests.engine.helpers import assert_no_kv_held, make_engine, mixed_prompts, run_all
from tests.gguf_files import T, write_gguf
from tests.models.test_native_stack import native_calls
from tests.tiny import make_model_dir

# the tiny Gemma 3: window 8, every other layer sliding; 4-token blocks
LOOPY = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9, 10, 11, 9]]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gemma3")
    hf = make_model_dir(tmp / "hf", "gemma3")
    return write_gguf(hf, tmp / "gemma3.gguf", lambda _: T.Q8_0, arch="gemma3")


def prompts() -> list[list[int]]:
    # long prompts (5-12 windows) and repeats of them: the repeats hit the prefix cache
    long = mixed_prompts(3, seed=11)
    return LOOPY + long + [[*p, 17, 18] for p in long] + LOOPY


def greedy(n: int = 40) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def run_batches(engine: Engine, batches: list[list[list[int]]]) -> list[list[int]]:
    """One batch after another: the later ones find the earlier ones' prefixes cached."""
    return [out for batch in batches for out in run_all(engine, batch, greedy())]


def test_window_pool_gives_the_same_outputs(gemma: Path) -> None:
    batches = [prompts()[:5], prompts()[5:]]
    whole = make_engine(gemma, num_blocks=256, window_pool=False, speculate=3, proposer="ngram")
    want = run_batches(whole, batches)
    assert whole.res.window is None

    engine = make_engine(gemma, num_blocks=256, speculate=3, proposer="ngram")
    assert run_batches(engine, batches) == want
    window = engine.res.window
    assert window is not None and window.window == 8
    # sequences held their window and their step's rows, not their context: at most the bound
    # for 5 running and a step of the longest prompt, under half of what their contexts span
    bound = window_pool_blocks(8, 4, 5, max(len(p) for p in batches[0]))
    contexts = sum(blocks_for(len(p) + 40, 4) for p in batches[0])
    assert 0 < window.peak_used < bound and window.peak_used < contexts / 2
    cache = engine.res.allocator.stats
    assert cache.hit_tokens > 0  # repeats started from cached blocks, window blocks included
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens
    assert_no_kv_held(engine)
    assert_no_kv_held(whole)


def test_native_decoder_runs_the_pools_as_python_does(
    gemma: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native decoder attends each layer through its kind's pool (the window tables for the
    sliding one): the Python layers' tokens, with drafts accepted and rejected."""
    batches = [prompts()[:5], prompts()[5:]]
    calls = native_calls(monkeypatch)
    engine = make_engine(gemma, num_blocks=256, speculate=3, proposer="ngram")
    assert isinstance(engine.model.native_stack, NativeStack) and engine.res.window is not None
    got = run_batches(engine, batches)
    steps = len(calls)
    assert steps > 0 and engine.stats.proposer.drafted_tokens > 0
    with python_layers():
        python = make_engine(gemma, num_blocks=256, speculate=3, proposer="ngram")
        want = run_batches(python, batches)
    assert len(calls) == steps  # none ran natively under python_layers
    assert got == want
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens


def test_window_pool_under_preemption(gemma: Path) -> None:
    batch = prompts()[:6]
    want = run_all(make_engine(gemma, num_blocks=256, window_pool=False), batch, greedy(48))
    small = make_engine(gemma, num_blocks=40)  # six sequences of ~60-110 tokens do not fit
    assert run_all(small, batch, greedy(48)) == want
    assert small.scheduler.num_preemptions > 0
    assert_no_kv_held(small)


def test_kv_pool_sized_by_layer_kind(gemma: Path) -> None:
    """The same bytes hold more tokens: only the full layers pay per token."""
    from specserve.engine.kv_sizing import KvKinds, kv_blocks_for
    from specserve.models.loader import resolve_model_dir
    from specserve.models.registry import build_model

    cpu = torch.device("cpu")
    model = build_model(resolve_model_dir(str(gemma)), cpu)
    sizes = {}
    for split in (True, False):
        config = EngineConfig(cache=CacheConfig(max_kv_bytes=4 << 20, window_pool=split))
        kinds = KvKinds.of(config, model, cpu)
        sizes[split] = kv_blocks_for(config, kinds, 0, max_model_len=4096)
    (split_blocks, window_blocks), (whole_blocks, none) = sizes[True], sizes[False]
    assert none == 0 and window_blocks > 0
    assert split_blocks > 1.5 * whole_blocks  # half the layers slide: close to twice


def test_a_prefix_hit_without_its_window_is_recomputed(gemma: Path) -> None:
    """A pool this small (two running, 16-token steps: 13 blocks) has evicted the window blocks
    of a prompt's last positions by the time its 40 outputs are out: the prompt again hits
    its full blocks but must recompute what its sliding layers no longer hold."""
    prompt = mixed_prompts(1, seed=12)[0][:60]
    kw = {"num_blocks": 256, "max_running": 2, "max_batch_tokens": 16}
    whole = make_engine(gemma, window_pool=False, **kw)  # type: ignore[arg-type]
    engine = make_engine(gemma, **kw)  # type: ignore[arg-type]
    assert engine.res.window is not None and engine.res.window.num_blocks == 13
    outputs = [
        run_all(e, [prompt], greedy()) + run_all(e, [prompt], greedy(12)) for e in (whole, engine)
    ]
    assert outputs[0] == outputs[1]
    hits = engine.res.allocator.stats.hit_tokens
    assert hits < whole.res.allocator.stats.hit_tokens  # the hit was cut short
    assert_no_kv_held(engine)


def test_info_shows_the_pool_by_layer_kind(gemma: Path) -> None:
    from specserve.engine.async_engine import AsyncEngine
    from specserve.server.app import create_app
    from specserve.server.settings import ServerSettings
    from tests import http
    from tests.server.test_isolation import ThreadServer

    config = EngineConfig(
        model=str(gemma), num_threads=1, cache=CacheConfig(max_kv_bytes=4 << 20, block_size=4)
    )
    with ThreadServer(
        create_app(AsyncEngine(Engine(config)), ServerSettings(model_id="gemma3"))
    ) as server:
        body = {"prompt": [5, 6, 7] * 10, "max_tokens": 20}
        assert http.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
        memory = http.get(server.url + "/info", timeout=30).json()["memory"]
    pool = memory["kv_window_pool"]
    assert pool["window"] == 8 and pool["layers"] == 1  # the tiny model: one layer of two slides
    assert pool["blocks_peak"] > 0 and pool["blocks_used"] == 0 and pool["blocks_attached"] > 0
    # the full layer: K and V of 2 heads of 16 per position, 4 positions a block, fp16
    assert memory["kv_cache_dtype"] == "float16"
    assert memory["kv_cache_bytes"] == pool["bytes"] + memory["kv_blocks"] * 4 * 2 * 2 * 16 * 2
