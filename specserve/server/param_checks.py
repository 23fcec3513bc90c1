"""The checks of a validated request body against the server's limits: the prompt, the output
budget, `speculate`, how many stop sequences, `model` (404 `model_not_found`), `n`,
`logit_bias`'s token ids in the vocabulary. What needs no limit (ranges, types, fields accepted
only at their defaults, stop sequences' lengths, top logprobs' cap, fields that need or exclude
each other) is on the request models. Each failure is an `ApiError` naming the field and the
limit."""

from __future__ import annotations

from specserve.server.errors import ApiError, ErrorKind, invalid
from specserve.server.settings import Limits


def check_prompt(ids: list[int], limits: Limits, field: str) -> None:
    if not ids:
        raise invalid(field, "must not be empty")
    if any(not 0 <= t < limits.vocab_size for t in ids):
        raise invalid(field, f"token ids must be in [0, {limits.vocab_size})")
    if len(ids) > limits.max_input_tokens:
        raise invalid(
            field,
            f"has {len(ids)} tokens; the limit is {limits.max_input_tokens} "
            f"({limits.max_input_reason})",
        )


def resolve_max_new(
    requested: int | None, default: int | None, n_input: int, limits: Limits, field: str
) -> int:
    """The output budget: the requested one if it fits, else the default capped by what fits."""
    room = limits.max_request_tokens - n_input
    if requested is None:
        if room < 1:
            raise invalid(
                field,
                f"the prompt leaves no room: the KV cache holds "
                f"{limits.kv_capacity_tokens} tokens and the prompt has {n_input}",
            )
        return min(default or room, room)
    if n_input + requested > limits.max_total_tokens:
        raise invalid(
            field,
            f"prompt tokens ({n_input}) + {field} ({requested}) must be <= "
            f"{limits.max_total_tokens} (the context window, --max-total-tokens)",
        )
    if n_input + requested > limits.kv_capacity_tokens:
        raise invalid(
            field,
            f"prompt tokens ({n_input}) + {field} ({requested}) must be <= "
            f"{limits.kv_capacity_tokens} (the KV cache size)",
        )
    return requested


def check_speculate(value: int | None, limits: Limits, field: str) -> int | None:
    if value is not None and value > limits.speculate:
        raise invalid(
            field,
            f"must be between 0 and {limits.speculate} (the server's --speculate); got {value}",
        )
    return value


def check_stop(stop: str | list[str] | None, limits: Limits, field: str) -> tuple[str, ...]:
    """`stop` (a string or a list; each checked by the request model) as a tuple."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > limits.max_stop_sequences:
        raise invalid(
            field,
            f"at most {limits.max_stop_sequences} stop sequences are allowed; got {len(stops)}",
        )
    return stops


# What TGI's clients put in `model` for "the model this server serves" (TGI ignores the field;
# huggingface_hub's InferenceClient.chat_completion against a URL sends "dummy").
TGI_PLACEHOLDERS = ("tgi", "dummy")


def check_model(model: str | None, limits: Limits) -> None:
    """`model` must name the served model (or be left out, or be one of TGI's placeholders):
    404 model_not_found otherwise."""
    names = limits.model_names
    if (
        model is None
        or not names
        or model.lower() in (*TGI_PLACEHOLDERS, *(n.lower() for n in names))
    ):
        return
    raise ApiError(
        404,
        f"The model `{model}` does not exist: this server serves `{limits.model_names[0]}` "
        "(see /v1/models)",
        ErrorKind.MODEL_NOT_FOUND,
        "model",
    )


def check_choices(n: int, limits: Limits) -> int:
    if n > limits.max_choices:
        raise invalid("n", f"must be <= {limits.max_choices} (--max-choices); got {n}")
    return n


def check_logit_bias(
    bias: dict[str, float] | None, limits: Limits
) -> tuple[tuple[int, float], ...]:
    """`logit_bias` (distinct token id strings, checked by the request model) as (id, value)
    pairs; every id must be in the vocabulary."""
    pairs = {int(k): v for k, v in (bias or {}).items()}
    bad = next((t for t in pairs if t >= limits.vocab_size), None)
    if bad is not None:
        raise invalid("logit_bias", f"token ids must be in [0, {limits.vocab_size}); got {bad}")
    return tuple(sorted(pairs.items()))
