"""Stream events built without a model per token equal the model's own dump, byte for byte."""

from __future__ import annotations

from typing import Any

import pytest

from specserve.server.openai_replies import ChatChunkChoice, ChatCompletionChunk, Delta
from specserve.server.schemas import StreamResponse, Token
from specserve.server.sse import TextEvents, sse
from specserve.server.tgi import token_event

TEXTS = ["", "hi", ' say "no"', "a\\b", "line\nnext\ttab\r", "\x01\x1f\x7f", "é 中 😀", "\u2028"]


def _chunk(index: int, text: str, model: str = "m") -> ChatCompletionChunk:
    choice = ChatChunkChoice(index=index, delta=Delta(content=text))
    return ChatCompletionChunk(id="chatcmpl-1", created=5, model=model, choices=[choice])


@pytest.mark.parametrize("text", [*TEXTS, TextEvents.MARK])
def test_text_events_equal_the_models_dump(text: str) -> None:
    events = TextEvents(lambda s: _chunk(2, s))
    assert sse(events(text)) == sse(_chunk(2, text))


def test_text_events_need_the_text_in_one_place() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        TextEvents(lambda s: _chunk(0, s, model=s))
    with pytest.raises(ValueError, match="exactly once"):
        TextEvents(lambda s: _chunk(0, "fixed"))


@pytest.mark.parametrize("logprob", [None, 0.0, -0.0, -1e-7, -12.345678901234, -3.0])
@pytest.mark.parametrize("special", [False, True])
def test_a_token_event_equals_the_models_dump(logprob: float | None, special: bool) -> None:
    for index, text in enumerate(TEXTS):
        token: dict[str, Any] = {
            "id": 7 + index,
            "text": text,
            "logprob": logprob,
            "special": special,
        }
        model = StreamResponse(index=index, token=Token(**token))
        assert sse(token_event(index, token)) == sse(model)
