"""The configuration schema's field metadata: how users set a field (`Flag`, `flag`) and the
byte sizes its flags read (`parse_bytes`). The records themselves are in `config.py`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BYTE_UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}


def parse_bytes(value: str) -> int:
    """A byte count: '268435456', '256MiB', '8GiB', '1.5GB', '2e9'. ValueError otherwise."""
    text = value.strip().lower()
    suffix = next((u for u in BYTE_UNITS if text.endswith(u)), "")
    scale = BYTE_UNITS.get(suffix, 1)
    number = float(text[: len(text) - len(suffix)])
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"expected a positive number of bytes (like 256MiB), got {value!r}")
    return int(number * scale)


class _FieldDefault:
    def __repr__(self) -> str:
        return "<the field's default>"


FIELD_DEFAULT: Any = _FieldDefault()


@dataclass(frozen=True)
class Flag:
    """How users set a field: `name` on the command line, `env` in the environment, and the
    pool field named as the flag (`--speculate-max-batch` -> `speculate_max_batch`) in a fleet
    file. A Literal field's flag takes its values as choices; a bool field's flag is a switch
    that sets the opposite of the field's default (`--no-prefix-caching`)."""

    name: str
    env: str
    help: str
    # A fleet pool changes it on its running replicas (`Engine.set_speculation` takes it between
    # steps); any other field restarts them.
    live: bool = False
    # The flag's default where it is not the field's, as --help shows it (a string goes through
    # `parse`); None there means "unset", resolved at start-up.
    default: Any = FIELD_DEFAULT
    # A string's value where the field's type cannot read it (byte sizes like 2GiB).
    parse: Callable[[str], Any] | None = None


FLAG = "flag"  # the metadata key of a field's Flag


def flag(name: str, env: str, help: str, **kwargs: Any) -> dict[str, Flag]:
    """The metadata of a field that users set through the flag `name` (see `Flag`)."""
    return {FLAG: Flag(name, env, help, **kwargs)}
