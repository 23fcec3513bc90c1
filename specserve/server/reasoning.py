"""Reasoning output: the `<think>...</think>` block of models that write one (Qwen3, DeepSeek-R1,
QwQ) goes to `reasoning_content`, the rest to `content`.

A model thinks when its chat template knows the closing tag (such templates drop the block from
earlier assistant turns). The block either starts the reply or was opened by the prompt (a
generation prompt that ends with `<think>`, as DeepSeek-R1's does). A reply cut short inside the
block is all reasoning. Content after the block loses the newlines that separate it.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Reasoning:
    """A reply that may think: how it starts."""

    inside: bool  # the prompt opened the block


def thinks(template: str | None) -> bool:
    return bool(template) and CLOSE in (template or "")


def opened(prompt: str) -> bool:
    """Whether the rendered prompt leaves the reply inside a think block."""
    return prompt.rstrip().endswith(OPEN)


def split(text: str, inside: bool) -> tuple[str | None, str]:
    """(reasoning, content) of a whole reply; reasoning None where there was no block.
    `inside`: the prompt opened the block."""
    if not inside:
        stripped = text.lstrip()
        if not stripped.startswith(OPEN):
            return None, text
        text = stripped[len(OPEN) :]
    reasoning, close, content = text.partition(CLOSE)
    return reasoning, content.lstrip("\n") if close else ""


@dataclass
class ReasoningStream:
    """One streamed reply split as it arrives: `feed` returns the (reasoning, content) to send
    now. Text that may still be the start of a tag is held back until it is told apart."""

    inside: bool  # in the block (the prompt opened it)
    state: str = "start"  # start (no text yet told apart) | think | after (newlines dropped) | text
    held: str = ""

    def __post_init__(self) -> None:
        if self.inside:
            self.state = "think"

    def feed(self, new: str, finished: bool = False) -> tuple[str, str]:
        text, self.held = self.held + new, ""
        reasoning = content = ""
        if self.state == "start":
            stripped = text.lstrip()
            if OPEN.startswith(stripped) and stripped != OPEN and not finished:
                self.held = text
                return "", ""
            if stripped.startswith(OPEN):
                self.state, text = "think", stripped[len(OPEN) :]
            else:
                self.state = "text"
        if self.state == "think":
            before, close, text = text.partition(CLOSE)
            if not close:
                keep = 0 if finished else _partial_tag(before)
                self.held = before[len(before) - keep :]
                return before[: len(before) - keep], ""
            reasoning, self.state = before, "after"
        if self.state == "after":
            text = text.lstrip("\n")
            if text:
                self.state = "text"
        if self.state == "text":
            content = text
        return reasoning, content


def _partial_tag(text: str) -> int:
    """How many of the last characters of `text` could begin the closing tag."""
    for n in range(min(len(CLOSE) - 1, len(text)), 0, -1):
        if CLOSE.startswith(text[-n:]):
            return n
    return 0
