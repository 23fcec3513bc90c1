"""Engine flags shared by `generate` and `serve`, generated from the config schema.

Every field of `EngineConfig` (and of its nested records) that carries a `Flag` in its metadata
is one flag here, in declaration order; every flag has an environment-variable form. Parsed
flags go back into an `EngineConfig` through the same fields (`engine_config`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from dataclasses import fields, is_dataclass
from types import NoneType, UnionType
from typing import Any, Literal, get_args, get_origin, get_type_hints

from specserve.cli_flags import Option, add_option
from specserve.config import EngineConfig
from specserve.config_schema import FIELD_DEFAULT, FLAG, Flag
from specserve.speculation.medusa_resolve import default_speculate
from specserve.speculation.registry import AUTO, REGISTRY


def schema_options(cls: type = EngineConfig, path: tuple[str, ...] = ()) -> Iterator[Option]:
    """The flag of every flagged field of `cls`, nested records walked in place."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and is_dataclass(kind):
            yield from schema_options(kind, (*path, f.name))
        elif FLAG in f.metadata:
            yield _option(f.metadata[FLAG], kind, f.default, (*path, f.name))


def _option(flag: Flag, kind: Any, default: Any, path: tuple[str, ...]) -> Option:
    """The flag of one field of type `kind`: a switch for a bool, choices for a Literal (for
    --proposer, the registry's kinds)."""
    if path == PROPOSER:
        return _proposer_option(flag, default, path)
    if get_origin(kind) is UnionType:  # `int | None`: the flag parses the int
        [kind] = [k for k in get_args(kind) if k is not NoneType]
    common: dict[str, Any] = {"live": flag.live, "path": path}
    if kind is bool:
        return Option(flag.name, flag.env, flag.help, False, switch=True, **common)
    choices = get_args(kind) if get_origin(kind) is Literal else None
    shown = default if flag.default is FIELD_DEFAULT else flag.default
    parse = flag.parse or (str if choices else kind)
    return Option(flag.name, flag.env, flag.help, shown, parse, choices, **common)


PROPOSER = ("spec", "proposer")


def proposer_names() -> tuple[str, ...]:
    return (AUTO, *REGISTRY.names())


def _proposer_option(flag: Flag, default: Any, path: tuple[str, ...]) -> Option:
    """--proposer: a choice per registered kind, each kind's summary in the help; so a new
    kind is its module and its line in the registry."""
    kinds = "; ".join(f"{k.name}: {k.summary}" if k.summary else k.name for k in REGISTRY.kinds())
    help = f"{flag.help}; or one kind: {kinds}"
    choices = proposer_names()
    return Option(flag.name, flag.env, help, default, str, choices, live=flag.live, path=path)


ENGINE_OPTIONS: tuple[Option, ...] = tuple(schema_options())


def add_engine_args(p: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Every engine flag: the model, speculation, and the runtime limits."""
    for option in ENGINE_OPTIONS:
        add_option(p, option, environ)


def engine_config_from_args(args: argparse.Namespace | Mapping[str, Any]) -> EngineConfig:
    """The engine config the flags say; SystemExit naming the problem when they are invalid."""
    try:
        return engine_config(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc


def engine_config(
    args: argparse.Namespace | Mapping[str, Any], resolve_speculate: bool = True
) -> EngineConfig:
    """The engine config the flags say (a parsed Namespace, or a fleet pool's values by flag
    name); ValueError when they are invalid. An unset --speculate is resolved (the Medusa heads'
    count, which reads the model) unless `resolve_speculate` is False: then it counts as 0,
    enough to check the rest without the model."""
    values = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    if values["speculate"] is None:
        values["speculate"] = 0
        if resolve_speculate:
            values["speculate"] = default_speculate(
                values["model"], values["proposer"], values["medusa"]
            )
    config: EngineConfig = _build(EngineConfig, (), values)
    if config.spec.proposer not in proposer_names():  # a fleet file's value (argparse checks flags)
        raise ValueError(
            f"proposer must be one of {proposer_names()}, got {config.spec.proposer!r}"
        )
    return config


_BY_PATH = {o.path: o for o in ENGINE_OPTIONS}


def _build(cls: Any, path: tuple[str, ...], values: Mapping[str, Any]) -> Any:
    """`cls` with its flagged fields under `path` set from the flag values, the rest at their
    defaults. A switch sets the opposite of its field's default (`--no-prefix-caching`)."""
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        at = (*path, f.name)
        if is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], at, values)
        elif at in _BY_PATH:
            option = _BY_PATH[at]
            value = values[option.dest]
            kwargs[f.name] = bool(value) != f.default if option.switch else value
    return cls(**kwargs)
