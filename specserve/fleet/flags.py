"""A pool's fields are `specserve serve`'s flags: the same `Option`s, as pydantic fields.

Every engine flag (`cli_args.ENGINE_OPTIONS`, from the config schema) and the serve flags that
belong to one engine (`POOL_SERVE_FLAGS`) become a field named as the flag's dest
(`--speculate-max-batch` -> `speculate_max_batch`), with its type, its choices, its help and its
declared default (the environment is not read: a fleet file says everything). The fleet-wide
serve flags (where the ingress listens, the API key, the body limit, the drain timeout) become
fields of the fleet itself. The fields a pool changes live are those the schema marks live.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from specserve.cli_args import ENGINE_OPTIONS
from specserve.cli_flags import Option
from specserve.server.startup import SERVE_OPTIONS

# serve flags a pool takes: its own admission limit, prompt limit, speculation profile and the
# names its model answers to.
POOL_SERVE_FLAGS = (
    "--served-model-name",
    "--max-input-tokens",
    "--max-concurrent-requests",
    "--max-choices",
    "--speculation-profile",
    "--profile-workload",
    "--strict-profile",
)
# serve flags the fleet takes once, for its ingress.
FLEET_SERVE_FLAGS = (
    "--host",
    "--port",
    "--api-key",
    "--max-body-bytes",
    "--drain-timeout",
    "--private-metrics",
)

POOL_OPTIONS = ENGINE_OPTIONS + tuple(o for o in SERVE_OPTIONS if o.flag in POOL_SERVE_FLAGS)
FLEET_OPTIONS = tuple(o for o in SERVE_OPTIONS if o.flag in FLEET_SERVE_FLAGS)

# What `Engine.set_speculation` changes between steps: a pool's replicas take these through
# Ray Serve's user_config without restarting. Every other field restarts the pool's replicas.
LIVE_FIELDS = tuple(o.dest for o in POOL_OPTIONS if o.live)


def fields_of(options: tuple[Option, ...]) -> dict[str, Any]:
    """pydantic field definitions `{dest: (type, Field)}` for `options`."""
    return {o.dest: _field(o) for o in options}


def with_defaults(values: Mapping[str, Any]) -> dict[str, Any]:
    """A pool's flag values: `values` over the declared defaults."""
    return {o.dest: values.get(o.dest, o.value) for o in POOL_OPTIONS}


def _field(option: Option) -> tuple[Any, Any]:
    kind: Any
    if option.switch:
        kind = bool
    elif option.choices is not None:
        kind = Literal[option.choices]
    elif isinstance(option.parse, type):
        kind = option.parse
    else:  # a parsing function (e.g. byte sizes): a string goes through it, as on the CLI
        parse: Any = option.parse
        kind = Annotated[Any, BeforeValidator(lambda v: parse(v) if isinstance(v, str) else v)]
    if option.default is None:
        kind = kind | None
    description = f"{option.help} (`serve {option.flag}`)"
    return kind, Field(default=option.value, description=description)
