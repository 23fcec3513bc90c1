"""Batch invariance on every GGUF type (#52): a tiny Llama written as a GGUF whose matrices are
all of one type (and a Q4_K_M-like mix), served in the q8 numerics from the file in place.
Greedy tokens and their log-probabilities are bit-identical with speculation on and off (the
"on" side drafted and had drafts rejected), with the prefix cache on and off, alone and in a
batch, and under preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from specserve.engine.engine import Engine
from specserve.kernels import ggml
from specserve.models.block_linear import block_kinds
from specserve.request import SamplingParams
from tests.engine.helpers import assert_no_kv_held, make_engine, mixed_prompts
from tests.gguf_files import T, write_gguf
from tests.kernels.expect import require
from tests.tiny import make_model_dir


def q4_k_m(name: str) -> GGMLQuantizationType:
    """llama-quantize's Q4_K_M, roughly: Q6_K for v, down and the output, Q4_K elsewhere."""
    return (
        T.Q6_K if name.endswith(("attn_v.weight", "ffn_down.weight", "output.weight")) else T.Q4_K
    )


TYPES: dict[str, object] = {
    t.name: t for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)
}
TYPES["Q4_K_M"] = q4_k_m
# which kinds the kernels run each as (Q4_0 and Q5_0 are held as Q4_1 and Q8_0 blocks)
RUN_AS = {"Q4_0": ["Q4_1"], "Q5_0": ["Q8_0"], "Q4_K_M": ["Q4_K", "Q6_K"]}
LOOPY = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [12, 13, 14, 15, 16, 12, 13]]
PROMPTS = LOOPY + mixed_prompts(4, seed=11)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("hf"), "llama", hidden=256, seed=7)


def gguf_of(tiny_hf: Path, tmp_path: Path, name: str) -> Path:
    kind = TYPES[name]
    pick = kind if callable(kind) else (lambda _: kind)
    return write_gguf(tiny_hf, tmp_path / f"{name}.gguf", pick)  # type: ignore[arg-type]


Run = list[tuple[list[int], list[float]]]  # per prompt: tokens, their logprobs


def run(engine: Engine, prompts: list[list[int]] | None = None) -> Run:
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=0)
    ids = [engine.add_request(p, params) for p in prompts or PROMPTS]
    got: dict[str, tuple[list[int], list[float]]] = {i: ([], []) for i in ids}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None and out.finish_reason not in ("error", "abort"), out
            got[out.request_id][0].extend(out.new_token_ids)
            got[out.request_id][1].extend(lp.logprob for lp in out.logprobs or [])
    return [got[i] for i in ids]


@pytest.mark.parametrize("name", list(TYPES))
def test_every_type_is_batch_invariant(tiny_hf: Path, tmp_path: Path, name: str) -> None:
    require(ggml.library, "GGUF block kernels")
    model = gguf_of(tiny_hf, tmp_path, name)
    off = make_engine(model, prefix_caching=False)
    assert block_kinds(off.res.model) == sorted(RUN_AS.get(name, [name]))
    want = run(off)
    alone = [run(make_engine(model, prefix_caching=False), [p])[0] for p in PROMPTS[:3]]
    assert alone == want[:3]
    on = make_engine(model, speculate=4, policy="static")  # every draft verified
    assert run(on) == want
    stats = on.stats.proposer
    assert stats.drafted_tokens > stats.accepted_tokens, "the on side must have had rejections"
    assert run(on) == want  # again: the prompts now come from the prefix cache
    assert on.res.allocator.num_free == on.res.allocator.num_blocks
    tight = make_engine(model, num_blocks=24, speculate=4, policy="static")
    assert run(tight) == want
    assert tight.scheduler.num_preemptions > 0
    assert_no_kv_held(tight)
