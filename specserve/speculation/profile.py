"""Speculation profiles: the bench's recommendation, tied to the artifacts it was measured on.

A profile is JSON::

    {"format": "specserve-speculation-profile/1", "created": ISO-8601, "command": str,
     "slo": {"ttft_s", "itl_s"}, "default_workload": str,
     "workloads": {name: {"speculate": N, "speculate_max_batch": M | null,
                          "best_by_load": {load: N}, "mode": "closed" | "open"}},
     "target": {"config_sha256", "weights_sha256"} | null,
     "proposer": {"kind", "artifact": {"config_sha256", "weights_sha256"} | null} | null}

`speculate_max_batch` is the gate (`--speculate-max-batch`): null means speculation paid at every
measured load. A fingerprint hashes what decides the model's outputs: config.json (canonical JSON,
so formatting does not count) and the bytes of every weights file. A server loading a profile
checks both with `check_profile`; a mismatch means the recommendation is stale.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specserve.models.fingerprint import Fingerprint, target_fingerprint
from specserve.models.loader import resolve_model_dir
from specserve.speculation.registry import REGISTRY

logger = logging.getLogger(__name__)

FORMAT = "specserve-speculation-profile/1"
_EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # /info's model_id when serving the embedded default


# ------------------------------------------------------------------------------ fingerprints
def proposer_fingerprint(
    kind: str | None, artifact_dir: Path | None = None, cache_dir: Path | None = None
) -> Fingerprint | None:
    """The active proposer's kind and artifact (a draft model, Medusa heads; None for a kind
    that loads nothing). `kind` None: speculation off. `artifact_dir`: where the kind's
    registration says its artifact lives (`REGISTRY.artifact_dir`)."""
    return REGISTRY.fingerprint(kind, artifact_dir, cache_dir)


# ---------------------------------------------------------------------------------- profiles
def make_profile(
    workloads: dict[str, dict[str, Any]],
    target: Fingerprint | None,
    proposer: Fingerprint | None,
    command: str,
    slo: dict[str, float],
) -> dict[str, Any]:
    """A profile for `workloads` (name -> entry as in the module docstring); the first is the
    default a server applies when not told which pool it serves."""
    from datetime import UTC, datetime

    return {
        "format": FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "slo": slo,
        "default_workload": next(iter(workloads)),
        "workloads": workloads,
        "target": target,
        "proposer": proposer,
    }


def load_profile(path: str | Path) -> dict[str, Any]:
    """Read and validate a profile; raises ValueError naming the file and the problem."""
    try:
        profile = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read speculation profile {path}: {exc}") from exc
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise ValueError(f"{path} is not a speculation profile (expected format {FORMAT!r})")
    workloads = profile.get("workloads")
    if not isinstance(workloads, dict) or not workloads:
        raise ValueError(f"{path}: 'workloads' must be a non-empty object")
    for name, entry in workloads.items():
        n, gate = entry.get("speculate"), entry.get("speculate_max_batch")
        if not isinstance(n, int) or n < 0 or not (gate is None or isinstance(gate, int)):
            raise ValueError(
                f"{path}: workload {name!r} needs speculate >= 0 and an int or "
                "null speculate_max_batch"
            )
    return profile


def profile_setting(profile: dict[str, Any], workload: str | None = None) -> tuple[int, int | None]:
    """(N, speculate_max_batch) for `workload`; None picks the profile's default workload."""
    name = workload or profile.get("default_workload") or next(iter(profile["workloads"]))
    entry = profile["workloads"].get(name)
    if entry is None:
        raise ValueError(f"profile has no workload {name!r}; it has {sorted(profile['workloads'])}")
    return int(entry["speculate"]), entry.get("speculate_max_batch")


def check_profile(
    profile: dict[str, Any],
    target: Fingerprint,
    proposer: Fingerprint | None,
    workloads: Sequence[str] | None = None,
) -> list[str]:
    """Why the profile does not apply to the loaded artifacts; empty when it does. `workloads`:
    the ones whose settings are applied (None: all); the proposer matters only if one of them
    speculates (a pool serving a workload at N = 0 runs no proposer, rightly)."""
    problems = []
    saved = profile.get("target")
    if not saved:
        problems.append("the profile records no target fingerprint, so it cannot be verified")
    else:
        for key in ("config_sha256", "weights_sha256"):
            if saved.get(key) != target.get(key):
                problems.append(
                    _changed(f"target checkpoint {key[:-7]}", saved.get(key), target.get(key))
                )
    wanted = profile.get("proposer")
    applied = profile["workloads"] if workloads is None else workloads
    if wanted and any(profile_setting(profile, w)[0] for w in applied):
        if proposer is None:
            problems.append(
                f"the profile was measured with proposer {wanted.get('kind')!r}, "
                "but speculation is off"
            )
        elif wanted.get("kind") != proposer.get("kind"):
            problems.append(
                f"the profile was measured with proposer {wanted.get('kind')!r}, "
                f"the server runs {proposer.get('kind')!r}"
            )
        elif wanted.get("artifact") != proposer.get("artifact"):
            problems.append(
                f"the {proposer['kind']} proposer's artifact changed since the profile was measured"
            )
    return problems


class StaleProfileError(ValueError):
    """The profile was measured on other artifacts and --strict-profile is set."""


def review_profile(
    profile: dict[str, Any],
    path: str | Path,
    target: Fingerprint,
    proposer: Fingerprint | None,
    strict: bool = False,
    workloads: Sequence[str] | None = None,
) -> list[str]:
    """`check_profile`, then log one warning per stale profile, or raise under `strict`."""
    problems = check_profile(profile, target, proposer, workloads)
    if problems:
        message = (
            f"speculation profile {path} is stale and must be re-measured with "
            "`specserve bench`: " + "; ".join(problems)
        )
        if strict:
            raise StaleProfileError(message)
        logger.warning("%s", message)
    return problems


def _changed(what: str, old: Any, new: Any) -> str:
    return f"{what} changed (profile {str(old)[:12]}, loaded {str(new)[:12]})"


def fingerprints(
    info: dict[str, Any], model: str | None = None, draft_model: str | None = None
) -> tuple[Fingerprint | None, Fingerprint | None]:
    """(target, proposer) fingerprints of the server that answered `info` (its /info).

    The server's own `fingerprints` field wins. Otherwise they are computed here, from `model`
    / `draft_model` or the paths /info names, which works when the bench runs beside the server.
    """
    if isinstance(info.get("fingerprints"), dict):
        return info["fingerprints"].get("target"), info["fingerprints"].get("proposer")
    spec = info.get("speculation") or {}
    model_id = str(info.get("model_id", ""))
    ref = model or (model_id if Path(model_id).exists() else None)
    if ref is None and not model_id.endswith(_EMBEDDED_NAME):
        logger.warning("cannot fingerprint model %r: pass --model", model_id)
        return None, None
    try:
        target_dir = resolve_model_dir(ref)
        kind = spec.get("proposer")
        settings = {**spec, "draft_model": draft_model or spec.get("draft_model")}
        artifact_dir = REGISTRY.artifact_dir(kind, settings, target_dir) if kind else None
        return target_fingerprint(target_dir), proposer_fingerprint(kind, artifact_dir)
    except (OSError, ValueError) as exc:
        logger.warning("cannot fingerprint the served artifacts: %s", exc)
        return None, None
