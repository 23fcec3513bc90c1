"""Library entry point: `from specserve import LLM; LLM().generate(["..."])`."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.config import EngineConfig
from specserve.engine.engine import Engine
from specserve.request import SamplingParams


@dataclass(frozen=True)
class Completion:
    prompt: str | list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    drafted_tokens: int
    accepted_tokens: int


class LLM:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig(model=model)
        self.engine = Engine(self.config)

    def generate(
        self, prompts: list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Run all prompts together (continuous batching) and return them in order."""
        params = params or SamplingParams()
        ids = [self.engine.add_request(p, params) for p in prompts]
        texts = {i: "" for i in ids}
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        done: dict[str, Completion] = {}
        while len(done) < len(ids):
            for out in self.engine.step():
                texts[out.request_id] += out.new_text
                tokens[out.request_id] += out.new_token_ids
                if out.finished:
                    prompt = prompts[ids.index(out.request_id)]
                    done[out.request_id] = Completion(
                        prompt,
                        texts[out.request_id],
                        tokens[out.request_id],
                        out.finish_reason,
                        out.drafted_tokens,
                        out.accepted_tokens,
                    )
        return [done[i] for i in ids]

    def chat(
        self, conversations: list[list[dict[str, str]]], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Apply the tokenizer's chat template to each conversation, then generate."""
        return self.generate([self.engine.encode_chat(c) for c in conversations], params)
