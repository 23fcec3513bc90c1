"""The Ray cluster a fleet runs in: one `fleet up` starts on this machine (every port on
127.0.0.1, its address saved privately in the specserve cache), or one the commands join.
Ray is imported only inside these functions, when a fleet command runs."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from specserve.fleet.secrets import remove_secrets
from specserve.storage import default_cache_dir, private_dir, read_private, write_private


def address_file() -> Path:
    return default_cache_dir() / "fleet-address"


# The environment of a cluster `fleet up` starts (and a test's), read by its raylet and workers.
# Ray Serve gives a starting HTTP proxy 5 s to report ready before it kills and restarts it; on a
# busy machine a Ray worker takes longer than that to start, and starting Serve then fails.
# Ray starts its workers at nice 15, and the replicas are workers: beside any process at the
# default priority (a build, a load generator, another server) each then gets ~1/28 of that
# process's CPU share. On 2 cores with two busy-looping processes beside it, the fleet tests ran
# for over 20 minutes without finishing where they take ~2 idle; at nice 0 they share the cores
# as the rest of the machine does.
SERVE_ENV = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "55",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
    "RAY_worker_niceness": "0",
}


def loopback_only() -> None:
    """Before Ray is imported: a single-machine cluster whose every port binds 127.0.0.1.
    (Ray otherwise swaps 127.0.0.1 for the machine's reachable address; its switch for that
    is named after the platforms where it is the default.)"""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def connect(address: str | None) -> None:
    """Join the Ray cluster the fleet runs in; SystemExit when there is none."""
    address = address or os.environ.get("RAY_ADDRESS")
    if address is None and address_file().is_file():
        try:  # a file someone else wrote would send this client (and its token) elsewhere
            address = read_private(address_file(), "fleet address file").strip()
        except ValueError as exc:
            raise SystemExit(f"error: not trusting {exc}; remove it or pass --address") from exc
        loopback_only()  # the cluster `fleet up` started here
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # with the token it saved
    if address is None:
        raise SystemExit("error: no fleet found: start one with `specserve fleet up`")
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise SystemExit(f"error: cannot reach the Ray cluster at {address}: {exc}") from exc


def auth_token_file() -> Path:
    return Path.home() / ".ray" / "auth_token"  # where Ray reads (and would write) its token


def private_token() -> None:
    """Ray's token file, private from its creation: Ray writes one 0644 when there is none, so
    it is written here first (0600, in a 0700 directory), or tightened if it is there."""
    token = auth_token_file()
    private_dir(token.parent)
    if token.is_file():
        token.chmod(0o600)
    else:
        write_private(token, secrets.token_hex(32))  # 256 bits, as Ray's own


def start_cluster(num_cpus: int | None) -> str:
    """A Ray cluster in this process, on 127.0.0.1, without the dashboard, with Ray's token
    authentication on (explicitly: not left to Ray's default of the day)."""
    loopback_only()
    for name, value in SERVE_ENV.items():  # inherited by the cluster's workers
        os.environ.setdefault(name, value)
    os.environ["RAY_AUTH_MODE"] = "token"
    private_token()
    import ray

    cpus = num_cpus if num_cpus is not None else os.cpu_count()
    ray.init(
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=True,
        logging_level=logging.WARNING,
    )
    address = str(ray.get_runtime_context().gcs_address)
    address_file().parent.mkdir(parents=True, exist_ok=True)
    write_private(address_file(), address)
    return address


def stop_cluster() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()
        address_file().unlink(missing_ok=True)
        remove_secrets()
        print("fleet stopped", flush=True)
