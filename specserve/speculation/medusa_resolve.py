"""Which Medusa heads serve, and with what N: `--medusa`, heads stored in the checkpoint, or
(with `--proposer medusa`) the shipped heads whose base fingerprint matches the loaded model."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from specserve.models.loader import resolve_model_dir
from specserve.speculation.eagle_head import DEFAULT_DEPTH
from specserve.speculation.medusa import (
    SHIPPED_DIR,
    fingerprint,
    is_heads_dir,
    read_medusa_config,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MedusaChoice:
    heads_dir: Path | None  # None: no Medusa (n-gram, or speculation off)
    speculate: int  # the effective N


def resolve_medusa(
    model_dir: Path, proposer: str, speculate: int | None, medusa: str | None = None
) -> MedusaChoice:
    """Which heads serve `model_dir`, and the effective N.

    Heads come from `medusa` (a heads directory), else from `model_dir` itself when it holds
    them; with proposer "medusa" also from the shipped heads whose base fingerprint matches.
    No heads: proposer "medusa" falls back to n-gram (logged). `speculate` None means the
    number of heads (0 without Medusa); a larger N than the heads is refused, as TGI does.
    """
    heads_dir = _find_heads(model_dir, proposer, medusa)
    if heads_dir is None:
        if proposer == "medusa":
            then = f"n-gram with N={speculate}" if speculate else "off (n-gram needs --speculate N)"
            logger.info(
                "--proposer medusa: no Medusa heads for %s (pass --medusa DIR); "
                "falling back to n-gram: speculation %s",
                model_dir,
                then,
            )
        return MedusaChoice(None, speculate or 0)
    num_heads = read_medusa_config(heads_dir).num_heads
    if speculate is None:
        return MedusaChoice(heads_dir, num_heads)
    if speculate > num_heads:
        raise ValueError(
            f"--speculate {speculate} is more than the {num_heads} Medusa heads in {heads_dir}: "
            f"pass --speculate {num_heads} or less, or leave it unset"
        )
    return MedusaChoice(heads_dir, speculate)


def _find_heads(model_dir: Path, proposer: str, medusa: str | None) -> Path | None:
    if proposer not in ("auto", "medusa"):
        if medusa is not None:
            logger.warning("--medusa %s is ignored with --proposer %s", medusa, proposer)
        return None
    if medusa is not None:
        read_medusa_config(Path(medusa))  # a clear error when it is not a heads directory
        return Path(medusa)
    if is_heads_dir(model_dir):
        return model_dir
    return shipped_heads_for(model_dir) if proposer == "medusa" else None


def shipped_heads_for(model_dir: Path) -> Path | None:
    """The shipped heads trained for exactly this base (config and weights), if any."""
    candidates = [d for d in sorted(SHIPPED_DIR.glob("*")) if is_heads_dir(d)]
    if not candidates:
        return None
    actual = fingerprint(model_dir)
    for d in candidates:
        if read_medusa_config(d).base_fingerprint == actual:
            return d
    return None


def default_speculate(model: str | None, proposer: str, medusa: str | None = None) -> int:
    """N when --speculate is not given: the number of heads when Medusa serves, the depth the
    EAGLE head was trained to draft with eagle or hybrid, else 0."""
    if proposer in ("eagle", "hybrid"):
        return DEFAULT_DEPTH
    if proposer not in ("auto", "medusa"):
        return 0
    try:
        model_dir = resolve_model_dir(model)
    except ValueError:
        return 0  # loading the engine reports the bad model
    return resolve_medusa(model_dir, proposer, None, medusa).speculate
