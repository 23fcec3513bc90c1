"""Errors as the two API families spell them.

TGI routes answer `{"error": message, "error_type": kind}`; OpenAI routes (`/v1/...`) answer
`{"error": {"message", "type", "param", "code"}}`. Validation failures are 422 on TGI routes (as
TGI does) and 400 on OpenAI routes (as OpenAI does); malformed JSON is 400 on both.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse

from specserve.server.outcome import Outcome


class ErrorKind(enum.Enum):
    VALIDATION = "validation"
    OVERLOADED = "overloaded"
    GENERATION = "generation"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    TOO_LARGE = "payload_too_large"
    UNAVAILABLE = "unavailable"
    NOT_FOUND = "not_found"
    MODEL_NOT_FOUND = "model_not_found"

    @property
    def outcome(self) -> Outcome:
        """The `outcome` label of the request counter."""
        return _OUTCOME[self]


_OUTCOME = {
    ErrorKind.VALIDATION: Outcome.INVALID,
    ErrorKind.OVERLOADED: Outcome.OVERLOADED,
    ErrorKind.GENERATION: Outcome.ERROR,
    ErrorKind.UNAUTHORIZED: Outcome.UNAUTHORIZED,
    ErrorKind.FORBIDDEN: Outcome.FORBIDDEN,
    ErrorKind.TOO_LARGE: Outcome.TOO_LARGE,
    ErrorKind.UNAVAILABLE: Outcome.UNAVAILABLE,
    ErrorKind.NOT_FOUND: Outcome.NOT_FOUND,
    ErrorKind.MODEL_NOT_FOUND: Outcome.INVALID,
}

# (OpenAI error type, OpenAI error code) per kind.
_OPENAI_KIND: dict[ErrorKind, tuple[str, str | None]] = {
    ErrorKind.VALIDATION: ("invalid_request_error", None),
    ErrorKind.OVERLOADED: ("rate_limit_error", "rate_limit_exceeded"),
    ErrorKind.GENERATION: ("server_error", None),
    ErrorKind.UNAUTHORIZED: ("authentication_error", "invalid_api_key"),
    ErrorKind.FORBIDDEN: ("permission_error", "admin_key_required"),
    ErrorKind.TOO_LARGE: ("invalid_request_error", "payload_too_large"),
    ErrorKind.UNAVAILABLE: ("server_error", "unavailable"),
    ErrorKind.NOT_FOUND: ("invalid_request_error", "not_found"),
    ErrorKind.MODEL_NOT_FOUND: ("invalid_request_error", "model_not_found"),
}


@dataclass
class ApiError(Exception):
    status: int
    message: str
    kind: ErrorKind = ErrorKind.VALIDATION
    param: str | None = None  # the request field at fault
    headers: dict[str, str] = field(default_factory=dict)
    counted: bool = False  # already in the request metrics (it was raised after admission)

    def __str__(self) -> str:
        return self.message


def invalid(param: str, message: str) -> ApiError:
    """A bad value in `param`; the message should name the limit it broke."""
    return ApiError(422, f"{param}: {message}", ErrorKind.VALIDATION, param)


def is_openai_path(path: str) -> bool:
    return path.startswith("/v1/")


def error_body(path: str, err: ApiError) -> dict[str, Any]:
    if is_openai_path(path):
        kind, code = _OPENAI_KIND[err.kind]
        return {"error": {"message": err.message, "type": kind, "param": err.param, "code": code}}
    return {"error": err.message, "error_type": err.kind.value}


def error_response(path: str, err: ApiError) -> JSONResponse:
    status = err.status
    if status == 422 and is_openai_path(path):
        status = 400
    return JSONResponse(error_body(path, err), status_code=status, headers=err.headers)


def from_validation_errors(
    errors: Sequence[Mapping[str, Any]], required: Sequence[str] = ()
) -> ApiError:
    """One ApiError for pydantic's list: 400 for unparseable JSON, else 422 naming each field.
    `required`: the body's required fields, named when the body is missing altogether."""
    if any(e.get("type") == "json_invalid" for e in errors):
        first = next(e for e in errors if e.get("type") == "json_invalid")
        detail = (first.get("ctx") or {}).get("error", first.get("msg", ""))
        return ApiError(400, f"request body is not valid JSON: {detail}")
    if any(e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",) for e in errors):
        fields = f" with {', '.join(required)}" if required else ""
        return ApiError(422, f"body: missing: send a JSON object{fields}", param="body")
    parts: list[str] = []
    params: list[str] = []
    for e in errors:
        name = _field_name(e.get("loc", ())) or "body"
        msg = "unknown field" if e.get("type") == "extra_forbidden" else str(e.get("msg", ""))
        text = f"{name}: {msg.removeprefix('Value error, ')}"
        if text not in parts:
            parts.append(text)
            params.append(name)
    return ApiError(422, "; ".join(parts[:4]), ErrorKind.VALIDATION, params[0] if params else None)


def not_utf8(exc: UnicodeDecodeError) -> ApiError:
    """The body's bytes are not UTF-8 (JSON on the wire must be, RFC 8259)."""
    return ApiError(
        400, f"request body is not valid UTF-8: {exc.reason} at byte {exc.start}", param="body"
    )


def _field_name(loc: Sequence[Any]) -> str:
    """`('body', 'parameters', 'top_p')` -> `parameters.top_p`; list indices stay as `[i]`."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part) in ("str", "int", "float", "bool"):
            continue  # pydantic's name of a union branch, not a field
        else:
            out += f".{part}" if out else str(part)
    return out
