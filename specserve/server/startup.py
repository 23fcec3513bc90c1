"""Start an engine from `serve`'s flag values: `specserve serve` and a fleet replica both do it
here (`start`), from a parsed Namespace's values or a fleet pool's.

With --speculation-profile, the profile's N and gate replace --speculate and
--speculate-max-batch; once the engine has loaded, the profile is checked against the loaded
target and proposer (see `server/provenance.py`): stale means a warning, or an error under
--strict-profile.

The serve-only flags are declared here (`SERVE_OPTIONS`), by hand: they configure the HTTP
server and its admission (`ServerSettings`), not the engine, so they are no `EngineConfig` field.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.cli_args import engine_config
from specserve.cli_flags import Option
from specserve.config import EngineConfig
from specserve.engine.async_engine import AsyncEngine
from specserve.engine.engine import Engine
from specserve.models.gguf_file import GGUFError, GGUFFile
from specserve.server.keyfile import admin_key, api_keys
from specserve.server.provenance import ProfileChoice, Provenance, load_choice, review
from specserve.server.settings import ServerSettings, model_names

logger = logging.getLogger("specserve.serve")

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

SERVE_OPTIONS: tuple[Option, ...] = (
    Option(
        "--host",
        "SPECSERVE_HOST",
        "address to listen on; loopback by default, 0.0.0.0 for every interface",
        "127.0.0.1",
    ),
    Option("--port", "PORT", "port to listen on", 8080, int),
    Option(
        "--served-model-name",
        "SERVED_MODEL_NAME",
        "names requests address the model by (`model`), comma-separated; the first is the id "
        "/v1/models lists. Default: the --model value and its last path part; for a GGUF "
        "file its stem (the id) and its general.name too; for the embedded model its HF name",
        None,
    ),
    Option(
        "--max-input-tokens",
        "MAX_INPUT_TOKENS",
        "longest prompt in tokens (unset = the context window minus one)",
        None,
        int,
    ),
    Option(
        "--max-concurrent-requests",
        "MAX_CONCURRENT_REQUESTS",
        "generation requests in flight (running + queued); more get 429 with Retry-After",
        128,
        int,
    ),
    Option(
        "--max-choices",
        "MAX_CHOICES",
        "most choices (OpenAI `n`) one request may ask for; they share the prompt's KV blocks",
        8,
        int,
    ),
    Option(
        "--api-key",
        "API_KEY",
        "require 'Authorization: Bearer <key>' on every route except /health and /metrics",
        None,
    ),
    Option(
        "--api-key-file",
        "API_KEY_FILE",
        "read --api-key from a file (mode 600); several lines are several keys, one per tenant: "
        "a tenant's requests share cached prompts and suffix drafts only with its own",
        None,
    ),
    Option(
        "--admin-key-file",
        "ADMIN_KEY_FILE",
        "the operator's key, from a file (mode 600): with several --api-key-file keys, /info "
        "and POST /reset_prefix_cache, /reset_suffix_cache take only it (tenant keys get 403)",
        None,
    ),
    Option(
        "--max-body-bytes",
        "MAX_BODY_BYTES",
        "largest request body; larger ones get 413",
        2_000_000,
        int,
    ),
    Option(
        "--drain-timeout",
        "DRAIN_TIMEOUT",
        "seconds requests in flight get to finish at shutdown (the listener stays open, "
        "/health answers 503); then they are aborted with an error",
        30.0,
        float,
    ),
    Option(
        "--speculation-profile",
        "SPECULATION_PROFILE",
        "speculation profile JSON written by `specserve bench`: its N and gate replace "
        "--speculate and --speculate-max-batch; checked against the loaded model and proposer",
        None,
    ),
    Option(
        "--profile-workload",
        "PROFILE_WORKLOAD",
        "which of the profile's workloads to apply (unset = the profile's default)",
        None,
    ),
    Option(
        "--private-metrics",
        "PRIVATE_METRICS",
        "with an API key, /metrics needs it too (by default scrapers read it without one)",
        False,
        switch=True,
    ),
    Option(
        "--stream-from-loop",
        "STREAM_FROM_LOOP",
        "write streamed events from the event loop, as every other response; by default, when "
        "the compute threads take every core, the engine's thread writes them between two "
        "steps (plain HTTP only; see specserve/server/direct.py)",
        False,
        switch=True,
    ),
    Option(
        "--strict-profile",
        "STRICT_PROFILE",
        "refuse to start (exit 2) when the speculation profile was measured on other artifacts",
        False,
        switch=True,
    ),
)


class FlagError(ValueError):
    """The flag values say an engine or server that cannot be: nothing was loaded."""


@dataclass(frozen=True)
class Started:
    """An engine serving, and what it was started with."""

    engine: AsyncEngine
    config: EngineConfig
    settings: ServerSettings
    provenance: Provenance


def start(values: Mapping[str, Any]) -> Started:
    """Build the engine the flag values say (in its step thread) and review the speculation
    profile against it. FlagError when the values are invalid; ValueError when the profile
    cannot be read, the engine cannot load, or a stale profile meets --strict-profile."""
    values, choice = with_profile(values)
    try:
        config = engine_config(values)
        settings = server_settings(values)
    except ValueError as exc:
        raise FlagError(str(exc)) from exc
    front = AsyncEngine(lambda: Engine(config))
    provenance = review(front.engine, choice, strict=values["strict_profile"])
    return Started(front, config, settings, provenance)


def with_profile(values: Mapping[str, Any]) -> tuple[dict[str, Any], ProfileChoice | None]:
    """The values with --speculation-profile's N and gate in place of --speculate and
    --speculate-max-batch, and the profile's choice (None without a profile)."""
    values = dict(values)
    if values["speculation_profile"] is None:
        return values, None
    choice = load_choice(values["speculation_profile"], values["profile_workload"])
    values["speculate"], values["speculate_max_batch"] = (
        choice.speculate,
        choice.speculate_max_batch,
    )
    logger.info(
        "speculation profile %s, workload %r: --speculate %d --speculate-max-batch %s",
        choice.path,
        choice.workload,
        choice.speculate,
        choice.speculate_max_batch,
    )
    return values, choice


def server_settings(values: Mapping[str, Any]) -> ServerSettings:
    """The serve-side limits the values say. A fleet pool's values have no ingress flags (API
    key, body size): its replicas take the defaults, and the fleet's ingress applies those."""
    model_id, names = served_names(values.get("served_model_name"), values["model"])
    return ServerSettings(
        model_id=model_id,
        model_names=names,
        max_input_tokens=values["max_input_tokens"],
        max_concurrent_requests=values["max_concurrent_requests"],
        max_choices=values["max_choices"],
        **api_keys(values.get("api_key"), values.get("api_key_file")),
        admin_key=admin_key(values.get("admin_key_file")),
        max_body_bytes=values.get("max_body_bytes", ServerSettings.max_body_bytes),
        private_metrics=values.get("private_metrics", False),
    )


def served_names(explicit: str | None, model: str | None) -> tuple[str, tuple[str, ...]]:
    """The model's id and every name a request may address it by (see --served-model-name)."""
    if explicit:
        names = tuple(dict.fromkeys(n.strip() for n in explicit.split(",") if n.strip()))
        if not names:
            raise ValueError("--served-model-name names no name")
        return names[0], names
    if model is None:
        return DEFAULT_MODEL_ID, model_names(DEFAULT_MODEL_ID)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        found = [path.stem, *model_names(model), _gguf_name(path)]
        return path.stem, tuple(dict.fromkeys(n for n in found if n))
    return model, model_names(model)


def _gguf_name(path: Path) -> str:
    """The GGUF's general.name ("" where the header does not read: loading says why)."""
    try:
        return GGUFFile(path).string("general.name")
    except GGUFError:
        return ""


def freeze_startup_heap() -> int:
    """Put every object alive now out of the garbage collector's reach; returns how many.

    The model, tokenizer and imported modules live as long as the process, and a full
    collection walks them all while holding the GIL: with the embedded model, ~376k objects
    and 420-450 ms a full collection (ad hoc, this machine), a stall for every stream in flight
    whenever one runs while serving; after the freeze it took under 1 ms. The collector still
    frees what is allocated from now on."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%d objects alive after start-up frozen: no garbage collection scans them", frozen)
    return frozen
