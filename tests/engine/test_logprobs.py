"""Log-probabilities through the engine: the target's own, from the verifying pass, equal with
speculation on and off for every proposer (to float32 rounding on these dense float32 models;
bit for bit on the GGUF blocks, see tests/server/test_clients.py), and the prompt's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.engine.engine import Engine
from specserve.outputs import TokenLogprob
from specserve.request import SamplingParams
from tests.engine.helpers import assert_no_kv_held, make_engine
from tests.engine.test_speculation import LOOPY
from tests.speculation.test_medusa import write_tgi_checkpoint
from tests.tiny import noisy_copy


def run(
    engine: Engine, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], list[list[TokenLogprob]], list[list[TokenLogprob | None] | None]]:
    ids = [engine.add_request(p, params) for p in prompts]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    lps: dict[str, list[TokenLogprob]] = {i: [] for i in ids}
    prompt_lps: dict[str, list[TokenLogprob | None]] = {}
    while engine.has_work():
        for out in engine.step():
            assert out.finish_reason != "error", out.error
            tokens[out.request_id] += out.new_token_ids
            lps[out.request_id] += out.logprobs or []
            if out.prompt_logprobs is not None:
                prompt_lps[out.request_id] = out.prompt_logprobs
    return [tokens[i] for i in ids], [lps[i] for i in ids], [prompt_lps.get(i) for i in ids]


@pytest.fixture(scope="module")
def artifacts(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    heads = tmp_path_factory.mktemp("heads")
    write_tgi_checkpoint(heads, 64, 320, 3, 1, own_lm_head=False)
    return {
        "draft": str(noisy_copy(tiny_llama, tmp_path_factory.mktemp("draft"))),
        "medusa": str(heads),
    }


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("proposer", ["ngram", "suffix", "draft", "medusa"])
def test_logprobs_equal_with_speculation_on_and_off(
    tiny_llama: Path, artifacts: dict[str, str], proposer: str, sampled: bool
) -> None:
    if sampled and proposer == "draft":
        pytest.skip("sampled drafts keep the distribution, not the tokens (rejection sampling)")
    kw: dict[str, object] = {"proposer": proposer}
    if proposer == "draft":
        kw["draft_model"] = artifacts["draft"]
    if proposer == "medusa":
        kw["medusa"] = artifacts["medusa"]
    params = SamplingParams(
        max_new_tokens=24, ignore_eos=True, logprobs=3, temperature=0.5 if sampled else 0.0,
        seed=11 if sampled else None,
    )  # fmt: skip
    want_tokens, want_lps, _ = run(make_engine(tiny_llama), LOOPY, params)
    engine = make_engine(tiny_llama, speculate=3, **kw)  # type: ignore[arg-type]
    tokens, lps, _ = run(engine, LOOPY, params)
    spec = engine.stats.proposer
    assert spec.drafted_tokens > spec.accepted_tokens  # drafted, and some drafts rejected
    if proposer != "medusa":  # random heads rarely land a draft
        assert spec.accepted_tokens > 0
    assert tokens == want_tokens
    for got, want in zip(lps, want_lps, strict=True):
        assert [e.token for e in got] == [e.token for e in want]
        torch.testing.assert_close(
            torch.tensor([e.logprob for e in got]), torch.tensor([e.logprob for e in want]),
            atol=1e-5, rtol=0,
        )  # fmt: skip
        assert [[t for t, _ in e.top] for e in got] == [[t for t, _ in e.top] for e in want]
    assert_no_kv_held(engine)


def test_logprobs_are_the_models_own(tiny_llama: Path) -> None:
    """Greedy: each token is the row's argmax, and its logprob the row's log-softmax there;
    the prompt's come with the first output (None for the first prompt token)."""
    import transformers

    params = SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=2, prompt_logprobs=True)
    # HF's numbers: exact numerics, K/V as computed (float32), not fp16-rounded K/V's.
    engine = make_engine(tiny_llama, speculate=2, numerics="exact", kv_dtype="float32")
    [tokens], [lps], [prompt_lps] = run(engine, LOOPY[:1], params)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
    ids = LOOPY[0] + tokens
    with torch.no_grad():
        logp = ref(torch.tensor([ids])).logits[0].log_softmax(-1)
    n = len(LOOPY[0])
    want = [float(logp[n - 1 + i, t]) for i, t in enumerate(tokens)]
    torch.testing.assert_close(torch.tensor([e.logprob for e in lps]), torch.tensor(want),
                               atol=1e-4, rtol=0)  # fmt: skip
    assert all(e.top[0][0] == e.token for e in lps)  # greedy: the chosen token is the best
    assert isinstance(prompt_lps, list) and prompt_lps[0] is None and len(prompt_lps) == n
    want_prompt = [float(logp[i - 1, ids[i]]) for i in range(1, n)]
    got_prompt = [e.logprob for e in prompt_lps[1:] if e is not None]  # a None: shapes differ
    torch.testing.assert_close(torch.tensor(got_prompt), torch.tensor(want_prompt), atol=1e-4,
                               rtol=0)  # fmt: skip


def test_removed_tokens_are_reported_at_the_floor_not_minus_inf() -> None:
    from specserve.engine.logprobs import LOGPROB_FLOOR, emitted_logprobs
    from specserve.runner.sampler import SampleRow

    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])  # [1, vocab]
    row = SampleRow(SamplingParams(temperature=1.0, top_k=2, seed=0), [], 0)
    (e,) = emitted_logprobs(logits, [row], [4], top=5)
    assert e.logprob == LOGPROB_FLOOR == -9999.0
    assert [lp for _, lp in e.top][2:] == [LOGPROB_FLOOR] * 3
    assert all(lp > LOGPROB_FLOOR for _, lp in e.top[:2])


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 5e-324])
def test_tiny_temperatures_sample_without_nan(temperature: float) -> None:
    from specserve.runner.sampler import SampleRow, sample_row

    logits = torch.tensor([30.0, -30.0, 29.0, 0.0])  # [vocab]
    row = SampleRow(SamplingParams(temperature=temperature, seed=1), [], 0)
    s = sample_row(logits, row)
    assert s.token == 0 and s.logprob == 0.0


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": float("inf")},
        {"temperature": float("nan")},
        {"repetition_penalty": float("inf")},
    ],
)
def test_sampling_params_refuse_non_finite_values(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="finite"):
        SamplingParams(**fields)  # type: ignore[arg-type]


def test_prompt_logprobs_of_a_long_prefill_come_a_few_rows_at_a_time(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 200-token prompt prefilled in one chunk: the head turns at most PROMPT_LOGPROB_ROWS
    rows into logits at once (never [200, vocab] plus its log-softmax), with the same values."""
    from specserve.engine.logprobs import PROMPT_LOGPROB_ROWS

    prompt = (LOOPY[0] * 20)[:200]
    params = SamplingParams(max_new_tokens=2, ignore_eos=True, prompt_logprobs=True)
    engine = make_engine(tiny_llama, num_blocks=128, max_batch_tokens=256)
    model = engine.res.model
    real = model.logits
    head_rows: list[int] = []

    def counted(hidden: torch.Tensor) -> torch.Tensor:  # [rows, hidden]
        head_rows.append(hidden.shape[0])
        return real(hidden)

    monkeypatch.setattr(model, "logits", counted)
    _, _, [prompt_lps] = run(engine, [prompt], params)
    assert max(head_rows) <= PROMPT_LOGPROB_ROWS < len(prompt)
    assert isinstance(prompt_lps, list) and len(prompt_lps) == len(prompt)
    with torch.inference_mode():
        logp = engine.res.model.logits(hidden_states(engine, prompt)).float().log_softmax(-1)
    want = [float(logp[i - 1, prompt[i]]) for i in range(1, len(prompt))]
    got = [e.logprob for e in prompt_lps[1:] if e is not None]  # a None: shapes differ
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)
    assert_no_kv_held(engine)


def hidden_states(engine: Engine, ids: list[int]) -> torch.Tensor:
    """[len(ids), hidden]: the final states of a fresh one-chunk prefill of `ids`."""
    from specserve.runner.model_runner import ModelRunner, RunItem

    model = engine.res.model
    runner = ModelRunner(model, 64, 4, torch.device("cpu"), kv_dtype=engine.config.cache.kv_dtype)
    return runner.run([RunItem(ids, 0, list(range(64)), len(ids))]).hidden
