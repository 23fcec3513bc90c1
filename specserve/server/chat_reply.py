"""A chat reply's text as OpenAI's message parts: reasoning (server/reasoning.py), content and
tool calls (server/tools.py), whole or streamed.

Streamed, a reply that may still become calls is held back until it is told apart from text;
calls then go out as OpenAI sends them: for each call, a delta with its index, id, type and
function name (arguments ""), then deltas with pieces of its arguments as they are generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specserve.outputs import RequestOutput
from specserve.server.openai_replies import AssistantMessage
from specserve.server.reasoning import Reasoning, ReasoningStream, split
from specserve.server.tool_formats import ObjectEnd, is_calls, scan
from specserve.server.tools import ToolPlan, as_call, openai_call, parse_calls


def reply_message(
    text: str, tools: ToolPlan, reasoning: Reasoning | None
) -> tuple[AssistantMessage, bool]:
    """The whole reply as a message, and whether it is calls."""
    thought, content = split(text, reasoning.inside) if reasoning else (None, text)
    calls = parse_calls(content, tools)
    if calls is None:
        return AssistantMessage(content=content, reasoning_content=thought), False
    return AssistantMessage(content=None, reasoning_content=thought, tool_calls=calls), True


@dataclass
class Piece:
    """What one output of a streamed reply adds: text of each kind, tool-call deltas."""

    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    is_calls: bool = False  # finished as calls (finish_reason "tool_calls")


class ReplyStream:
    """One streamed choice's reply, split as it arrives."""

    def __init__(self, tools: ToolPlan, reasoning: Reasoning | None) -> None:
        self.tools = tools
        self.thinking = ReasoningStream(reasoning.inside) if reasoning else None
        self.calls: bool | None = None if tools.calls else False  # None: not told apart yet
        self.text = ""  # the content so far, while it is or may be calls
        self.sent: list[int] = []  # per call started: characters of its arguments sent
        self.ends: dict[int, ObjectEnd] = {}  # what scans of `text` found so far

    def feed(self, new: str, finished: bool) -> Piece:
        thought, content = self.thinking.feed(new, finished) if self.thinking else ("", new)
        if self.calls is False:
            return Piece(thought, content)
        self.text += content
        if self.calls is None:
            self.calls = is_calls(self.text, self.tools.syntax)
            if self.calls is None and not finished:
                return Piece(thought)
            if not self.calls:
                self.calls = False
                return Piece(thought, self.text)
        found = scan(self.text, self.tools.syntax, self.ends)
        if finished and not found.calls and not self.sent:  # began as calls do, was not one:
            return Piece(thought, self.text)  # (JSON under the response_format, say)
        deltas: list[dict[str, Any]] = []
        for i, call in enumerate(found.calls):
            if i == len(self.sent):
                self.sent.append(0)
                deltas.append({"index": i, **openai_call(call.name, "")})
            if piece := call.arguments[self.sent[i] :]:
                deltas.append({"index": i, "function": {"arguments": piece}})
                self.sent[i] = len(call.arguments)
        return Piece(thought, "", deltas, finished and found.complete and bool(found.calls))


class HeldCalls:
    """For a stream that sends a reply's call whole at its end (the Responses stream): a choice
    whose text may be calls is held back until it finishes, then taken with its first call;
    one that starts otherwise streams as text."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text: dict[int, str] = {}
        self.entries: dict[int, list[Any]] = {}
        self.streaming: set[int] = set()

    def take(self, i: int, out: RequestOutput) -> tuple[str, list[Any], dict[str, Any] | None]:
        """What to send for this output now: (text, logprob entries, the call if it is one)."""
        entries = list(out.logprobs or [])
        if not self.plan.calls or i in self.streaming:
            return out.new_text, entries, None
        text = self.text.get(i, "") + out.new_text
        entries = self.entries.get(i, []) + entries
        if is_calls(text, self.plan.syntax) is False:
            self.streaming.add(i)  # text, not calls: send what was held and stream on
            return text, entries, None
        if not out.finished:
            self.text[i], self.entries[i] = text, entries
            return "", [], None
        return text, entries, as_call(text, self.plan)
