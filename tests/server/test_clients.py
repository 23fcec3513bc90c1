"""Real client SDKs, unchanged, against the embedded SmolLM2-135M-Instruct with speculation on."""

from __future__ import annotations

import openai
import pytest
from huggingface_hub import InferenceClient
from openai.types.chat import ChatCompletionMessageParam

from tests import http
from tests.server.conftest import Server

pytestmark = pytest.mark.integration

QUESTION = "List the days of the week, separated by commas."
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def client(smol_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_embedded_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completions_stream_matches_non_stream(client: openai.OpenAI) -> None:
    prompt = "def fibonacci(n):"
    # static: the same drafts both times (adaptive drafts by the measured step cost), so the
    # usage's speculation counts match too
    static = {"speculation_policy": "static"}
    whole = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, temperature=0, extra_body=static
    )
    choice = whole.choices[0]
    assert choice.finish_reason in ("length", "stop") and choice.text
    usage = whole.usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=static,
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert chunks[-1].choices == [] and chunks[-1].usage == usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason


def test_chat_applies_template_and_streams(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0
    )
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant" and text
    raw = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=1)
    assert whole.usage and raw.usage
    assert whole.usage.prompt_tokens > raw.usage.prompt_tokens + 5  # template tokens added
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_seed_reproducible_and_stop(client: openai.OpenAI) -> None:
    def chat(**kwargs: object) -> tuple[str | None, str]:
        out = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=16,
            **kwargs,  # type: ignore[call-overload]
        )
        return out.choices[0].message.content, out.choices[0].finish_reason

    assert chat(temperature=0.8, seed=7) == chat(temperature=0.8, seed=7)
    greedy, _ = chat(temperature=0)
    assert greedy and "," in greedy
    assert chat(temperature=0, stop=[","]) == (greedy.split(",")[0], "stop")


def test_openai_sdk_raises_on_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=4, extra_body={"speculate": 99}
        )
    assert "speculate" in str(info.value) and "4" in str(info.value)


def test_inference_client_stream_with_details(smol_server: Server) -> None:
    hf = InferenceClient(smol_server.url)
    events = list(
        hf.text_generation("The capital of France is", max_new_tokens=16, stream=True, details=True)
    )
    assert [e.index for e in events] == list(range(1, len(events) + 1))
    last = events[-1]
    assert last.details is not None and last.generated_text is not None
    assert last.details.finish_reason in ("length", "eos_token")
    assert last.details.generated_tokens == len(events)
    assert "".join(e.token.text for e in events) == last.generated_text
    whole = hf.text_generation("The capital of France is", max_new_tokens=16, details=True)
    assert whole.generated_text == last.generated_text
    assert whole.details is not None
    assert [t.id for t in whole.details.tokens] == [e.token.id for e in events]


def test_inference_client_plain_stream_and_validation_error(smol_server: Server) -> None:
    from huggingface_hub.errors import ValidationError

    hf = InferenceClient(smol_server.url)
    pieces = list(hf.text_generation("Once upon a time", max_new_tokens=8, stream=True))
    assert 1 <= len(pieces) <= 8 and all(isinstance(p, str) for p in pieces)
    with pytest.raises(ValidationError):
        hf.text_generation("Once upon a time", max_new_tokens=8, top_p=2.0)


def test_speculation_is_lossless_on_the_real_model(smol_server: Server) -> None:
    prompt = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul"
    outs = []
    for speculate in (None, 0):
        params = {"max_new_tokens": 24, "details": True, "speculate": speculate}
        body = {"inputs": prompt, "parameters": {k: v for k, v in params.items() if v is not None}}
        outs.append(http.post(smol_server.url + "/generate", json=body, timeout=60).json())
    assert outs[0]["generated_text"] == outs[1]["generated_text"]
    assert outs[0]["details"]["drafted_tokens"] > 0 and outs[1]["details"]["drafted_tokens"] == 0


def test_logprobs_are_bit_identical_with_speculation_on_and_off(client: openai.OpenAI) -> None:
    """On the GGUF blocks every kernel computes a row the same whatever rows share its step,
    so the verifying pass's log-probabilities equal plain decoding's, bit for bit."""
    text = "Repeat exactly: the cat sat on the mat, the cat sat on the mat."
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
    # A first request caches the prompt's full blocks, so both runs below start from the same KV
    # (a run that computed the whole prompt itself would differ in the last bits: prefill
    # chunks take the GEMM path).
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    runs = {}
    for n in (0, 4):
        out = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=40, temperature=0, logprobs=True,
            top_logprobs=3, extra_body={"speculate": n, "ignore_eos": True},
        )  # fmt: skip
        runs[n] = out
    plain, spec = runs[0].choices[0], runs[4].choices[0]
    assert plain.message.content == spec.message.content
    details = runs[4].usage.completion_tokens_details if runs[4].usage else None
    assert details is not None and (details.accepted_prediction_tokens or 0) > 0
    assert (details.rejected_prediction_tokens or 0) > 0  # drafted, some accepted, some rejected
    assert plain.logprobs is not None and spec.logprobs is not None
    a, b = plain.logprobs.content or [], spec.logprobs.content or []
    assert [e.token for e in a] == [e.token for e in b] and len(a) == 40
    assert [e.logprob for e in a] == [e.logprob for e in b]
    assert [[t.logprob for t in e.top_logprobs] for e in a] == [
        [t.logprob for t in e.top_logprobs] for e in b
    ]
