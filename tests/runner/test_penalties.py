"""OpenAI's logit bias, presence and frequency penalties and vLLM's min-p in the sampler
(#55), on literal logits: the formulas, the generated-tokens-only rule, the incremental counts
of a `History` against a fresh count of its tokens, and the parameters' ranges."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specserve.request import History, SamplingParams, Sequence
from specserve.runner.sampler import (
    SampleRow,
    apply_output_penalties,
    output_counts,
    pick_tokens,
    processed_logits,
    sample_row,
)


def test_logit_bias_adds_to_the_named_tokens() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    params = SamplingParams(logit_bias=((1, 5.0), (3, -2.5)))
    z = processed_logits(logits, SampleRow(params, [], 0))
    assert z.tolist() == [1.0, 7.0, 3.0, 1.5]
    assert logits.tolist() == [1.0, 2.0, 3.0, 4.0]  # the pass's logits are left alone


def test_a_token_biased_by_minus_100_is_never_picked() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = 8 * torch.randn(64, 200, generator=gen)  # [rows, vocab]
    best = [int(i) for i in logits.argmax(-1)]
    for temperature, seed in ((0.0, None), (1.0, 3), (2.0, 4)):
        for i in range(64):
            params = SamplingParams(
                temperature=temperature, seed=seed, logit_bias=((best[i], -100),)
            )
            for pos in range(20):
                assert sample_row(logits[i], SampleRow(params, [], pos)).token != best[i]


def test_presence_and_frequency_count_only_generated_tokens() -> None:
    """OpenAI: logit[j] -= frequency * c[j] + presence * (c[j] > 0), c counting the output."""
    prompt, output = [0, 1, 1, 2], [2, 3, 3, 3]
    logits = torch.zeros(6)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    z = processed_logits(logits, SampleRow(params, prompt + output, len(output)))
    assert z.tolist() == [0.0, 0.0, -0.75, -1.25, 0.0, 0.0]  # prompt tokens 0 and 1 untouched
    negative = SamplingParams(presence_penalty=-1.0, frequency_penalty=-2.0)
    z = processed_logits(logits, SampleRow(negative, prompt + output, len(output)))
    assert z.tolist() == [0.0, 0.0, 3.0, 7.0, 0.0, 0.0]  # negative values encourage repeats
    first = processed_logits(logits, SampleRow(params, prompt, 0))  # nothing generated yet
    assert first.tolist() == [0.0] * 6


def test_history_counts_equal_fresh_counts_as_output_grows_and_drafts_come_and_go() -> None:
    rng = random.Random(0)
    params = SamplingParams(presence_penalty=0.7, frequency_penalty=-0.3, repetition_penalty=1.2)
    seq = Sequence(0, "r", [rng.randrange(40) for _ in range(30)], params)
    for _ in range(40):
        seq.output_ids += [rng.randrange(60) for _ in range(rng.randrange(4))]
        drafts = [rng.randrange(70) for _ in range(rng.randrange(5))]
        out_pos = len(seq.output_ids) + len(drafts)
        ids, counts = output_counts(History(seq, drafts), out_pos)
        want: dict[int, int] = {}
        for t in seq.output_ids + drafts:
            want[t] = want.get(t, 0) + 1
        assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == want
        logits = torch.randn(70)
        on_view, on_list = logits.clone(), logits.clone()
        apply_output_penalties(on_view, SampleRow(params, History(seq, drafts), out_pos))
        apply_output_penalties(on_list, SampleRow(params, seq.token_ids + drafts, out_pos))
        assert torch.equal(on_view, on_list)


def test_min_p_keeps_tokens_at_least_min_p_times_the_top_probability() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(500, generator=gen)
    for min_p, temperature in ((0.05, 1.0), (0.3, 0.7), (0.9, 1.5), (1.0, 1.0)):
        params = SamplingParams(temperature=temperature, seed=0, min_p=min_p)
        z = processed_logits(logits, SampleRow(params, [], 0))
        probs = (logits / temperature).double().softmax(-1)
        want = probs >= min_p * probs.max() * (1 - 1e-9)
        assert torch.equal(torch.isfinite(z), want), min_p
    greedy = SamplingParams(min_p=0.9)  # as top-p: greedy rows are left alone
    assert torch.isfinite(processed_logits(logits, SampleRow(greedy, [], 0))).all()


def test_batched_picks_see_the_bias_and_the_penalties() -> None:
    """`pick_tokens`' raw-argmax shortcut must not take rows whose argmax these move."""
    logits = torch.tensor([[0.0, 5.0, 1.5]] * 3)
    rows = [
        SampleRow(SamplingParams(logit_bias=((1, -10.0),)), [], 0),
        SampleRow(SamplingParams(presence_penalty=2.0, frequency_penalty=2.0), [7, 1], 1),
        SampleRow(SamplingParams(), [], 0),
    ]
    assert pick_tokens(logits, rows) == [2, 2, 1]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("frequency_penalty", math.nan),
        ("min_p", 1.5),
        ("min_p", -0.1),
        ("logit_bias", ((1, 101.0),)),
        ("logit_bias", ((1, 1.0), (1, 2.0))),
        ("logit_bias", ((-1, 1.0),)),
    ],
)
def test_out_of_range_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]
