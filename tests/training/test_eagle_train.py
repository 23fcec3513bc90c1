"""EAGLE head training (`specserve.training.eagle_train`): a tiny head on a tiny base learns,
is lossless in the engine (greedy, drafts rejected too), keeps its collected data for the next
run, and `specserve train-eagle` writes it or refuses bad input."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specserve.request import SamplingParams
from specserve.speculation.eagle_head import fingerprint, load_eagle
from specserve.speculation.eagle_proposer import EagleProposer
from specserve.training.eagle_cli import add_eagle_parser
from specserve.training.eagle_train import EagleReport, train_eagle
from specserve.training.medusa_data import Continuation
from specserve.training.medusa_options import TrainOptions
from tests.engine.helpers import make_engine, mixed_prompts

OPTIONS = TrainOptions(
    prompts=16, new_tokens=32, epochs=6, lr=3e-3, workloads=("code-complete", "chat-creative")
)


@pytest.fixture(scope="module")
def tiny_head(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path
) -> tuple[Path, EagleReport, Path]:
    out = tmp_path_factory.mktemp("tiny-eagle")
    data = out.parent / "eagle-data.pt"
    report = train_eagle(
        tiny_llama,
        out,
        OPTIONS,
        depths=3,
        intermediate_size=32,
        window=16,
        sequences_per_step=4,
        data=data,
        progress=False,
    )
    return out, report, data


def test_tiny_training_learns_and_records_its_base(
    tiny_head: tuple[Path, EagleReport, Path], tiny_llama: Path
) -> None:
    out, report, _ = tiny_head
    head, cfg = load_eagle(out)
    assert cfg.base_fingerprint == fingerprint(tiny_llama)
    assert cfg.shape.window == 16 and len(head.draft_vocab) == report.draft_vocab_size
    assert report.heldout_positions > 0 and len(report.accuracy) == 3
    # a random base's greedy text is repetitive: a head that learned drafts much of it
    assert report.accuracy[0] > 0.3 and report.mean_accepted > 0.3
    assert cfg.extra["training"]["train_positions"] == report.train_positions


def test_collected_data_is_reused_only_for_the_same_options(
    tiny_head: tuple[Path, EagleReport, Path],
    tiny_llama: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import specserve.training.eagle_data as eagle_data

    _, report, data = tiny_head
    calls: list[int] = []
    real = eagle_data.collect

    def counted(*args: Any) -> list[Continuation]:
        calls.append(1)
        return real(*args)

    def train(out: Path, options: TrainOptions) -> EagleReport:
        return train_eagle(
            tiny_llama, out, options, depths=3, intermediate_size=32, window=16, data=data,
            progress=False,
        )  # fmt: skip

    monkeypatch.setattr(eagle_data, "collect", counted)
    again = train(tmp_path / "again", replace(OPTIONS, epochs=1))
    assert calls == [] and again.heldout_positions == report.heldout_positions  # read back
    train(tmp_path / "other", replace(OPTIONS, new_tokens=16))
    assert calls == [1]  # other options: collected again


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("kind", ["eagle", "hybrid"])
def test_trained_head_in_the_engine_is_lossless(
    tiny_head: tuple[Path, EagleReport, Path],
    tiny_llama: Path,
    kind: str,
    sampled: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from specserve.speculation.hybrid import HybridProposer

    # drafting free: the tiny head drafts in every step, however few it gets right
    monkeypatch.setattr("specserve.speculation.eagle_proposer.HEAD_TOKEN_COST", 0.0)
    from specserve.speculation.suffix import SuffixProposer
    from tests.engine.test_logprobs import run

    params = SamplingParams(
        max_new_tokens=24, ignore_eos=True, logprobs=2, temperature=0.7 if sampled else 0.0,
        seed=5 if sampled else None,
    )  # fmt: skip
    prompts = mixed_prompts(6)
    want = run(make_engine(tiny_llama), prompts, params)  # fails on an errored request
    engine = make_engine(tiny_llama, speculate=3, num_blocks=40, policy="static")
    eagle = EagleProposer.load(tiny_head[0], engine.res.model, tiny_llama)
    proposer = eagle if kind == "eagle" else HybridProposer(SuffixProposer(1024), eagle)
    engine.use_proposer(proposer)
    tokens, lps, _ = run(engine, prompts, params)
    assert tokens == want[0]
    # The tiny base has dense weights: its GEMM may round a row differently in another batch
    # mix, so logprobs match to float32 noise here (bit for bit on the GGUF blocks:
    # tests/speculation/test_eagle.py on the embedded model)
    for got, ref in zip(lps, want[1], strict=True):
        assert [e.token for e in got] == [e.token for e in ref]
        assert [e.logprob for e in got] == pytest.approx([e.logprob for e in ref], abs=1e-5)
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # drafted, some rejected
    assert engine.res.allocator.num_free == engine.res.allocator.num_blocks
    assert not eagle._states and not len(eagle.gained)  # every sequence released
    if kind == "hybrid":
        assert isinstance(proposer, HybridProposer) and proposer.chosen["head"] > 0


def test_train_eagle_command(tmp_path: Path, tiny_llama: Path) -> None:
    parser = argparse.ArgumentParser()
    add_eagle_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "head"
    argv = ["train-eagle", "--model", str(tiny_llama), "--out", str(out), "--depths", "2"]
    options = ["--new-tokens", "8", "--epochs", "1", "--workload", "chat-creative"]
    args = parser.parse_args([*argv, *options, "--prompts", "8", "--intermediate-size", "16"])
    assert args.func(args) == 0
    assert load_eagle(out)[1].shape.intermediate_size == 16
    args = parser.parse_args([*argv, *options, "--prompts", "4"])  # nothing to hold out
    assert args.func(args) == 2
    args = parser.parse_args([*argv, *options, "--prompts", "8", "--window", "0"])
    assert args.func(args) == 2
