"""The command line: --version, where --host comes from, help texts that say their defaults, and
the engine flags generated from the config schema."""

from __future__ import annotations

import argparse
import functools
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from specserve import __version__
from specserve.cli import build_parser
from specserve.cli_args import ENGINE_OPTIONS, engine_config
from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
from specserve.config_schema import FLAG, Flag
from specserve.server.startup import SERVE_OPTIONS

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


# ------------------------------------------------------------------- one configuration schema
def _flagged_fields() -> list[Flag]:
    """Every Flag in the config records' metadata, read without the generator."""
    records = (EngineConfig, SpecConfig, CacheConfig, SchedulerConfig)
    return [f.metadata[FLAG] for cls in records for f in fields(cls) if FLAG in f.metadata]


def _option_strings(name: str) -> set[str]:
    return {s for a in _subparser(name)._actions for s in a.option_strings}


def test_the_engine_flags_are_the_schema_fields() -> None:
    """No engine flag is declared by hand: generate's and serve's flags are the flagged config
    fields, plus serve's own (SERVE_OPTIONS) and generate's sampling and output flags."""
    schema = {flag.name for flag in _flagged_fields()}
    assert schema == {o.flag for o in ENGINE_OPTIONS}
    assert _option_strings("serve") == schema | {o.flag for o in SERVE_OPTIONS} | {"-h", "--help"}
    sampling = {"--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed"}
    own = sampling | {"--raw", "--stats", "-h", "--help"}
    assert _option_strings("generate") == schema | own
    envs = [flag.env for flag in _flagged_fields()] + [o.env for o in SERVE_OPTIONS]
    assert len(envs) == len(set(envs))


# Every flagged field away from its default, so each one's way from flag to field is checked.
CHANGED = EngineConfig(
    model="/models/m.gguf",
    device="cuda:1",
    dense_weights=True,
    numerics="exact",
    attention="reference",
    num_threads=3,
    max_model_len=512,
    max_memory="1GiB",
    cache=CacheConfig(
        max_kv_bytes=256 << 20, kv_dtype="float32", prefix_caching=False, window_pool=False
    ),
    scheduler=SchedulerConfig(max_batch_tokens=100, max_running_requests=7, itl_target_ms=25.0),
    spec=SpecConfig(
        speculate=3,
        proposer="draft",
        policy="static",
        max_batch=5,
        max_tokens=77,
        draft_model="/models/d",
        medusa="/heads",
        force_medusa=True,
        eagle="/eagle-head",
        force_eagle=True,
        ngram_max=3,
        suffix_cache_tokens=99,
    ),
)


def _field_value(config: EngineConfig, path: tuple[str, ...]) -> Any:
    return functools.reduce(getattr, path, config)


def _flags_for(config: EngineConfig) -> dict[str, str | None]:
    """{flag: its text} (None: a switch given) that say `config`."""
    out: dict[str, str | None] = {}
    for option in ENGINE_OPTIONS:
        value = _field_value(config, option.path)
        if not option.switch:
            out[option.flag] = str(value)
        elif value != _field_value(EngineConfig(), option.path):
            out[option.flag] = None
    return out


def test_an_engine_config_round_trips_through_its_flags_and_their_env_forms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for option in ENGINE_OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
        assert _field_value(CHANGED, option.path) != _field_value(EngineConfig(), option.path)
    flags = _flags_for(CHANGED)
    argv = [s for flag, text in flags.items() for s in (flag, text) if s is not None]
    assert engine_config(build_parser().parse_args(["generate", "hi", *argv])) == CHANGED
    assert engine_config(build_parser().parse_args(["serve", *argv])) == CHANGED
    for option in ENGINE_OPTIONS:
        monkeypatch.setenv(option.env, flags.get(option.flag) or "1")
    assert engine_config(build_parser().parse_args(["generate", "hi"])) == CHANGED
    # and with nothing given, the config's own defaults (speculate unset counts as 0)
    for option in ENGINE_OPTIONS:
        monkeypatch.delenv(option.env)
    args = build_parser().parse_args(["generate", "hi"])
    assert engine_config(args, resolve_speculate=False) == EngineConfig()


def test_serve_warns_of_a_passive_openmp_wait_policy() -> None:
    from specserve.server.cli import wait_policy_warning

    assert "2x slower" in (wait_policy_warning({"OMP_WAIT_POLICY": " passive"}) or "")
    assert wait_policy_warning({"OMP_WAIT_POLICY": "ACTIVE"}) is None
    assert wait_policy_warning({}) is None
