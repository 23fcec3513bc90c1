"""The EAGLE proposer's registration: which head serves the loaded target (none: n-gram serves,
logged), where its artifact lives, and its fingerprint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specserve.models.fingerprint import Fingerprint, config_sha256, files_sha256
from specserve.models.loader import resolve_model_dir
from specserve.speculation.eagle_head import (
    CONFIG_FILE,
    HEAD_FILE,
    eagle_head_dir,
    shipped_head_for,
)
from specserve.speculation.eagle_proposer import EagleProposer
from specserve.speculation.proposer import HiddenRows, Loaded, Proposer, Registration

logger = logging.getLogger(__name__)


def eagle_proposer(loaded: Loaded) -> EagleProposer | None:
    """The EAGLE proposer for the loaded target; None when no head serves it (logged)."""
    spec, target = loaded.config.spec, loaded.target
    if target is None:
        return None
    head_dir = eagle_head_dir(target.model_dir, spec.eagle)
    if head_dir is None:
        logger.info(
            "--proposer %s: no EAGLE head for %s (pass --eagle DIR; specserve train-eagle "
            "makes one); n-gram serves",
            spec.proposer,
            target.model_dir,
        )
        return None
    return EagleProposer.load(head_dir, target.model, target.model_dir, spec.force_eagle)


def _artifact_dir(settings: Mapping[str, Any], target_dir: Path, live: Proposer | None) -> Path:
    head_dir = getattr(live, "head_dir", None)
    if isinstance(head_dir, Path):
        return head_dir
    eagle = settings.get("eagle")
    if eagle:
        return Path(eagle)
    return shipped_head_for(resolve_model_dir(str(target_dir))) or target_dir


def fingerprint_head(head_dir: Path, cache_dir: Path | None) -> Fingerprint:
    config = head_dir / CONFIG_FILE
    return {
        "config_sha256": config_sha256(config) if config.is_file() else None,
        "weights_sha256": files_sha256(
            [p for p in [head_dir / HEAD_FILE] if p.is_file()], cache_dir
        ),
    }


REGISTRATION = Registration(
    "eagle",
    eagle_proposer,
    artifacts=("eagle", "force_eagle"),
    hidden=HiddenRows.ACCEPTED,
    summary="an EAGLE-style head on the target's features (--eagle DIR, or the shipped head "
    "for the default model)",
    artifact_dir=_artifact_dir,
    fingerprint=fingerprint_head,
)
