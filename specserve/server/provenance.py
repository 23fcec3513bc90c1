"""What the served setting rests on: the artifacts' fingerprints and the speculation profile.

Start-up (`server/cli.py`): `load_choice` reads `--speculation-profile` and picks the workload's
(N, gate) before the engine is built; once the engine has loaded, `review` fingerprints the target
and the proposer's artifact and checks the profile against them. A profile measured on other
artifacts is stale: the server warns (or, under `--strict-profile`, refuses to start), and
reports it in /info and as `specserve_speculation_profile_stale`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from specserve.engine.engine import Engine
from specserve.speculation.profile import (
    Fingerprint,
    StaleProfileError,
    load_profile,
    profile_setting,
    proposer_fingerprint,
    review_profile,
    target_fingerprint,
)
from specserve.speculation.registry import REGISTRY

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileChoice:
    """A loaded profile and the setting taken from it for one workload."""

    path: str
    workload: str
    speculate: int
    speculate_max_batch: int | None
    profile: dict[str, Any]


def load_choice(path: str, workload: str | None) -> ProfileChoice:
    """Read the profile and pick `workload` (None: its default); ValueError says what is wrong."""
    profile = load_profile(path)
    name = workload or profile.get("default_workload") or next(iter(profile["workloads"]))
    speculate, max_batch = profile_setting(profile, name)
    return ProfileChoice(path, name, speculate, max_batch, profile)


@dataclass(frozen=True)
class Fingerprints:
    target: Fingerprint
    proposer: Fingerprint | None  # None: speculation is off


@dataclass(frozen=True)
class ProfileStatus:
    """The applied profile as /info and /metrics show it."""

    path: str
    workload: str
    speculate: int
    speculate_max_batch: int | None
    problems: tuple[str, ...]  # why it does not match the loaded artifacts; empty = current

    @property
    def stale(self) -> bool:
        return bool(self.problems)


@dataclass(frozen=True)
class Provenance:
    fingerprints: Fingerprints | None  # None when the artifacts could not be hashed
    profile: ProfileStatus | None  # None without --speculation-profile


def fingerprint_engine(engine: Engine) -> Fingerprints:
    """Hash the loaded target and proposer artifact (digests are cached on disk per file, so
    only the first start after a checkpoint changes reads its bytes)."""
    proposer, model_dir = engine.proposer, engine.facts.model_dir
    if proposer is None:
        return Fingerprints(target=target_fingerprint(model_dir), proposer=None)
    settings = asdict(engine.config.spec)
    artifact = REGISTRY.artifact_dir(proposer.name, settings, model_dir, proposer)
    return Fingerprints(
        target=target_fingerprint(model_dir),
        proposer=proposer_fingerprint(proposer.name, artifact),
    )


def review(engine: Engine, choice: ProfileChoice | None, strict: bool) -> Provenance:
    """Fingerprint the engine and check `choice` against it. Raises StaleProfileError when the
    profile is stale (or cannot be checked) and `strict` is set."""
    try:
        fps = fingerprint_engine(engine)
    except (OSError, ValueError) as exc:
        reason = f"cannot fingerprint the loaded artifacts: {exc}"
        logger.warning("%s", reason)
        return Provenance(None, _unverifiable(choice, reason, strict))
    if choice is None:
        return Provenance(fps, None)
    problems = review_profile(
        choice.profile, choice.path, fps.target, fps.proposer, strict, [choice.workload]
    )
    return Provenance(fps, _status(choice, problems))


def _unverifiable(choice: ProfileChoice | None, reason: str, strict: bool) -> ProfileStatus | None:
    if choice is None:
        return None
    if strict:
        raise StaleProfileError(f"speculation profile {choice.path} cannot be checked: {reason}")
    return _status(choice, [reason])


def _status(choice: ProfileChoice, problems: list[str]) -> ProfileStatus:
    c = choice
    return ProfileStatus(c.path, c.workload, c.speculate, c.speculate_max_batch, tuple(problems))
