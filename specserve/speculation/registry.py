"""The proposer registry: each kind of proposer registers once, in its own module (a
`Registration`), and is listed in `REGISTRY` below. Whatever depends on the kind asks here:
building the configured proposer (and `--proposer auto`'s choice), a live speculation change,
the artifact fingerprint, whether a fleet pool must restart to switch.

Resolution: `--proposer auto` tries every kind registered with `auto=True`, in the order
below; a named kind is tried first, then the fallback (Medusa without heads serves n-gram). A
kind's `build` returns None when it does not apply, and the next candidate serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specserve.config import EngineConfig, SpecConfig
from specserve.models.fingerprint import Fingerprint
from specserve.models.llama import DecoderLM
from specserve.speculation import draft, eagle_registration, hybrid, medusa_proposer, ngram, suffix
from specserve.speculation.proposer import HiddenRows, Loaded, Proposer, Registration, Target

AUTO = "auto"
# SpecConfig fields that change live under any proposer (the policy and the engine read them);
# the rest are some kind's `artifacts` or `settings`.
SHARED_LIVE = ("speculate", "proposer", "policy", "max_batch", "max_tokens")


class Registry:
    def __init__(self, *kinds: Registration, fallback: str) -> None:
        self._kinds = {k.name: k for k in kinds}
        self.fallback = fallback  # loads nothing; serves where a named kind does not apply
        if self.get(fallback).loads:
            raise ValueError(f"the fallback proposer {fallback!r} must load nothing")

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def kinds(self) -> tuple[Registration, ...]:
        return tuple(self._kinds.values())

    def get(self, name: str) -> Registration:
        kind = self._kinds.get(name)
        if kind is None:
            raise ValueError(f"proposer {name!r} is not available in this build")
        return kind

    def candidates(self, proposer: str) -> list[Registration]:
        """The kinds tried, in order, for `--proposer NAME`."""
        if proposer == AUTO:
            return [k for k in self._kinds.values() if k.auto]
        kinds = [self.get(proposer)]
        return kinds if proposer == self.fallback else [*kinds, self.get(self.fallback)]

    def hidden_rows(self, proposer: Proposer | None) -> HiddenRows:
        """Which hidden states the engine hands `proposer`'s `sync` (NONE for a kind that is
        not registered: a test's)."""
        kind = self._kinds.get(proposer.name) if proposer is not None else None
        return kind.hidden if kind is not None else HiddenRows.NONE

    def may_load(self, proposer: str) -> bool:
        """Whether `--proposer NAME` may load an artifact (a fleet pool restarts to switch)."""
        return any(k.loads for k in self.candidates(proposer))

    # ------------------------------------------------------------------------------ build
    def load_model(self, config: EngineConfig, target: Target) -> DecoderLM | None:
        """The proposer's own model, loaded before the KV pool is sized (see `Registration`)."""
        if config.spec.speculate == 0:
            return None
        for kind in self.candidates(config.spec.proposer):
            model = kind.load_model(config, target) if kind.load_model is not None else None
            if model is not None:
                return model
        return None

    def build(self, loaded: Loaded) -> Proposer | None:
        """The configured proposer; None when speculation is off."""
        spec = loaded.config.spec
        if spec.speculate == 0:
            return None
        for kind in self.candidates(spec.proposer):
            proposer = kind.build(loaded)
            if proposer is not None:
                return proposer
        raise ValueError(f"proposer {spec.proposer!r} is not available in this build")

    # ------------------------------------------------------------------------ live change
    def live_proposer(self, current: Proposer | None, old: SpecConfig, loaded: Loaded) -> Proposer:
        """The proposer for the new `loaded.config.spec` (speculating), from `current` (built
        for `old`). A kind that loads nothing is kept while its settings stay, else rebuilt;
        a loaded one is kept while everything resolution reads stays the same. ValueError when
        the new settings would load an artifact."""
        new = loaded.config.spec
        named = self._kinds.get(new.proposer)
        if named is not None and not named.loads:
            return self._kept_or_built(named, current, old, loaded)
        if current is not None and self.resolution_key(old) == self.resolution_key(new):
            kind = self.get(current.name)
            if not kind.loads:
                return self._kept_or_built(kind, current, old, loaded)
            kind.check_live(current, new)
            return current
        raise ValueError(
            f"proposer {new.proposer!r} needs artifacts this engine has not loaded "
            "(a draft model or Medusa heads): restart it with the new setting"
        )

    def resolution_key(self, spec: SpecConfig) -> tuple[object, ...]:
        """What picks the proposer and its artifacts: the name and every kind's artifacts."""
        fields = [f for k in self._kinds.values() for f in k.artifacts]
        return (spec.proposer, *(getattr(spec, f) for f in fields))

    def _kept_or_built(
        self, kind: Registration, current: Proposer | None, old: SpecConfig, loaded: Loaded
    ) -> Proposer:
        new = loaded.config.spec
        same = all(getattr(old, f) == getattr(new, f) for f in kind.settings)
        if current is not None and current.name == kind.name and same:
            return current
        proposer = kind.build(loaded)
        if proposer is None:
            raise ValueError(f"proposer {kind.name!r} does not apply to {new}")
        return proposer

    # ----------------------------------------------------------------------- fingerprints
    def artifact_dir(
        self,
        kind: str,
        settings: Mapping[str, Any],
        target_dir: Path,
        live: Proposer | None = None,
    ) -> Path | None:
        """Where the artifact of the active proposer `kind` lives (None: it has none)."""
        return self.get(kind).artifact_dir(settings, target_dir, live)

    def fingerprint(
        self, kind: str | None, artifact_dir: Path | None = None, cache_dir: Path | None = None
    ) -> Fingerprint | None:
        """{"kind", "artifact"} of the active proposer `kind` (None: speculation off);
        `artifact_dir` from `artifact_dir`."""
        if kind is None:
            return None
        hashed = self.get(kind).fingerprint
        if hashed is None:
            return {"kind": kind, "artifact": None}
        if artifact_dir is None:
            raise ValueError(f"proposer {kind!r} needs its model directory to be fingerprinted")
        return {"kind": kind, "artifact": hashed(artifact_dir, cache_dir)}


# `--proposer auto` tries the kinds registered with auto=True in this order.
REGISTRY = Registry(
    draft.REGISTRATION,
    medusa_proposer.REGISTRATION,
    ngram.REGISTRATION,
    suffix.REGISTRATION,
    eagle_registration.REGISTRATION,
    hybrid.REGISTRATION,
    fallback=ngram.REGISTRATION.name,
)
