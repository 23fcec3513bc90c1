"""A pool's fields are `specserve serve`'s flags: read from the same argparse declarations.

Every engine flag (`cli_args.add_engine_args`) and the serve flags that belong to one engine
(`POOL_SERVE_FLAGS`) become a field named as the flag's dest (`--speculate-max-batch` ->
`speculate_max_batch`), with its type, its choices, its help and its declared default (the
environment is not read: a fleet file says everything). The fleet-wide serve flags (where the
ingress listens, the API key, the body limit) become fields of the fleet itself.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from specserve.cli_args import add_engine_args
from specserve.cli_flags import add_flag, add_switch
from specserve.server.cli import SERVE_FLAGS, STRICT_PROFILE

# serve flags a pool takes: its own admission limit, prompt limit and speculation profile.
POOL_SERVE_FLAGS = (
    "--max-input-tokens",
    "--max-concurrent-requests",
    "--max-choices",
    "--speculation-profile",
    "--profile-workload",
)
# serve flags the fleet takes once, for its ingress.
FLEET_SERVE_FLAGS = ("--host", "--port", "--api-key", "--max-body-bytes", "--drain-timeout")

# What `Engine.set_speculation` changes between steps: a pool's replicas take these through
# Ray Serve's user_config without restarting. Every other field restarts the pool's replicas.
LIVE_FIELDS = (
    "speculate",
    "proposer",
    "speculation_policy",
    "speculate_max_batch",
    "speculate_max_tokens",
    "ngram_max",
    "suffix_cache_tokens",
)


def pool_parser() -> argparse.ArgumentParser:
    """The flags of one pool, with their declared defaults."""
    p = argparse.ArgumentParser(add_help=False)
    add_engine_args(p, environ={})
    for flag in SERVE_FLAGS:
        if flag[0] in POOL_SERVE_FLAGS:
            add_flag(p, *flag, environ={})
    add_switch(p, *STRICT_PROFILE, environ={})
    return p


def fleet_parser() -> argparse.ArgumentParser:
    """The fleet-wide serve flags, with their declared defaults."""
    p = argparse.ArgumentParser(add_help=False)
    for flag in SERVE_FLAGS:
        if flag[0] in FLEET_SERVE_FLAGS:
            add_flag(p, *flag, environ={})
    return p


def fields_of(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """pydantic field definitions `{dest: (type, Field)}` for every flag of `parser`."""
    return {action.dest: _field(action) for action in _flags(parser)}


def namespace(values: dict[str, Any], parser: argparse.ArgumentParser) -> argparse.Namespace:
    """What parsing the flags would give: `values` over the declared defaults."""
    ns = argparse.Namespace(**{a.dest: _default(a) for a in _flags(parser)})
    for dest, value in values.items():
        if hasattr(ns, dest):
            setattr(ns, dest, value)
    return ns


def _flags(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    return (a for a in parser._actions if a.option_strings and a.dest != "help")


def _field(action: argparse.Action) -> tuple[Any, Any]:
    kind: Any
    if isinstance(action, argparse._StoreTrueAction):
        kind = bool
    elif action.choices is not None:
        kind = Literal[tuple(action.choices)]
    elif isinstance(action.type, type) or action.type is None:
        kind = action.type or str
    else:  # a parsing function (e.g. byte sizes): a string goes through it, as on the CLI
        parse: Any = action.type
        kind = Annotated[Any, BeforeValidator(lambda v: parse(v) if isinstance(v, str) else v)]
    if action.default is None:
        kind = kind | None
    return kind, Field(default=_default(action), description=_help(action))


def _default(action: argparse.Action) -> Any:
    """The default as parsing gives it: argparse runs a string default through the type."""
    convert = action.type
    if isinstance(action.default, str) and callable(convert) and convert is not str:
        return convert(action.default)
    return action.default


_ENV_SUFFIX = re.compile(r" \[env: [^]]*\]$")


def _help(action: argparse.Action) -> str:
    """The flag's help without its `[env: ...; default: ...]` suffix."""
    text = _ENV_SUFFIX.sub("", action.help or "")
    return f"{text} (`serve {action.option_strings[0]}`)"
