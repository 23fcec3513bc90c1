"""argparse flags with an environment-variable form: `--flag` beats `$ENV`, which beats the
declared default; `--help` shows all three."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Option:
    """One flag: what `add_option` declares on a parser and a fleet file takes as a field."""

    flag: str
    env: str
    help: str
    default: Any  # as --help shows it; a string default goes through `parse`, as argparse does
    parse: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    switch: bool = False  # on/off, off by default (default False)
    live: bool = False  # a fleet pool changes it without restarting its replicas
    # The EngineConfig field it sets (`("spec", "policy")`); () for a serve-only flag.
    path: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The flag's name in a parsed Namespace and in a fleet file."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def value(self) -> Any:
        """The default as parsing gives it."""
        if isinstance(self.default, str) and self.parse is not str:
            return self.parse(self.default)
        return self.default


def add_option(
    parser: argparse.ArgumentParser, option: Option, environ: Mapping[str, str] | None = None
) -> None:
    if option.switch:
        add_switch(parser, option.flag, option.env, option.help, environ)
    else:
        o = option
        add_flag(parser, o.flag, o.env, o.default, o.help, o.parse, environ, choices=o.choices)


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
