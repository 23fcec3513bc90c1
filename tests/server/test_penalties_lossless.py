"""logit_bias, presence and frequency penalties and min_p on the embedded model, served from
its GGUF blocks (#55): greedy and seeded outputs, their log-probabilities and top alternatives
are bit-identical with speculation on and off; the "on" side drafted, kept some drafts and
rejected some."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from tests.server.conftest import Server

pytestmark = pytest.mark.integration

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TEXT = "Repeat exactly: the cat sat on the mat, the dog sat on the log, the cat sat on the mat."
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": TEXT}]
SEEDED = {"temperature": 0.8, "seed": 11}
CASES: dict[str, dict[str, Any]] = {
    "logit_bias": {"logit_bias": {"260": -100, "2644": 2}},  # " the": never, " cat": up
    "presence": {"presence_penalty": 0.4},
    "frequency": {"frequency_penalty": 0.3},
    "negative": {"presence_penalty": -0.5, "frequency_penalty": 0.2},
    "min_p": {**SEEDED, "extra_body": {"min_p": 0.1}},
    "seeded_all": {
        **SEEDED,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.2,
        "logit_bias": {"28": 1.5},
        "extra_body": {"min_p": 0.05},
    },
}


@pytest.fixture(scope="module")
def client(smol_server: Server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)
    # Cache the prompt's full blocks first, so that both runs below start from the same KV (a
    # run computing the whole prompt takes the GEMM path for its chunks: other last bits).
    c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    return c


def complete(client: openai.OpenAI, fields: dict[str, Any], speculate: int) -> ChatCompletion:
    extra = {**fields.get("extra_body", {}), "speculate": speculate, "ignore_eos": True}
    extra["speculation_policy"] = "static"  # every draft verified
    kw = {k: v for k, v in fields.items() if k != "extra_body"}
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, logprobs=True, top_logprobs=3,
        extra_body=extra, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bit_identical_with_speculation_on_and_off(client: openai.OpenAI, case: str) -> None:
    off, on = (complete(client, CASES[case], n) for n in (0, 4))
    details = on.usage.completion_tokens_details if on.usage else None
    assert details is not None
    accepted, rejected = details.accepted_prediction_tokens, details.rejected_prediction_tokens
    assert (accepted or 0) > 0 and (rejected or 0) > 0, (accepted, rejected)
    a, b = off.choices[0].logprobs, on.choices[0].logprobs
    assert a is not None and b is not None and a.content and b.content and len(a.content) == 40
    assert off.choices[0].message.content == on.choices[0].message.content
    assert [(e.token, e.logprob) for e in a.content] == [(e.token, e.logprob) for e in b.content]
    assert [[(t.token, t.logprob) for t in e.top_logprobs] for e in a.content] == [
        [(t.token, t.logprob) for t in e.top_logprobs] for e in b.content
    ]
    if case == "logit_bias":
        plain = complete(client, {}, 0).choices[0].logprobs
        assert plain is not None and any(e.token == " the" for e in plain.content or [])
        assert all(e.token != " the" for e in a.content)
