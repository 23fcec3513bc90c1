"""The command line: --version, where --host comes from, help texts that say their defaults."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from specserve import __version__
from specserve.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"specserve {__version__}"


def test_host_ignores_hostname_and_reads_specserve_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTNAME", "build-box-7")  # Docker and many shells export it
    monkeypatch.delenv("SPECSERVE_HOST", raising=False)
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    monkeypatch.setenv("SPECSERVE_HOST", "0.0.0.0")
    assert build_parser().parse_args(["serve"]).host == "0.0.0.0"


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser: argparse.ArgumentParser = sub.choices[name]  # type: ignore[index]
    return parser


def _help(name: str) -> str:
    return " ".join(_subparser(name).format_help().split())


@pytest.mark.parametrize(
    ("flag", "env", "default"),
    [
        ("--max-new-tokens", "SPECSERVE_MAX_NEW_TOKENS", "128"),
        ("--temperature", "SPECSERVE_TEMPERATURE", "0.0"),
        ("--top-p", "SPECSERVE_TOP_P", "1.0"),
        ("--top-k", "SPECSERVE_TOP_K", "0"),
        ("--seed", "SPECSERVE_SEED", "None"),
    ],
)
def test_generate_help_shows_env_and_default(flag: str, env: str, default: str) -> None:
    text = _help("generate")
    assert re.search(rf"{flag} \S+ .*?\[env: {env}; default: {default}\]", text), text


def test_sampling_flags_read_their_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_TEMPERATURE", "0.7")
    monkeypatch.setenv("SPECSERVE_SEED", "11")
    args = build_parser().parse_args(["generate", "hi"])
    assert (args.temperature, args.seed) == (0.7, 11)


def test_readme_and_help_agree_on_proposer_auto() -> None:
    # The truth is speculation/registry.py (auto's order): the draft model when --draft-model is
    # given, else Medusa heads (--medusa or stored in the checkpoint), else n-gram.
    [action] = [a for a in _subparser("serve")._actions if a.dest == "proposer"]
    assert "auto (the draft model if --draft-model is given, else Medusa heads" in str(action.help)
    row = next(line for line in README.read_text().splitlines() if "`--proposer auto" in line)
    assert row.index("draft model") < row.index("Medusa") < row.index("n-gram"), row


def test_numerics_flag_env_and_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from specserve.cli_args import engine_config
    from specserve.config import EngineConfig

    monkeypatch.delenv("NUMERICS", raising=False)
    args = build_parser().parse_args(["generate", "hi"])
    assert engine_config(args, resolve_speculate=False).numerics == "q8"  # the default
    monkeypatch.setenv("NUMERICS", "exact")
    args = build_parser().parse_args(["generate", "hi"])
    assert engine_config(args, resolve_speculate=False).numerics == "exact"
    args = build_parser().parse_args(["generate", "hi", "--numerics", "q8"])
    assert args.numerics == "q8"  # the flag beats the env form
    assert re.search(r"--numerics \S+ .*?\[env: NUMERICS; default: q8\]", _help("serve"))
    with pytest.raises(ValueError, match="numerics must be one of"):
        EngineConfig(numerics="fp8")  # type: ignore[arg-type]
