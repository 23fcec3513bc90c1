"""A fleet config -> one Ray Serve application: a deployment per pool, an ingress in front.

It is deployed as `serve run CONFIG` deploys (Ray Serve's declarative path, without the
dashboard): an import path (`app_builder`, bound to the pool names) plus per-deployment
options. On that path Serve keeps a deployment's replicas while its code and actor options stay
the same, and an update of only its `user_config` is the lightweight one: `reconfigure` runs in
each replica, same process, requests in flight untouched. (Re-running `serve.run` gives every
deploy a new random code version and replaces every replica; 2.60 no longer takes a version.)

So a pool's live settings are its `user_config`, and everything else its replicas are built
from (with `config.restart_key`, which also covers a live setting that loads something) travels
in an environment variable of their actor options (`SPECSERVE_POOL`): changing a model or an
engine limit changes those options, and Serve restarts that pool's replicas, and only those.
The ingress takes the whole config as its user_config (routes, what /info shows), and only
what its app is built from (API key, body limit) in its options. Adding or removing a pool
changes the builder's arguments: then everything restarts.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle

from specserve.fleet.config import (
    FleetConfig,
    live_settings,
    parse_fleet,
    pool_values,
    restart_key,
)
from specserve.fleet.flags import LIVE_FIELDS
from specserve.fleet.ingress import FleetContexts, fleet_app
from specserve.fleet.replica import PoolReplica
from specserve.fleet.secrets import read_secret, write_secret
from specserve.server.settings import ServerSettings

logger = logging.getLogger(__name__)

APP = "specserve-fleet"
INGRESS = "ingress"
POOL_ENV = "SPECSERVE_POOL"  # a pool replica's flag values, JSON
INGRESS_ENV = "SPECSERVE_INGRESS"  # the ingress's body limit and API key file, JSON
HEALTH_CHECK_PERIOD_S = 2
GRACE_S = 5  # beyond the drain timeout: for the last responses to be written
# What talking to the cluster can raise, besides our own RuntimeError: a config Serve refuses
# (ValueError, pydantic's among them), a lost connection or timeout (OSError), an actor or task
# that failed (RayError), Serve's own errors. The CLI turns each into a message and exit code 1.
DEPLOY_ERRORS: tuple[type[Exception], ...] = (
    RuntimeError,
    ValueError,
    OSError,
    RayError,
    RayServeException,
)


def pool_deployment_name(pool: str) -> str:
    return f"pool-{pool}"


class PoolDeployment(PoolReplica):
    """A pool's replica as Ray Serve starts it: the flag values from its actor options."""

    def __init__(self, pool: str) -> None:
        super().__init__(pool, json.loads(os.environ[POOL_ENV])["values"])


class FleetIngress:
    """The ingress replica: `fleet_app` over the pools' handles."""

    def __init__(self, pools: dict[str, DeploymentHandle]) -> None:
        guard = json.loads(os.environ[INGRESS_ENV])
        key_file = guard.pop("api_key_file")
        self.guard = {**guard, "api_key": None if key_file is None else read_secret(key_file)}
        self.contexts = FleetContexts(None, pools)

    def __serve_build_asgi_app__(self) -> Any:
        settings = ServerSettings(model_id="fleet", **self.guard)
        return fleet_app(self.contexts, settings)

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.contexts.update(parse_fleet(config, "the deployed fleet"))

    def refresh(self) -> None:
        """The pools changed (redeployed): take their limits and tokenizers again."""
        self.contexts.refresh()

    def drain(self) -> int:
        """Refuse new requests, keep those in flight (see `FleetContexts.drain`); their count."""
        return self.contexts.drain()

    def in_flight(self) -> int:
        return self.contexts.in_flight()

    def fleet_config(self) -> dict[str, Any]:
        """The deployed config, API key included (its user_config leaves the key out)."""
        assert self.contexts.config is not None
        raw = dump(self.contexts.config)
        if self.guard["api_key"] is not None:
            raw["api_key"] = self.guard["api_key"]
        return raw


def app_builder(args: dict[str, Any]) -> Any:
    """The application for `args["pools"]` (the import path of the deploy config)."""
    pools = {
        name: serve.deployment(name=pool_deployment_name(name))(PoolDeployment).bind(name)
        for name in args["pools"]
    }
    return serve.deployment(name=INGRESS)(serve.ingress()(FleetIngress)).bind(pools)


def dump(config: FleetConfig, secrets: bool = True) -> dict[str, Any]:
    """The config as it was written (fields left out stay out, so defaults stay defaults);
    `secrets=False` leaves out the API key."""
    exclude = None if secrets else {"api_key"}
    raw: dict[str, Any] = config.model_dump(mode="json", exclude_unset=True, exclude=exclude)
    return raw


def deploy_schema(config: FleetConfig, others: list[dict[str, Any]] | None = None) -> Any:
    """The `serve run`-style config of the fleet (a `ServeDeploySchema`), beside `others`:
    the configs of applications deployed declaratively in the same cluster, kept as they are
    (a declarative deploy deletes every declarative application it does not list)."""
    from ray.serve.schema import ServeDeploySchema

    # Ray logs a deployment's runtime_env and user_config: the API key travels as the path
    # of a file only its owner reads (fleet/secrets.py), never as its value.
    key_file = None if config.api_key is None else str(write_secret("api-key", config.api_key))
    guard = {
        "api_key_file": key_file,
        "max_body_bytes": config.max_body_bytes,
        "private_metrics": config.private_metrics,
    }
    in_flight = sum(p.max_concurrent_requests for p in config.pools.values())
    ingress = {
        "name": INGRESS,
        "user_config": dump(config, secrets=False),
        "num_replicas": 1,  # request series are observed here: one ingress, one count
        "max_ongoing_requests": in_flight + 64,  # admitted per pool, plus status routes
        "graceful_shutdown_timeout_s": config.drain_timeout + GRACE_S,
        "ray_actor_options": {"num_cpus": 0, "runtime_env": _env(INGRESS_ENV, guard)},
    }
    app = {
        "name": APP,
        "route_prefix": "/",
        "import_path": f"{__name__}:app_builder",
        "args": {"pools": sorted(config.pools)},
        "deployments": [
            ingress,
            *(_pool_options(n, p, config.drain_timeout) for n, p in config.pools.items()),
        ],
    }
    return ServeDeploySchema.model_validate({"applications": [*(others or []), app]})


def _pool_options(name: str, pool: Any, drain_timeout: float) -> dict[str, Any]:
    fixed = {k: v for k, v in pool_values(pool).items() if k not in LIVE_FIELDS}
    options: dict[str, Any] = {
        "name": pool_deployment_name(name),
        "user_config": live_settings(pool),
        "ray_actor_options": {
            "num_cpus": pool.num_cpus,
            # What the replicas are built from: a change here restarts them (see above).
            "runtime_env": _env(POOL_ENV, {"version": restart_key(pool), "values": fixed}),
        },
        # The engine batches and queues: let every admitted request of the pool reach it.
        "max_ongoing_requests": pool.max_concurrent_requests,
        # A replica being replaced (or a fleet being removed) lets its requests run this long.
        "graceful_shutdown_timeout_s": drain_timeout + GRACE_S,
        # check_health fails once the engine thread died: Serve replaces the replica.
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": 30,
        # A restart (model, limits) starts each new replica before it stops an old one, so a
        # one-replica pool keeps serving meanwhile; it needs room for one more replica.
        "max_surge_percent": 100,
    }
    if pool.autoscaling is not None:
        options["autoscaling_config"] = pool.autoscaling.model_dump()
    else:
        options["num_replicas"] = pool.replicas
    return options


def _env(name: str, value: Any) -> dict[str, Any]:
    return {"env_vars": {name: json.dumps(value, sort_keys=True)}}


def deploy(config: FleetConfig, timeout_s: float = 600.0) -> DeploymentHandle:
    """Deploy or update the fleet and wait until it serves, up to `timeout_s`; the ingress
    then re-reads the pools' limits (a restarted pool may have a new model). Serve must be
    started.

    The config is applied without Serve's own blocking wait (it gives up after a hard-coded
    60 s, whatever the caller allows: too short for replicas loading models on a busy
    machine); `wait_running` waits for as long as the caller said."""
    from ray.serve._private.api import serve_start  # what `serve run CONFIG` calls

    started = time.monotonic()
    client = serve_start(http_options={"host": config.host, "port": config.port})
    client.deploy_apps(
        deploy_schema(config, other_apps(client.get_serve_details())), _blocking=False
    )
    wait_running(timeout_s - (time.monotonic() - started))
    handle = ingress_handle()
    handle.refresh.remote().result()
    logger.info("fleet deployed in %.1f s", time.monotonic() - started)
    return handle


def drain(timeout_s: float) -> int:
    """Stop the fleet taking requests (503, /health 503) and wait up to `timeout_s` for those
    in flight to finish, as `serve` drains at shutdown. How many were still running."""
    handle = ingress_handle()
    left: int = handle.drain.remote().result()
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = handle.in_flight.remote().result()
    return left


def other_apps(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The submitted configs of the applications deployed declaratively beside the fleet (from
    Serve's instance details). Applications `serve.run` deployed are not touched by a
    declarative deploy, so they are left out."""
    return [
        app["deployed_app_config"]
        for name, app in details.get("applications", {}).items()
        if name != APP and app.get("source") == "declarative" and app.get("deployed_app_config")
    ]


def wait_running(timeout_s: float) -> None:
    """Until the application runs; RuntimeError with Serve's message if it failed."""
    deadline = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(APP)
        status = str(app.status) if app is not None else "NOT_STARTED"
        if status.endswith("RUNNING"):
            return
        if status.endswith("DEPLOY_FAILED") or time.monotonic() > deadline:
            message = app.message if app is not None else "the application is not there"
            raise RuntimeError(f"fleet {status}: {message}")
        time.sleep(0.5)


def ingress_handle() -> DeploymentHandle:
    return serve.get_app_handle(APP)


def current_config() -> FleetConfig:
    """The config the running fleet was deployed with."""
    raw = ingress_handle().fleet_config.remote().result()
    return parse_fleet(raw, "the running fleet")
