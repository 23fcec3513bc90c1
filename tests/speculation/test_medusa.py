"""Medusa heads: TGI tensor layout, coupling by fingerprint, proposer, losslessness
(training: tests/training/test_medusa_train.py)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specserve.engine.engine import Engine
from specserve.models.registry import build_model
from specserve.request import SamplingParams, Sequence
from specserve.speculation.medusa import (
    HEADS_FILE,
    MedusaConfig,
    MedusaHeads,
    ResBlock,
    fingerprint,
    load_medusa,
    save_medusa,
)
from specserve.speculation.medusa_proposer import MedusaProposer
from specserve.speculation.medusa_resolve import resolve_medusa

CPU = torch.device("cpu")


def write_tgi_checkpoint(
    out: Path, hidden: int, vocab: int, heads: int, layers: int, own_lm_head: bool, **cfg: object
) -> dict[str, torch.Tensor]:
    """A checkpoint as TGI reads it, with random tensors; returns the tensors."""
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(heads):
        for j in range(layers):
            tensors[f"{i}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=g) * 0.3
            tensors[f"{i}.{j}.linear.bias"] = torch.randn(hidden, generator=g) * 0.3
        if own_lm_head:
            tensors[f"{i}.{layers}.weight"] = torch.randn(vocab, hidden, generator=g)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / HEADS_FILE))
    config = {
        "medusa_num_heads": heads,
        "medusa_num_layers": layers,
        "base_model_name_or_path": "some/base",
        **cfg,
    }
    (out / "config.json").write_text(json.dumps(config))
    return tensors


def tgi_reference(
    tensors: dict[str, torch.Tensor], x: torch.Tensor, head: int, layers: int, lm_head: torch.Tensor
) -> torch.Tensor:
    """TGI's MedusaHead: ResBlocks x + silu(linear(x)), then the head's `{i}.{L}` linear."""
    for j in range(layers):
        w, b = tensors[f"{head}.{j}.linear.weight"], tensors[f"{head}.{j}.linear.bias"]
        x = x + F.silu(x @ w.T + b)
    return x @ tensors.get(f"{head}.{layers}.weight", lm_head).T


@pytest.mark.parametrize("own_lm_head", [True, False])
def test_tgi_layout_maps_as_tgi_does(tmp_path: Path, own_lm_head: bool) -> None:
    hidden, vocab, heads, layers = 16, 40, 3, 2
    tensors = write_tgi_checkpoint(tmp_path, hidden, vocab, heads, layers, own_lm_head)
    model, cfg = load_medusa(tmp_path)
    assert (cfg.num_heads, cfg.num_layers, model.shares_lm_head) == (heads, layers, not own_lm_head)
    base_lm_head = torch.nn.Linear(hidden, vocab, bias=False)
    x = torch.randn(5, hidden)
    with torch.no_grad():
        got = model.logits(x, base_lm_head)  # [5, heads, vocab]
        for i in range(heads):
            want = tgi_reference(tensors, x, i, layers, base_lm_head.weight)
            torch.testing.assert_close(got[:, i], want)
        assert model.logits(x, base_lm_head, num_heads=2).shape == (5, 2, vocab)


def test_partial_own_lm_heads_and_stray_tensors_are_refused(tmp_path: Path) -> None:
    tensors = write_tgi_checkpoint(tmp_path / "a", 8, 20, 2, 1, own_lm_head=True)
    del tensors["1.1.weight"]
    save_file(tensors, str(tmp_path / "a" / HEADS_FILE))
    with pytest.raises(ValueError, match="own lm_head"):
        load_medusa(tmp_path / "a")
    tensors = write_tgi_checkpoint(tmp_path / "b", 8, 20, 2, 1, own_lm_head=False)
    save_file({**tensors, "2.0.linear.bias": torch.zeros(8)}, str(tmp_path / "b" / HEADS_FILE))
    with pytest.raises(RuntimeError, match="Unexpected key"):
        load_medusa(tmp_path / "b")


def test_save_writes_tgi_names_and_round_trips(tmp_path: Path) -> None:
    model = MedusaHeads(8, num_heads=2, num_layers=1)
    head = model[1]
    assert isinstance(head, torch.nn.Sequential)
    block = head[0]  # head 1's first ResBlock
    assert isinstance(block, ResBlock)
    torch.nn.init.normal_(block.linear.weight)
    model.draft_vocab = torch.tensor([0, 5, 7])
    cfg = MedusaConfig(2, 1, "base", {"config": "a", "weights": "b"}, {"note": "x"})
    save_medusa(model, tmp_path, cfg, dtype=torch.float32)
    names = set(load_file(str(tmp_path / HEADS_FILE)))
    tgi = {f"{i}.0.linear.{k}" for i in range(2) for k in ("weight", "bias")}
    assert names == tgi | {"draft_vocab"}  # TGI reads its names and ignores the vocabulary
    loaded, loaded_cfg = load_medusa(tmp_path)
    assert loaded_cfg == cfg
    assert loaded.draft_vocab is not None and loaded.draft_vocab.tolist() == [0, 5, 7]
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, msg=k)


# ------------------------------------------------------------------------------ resolution
def test_speculate_defaults_to_the_heads_and_more_is_refused(
    tmp_path: Path, tiny_llama: Path
) -> None:
    write_tgi_checkpoint(tmp_path, 64, 320, 4, 1, own_lm_head=False)
    for proposer in ("auto", "medusa"):
        choice = resolve_medusa(tiny_llama, proposer, None, medusa=str(tmp_path))
        assert (choice.heads_dir, choice.speculate) == (tmp_path, 4)
    assert resolve_medusa(tiny_llama, "medusa", 2, str(tmp_path)).speculate == 2
    with pytest.raises(ValueError, match=r"--speculate 5 is more than the 4 Medusa heads"):
        resolve_medusa(tiny_llama, "medusa", 5, str(tmp_path))
    with pytest.raises(ValueError, match="not a Medusa checkpoint"):
        resolve_medusa(tiny_llama, "medusa", None, str(tiny_llama))


def test_heads_beside_the_weights_are_found(tmp_path: Path, tiny_llama: Path) -> None:
    combined = tmp_path / "combined"
    shutil.copytree(tiny_llama, combined)
    write_tgi_checkpoint(tmp_path / "heads", 64, 320, 3, 1, own_lm_head=False)
    shutil.copy(tmp_path / "heads" / HEADS_FILE, combined / HEADS_FILE)
    cfg = json.loads((combined / "config.json").read_text())
    cfg.update(medusa_num_heads=3, medusa_num_layers=1)
    (combined / "config.json").write_text(json.dumps(cfg))
    assert resolve_medusa(combined, "auto", None) == resolve_medusa(combined, "medusa", None)
    assert resolve_medusa(combined, "auto", None).heads_dir == combined
    assert resolve_medusa(combined, "ngram", None).heads_dir is None
    build_model(combined, CPU)  # the base still loads: medusa_* files are not its weights


def test_no_heads_falls_back_to_ngram_with_a_log_line(
    tiny_llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="specserve.speculation.medusa_resolve"):
        choice = resolve_medusa(tiny_llama, "medusa", 3)
    assert (choice.heads_dir, choice.speculate) == (None, 3)
    assert "falling back to n-gram" in caplog.text
    assert resolve_medusa(tiny_llama, "auto", None).speculate == 0


# ----------------------------------------------------------------------------- fingerprint
def test_fingerprint_ignores_bookkeeping_not_weights(tmp_path: Path, tiny_llama: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["transformers_version"] = "0.0.1"
    (copy / "config.json").write_text(json.dumps(cfg, indent=4))
    tensors = load_file(str(copy / "model.safetensors"))
    save_file(dict(reversed(tensors.items())), str(copy / "model.safetensors"), {"x": "y"})
    assert fingerprint(copy) == fingerprint(tiny_llama)
    tensors["model.norm.weight"][0] += 1
    save_file(tensors, str(copy / "model.safetensors"))
    assert fingerprint(copy)["weights"] != fingerprint(tiny_llama)["weights"]
    assert fingerprint(copy)["config"] == fingerprint(tiny_llama)["config"]


def test_heads_for_another_base_are_refused_unless_forced(
    tmp_path: Path, tiny_llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.tiny import make_model_dir

    other = make_model_dir(tmp_path / "other", seed=1, with_tokenizer=False)
    heads = tmp_path / "heads"
    recorded = fingerprint(other)
    write_tgi_checkpoint(heads, 64, 320, 2, 1, False, base_fingerprint=recorded)
    base = build_model(tiny_llama, CPU)
    with pytest.raises(ValueError) as err:
        MedusaProposer.load(heads, base, tiny_llama)
    assert str(recorded) in str(err.value)
    assert str(fingerprint(tiny_llama)) in str(err.value)
    with caplog.at_level(logging.WARNING, logger="specserve.speculation.medusa_resolve"):
        proposer = MedusaProposer.load(heads, base, tiny_llama, force=True)
    assert proposer.num_heads == 2 and "--force-medusa" in caplog.text
    MedusaProposer.load(heads, build_model(other, CPU), other)  # its own base: accepted


def test_heads_of_the_wrong_shape_are_refused(tmp_path: Path, tiny_llama: Path) -> None:
    write_tgi_checkpoint(tmp_path, 32, 320, 2, 1, own_lm_head=False)
    with pytest.raises(ValueError, match="do not fit"):
        MedusaProposer.load(tmp_path, build_model(tiny_llama, CPU), tiny_llama, force=True)


# -------------------------------------------------------------------------------- proposer
def _seq(seq_id: int, n: int) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(range(1, n + 1)), SamplingParams())


def test_proposer_drafts_the_heads_argmax_chain() -> None:
    torch.manual_seed(0)
    heads = MedusaHeads(16, num_heads=3, num_layers=1)
    for p in heads.parameters():
        torch.nn.init.normal_(p)
    lm_head = torch.nn.Linear(16, 50, bias=False)
    proposer = MedusaProposer(heads, lm_head)
    a, b, c = _seq(0, 5), _seq(1, 7), _seq(2, 3)
    ha, hb = torch.randn(16), torch.randn(16)
    proposer.sync(a, ha)
    proposer.sync(b, hb)
    with torch.no_grad():
        logits = heads.logits(torch.stack([ha, hb]), lm_head)  # [2, 3, 50]
        want = logits.argmax(-1).tolist()
        top_prob = logits.softmax(-1).max(-1).values.tolist()  # each head's confidence
    drafts = proposer.propose([a, b, c], [3, 1, 2])
    assert [d.tokens for d in drafts] == [want[0], want[1][:1], []]  # c was never synced
    assert all(d.probs is None for d in drafts)
    assert drafts[0].confidence == pytest.approx(top_prob[0], rel=1e-5)
    assert drafts[1].confidence == pytest.approx(top_prob[1][:1], rel=1e-5)
    a.output_ids.append(9)  # a's tokens moved on without a sync: its hidden is stale
    assert proposer.propose([a, b], [2, 0])[0].tokens == []
    proposer.release(b)
    assert proposer.propose([b], [2])[0].tokens == []


def test_proposer_drafts_only_from_the_draft_vocab() -> None:
    torch.manual_seed(1)
    heads = MedusaHeads(16, num_heads=2, num_layers=1)
    for p in heads.parameters():
        torch.nn.init.normal_(p)
    vocab = torch.tensor([3, 8, 20, 41])
    heads.draft_vocab = vocab
    lm_head = torch.nn.Linear(16, 50, bias=False)
    proposer = MedusaProposer(heads, lm_head)
    seq, h = _seq(0, 4), torch.randn(16)
    proposer.sync(seq, h)
    with torch.no_grad():
        restricted = heads.logits(h[None], lm_head)[0][:, vocab]  # [2 heads, 4]
        want = vocab[restricted.argmax(-1)].tolist()
    [draft] = proposer.propose([seq], [2])
    assert draft.tokens == want
    # confidence: the head's probability within the draft vocabulary
    assert draft.confidence == pytest.approx(restricted.softmax(-1).max(-1).values.tolist())


# ----------------------------------------------------------------------- real default model
def _real_engine(heads: Path | None, speculate: int, num_blocks: int = 512) -> Engine:
    """An engine on the embedded model (loaded once), with Medusa heads or none."""
    from tests.integration.test_real_model import base_engine, engine_with

    engine = engine_with(speculate, num_blocks)
    if heads is not None:
        res = base_engine().res
        engine.use_proposer(MedusaProposer.load(heads, res.model, res.model_dir))
    return engine


@pytest.mark.integration
def test_shipped_heads_match_the_default_model() -> None:
    from specserve.models.loader import resolve_model_dir
    from specserve.speculation.medusa import SHIPPED_DIR

    model_dir = resolve_model_dir(None)
    choice = resolve_medusa(model_dir, "medusa", None)
    assert choice.heads_dir == SHIPPED_DIR / "smollm2-135m-instruct"
    assert choice.speculate == load_medusa(choice.heads_dir)[1].num_heads
    assert resolve_medusa(model_dir, "auto", None).heads_dir is None  # shipped heads: opt-in


@pytest.mark.integration
@pytest.mark.parametrize("num_blocks", [512, 24])
def test_shipped_heads_greedy_is_bit_identical(num_blocks: int) -> None:
    from specserve.models.loader import resolve_model_dir
    from tests.engine.helpers import run_all
    from tests.integration.test_real_model import prompts

    heads = resolve_medusa(resolve_model_dir(None), "medusa", None).heads_dir
    assert heads is not None
    ps = (prompts() * 2)[:5]
    caps = [None, 0, 2, None, 1]
    params = [SamplingParams(max_new_tokens=40, ignore_eos=True, speculate=c) for c in caps]
    want = run_all(_real_engine(None, 0), ps, params)
    engine = _real_engine(heads, 4, num_blocks)
    assert run_all(engine, ps, params) == want
    stats = engine.stats.proposer
    assert stats.accepted_tokens > 0 and len(stats.accepted_per_position) == 4
    assert stats.drafted_tokens > stats.accepted_tokens  # and some drafts were rejected
    assert isinstance(engine.proposer, MedusaProposer) and engine.proposer.blocks is not None
    if num_blocks == 24:  # 384 slots for 5 x ~80 tokens: preemption must have happened
        assert engine.scheduler.num_preemptions > 0
    assert engine.res.allocator.num_free == num_blocks


@pytest.mark.integration
def test_shipped_heads_seeded_sampling_is_bit_identical() -> None:
    from specserve.models.loader import resolve_model_dir
    from tests.engine.helpers import run_all
    from tests.integration.test_real_model import prompts

    heads = resolve_medusa(resolve_model_dir(None), "medusa", None).heads_dir
    params = [
        SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.95, seed=s, ignore_eos=True)
        for s in (1, 2, 3)
    ]
    want = run_all(_real_engine(None, 0), prompts(), params)
    engine = _real_engine(heads, 4)
    assert run_all(engine, prompts(), params) == want
    assert engine.stats.proposer.drafted_tokens > 0
