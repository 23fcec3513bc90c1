"""How a request to the server ended: the `outcome` label of `specserve_requests_total`."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """A `str`: the metric label is the value."""

    SUCCESS = "success"  # every choice ran to its end (eos, a stop, its length)
    CANCELLED = "cancelled"  # aborted (the client went away, a drain), or never finished
    ERROR = "error"  # failed after admission: the engine, a step, or the server
    INVALID = "invalid"  # refused: a bad request (a validation error, an unknown model)
    OVERLOADED = "overloaded"  # 429: no slot free
    UNAVAILABLE = "unavailable"  # 503: shutting down, or the engine stopped
    UNAUTHORIZED = "unauthorized"  # 401
    FORBIDDEN = "forbidden"  # 403: an admin route without the admin key
    TOO_LARGE = "too_large"  # 413
    NOT_FOUND = "not_found"  # 404: no such route
