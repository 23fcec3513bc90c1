"""verify_cost (issue 3) and its random-weight checkpoints, on CPU at toy sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import verify_cost
from benchmarks.random_model import SHAPES, tensor_shapes, write_random_model
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_random(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(SHAPES["tiny"], tmp_path_factory.mktemp("tiny-random"))


def table_rows(markdown: str) -> list[list[str]]:
    """Body rows of every markdown table in `markdown` (header and rule lines dropped)."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ") and ln[2:3].isdigit()]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_cli_prints_a_row_per_batch_and_k(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "verify.json"
    argv = ["--device", "cpu", "--batches", "1,2", "--ks", "0,2", "--model-shape", "tiny"]
    argv += ["--context", "20", "--warmup", "1", "--repeats", "3", "--threads", "1"]
    argv += ["--work-dir", str(tmp_path / "models"), "--json", str(path)]
    assert verify_cost.main(argv) == 0

    out = capsys.readouterr().out
    assert "### tiny (random weights), float32" in out
    assert "| batch | k | tokens | ms per step | ms per sequence | ratio to k=0 |" in out
    rows = table_rows(out)
    expected = [("1", "0", "1"), ("1", "2", "3"), ("2", "0", "2"), ("2", "2", "6")]
    assert [(r[0], r[1], r[2]) for r in rows] == expected
    for row in rows:
        assert float(row[3].split()[0]) > 0 and float(row[4]) > 0 and float(row[5]) > 0
    assert [r[5] for r in rows if r[1] == "0"] == ["1.00", "1.00"]

    report = json.loads(path.read_text())
    assert report["config"]["batches"] == [1, 2] and report["config"]["ks"] == [0, 2]
    [run] = report["runs"]
    assert run["dtype"] == "float32" and run["error"] is None
    for p in run["points"]:
        assert 0 < p["ms_min"] <= p["ms_step"] <= p["ms_max"]
        assert p["ms_per_seq"] == pytest.approx(p["ms_step"] / p["batch"])
        assert p["tokens"] == p["batch"] * (p["k"] + 1)


def test_measure_frees_every_block(tiny_random: Path) -> None:
    model = build_model(tiny_random, CPU)
    allocator = BlockAllocator(num_blocks=3 * 4, block_size=4)
    runner = ModelRunner(model, allocator.num_blocks, allocator.block_size, CPU)
    points = verify_cost.measure_verify_cost(
        runner, allocator, batches=[3, 1], ks=[1, 0, 3], context=9, warmup=0, repeats=2
    )
    assert [(p.batch, p.k) for p in points] == [(b, k) for b in (3, 1) for k in (1, 0, 3)]
    assert all(p.ratio_k0 is not None and p.ms_step > 0 for p in points)
    assert allocator.num_free == allocator.num_blocks


def test_measure_without_k0_has_no_ratio(tiny_random: Path) -> None:
    model = build_model(tiny_random, CPU)
    allocator = BlockAllocator(num_blocks=2, block_size=4)
    runner = ModelRunner(model, 2, 4, CPU)
    [point] = verify_cost.measure_verify_cost(runner, allocator, [1], [2], context=0, repeats=1)
    assert point.ratio_k0 is None and point.tokens == 3
    assert "| 1 | 2 | 3 |" in verify_cost.render_points([point])


def test_cli_reports_a_failing_dtype_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = verify_cost.run_model

    def fail_in_fp16(model_dir: Path, dtype: str, *rest: object) -> list[verify_cost.Point]:
        if dtype == "float16":
            raise RuntimeError("no fp16 here")
        return real(model_dir, dtype, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_cost, "run_model", fail_in_fp16)
    argv = ["--device", "cpu", "--batches", "1", "--ks", "0", "--model-shape", "tiny"]
    argv += ["--dtypes", "float16,float32", "--context", "4", "--repeats", "1"]
    assert verify_cost.main([*argv, "--work-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "### tiny (random weights), float16\n\nFAILED: RuntimeError: no fp16 here" in out
    assert len(table_rows(out)) == 1  # float32 still measured


def test_random_model_matches_hf_and_is_reused(tiny_random: Path) -> None:
    import transformers

    shapes = tensor_shapes(SHAPES["smollm2-135m"])
    assert "lm_head.weight" not in shapes  # tied: stored once
    assert shapes["model.embed_tokens.weight"] == (49152, 576)
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 134_515_008
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_random)).float().eval()
    ours = build_model(tiny_random, CPU, numerics="exact")  # HF parity: float32 arithmetic
    ids = list(range(3, 23))
    runner = ModelRunner(ours, 8, 4, CPU)
    got = runner.run([RunItem(ids, 0, list(range(5)), len(ids))]).logits
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    stamp = (tiny_random / "model.safetensors").stat().st_mtime_ns
    write_random_model(SHAPES["tiny"], tiny_random)  # same config, seed and dtype: kept
    assert (tiny_random / "model.safetensors").stat().st_mtime_ns == stamp
