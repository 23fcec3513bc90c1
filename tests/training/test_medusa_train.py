"""Medusa training (`specserve.training`): tiny heads on a tiny base lower the head loss, are
lossless in the engine, and `specserve train-medusa` writes them or refuses bad input."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specserve.request import SamplingParams
from specserve.speculation.medusa import fingerprint, load_medusa
from specserve.speculation.medusa_proposer import MedusaProposer
from specserve.training.medusa_cli import add_medusa_parser
from specserve.training.medusa_options import TrainOptions, TrainReport
from specserve.training.medusa_train import train_medusa
from tests.engine.helpers import make_engine, mixed_prompts, run_all


@pytest.fixture(scope="module")
def tiny_heads(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path
) -> tuple[Path, TrainReport]:
    out = tmp_path_factory.mktemp("tiny-heads")
    options = TrainOptions(
        prompts=16,
        new_tokens=32,
        epochs=4,
        batch_size=32,
        workloads=("code-complete", "chat-creative"),
    )
    report = train_medusa(tiny_llama, out, heads=3, options=options, progress=False)
    return out, report


def test_tiny_training_reduces_head_loss(
    tiny_heads: tuple[Path, TrainReport], tiny_llama: Path
) -> None:
    out, report = tiny_heads
    assert all(a < b for a, b in zip(report.loss_after, report.loss_before, strict=True))
    heads, cfg = load_medusa(out)
    assert cfg.base_fingerprint == fingerprint(tiny_llama)
    assert heads.shares_lm_head and cfg.extra["training"]["heldout_positions"] > 0


def test_trained_heads_in_the_engine_are_lossless(
    tiny_heads: tuple[Path, TrainReport], tiny_llama: Path
) -> None:
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompts = mixed_prompts(6)
    want = run_all(make_engine(tiny_llama), prompts, params)
    engine = make_engine(tiny_llama, speculate=3, num_blocks=40)
    proposer = MedusaProposer.load(tiny_heads[0], engine.res.model, tiny_llama)
    engine.use_proposer(proposer)
    assert run_all(engine, prompts, params) == want
    assert engine.stats.proposer.drafted_tokens > 0
    assert engine.res.allocator.num_free == engine.res.allocator.num_blocks


def test_train_medusa_command(tmp_path: Path, tiny_llama: Path) -> None:
    parser = argparse.ArgumentParser()
    add_medusa_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "heads"
    argv = ["train-medusa", "--model", str(tiny_llama), "--out", str(out), "--heads", "2"]
    options = ["--new-tokens", "8", "--epochs", "1", "--workload", "chat-creative"]
    args = parser.parse_args([*argv, *options, "--prompts", "8"])
    assert args.func(args) == 0
    assert load_medusa(out)[1].num_heads == 2
    args = parser.parse_args([*argv, *options, "--prompts", "4"])  # nothing to hold out
    assert args.func(args) == 2
    args = parser.parse_args(["train-medusa", "--model", str(tmp_path / "nope"), "--out", "x"])
    assert args.func(args) == 2
