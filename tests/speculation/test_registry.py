"""The proposer registry: the one place kinds are named, auto's order, and the live-change
decision read from each kind's declared artifacts and settings (no engine, no model)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import pytest
import torch

from specserve.cli_args import ENGINE_OPTIONS, engine_config
from specserve.config import EngineConfig, SpecConfig
from specserve.request import Sequence
from specserve.speculation import ngram
from specserve.speculation.ngram import NgramProposer
from specserve.speculation.proposer import (
    Draft,
    HiddenRows,
    IndexStats,
    Loaded,
    Proposer,
    Registration,
)
from specserve.speculation.registry import AUTO, REGISTRY, SHARED_LIVE, Registry
from specserve.speculation.suffix import SuffixProposer


def loaded(**spec: object) -> Loaded:
    return Loaded(EngineConfig(spec=SpecConfig(**spec)))  # type: ignore[arg-type]


def test_proposer_flag_lists_every_registered_kind() -> None:
    """--proposer's choices and help come from the registry: a new kind is its module and its
    registry line."""
    [option] = [o for o in ENGINE_OPTIONS if o.flag == "--proposer"]
    assert option.choices == (AUTO, *REGISTRY.names())
    for kind in REGISTRY.kinds():
        assert kind.summary and f"{kind.name}: {kind.summary}" in option.help
    with pytest.raises(ValueError, match="proposer must be one of"):
        engine_config({o.dest: o.value for o in ENGINE_OPTIONS} | {"proposer": "lookahead"})


def test_every_spec_field_is_live_or_declared_by_a_kind() -> None:
    """A SpecConfig field no kind declares would change live under a proposer built without
    it (the old `_same_artifacts` bug): every field is shared-live, an artifact or a setting."""
    declared = [f for n in REGISTRY.names() for k in [REGISTRY.get(n)] for f in k.artifacts]
    declared += [f for n in REGISTRY.names() for f in REGISTRY.get(n).settings]
    spec_fields = {f.name for f in fields(SpecConfig)}
    assert set(declared) | set(SHARED_LIVE) == spec_fields
    # one kind owns each field; the hybrid, built of the suffix proposer and the EAGLE head,
    # declares what both of them do
    hybrid = REGISTRY.get("hybrid")
    parts = REGISTRY.get("eagle").artifacts + REGISTRY.get("suffix").settings
    assert sorted(hybrid.artifacts + hybrid.settings) == sorted(parts)
    others = [f for f in declared if f not in hybrid.artifacts + hybrid.settings]
    assert len(others) == len(set(others)) and len(declared) == len(set(declared)) + len(parts)


def test_auto_order_and_fallback() -> None:
    def names(proposer: str) -> list[str]:
        return [k.name for k in REGISTRY.candidates(proposer)]

    assert names(AUTO) == ["draft", "medusa", "ngram"]
    assert names("medusa") == ["medusa", "ngram"]  # no heads: n-gram serves
    assert names("ngram") == ["ngram"]
    assert names("suffix") == ["suffix", "ngram"]
    loads = {
        "auto": True,
        "ngram": False,
        "suffix": False,
        "draft": True,
        "medusa": True,
        "eagle": True,
        "hybrid": True,
    }
    assert {n: REGISTRY.may_load(n) for n in loads} == loads
    assert names("eagle") == ["eagle", "ngram"] and names("hybrid") == ["hybrid", "ngram"]
    with pytest.raises(ValueError, match="not available"):
        REGISTRY.get("lookahead")


def test_build_resolves_without_artifacts() -> None:
    assert REGISTRY.build(loaded(speculate=0)) is None
    # auto with no draft model and no target (so no heads) is n-gram
    proposer = REGISTRY.build(loaded(speculate=2, ngram_max=3))
    assert isinstance(proposer, NgramProposer) and proposer.ngram_max == 3
    assert isinstance(REGISTRY.build(loaded(speculate=2, proposer="suffix")), SuffixProposer)
    with pytest.raises(ValueError, match="needs its loaded model"):
        REGISTRY.build(loaded(speculate=2, proposer="draft", draft_model="d"))


def test_live_change_rebuilds_only_what_a_kind_reads() -> None:
    old = SpecConfig(speculate=2, proposer="ngram")
    current = REGISTRY.build(Loaded(EngineConfig(spec=old)))
    same = loaded(speculate=4, proposer="ngram", policy="adaptive", max_batch=3)
    assert REGISTRY.live_proposer(current, old, same) is current
    rebuilt = REGISTRY.live_proposer(
        current, old, loaded(speculate=2, proposer="ngram", ngram_max=2)
    )
    assert isinstance(rebuilt, NgramProposer) and rebuilt is not current
    suffix = REGISTRY.live_proposer(current, old, loaded(speculate=2, proposer="suffix"))
    assert isinstance(suffix, SuffixProposer)
    with pytest.raises(ValueError, match="restart"):
        REGISTRY.live_proposer(current, old, loaded(speculate=2, proposer="medusa"))
    with pytest.raises(ValueError, match="restart"):  # auto might load a draft model or heads
        REGISTRY.live_proposer(None, replace(old, speculate=0), loaded(speculate=2))


@dataclass
class Loader(Proposer):
    """Stands in for a proposer that loaded an artifact."""

    name: str = "medusa"

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        return [Draft([]) for _ in seqs]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        del seq, hidden

    def release(self, seq: Sequence) -> None:
        del seq


def registry_with(artifacts: tuple[str, ...]) -> Registry:
    kind = Registration("medusa", lambda _: None, artifacts=artifacts, auto=True)
    return Registry(kind, ngram.REGISTRATION, fallback="ngram")


def test_an_artifact_field_declared_by_its_kind_refuses_a_live_change() -> None:
    old = SpecConfig(speculate=2, proposer="medusa", medusa="heads")
    new = loaded(speculate=3, proposer="medusa", medusa="heads", force_medusa=True)
    current = Loader()
    # Undeclared, the new field would keep the loaded heads ...
    assert registry_with(("medusa",)).live_proposer(current, old, new) is current
    # ... declared, the decision reads it: loading other heads needs a restart.
    with pytest.raises(ValueError, match="restart"):
        registry_with(("medusa", "force_medusa")).live_proposer(current, old, new)
    with pytest.raises(ValueError, match="restart"):
        REGISTRY.live_proposer(current, old, new)


def test_a_loaded_kind_checks_what_it_can_serve_live() -> None:
    def at_most_two(proposer: Proposer, spec: SpecConfig) -> None:
        if spec.speculate > 2:
            raise ValueError("too many")

    kind = Registration("medusa", lambda _: None, artifacts=("medusa",), check_live=at_most_two)
    registry = Registry(kind, ngram.REGISTRATION, fallback="ngram")
    old, current = SpecConfig(speculate=2, proposer="medusa"), Loader()
    assert registry.live_proposer(current, old, loaded(speculate=1, proposer="medusa")) is current
    with pytest.raises(ValueError, match="too many"):
        registry.live_proposer(current, old, loaded(speculate=3, proposer="medusa"))


def test_fallback_must_load_nothing() -> None:
    kind = Registration("medusa", lambda _: None, artifacts=("medusa",))
    with pytest.raises(ValueError, match="must load nothing"):
        Registry(kind, fallback="medusa")


def test_declared_step_needs_and_fingerprints() -> None:
    hidden = {
        "draft": HiddenRows.NONE,
        "medusa": HiddenRows.LAST_ACCEPTED,
        "ngram": HiddenRows.NONE,
        "suffix": HiddenRows.NONE,
        "eagle": HiddenRows.ACCEPTED,
        "hybrid": HiddenRows.ACCEPTED,
    }
    assert {n: REGISTRY.get(n).hidden for n in hidden} == hidden
    assert REGISTRY.fingerprint(None) is None
    assert REGISTRY.fingerprint("suffix") == {"kind": "suffix", "artifact": None}
    with pytest.raises(ValueError, match="needs its model directory"):
        REGISTRY.fingerprint("draft")


def test_capabilities_default_to_nothing_kept() -> None:
    plain = NgramProposer()
    assert (plain.kv_blocks_in_use(), plain.reset(), plain.index_stats()) == (0, False, None)
    suffix = SuffixProposer(cache_tokens=128)
    assert suffix.reset() is True
    assert suffix.index_stats() == IndexStats(0, 128, suffix.global_index.nbytes, 0, 0, 0)
