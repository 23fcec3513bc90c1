"""The fleet config file: pools (each one `serve`'s engine flags), the routes, the ingress.

```yaml
default_pool: chat
port: 8080                 # host, port, api_key, max_body_bytes: as `serve` takes them
api_key_file: fleet.key    # or the key from a file (mode 600); api_key inline: this file mode 600
pools:
  code: {speculate: 4, proposer: ngram, speculate_max_batch: 8, replicas: 1, num_cpus: 1}
  chat: {speculate: 2}
  bulk: {speculate: 0, autoscaling: {min_replicas: 1, max_replicas: 2}}
routes:                    # first match wins, then the default pool
  - {header: {x-specserve-pool: "*"}}       # the header names the pool
  - {model: smollm2-code, pool: code}       # OpenAI `model` / TGI `parameters.model`
  - {path: /v1/completions, pool: code}
```

`load_fleet` validates it once, in the CLI, and every error names the file, the pool and the
field. A pool's fields are exactly `specserve serve`'s flags (`fleet/flags.py`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from specserve.cli_args import engine_config
from specserve.fleet.flags import FLEET_OPTIONS, LIVE_FIELDS, POOL_OPTIONS, fields_of
from specserve.server.keyfile import read_key_file
from specserve.server.startup import server_settings
from specserve.speculation.registry import REGISTRY
from specserve.storage import read_private

POOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
POOL_HEADER = "x-specserve-pool"


class FleetConfigError(ValueError):
    """A fleet config that cannot serve: the message names the file, the pool and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Autoscaling(_Strict):
    """Ray Serve autoscaling of a pool's replicas (instead of a fixed `replicas`)."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=1, ge=1)
    target_ongoing_requests: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self


class _PoolBase(_Strict):
    replicas: int = Field(default=1, ge=1, description="engines serving this pool")
    autoscaling: Autoscaling | None = Field(default=None, description="instead of replicas")
    num_cpus: float = Field(default=1.0, gt=0, description="CPUs one replica reserves in Ray")

    @model_validator(mode="after")
    def _engine(self) -> Self:
        if self.autoscaling is not None and "replicas" in self.model_fields_set:
            raise ValueError("give replicas or autoscaling, not both")
        values = self.model_dump()
        if values["speculation_profile"] is not None:
            given = {"speculate", "speculate_max_batch"} & self.model_fields_set
            if given:
                raise ValueError(
                    f"{', '.join(sorted(given))}: this pool takes them from its "
                    "speculation_profile (set speculation_profile to null to give them)"
                )
        engine_config(values, resolve_speculate=False)
        server_settings(values)  # the request limits
        return self


# Models built from the flag declarations: mypy sees them as Any.
PoolConfig: Any = create_model("PoolConfig", __base__=_PoolBase, **fields_of(POOL_OPTIONS))


class Route(_Strict):
    """One rule: exactly one of header, model or path; `pool` unless the header names it."""

    header: dict[str, str] | None = None
    model: str | None = None
    path: str | None = None
    pool: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        kinds = [k for k in ("header", "model", "path") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a route matches on exactly one of header, model or path")
        if self.header is not None and len(self.header) != 1:
            raise ValueError("a header route names exactly one header")
        names_pool = self.header is not None and "*" in self.header.values()
        if names_pool == (self.pool is not None):
            raise ValueError(
                'a route needs pool, except a header route with value "*" (the header names it)'
            )
        return self


_FleetBase: Any = create_model("_FleetBase", __base__=_Strict, **fields_of(FLEET_OPTIONS))


class FleetConfig(_FleetBase):
    default_pool: str
    pools: dict[str, PoolConfig]
    routes: list[Route] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> Self:
        for name in self.pools:
            if not POOL_NAME.match(name):
                raise ValueError(f"pool name {name!r}: letters, digits, '_' and '-' only")
        known = sorted(self.pools)
        if self.default_pool not in self.pools:
            raise ValueError(f"default_pool {self.default_pool!r} is not a pool; pools: {known}")
        for i, route in enumerate(self.routes):
            if route.pool is not None and route.pool not in self.pools:
                raise ValueError(f"routes[{i}]: pool {route.pool!r} is not a pool; pools: {known}")
        return self


# ------------------------------------------------------------------------------- loading
def load_fleet(path: str | Path) -> FleetConfig:
    """Read and validate a fleet file; FleetConfigError names the file, pool and field."""
    return parse_fleet(read_fleet(path), str(path))


def read_fleet(path: str | Path) -> Any:
    """A fleet file's mapping, its key resolved: `api_key_file` (a file of one key, under
    `--api-key-file`'s rules: this user's, mode 600; a relative path from the fleet file's
    folder) becomes `api_key`; an inline `api_key`
    is read only from a fleet file that is itself private, as a key file must be."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise FleetConfigError(f"{path}: cannot read the fleet config: {exc}") from exc
    if not isinstance(raw, dict):
        return raw
    try:
        if raw.get("api_key") is not None:
            read_private(path, "fleet config with an inline api_key")
        if raw.get("api_key_file") is not None:
            if raw.get("api_key") is not None:
                raise ValueError("give api_key or api_key_file, not both")
            key_file = Path(str(raw["api_key_file"])).expanduser()
            key_file = key_file if key_file.is_absolute() else Path(path).parent / key_file
            keys = read_key_file(str(key_file), "api_key_file")
            if len(keys) != 1:
                raise ValueError(f"api_key_file holds {len(keys)} keys; a fleet takes one")
            raw = {**raw, "api_key": keys[0]}
        raw.pop("api_key_file", None)
    except ValueError as exc:
        raise FleetConfigError(f"{path}: {exc}") from exc
    return raw


def parse_fleet(raw: Any, source: str) -> FleetConfig:
    if not isinstance(raw, dict):
        raise FleetConfigError(f"{source}: a fleet config is a mapping with pools and routes")
    try:
        return FleetConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{source}: {_where(e['loc'])}: {_message(e)}" for e in exc.errors()]
        raise FleetConfigError("\n".join(lines)) from None


def _where(loc: tuple[int | str, ...]) -> str:
    if len(loc) >= 2 and loc[0] == "pools":
        rest = ".".join(str(p) for p in loc[2:])
        return f"pool {loc[1]!r}" + (f", field {rest}" if rest else "")
    return ".".join(str(p) for p in loc) or "fleet"


def _message(error: Any) -> str:
    msg = str(error["msg"])
    return msg.removeprefix("Value error, ")


# ------------------------------------------------------------------------- one pool's parts
def pool_values(pool: _PoolBase) -> dict[str, Any]:
    """Every engine and serve flag of the pool (no Ray fields)."""
    return {k: v for k, v in pool.model_dump().items() if k in _FLAG_NAMES}


def live_settings(pool: _PoolBase) -> dict[str, Any]:
    """What changes without restarting the pool's replicas (Ray Serve's user_config)."""
    values = pool.model_dump()
    return {k: values[k] for k in LIVE_FIELDS}


def restart_key(pool: _PoolBase) -> str:
    """The pool's deployment version: a digest of everything a change of which must restart
    its replicas. The live fields count only where they load something: a proposer that may
    load an artifact (when speculating), and N when --max-memory sized the KV pool for it."""
    values = pool_values(pool)
    key = {k: v for k, v in values.items() if k not in LIVE_FIELDS}
    speculating = values["speculate"] != 0 or values["speculation_profile"] is not None
    loads = speculating and REGISTRY.may_load(values["proposer"])
    key["loads"] = values["proposer"] if loads else None
    if values["max_memory"] is not None:
        key["speculate"] = values["speculate"]
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def check_models(config: FleetConfig, pools: list[str] | None = None) -> None:
    """FleetConfigError naming the pool whose `model` is no path on this machine: checked
    before a deploy, so a typo fails at once instead of after its replicas fail to start."""
    for name in config.pools if pools is None else pools:
        model = config.pools[name].model
        if model is not None and not Path(model).expanduser().exists():
            raise FleetConfigError(f"pool {name!r}: model {model!r} does not exist")


def with_changes(config: FleetConfig, pool: str, changes: dict[str, Any]) -> FleetConfig:
    """The config with `changes` applied to one pool, validated as a file would be."""
    if pool not in config.pools:
        raise FleetConfigError(f"no pool {pool!r}; pools: {sorted(config.pools)}")
    raw = config.model_dump(exclude_unset=True)
    raw["pools"][pool] = {**raw["pools"].get(pool, {}), **changes}
    return parse_fleet(raw, f"fleet set {pool}")


_FLAG_NAMES = frozenset(o.dest for o in POOL_OPTIONS)
