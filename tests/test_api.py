"""The library entry point and the `specserve generate` command."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve import LLM, EngineConfig, SamplingParams, SpecConfig
from specserve.cli import main


def test_llm_generate_and_chat(tiny_llama: Path) -> None:
    llm = LLM(config=EngineConfig(model=str(tiny_llama), spec=SpecConfig(speculate=3)))
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = llm.generate(["def add(a, b):", "The quick brown fox"], params)
    assert [len(o.token_ids) for o in outs] == [12, 12]
    assert all(o.text and o.finish_reason == "length" for o in outs)
    assert outs[0].text == llm.engine.tokenizer.decode(outs[0].token_ids, skip_special_tokens=True)
    [chat] = llm.chat([[{"role": "user", "content": "hi"}]], params)
    assert len(chat.token_ids) == 12


def test_generate_command_streams_text(
    tiny_llama: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "generate",
            "def add(a, b):",
            "--model",
            str(tiny_llama),
            "--raw",
            "--max-new-tokens",
            "8",
            "--speculate",
            "2",
            "--stats",
        ]
    )
    out = capsys.readouterr()
    assert code == 0
    assert out.out.strip()
    assert "tok/s" in out.err and "drafted=" in out.err


def test_generate_command_reports_bad_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["generate", "hi", "--model", str(tmp_path / "missing")])
    assert code == 2
    assert "missing" in capsys.readouterr().err
