"""Logit bias, presence and frequency penalties and min-p through the engine (#55), on a tiny
Llama served from GGUF Q4_1 blocks in the q8 numerics (batch-invariant rows): the same tokens
and log-probabilities, bit for bit, with speculation on and off, greedy and seeded, with the
n-gram lookup (deterministic drafts, verified against the target's picks) and a draft model
whose drafts are picked under the same parameters; the on side drafted and had drafts
rejected, and neither side errored. A token biased by -100 never appears."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from specserve.kernels import ggml
from specserve.outputs import TokenLogprob
from specserve.request import SamplingParams
from tests.engine.helpers import assert_no_kv_held, make_engine, run_all
from tests.engine.test_logprobs import run
from tests.engine.test_speculation import LOOPY
from tests.gguf_files import T, write_gguf
from tests.kernels.expect import require
from tests.tiny import make_model_dir, noisy_copy


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("hf"), "llama", hidden=256, seed=7)


@pytest.fixture(scope="module")
def target(tiny_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(ggml.library, "GGUF block kernels")
    return write_gguf(tiny_hf, tmp_path_factory.mktemp("gguf") / "q4_1.gguf", lambda _: T.Q4_1)


@pytest.fixture(scope="module")
def draft_dir(tiny_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(noisy_copy(tiny_hf, tmp_path_factory.mktemp("draft")))


@pytest.fixture(scope="module")
def banned(target: Path) -> int:
    """The token plain greedy decoding of LOOPY emits most: the one to bias by -100."""
    plain = SamplingParams(max_new_tokens=24, ignore_eos=True)
    outs = run_all(make_engine(target), LOOPY, plain)
    return Counter(t for out in outs for t in out).most_common(1)[0][0]


CASES: dict[str, dict[str, object]] = {
    "presence": {"presence_penalty": 1.5},
    "frequency": {"frequency_penalty": 0.9},
    "negative": {"presence_penalty": -1.0, "frequency_penalty": 0.3},
    "min_p": {"min_p": 0.3},
    "everything": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "min_p": 0.1},
}


def case_fields(case: str, banned: int) -> dict[str, object]:
    return CASES.get(case) or {"logit_bias": ((banned, -100.0), (banned + 1, 4.0))}


def tokens_and_logprobs(lps: list[list[TokenLogprob]]) -> list[list[tuple[int, float]]]:
    return [[(e.token, e.logprob) for e in out] for out in lps]


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("case", [*CASES, "logit_bias"])
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_same_tokens_and_logprobs_with_speculation_on_and_off(
    target: Path, draft_dir: str, banned: int, proposer: str, case: str, sampled: bool
) -> None:
    if sampled and proposer == "draft":
        pytest.skip("sampled drafts keep the distribution, not the tokens (rejection sampling)")
    base = SamplingParams(
        max_new_tokens=24, ignore_eos=True, logprobs=2, temperature=0.8 if sampled else 0.0,
        seed=7 if sampled else None,
    )  # fmt: skip
    params = replace(base, **case_fields(case, banned))  # type: ignore[arg-type]
    want_tokens, want_lps, _ = run(make_engine(target), LOOPY, params)
    kw = {"draft_model": draft_dir} if proposer == "draft" else {}
    engine = make_engine(target, speculate=3, proposer=proposer, policy="static", **kw)  # type: ignore[arg-type]
    tokens, lps, _ = run(engine, LOOPY, params)  # `run` fails on an errored request
    spec = engine.stats.proposer
    assert spec.drafted_tokens > spec.accepted_tokens > 0  # drafted, kept some, rejected some
    assert tokens == want_tokens and all(len(t) == 24 for t in tokens)
    assert tokens_and_logprobs(lps) == tokens_and_logprobs(want_lps)  # bit for bit
    assert [[e.top for e in out] for out in lps] == [[e.top for e in out] for out in want_lps]
    if case == "logit_bias":
        assert all(banned not in out for out in tokens)
    assert_no_kv_held(engine)


def test_each_case_changes_the_output(target: Path, banned: int) -> None:
    """Each case above moves tokens or log-probabilities (else the on/off test proves little)."""
    base = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=0, temperature=0.8, seed=7)
    plain = run(make_engine(target), LOOPY, base)[1]
    for case in [*CASES, "logit_bias"]:
        params = replace(base, **case_fields(case, banned))  # type: ignore[arg-type]
        got = run(make_engine(target), LOOPY, params)[1]
        assert tokens_and_logprobs(got) != tokens_and_logprobs(plain), case
