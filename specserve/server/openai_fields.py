"""Fields of OpenAI's Chat Completions and Completions requests that mean nothing here, the
vLLM extensions honoured only at one value, and vLLM's `chat_template_kwargs`: defined, so that
clients sending them (the openai SDK's typed fields) are neither refused nor counted as
unknown, and so that they keep their JSON types and ranges. Fields whose meaning this server
cannot give (audio output, the deprecated `functions`) are accepted only at their neutral
value: 400 otherwise, not silence.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from specserve.server.schemas import Lenient, accepts

METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def _check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's limits: at most 16 pairs, keys of at most 64 characters, values of 512."""
    if value is None:
        return None
    if len(value) > METADATA_PAIRS:
        raise ValueError(f"at most {METADATA_PAIRS} key-value pairs; got {len(value)}")
    if any(len(k) > METADATA_KEY_CHARS for k in value):
        raise ValueError(f"keys must be at most {METADATA_KEY_CHARS} characters")
    if any(len(v) > METADATA_VALUE_CHARS for v in value.values()):
        raise ValueError(f"values must be at most {METADATA_VALUE_CHARS} characters")
    return value


IGNORED = "accepted and ignored"


def ignored(what: str = IGNORED) -> Any:
    return Field(default=None, description=what)


class BothEndpoints(Lenient):
    """Fields of both /v1/completions and /v1/chat/completions."""

    user: str | None = ignored("accepted and ignored (an end-user id, for OpenAI's abuse checks)")
    skip_special_tokens: Annotated[
        bool, accepts((True,), "special tokens are always left out of the text")
    ] = Field(default=True, description="extension (vLLM's): only true")


class ChatOnly(Lenient):
    """Chat Completions fields that change nothing here."""

    store: bool | None = ignored("accepted and ignored: nothing is stored")
    metadata: Annotated[dict[str, str] | None, AfterValidator(_check_metadata)] = ignored(
        "accepted and ignored (OpenAI's limits checked: 16 pairs, 64/512 characters)"
    )
    service_tier: str | None = ignored()
    safety_identifier: str | None = ignored()
    prompt_cache_key: str | None = ignored(
        "accepted and ignored: prompt prefixes are cached anyway (see `cache_salt`)"
    )
    prompt_cache_retention: str | None = ignored()
    prompt_cache_options: dict[str, Any] | None = ignored()
    prediction: dict[str, Any] | None = ignored(
        "accepted and ignored: it would not change the output; the server drafts its own"
    )
    reasoning_effort: str | None = ignored()
    verbosity: str | None = ignored()
    web_search_options: dict[str, Any] | None = ignored("accepted and ignored: no web search")
    moderation: dict[str, Any] | None = ignored()
    modalities: Annotated[list[str] | None, accepts((None, ["text"]), "text only")] = ignored(
        'only ["text"]'
    )
    audio: Annotated[dict[str, Any] | None, accepts((None,), "no audio output: must be null")] = (
        ignored("not supported; must be null")
    )
    functions: Annotated[
        list[dict[str, Any]] | None, accepts((None,), "deprecated by OpenAI: send `tools`")
    ] = ignored("deprecated; send `tools`")
    function_call: Annotated[
        str | dict[str, Any] | None,
        accepts((None,), "deprecated by OpenAI: send `tool_choice`"),
    ] = ignored("deprecated; send `tool_choice`")
    chat_template_kwargs: dict[str, Any] | None = ignored(
        "extension (vLLM's): extra variables for the chat template, e.g. enable_thinking "
        "(server/chat_template.py)"
    )
