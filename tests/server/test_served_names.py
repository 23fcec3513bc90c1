"""Names users address a model by (#53 item 5): a GGUF served from a path answers to its stem
(the id /v1/models lists), its general.name and the path; --served-model-name replaces them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specserve.server.errors import ApiError
from specserve.server.param_checks import check_model
from specserve.server.settings import Limits
from specserve.server.startup import DEFAULT_MODEL_ID, served_names
from tests.gguf_files import T, write_gguf
from tests.tiny import make_model_dir

LIMITS = Limits(
    max_input_tokens=10, max_input_reason="", max_total_tokens=20, kv_capacity_tokens=20,
    speculate=0, max_stop_sequences=4, vocab_size=320,
)  # fmt: skip


def accepts(names: tuple[str, ...], model: str) -> bool:
    try:
        check_model(model, replace(LIMITS, model_names=names))
    except ApiError as exc:
        assert exc.status == 404
        return False
    return True


def test_a_gguf_answers_to_its_stem_its_name_and_its_path(tmp_path: Path) -> None:
    hf = make_model_dir(tmp_path / "hf", "llama")
    written = write_gguf(hf, tmp_path / "Tiny Chat.gguf", lambda _: T.Q8_0)  # its general.name
    gguf = written.rename(tmp_path / "tiny-q8_0.gguf")
    model_id, names = served_names(None, str(gguf))
    assert model_id == "tiny-q8_0"
    for name in ("tiny-q8_0", str(gguf), "tiny-q8_0.gguf", "TINY-Q8_0", "Tiny Chat"):
        assert accepts(names, name), name
    assert not accepts(names, "other")


def test_served_model_name_replaces_the_defaults() -> None:
    model_id, names = served_names("chat, chat-large ,chat", "/models/x.gguf")
    assert (model_id, names) == ("chat", ("chat", "chat-large"))
    assert accepts(names, "chat-large") and not accepts(names, "x")
    with pytest.raises(ValueError, match="names no name"):
        served_names(" , ", None)
    assert served_names(None, None)[0] == DEFAULT_MODEL_ID
