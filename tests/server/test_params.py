"""Request -> SamplingParams translation and error formatting, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.server.errors import ApiError, from_validation_errors
from specserve.server.openai_schemas import ChatCompletionRequest, CompletionRequest
from specserve.server.param_checks import resolve_max_new
from specserve.server.params import (
    TGI_DEFAULT_MAX_NEW_TOKENS,
    prepare_chat,
    prepare_completion,
    prepare_tgi,
)
from specserve.server.schemas import GenerateRequest
from specserve.server.settings import Limits

LIMITS = Limits(
    max_input_tokens=16,
    max_total_tokens=64,
    kv_capacity_tokens=48,
    speculate=4,
    max_stop_sequences=4,
    vocab_size=100,
)


def encode(text: str) -> list[int]:
    return [ord(c) % 100 for c in text]


def tgi(**parameters: object) -> GenerateRequest:
    return GenerateRequest.model_validate({"inputs": "hello", "parameters": parameters})


@pytest.mark.parametrize(
    ("parameters", "greedy"),
    [
        ({}, True),
        ({"do_sample": False}, True),
        ({"temperature": 1.0}, True),
        ({"do_sample": True}, False),
        # As TGI: a warper turns sampling on even without do_sample.
        ({"temperature": 0.7}, False),
        ({"top_k": 5}, False),
        ({"top_p": 0.9}, False),
        ({"top_p": 1.0}, True),
    ],
)
def test_tgi_sampling_follows_tgi(parameters: dict[str, object], greedy: bool) -> None:
    prep = prepare_tgi(tgi(**parameters), encode, LIMITS)
    assert prep.params.greedy is greedy
    assert (prep.seed is None) is greedy


def test_tgi_defaults_and_seed() -> None:
    prep = prepare_tgi(tgi(), encode, LIMITS)
    # Default 100 is capped by what fits: min(context 64, KV 48) - 5 prompt tokens.
    assert TGI_DEFAULT_MAX_NEW_TOKENS > 43 and prep.params.max_new_tokens == 43
    seeded = prepare_tgi(tgi(do_sample=True, seed=9, temperature=0.5), encode, LIMITS)
    assert seeded.params.seed == 9 and seeded.params.temperature == 0.5


def test_tgi_truncate_keeps_the_tail() -> None:
    prep = prepare_tgi(tgi(truncate=2), encode, LIMITS)
    assert prep.prompt_ids == encode("lo")


def test_resolve_max_new_limits() -> None:
    assert resolve_max_new(10, None, 5, LIMITS, "f") == 10
    with pytest.raises(ApiError, match=r"f: prompt tokens \(5\) \+ f \(60\) must be <= 64"):
        resolve_max_new(60, None, 5, LIMITS, "f")
    with pytest.raises(ApiError, match=r"48 \(the KV cache size"):
        resolve_max_new(45, None, 5, LIMITS, "f")


def test_openai_temperature_default_is_one_and_zero_is_greedy() -> None:
    sampled = prepare_completion(CompletionRequest(prompt="hi"), encode, LIMITS)
    assert sampled.params.temperature == 1.0 and sampled.seed is not None
    assert sampled.params.max_new_tokens == 16  # OpenAI's completions default
    greedy = prepare_completion(CompletionRequest(prompt="hi", temperature=0), encode, LIMITS)
    assert greedy.params.greedy and greedy.seed is None


@pytest.mark.parametrize("prompt", ["hi", [[1, 2]], ["hi"], [1, 2]])
def test_completion_prompt_forms(prompt: object) -> None:
    prep = prepare_completion(CompletionRequest.model_validate({"prompt": prompt}), encode, LIMITS)
    assert prep.prompt_ids in (encode("hi"), [1, 2])


def test_chat_messages_reach_the_template() -> None:
    seen: list[list[dict[str, str]]] = []

    def encode_chat(messages: list[dict[str, str]]) -> list[int]:
        seen.append(messages)
        return [1, 2, 3]

    req = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "stop": "x",
            "max_completion_tokens": 5,
        }
    )
    prep = prepare_chat(req, encode_chat, LIMITS)
    assert seen == [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"}]
    ]
    assert prep.params.stop == ("x",) and prep.params.max_new_tokens == 5


def test_validation_errors_name_fields() -> None:
    err = from_validation_errors(
        [
            {
                "type": "greater_than",
                "loc": ("body", "parameters", "top_p"),
                "msg": "Input should be greater than 0",
            },
            {"type": "extra_forbidden", "loc": ("body", "parameters", "x"), "msg": "Extra"},
            {"type": "int_parsing", "loc": ("body", "prompt", "list[int]", 2), "msg": "bad int"},
        ]
    )
    assert err.status == 422 and err.param == "parameters.top_p"
    assert err.message == (
        "parameters.top_p: Input should be greater than 0; parameters.x: unknown field; "
        "prompt[2]: bad int"
    )
    bad_json = from_validation_errors(
        [
            {
                "type": "json_invalid",
                "loc": ("body", 3),
                "msg": "x",
                "ctx": {"error": "Expecting value"},
            }
        ]
    )
    assert bad_json.status == 400 and "Expecting value" in bad_json.message


def test_max_input_tokens_is_what_the_kv_pool_accepts(tiny_llama: Path) -> None:
    from specserve.server.settings import ServerSettings
    from tests.engine.helpers import make_engine

    engine = make_engine(tiny_llama, num_blocks=16, block_size=4)  # 64 KV slots, 512 context
    limits = Limits.from_engine(engine, ServerSettings(model_id="m"))
    assert limits.max_input_tokens == 63 and limits.max_request_tokens == 64
    assert limits.max_input_reason == "the KV cache minus one"
    ok = prepare_tgi(GenerateRequest(inputs="x" * 63), lambda t: [5] * len(t), limits)
    assert len(ok.prompt_ids) == 63 and ok.params.max_new_tokens == 1
    with pytest.raises(ApiError, match="the limit is 63 \\(the KV cache minus one\\)"):
        prepare_tgi(GenerateRequest(inputs="x" * 64), lambda t: [5] * len(t), limits)
    explicit = Limits.from_engine(engine, ServerSettings(model_id="m", max_input_tokens=10))
    assert (explicit.max_input_tokens, explicit.max_input_reason) == (10, "--max-input-tokens")


def test_model_names() -> None:
    from specserve.server.settings import model_names

    assert model_names("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct",
    )
    assert model_names("/models/qwen.Q4_1.gguf")[1:] == ("qwen.Q4_1.gguf", "qwen.Q4_1")


def test_cache_salt_reaches_the_engine_from_both_apis() -> None:
    assert prepare_tgi(tgi(cache_salt="t1"), encode, LIMITS).params.cache_salt == "t1"
    assert prepare_tgi(tgi(), encode, LIMITS).params.cache_salt is None
    req = CompletionRequest.model_validate({"prompt": "hi", "cache_salt": "t2"})
    assert prepare_completion(req, encode, LIMITS).params.cache_salt == "t2"
    with pytest.raises(ValueError, match="cache_salt"):
        CompletionRequest.model_validate({"prompt": "hi", "cache_salt": ""})


def test_speculation_policy_reaches_the_engine_from_both_apis() -> None:
    assert prepare_tgi(tgi(speculation_policy="static"), encode, LIMITS).params.speculation_policy
    assert prepare_tgi(tgi(), encode, LIMITS).params.speculation_policy is None
    req = CompletionRequest.model_validate({"prompt": "hi", "speculation_policy": "static"})
    assert prepare_completion(req, encode, LIMITS).params.speculation_policy == "static"
    # only "static" is a request's to choose: "adaptive" needs the server's cost model
    with pytest.raises(ValueError, match="speculation_policy"):
        CompletionRequest.model_validate({"prompt": "hi", "speculation_policy": "adaptive"})
