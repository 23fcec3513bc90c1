"""`specserve fleet up|status|set|down|plan`: traffic pools on Ray Serve behind one router.

    specserve fleet plan --profile bench-out/speculation-profile.json --out fleet.yaml
    specserve fleet up --config fleet.yaml                      # a Ray cluster on this machine
    specserve fleet up --config fleet.yaml --address HOST:6379  # join a running cluster
    specserve fleet set code speculate=2 speculate_max_batch=8  # live: no replica restarts
    specserve fleet status
    specserve fleet down

Without --address, `up` starts a Ray cluster in its own process, bound to 127.0.0.1, and
serves until Ctrl-C, SIGTERM or `fleet down` (each drains first: new requests 503, those in
flight get the fleet's drain_timeout); the other commands find it through the address
it writes to the specserve cache. With --address the fleet lives in that cluster: `up` returns
once it serves, and `down` removes it. Ray is imported only by these commands.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from specserve.fleet.cluster import connect, start_cluster, stop_cluster
from specserve.fleet.config import (
    FleetConfigError,
    check_models,
    live_settings,
    parse_fleet,
    read_fleet,
    restart_key,
    with_changes,
)
from specserve.fleet.secrets import remove_secrets

logger = logging.getLogger("specserve.fleet")


def add_fleet_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fleet",
        help="traffic pools with their own speculation settings, on Ray Serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="fleet_command", required=True)
    up = sub.add_parser("up", help="deploy (or update) a fleet from its config file")
    up.add_argument("--config", required=True, type=Path, help="the fleet YAML")
    up.add_argument("--host", help="the ingress's address (default: the file's, 127.0.0.1)")
    up.add_argument("--port", type=int, help="the ingress's port (default: the file's, 8080)")
    up.add_argument("--num-cpus", type=int, help="CPUs of a cluster started here (all)")
    up.set_defaults(func=cmd_up)
    status = sub.add_parser("status", help="the fleet's deployments and replicas")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)
    setter = sub.add_parser("set", help="change a pool's settings (live where possible)")
    setter.add_argument("pool")
    setter.add_argument("changes", nargs="+", metavar="KEY=VALUE", help="YAML values")
    setter.set_defaults(func=cmd_set)
    down = sub.add_parser(
        "down",
        help="drain and remove the fleet (and stop a cluster `up` started)",
        description="New requests get 503 and /health 503; those in flight get the drain "
        "timeout to finish; then the fleet is removed.",
    )
    down.add_argument(
        "--drain-timeout",
        type=float,
        help="seconds requests in flight get to finish (default: the fleet's drain_timeout)",
    )
    down.set_defaults(func=cmd_down)
    for cmd in (up, status, setter, down):
        cmd.add_argument(
            "--address", help="Ray cluster (default: RAY_ADDRESS, else the one `up` started)"
        )
    plan = sub.add_parser("plan", help="a fleet config from the bench's speculation profile")
    plan.add_argument("--profile", required=True, type=Path)
    plan.add_argument("--out", required=True, type=Path)
    plan.add_argument("--model", help="every pool's --model (default: the embedded model)")
    plan.add_argument("--draft-model", help="every pool's --draft-model")
    plan.add_argument("--num-threads", type=int, help="every pool's --num-threads")
    plan.add_argument("--num-cpus", type=float, help="CPUs each replica reserves (default 1)")
    plan.add_argument("--port", type=int, help="the ingress's port")
    plan.set_defaults(func=cmd_plan)


# ------------------------------------------------------------------------------- commands
def cmd_up(args: argparse.Namespace) -> int:
    try:
        raw = read_fleet(args.config)  # errors name the file; the key file read
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v}
        config = parse_fleet({**raw, **overrides}, str(args.config))
        check_models(config)
    except (OSError, FleetConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    owned = args.address is None
    where = start_cluster(args.num_cpus) if owned else args.address
    if not owned:
        connect(args.address)
    from ray import serve

    from specserve.fleet.deploy import APP, DEPLOY_ERRORS, deploy

    try:
        deploy(config)
    except DEPLOY_ERRORS as exc:
        print(f"error: {_message(exc)}", file=sys.stderr)
        if owned:
            stop_cluster()
        return 1
    url = f"http://{config.host}:{config.port}"
    print(
        f"fleet serving at {url} in {time.monotonic() - started:.1f} s: pools "
        f"{', '.join(sorted(config.pools))} (Ray cluster {where})",
        flush=True,
    )
    if not owned:
        return 0
    stop = {"now": False}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.update(now=True))
    try:
        while not stop["now"] and APP in serve.status().applications:
            time.sleep(1.0)
        if stop["now"]:
            _drain(config.drain_timeout)
    finally:
        stop_cluster()
    return 0


def _drain(timeout_s: float) -> None:
    """As `serve` shuts down: new requests 503, those in flight get `timeout_s` to finish."""
    from specserve.fleet.deploy import DEPLOY_ERRORS, drain

    print(f"draining: requests in flight get up to {timeout_s:.0f} s", flush=True)
    try:
        left = drain(timeout_s)
    except DEPLOY_ERRORS as exc:  # the fleet is already down or broken: nothing to wait for
        print(f"error: cannot drain: {_message(exc)}", file=sys.stderr)
        return
    if left:
        print(f"drain timeout: {left} request(s) still running are cut off", flush=True)


def _message(exc: Exception) -> str:
    """One line for a failed cluster call: its type where the text alone says little."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return first if isinstance(exc, RuntimeError) and first else f"{type(exc).__name__}: {first}"


def cmd_status(args: argparse.Namespace) -> int:
    connect(args.address)
    from specserve.fleet.deploy import DEPLOY_ERRORS

    try:
        return _status(args)
    except DEPLOY_ERRORS as exc:
        print(f"error: {_message(exc)}", file=sys.stderr)
        return 1


def _status(args: argparse.Namespace) -> int:
    from ray import serve

    from specserve.fleet.deploy import APP, current_config

    app = serve.status().applications.get(APP)
    if app is None:
        print("no fleet is deployed in this cluster")
        return 1
    config = current_config()
    rows = {}
    for name, dep in app.deployments.items():
        replicas = {str(k).split(".")[-1]: v for k, v in dep.replica_states.items()}
        rows[name] = {"status": str(dep.status).split(".")[-1], "replicas": replicas}
    pools = {
        n: {"version": restart_key(p), "live": live_settings(p)} for n, p in config.pools.items()
    }
    out = {"status": str(app.status).split(".")[-1], "deployments": rows, "pools": pools}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"fleet {out['status']}; ingress at http://{config.host}:{config.port}")
    for name, row in rows.items():
        print(f"  {name}: {row['status']}, replicas {row['replicas']}")
    for name, pool in pools.items():
        print(f"  pool {name}: {pool['live']}")
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    import yaml

    try:
        changes = dict(_key_value(c, yaml) for c in args.changes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    connect(args.address)
    from specserve.fleet.deploy import DEPLOY_ERRORS, current_config, deploy

    try:
        old = current_config()
    except DEPLOY_ERRORS as exc:
        print(f"error: cannot read the running fleet: {_message(exc)}", file=sys.stderr)
        return 1
    try:
        new = with_changes(old, args.pool, changes)
        check_models(new, [args.pool])
    except FleetConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    restarts = restart_key(old.pools[args.pool]) != restart_key(new.pools[args.pool])
    how = "restarting its replicas" if restarts else "live, no replica restarts"
    print(f"pool {args.pool}: {changes} ({how})", flush=True)
    try:
        deploy(new)
    except DEPLOY_ERRORS as exc:
        print(f"error: {_message(exc)}", file=sys.stderr)
        return 1
    print(f"pool {args.pool} serves the new settings")
    return 0


def _key_value(text: str, yaml: Any) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def cmd_down(args: argparse.Namespace) -> int:
    connect(args.address)
    from ray import serve

    from specserve.fleet.deploy import APP, DEPLOY_ERRORS, current_config

    if APP not in serve.status().applications:
        print("no fleet is deployed in this cluster")
        return 1
    try:
        timeout = (
            current_config().drain_timeout if args.drain_timeout is None else args.drain_timeout
        )
    except DEPLOY_ERRORS as exc:
        print(
            f"error: cannot read the running fleet, not draining: {_message(exc)}", file=sys.stderr
        )
        timeout = None
    if timeout is not None:
        _drain(timeout)
    serve.delete(APP)
    remove_secrets()  # the ingress' key file: nothing reads it any more
    print("fleet removed (a cluster `fleet up` started stops with it)")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import yaml

    from specserve.fleet.plan import plan_fleet

    engine = {
        k: v
        for k, v in (
            ("model", args.model),
            ("draft_model", args.draft_model),
            ("num_threads", args.num_threads),
            ("num_cpus", args.num_cpus),
        )
        if v is not None
    }
    fleet = {"port": args.port} if args.port else {}
    try:
        raw = plan_fleet(args.profile, engine, **fleet)
        parse_fleet(raw, str(args.out))  # what `fleet up` will accept
    except (ValueError, FleetConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    print(f"wrote {args.out}: pools {', '.join(raw['pools'])}, default {raw['default_pool']}")
    return 0
