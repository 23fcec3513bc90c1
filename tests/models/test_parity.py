"""Our decoder's logits equal HF transformers' for the same weights (prefill and decode), in the
exact numerics (q8 is another arithmetic; these models have no GGUF blocks anyway)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from specserve.config import AttentionImpl
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from tests.tiny import make_model_dir

CPU = torch.device("cpu")


def assert_matches_hf(
    model_dir: Path,
    vocab: int,
    table: list[int],
    block_size: int,
    device: torch.device = CPU,
    attention: AttentionImpl = "auto",
    context: int | None = None,
) -> None:
    """Prefill 20 tokens, decode 7 one at a time, then a 3-token chunk, against HF fp32.
    `context`: the context served (build_model's)."""
    import transformers

    load = transformers.AutoModelForCausalLM.from_pretrained
    ref: Any = load(str(model_dir), dtype=torch.float32)
    ref = ref.to(device).eval()
    model = build_model(model_dir, device, numerics="exact", context=context)
    runner = ModelRunner(model, 16, block_size, device, attention)
    ids = torch.randint(0, vocab, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([ids], device=device)).logits[0].float()  # [30, V]
    out = runner.run([RunItem(ids[:20], 0, table, num_logits=20)]).logits
    assert out.device.type == device.type and out.dtype == torch.float32
    torch.testing.assert_close(out, want[:20], atol=1e-4, rtol=1e-4)
    for pos in range(20, 27):
        out = runner.run([RunItem([ids[pos]], pos, table, num_logits=1)]).logits
        torch.testing.assert_close(out[0], want[pos], atol=1e-4, rtol=1e-4)
    out = runner.run([RunItem(ids[27:30], 27, table, num_logits=3)]).logits
    torch.testing.assert_close(out, want[27:30], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attention", ["auto", "reference"])
@pytest.mark.parametrize(
    ("arch", "tied"), [("llama", False), ("llama", True), ("qwen2", False), ("mistral", False)]
)
def test_logits_match_hf_prefill_and_decode(
    arch: str, tied: bool, attention: AttentionImpl, tmp_path: Path
) -> None:
    """Both attention paths; mistral's window (24) is shorter than the 30 tokens."""
    model_dir = make_model_dir(tmp_path, arch, with_tokenizer=False, seed=3, tied=tied)
    table = [5, 2, 9, 0, 7, 11, 3, 1, 4, 6, 8, 10]  # scattered blocks on purpose
    assert_matches_hf(model_dir, 320, table, block_size=4, attention=attention)


def test_ragged_batch_matches_single_sequences(tiny_llama: Path) -> None:
    model = build_model(tiny_llama, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 320, (n,), generator=g).tolist() for n in (9, 1, 14)]
    tables = [[0, 1, 2], [3], [4, 5, 6, 7]]
    alone = []
    for ids, table in zip(seqs, tables, strict=True):
        runner = ModelRunner(model, num_blocks=8, block_size=4, device=torch.device("cpu"))
        alone.append(runner.run([RunItem(ids, 0, table, num_logits=len(ids))]).logits)
    runner = ModelRunner(model, num_blocks=8, block_size=4, device=torch.device("cpu"))
    items = [RunItem(ids, 0, t, num_logits=len(ids)) for ids, t in zip(seqs, tables, strict=True)]
    together = runner.run(items).logits
    torch.testing.assert_close(together, torch.cat(alone), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_long_chunks_match_hf(arch: str, tmp_path: Path) -> None:
    """Chunks longer than the kernel's split-task query limit (32) run by query blocks: from
    position 0 and later (over the cached context, with mistral's window)."""
    import transformers

    model_dir = make_model_dir(tmp_path, arch, with_tokenizer=False, seed=4)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    n1, n2 = 32 + 8, 32 + 4
    ids = torch.randint(0, 320, (n1 + 1 + n2,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    runner = ModelRunner(build_model(model_dir, CPU, numerics="exact"), 32, 4, CPU)
    table = list(range(31, 31 - 21, -1))
    runs = [(0, n1), (n1, n1 + 1), (n1 + 1, n1 + 1 + n2)]
    got = [
        runner.run([RunItem(ids[a:b].tolist(), a, table, num_logits=b - a)]).logits for a, b in runs
    ]
    torch.testing.assert_close(torch.cat(got), want, atol=1e-4, rtol=1e-4)
