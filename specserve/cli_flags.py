"""argparse flags with an environment-variable form: `--flag` beats `$ENV`, which beats the
declared default; `--help` shows all three."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import Any

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_bool(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"expected one of {_TRUE + _FALSE}")


def env_default(
    env: str,
    default: Any,
    cast: Callable[[str], Any] = str,
    environ: Mapping[str, str] | None = None,
) -> Any:
    value = (os.environ if environ is None else environ).get(env)
    if value is None or value == "":
        return default
    try:
        return cast(value)
    except ValueError as exc:
        raise SystemExit(f"environment variable {env}={value!r} is invalid: {exc}") from exc


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    env: str,
    default: Any,
    help: str,
    cast: Callable[[str], Any] = str,
    environ: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> None:
    """`environ`: where the env-var forms are read (None: this process's environment; {}: none,
    so the defaults are the declared ones, as a fleet config's pools take them)."""
    parser.add_argument(
        flag,
        default=env_default(env, default, cast, environ),
        type=cast,
        help=f"{help} [env: {env}; default: {default}]",
        **kwargs,
    )


def add_switch(
    parser: argparse.ArgumentParser,
    flag: str,
    env: str,
    help: str,
    environ: Mapping[str, str] | None = None,
) -> None:
    """An on/off flag, off by default; `env` set to a true value turns it on."""
    parser.add_argument(
        flag,
        action="store_true",
        default=env_default(env, False, parse_bool, environ),
        help=f"{help} [env: {env}; default: False]",
    )
