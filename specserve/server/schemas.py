"""TGI request and response shapes, and what every request model shares.

Field names and meanings follow text-generation-inference. Extensions (not in TGI) are marked;
they are optional, so TGI clients never need them: `speculate`, `speculation_policy`,
`ignore_eos`, `cache_salt` and `model` in the parameters, and the per-request speculation counts
`drafted_tokens` / `accepted_tokens` / `speculation_steps` in the details. As TGI, a field it
does not define is ignored (here with a warning and a count: `ignored_fields`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from specserve.request import MAX_PENALTY
from specserve.server.settings import MAX_STOP_CHARS, MAX_TOP_LOGPROBS

U64_MAX = 2**64 - 1
# Above this a penalty only pushes seen tokens' logits towards 0 and -inf.
MAX_REPETITION_PENALTY = 100.0

FinishReasonTGI = Literal["length", "eos_token", "stop_sequence"]


def check_unicode(value: Any) -> Any:
    """`value` as is; ValueError if a string in it (or in its lists and dict keys) holds a lone
    surrogate (JSON may spell one, "\\ud800"; UTF-8 cannot encode it, so no tokenizer can).
    Iterative: a value nested as deep as the JSON parser allows never overflows the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_string(item)
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return value


def _check_string(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise ValueError(
            f"must be valid Unicode: lone surrogate U+{ord(bad):04X} at index {exc.start}"
        ) from None


def check_stops(value: str | list[str] | None) -> str | list[str] | None:
    """Stop sequences: each non-empty and at most MAX_STOP_CHARS long (how many: the server's
    limit, checked where the request is prepared)."""
    stops = [value] if isinstance(value, str) else value or []
    if any(not s for s in stops):
        raise ValueError("stop sequences must be non-empty")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(
            f"stop sequences must be at most {MAX_STOP_CHARS} characters; got one of {longest}"
        )
    return value


def check_top_logprobs(value: int | None) -> int | None:
    """The alternatives asked for at each position: at most MAX_TOP_LOGPROBS (OpenAI's cap)."""
    if value is not None and value > MAX_TOP_LOGPROBS:
        raise ValueError(f"must be between 0 and {MAX_TOP_LOGPROBS}; got {value}")
    return value


def cache_salt_field() -> Any:
    """The `cache_salt` extension of both APIs."""
    return Field(
        default=None,
        min_length=1,
        max_length=256,
        description="extension (vLLM's): reuse cached prompt prefixes and draft from other "
        "requests' outputs only of requests with the same salt",
    )


def speculation_policy_field() -> Any:
    """The `speculation_policy` extension of both APIs."""
    return Field(
        default=None,
        description="extension: 'static' verifies every draft whole (up to `speculate`) even "
        "when the server's --speculation-policy is adaptive; null: the server's policy",
    )


class UnicodeChecked(BaseModel):
    """Every string field must be encodable as UTF-8 (see `check_unicode`)."""

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        return check_unicode(value)


class Strict(UnicodeChecked):
    """Models that reject unknown fields and, as the OpenAI API does, values of the wrong JSON
    type: `true` or `"5"` is not an integer."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Lenient(UnicodeChecked):
    """Generation request models: as strict as `Strict` about the fields they define, but a
    field nobody defines is kept aside (`model_extra`) and ignored, as vLLM and TGI do; the
    routes log and count it (`ignored_fields`)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def ignored_fields(model: BaseModel, prefix: str = "") -> Iterator[str]:
    """The dotted names of the fields in `model` (and the models nested in it, lists
    included) that their model does not define."""
    for name in model.model_extra or {}:
        yield prefix + name
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from ignored_fields(value, f"{prefix}{name}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from ignored_fields(item, f"{prefix}{name}[{i}].")


def accepts(allowed: tuple[Any, ...], what: str) -> AfterValidator:
    """A field this server honours only at `allowed` values; `what` says which."""

    def check(value: Any) -> Any:
        if value not in allowed:
            raise ValueError(f"not supported by this server ({what})")
        return value

    return AfterValidator(check)


class GenerateParameters(Lenient):
    best_of: Annotated[int | None, accepts((None, 1), "max_best_of is 1")] = Field(
        default=None, ge=1, description="only 1 is supported"
    )
    decoder_input_details: bool = Field(
        default=False,
        description="return the prompt tokens in details, with their log-probabilities (the "
        "prompt is then computed in full: no prefix-cache reuse)",
    )
    details: bool = Field(default=False, description="return generation details")
    do_sample: bool = Field(
        default=False,
        description="sample; a temperature != 1, top_k or top_p < 1 also turns sampling on",
    )
    frequency_penalty: float | None = Field(
        default=None,
        ge=-MAX_PENALTY,
        le=MAX_PENALTY,
        description="-2..2: subtracted from a token's logit once per time it was generated "
        "(OpenAI's semantics: output tokens only, not divided by the length as TGI does)",
    )
    grammar: dict[str, Any] | None = Field(
        default=None,
        description='constrain the output: {"type": "json", "value": <JSON schema>} or '
        '{"type": "regex", "value": "<regex>"}',
    )
    max_new_tokens: int | None = Field(
        default=None, ge=1, description="default: 100, capped by the context left after the prompt"
    )
    repetition_penalty: float | None = Field(
        default=None, gt=0, le=MAX_REPETITION_PENALTY, description="at most 100"
    )
    return_full_text: bool | None = Field(
        default=None, description="prepend the prompt to the output"
    )
    seed: int | None = Field(default=None, ge=0, le=U64_MAX)
    stop: Annotated[list[str], AfterValidator(check_stops)] = Field(
        default_factory=list, description="stop sequences (at most 4)"
    )
    temperature: float | None = Field(
        default=None, gt=0, description="> 0; below 0.01 it acts as 0.01 (as vLLM)"
    )
    top_k: int | None = Field(default=None, gt=0)
    top_n_tokens: Annotated[int | None, AfterValidator(check_top_logprobs)] = Field(
        default=None, ge=0, description="the most likely tokens at each position (at most 20)"
    )
    top_p: float | None = Field(default=None, gt=0, le=1)
    truncate: int | None = Field(
        default=None, ge=1, description="keep only the last N prompt tokens"
    )
    typical_p: Annotated[float | None, accepts((None, 1.0), "only 1.0")] = Field(
        default=None, gt=0, le=1, description="only 1 is supported"
    )
    watermark: Annotated[bool, accepts((False,), "must be false")] = Field(
        default=False, description="not supported; must be false"
    )
    adapter_id: Annotated[str | None, accepts((None,), "must be null")] = Field(
        default=None, description="not supported; must be null"
    )
    # Extensions.
    speculate: int | None = Field(
        default=None, ge=0, description="extension: max drafted tokens per step, 0..server N"
    )
    speculation_policy: Literal["static"] | None = speculation_policy_field()
    ignore_eos: bool = Field(default=False, description="extension: keep generating past EOS")
    cache_salt: str | None = cache_salt_field()
    model: str | None = Field(
        default=None, description="extension: a fleet routes by it (`serve` ignores it)"
    )


class GenerateRequest(Lenient):
    inputs: str = Field(..., description="the prompt")
    parameters: GenerateParameters = Field(default_factory=lambda: GenerateParameters())


class CompatGenerateRequest(GenerateRequest):
    stream: bool = False


class Token(BaseModel):
    id: int
    text: str
    logprob: float | None = Field(
        default=None,
        description="the target model's log-probability of the token under the distribution "
        "it was drawn from, from the pass that verified it",
    )
    special: bool


class PrefillToken(BaseModel):
    id: int
    text: str
    logprob: float | None = None


class Details(BaseModel):
    finish_reason: FinishReasonTGI
    generated_tokens: int
    seed: int | None = None
    prefill: list[PrefillToken] = Field(default_factory=list)
    tokens: list[Token] = Field(default_factory=list)
    top_tokens: list[list[Token]] | None = None
    best_of_sequences: list[dict[str, Any]] | None = None
    drafted_tokens: int = Field(default=0, description="extension: tokens proposed by speculation")
    accepted_tokens: int = Field(
        default=0, description="extension: proposed tokens the model accepted"
    )
    speculation_steps: int = Field(
        default=0, description="extension: steps in which this request verified drafts"
    )


class GenerateResponse(BaseModel):
    generated_text: str
    details: Details | None = None


class StreamDetails(BaseModel):
    finish_reason: FinishReasonTGI
    generated_tokens: int
    seed: int | None = None
    input_length: int
    drafted_tokens: int = Field(default=0, description="extension: tokens proposed by speculation")
    accepted_tokens: int = Field(
        default=0, description="extension: proposed tokens the model accepted"
    )
    speculation_steps: int = Field(
        default=0, description="extension: steps in which this request verified drafts"
    )


class StreamResponse(BaseModel):
    index: int
    token: Token
    top_tokens: list[Token] | None = None
    generated_text: str | None = None
    details: StreamDetails | None = None


class ErrorResponse(BaseModel):
    error: str
    error_type: str
