"""A chat request's prompt: its messages, tools and `chat_template_kwargs` through the model's
chat template, and what the template says about the reply (its tool syntax, whether it thinks).

Where the template takes `tools` in a syntax of server/tool_formats.py, the tools and earlier
calls go to it as structures (`tools=[...]`, an assistant's `tool_calls` with their arguments
parsed); otherwise the tools are a system message of our own and earlier calls the JSON text
the model wrote for them (server/tools.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from specserve.server.caps import check_prompt_chars
from specserve.server.errors import ApiError, ErrorKind, invalid
from specserve.server.openai_schemas import ChatCompletionRequest, ChatMessage
from specserve.server.reasoning import Reasoning, opened, thinks
from specserve.server.settings import Limits
from specserve.server.tool_formats import ToolSyntax, template_syntax
from specserve.server.tools import ToolPlan, calls_text, history_calls, tool_plan

# Arguments of apply_chat_template that a request's chat_template_kwargs must not set.
RESERVED = frozenset(
    {"conversation", "messages", "tools", "documents", "chat_template", "tokenize", "padding",
     "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
     "add_generation_prompt", "continue_final_message", "tokenizer_kwargs"}
)  # fmt: skip


@dataclass(frozen=True)
class ChatTemplate:
    """`render(messages, tools=..., **kwargs)` -> prompt text, `encode(text)` -> its ids;
    `source` the template's text. A plain `encode_chat(messages)` -> ids has no render: it is
    a template without tools or thinking."""

    render: Callable[..., str] | None
    encode: Callable[[Any], list[int]]
    source: str = ""
    special_id: Callable[[str], int | None] | None = None  # a special token's id (or None)
    tool_syntax: ToolSyntax | None = field(init=False)
    thinks: bool = field(init=False)

    def __post_init__(self) -> None:
        syntax = template_syntax(self.source)
        if syntax is not None and syntax.skipped and self.special_id is not None:
            syntax = replace(syntax, skipped_id=self.special_id(syntax.skipped))
        object.__setattr__(self, "tool_syntax", syntax)
        object.__setattr__(self, "thinks", thinks(self.source))

    def __call__(self, messages: list[dict[str, Any]]) -> list[int]:
        """Messages -> prompt ids (as `encode_chat`)."""
        return self.prompt(messages)[0]

    def prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[int], bool]:
        """(prompt ids, whether the prompt leaves the reply inside a think block)."""
        if self.render is None:
            return self.encode(messages), False
        for key in kwargs or {}:
            if key in RESERVED:
                raise invalid("chat_template_kwargs", f"cannot set {key!r}")
        from jinja2 import TemplateError

        try:
            text = self.render(messages, tools=tools, **(kwargs or {}))
        except (TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            # a template is code the request's messages and kwargs steer: what it raises is
            # the request's problem (a variable of the wrong type), not the server's
            raise ApiError(
                422,
                f"messages: the chat template rejected them: {exc}",
                ErrorKind.VALIDATION,
                "messages",
            ) from exc
        return self.encode(text), self.thinks and opened(text)


def as_template(encode_chat: ChatTemplate | Callable[[Any], list[int]]) -> ChatTemplate:
    if isinstance(encode_chat, ChatTemplate):
        return encode_chat
    return ChatTemplate(None, encode_chat)


def template_of(tokenizer: Any, encode: Callable[[str], list[int]]) -> ChatTemplate:
    """The chat template of `tokenizer`, its prompts encoded with `encode`."""

    def render(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        text: str = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
        return text

    def special_id(text: str) -> int | None:
        """The id of the one token `text` is, if the detokenizer drops it (a special token)."""
        token = tokenizer.convert_tokens_to_ids(text)
        if not isinstance(token, int) or token == getattr(tokenizer, "unk_token_id", None):
            return None
        if tokenizer.decode([token]) != text or tokenizer.decode([token], True) != "":
            return None
        return token

    source = getattr(tokenizer, "chat_template", None)
    return ChatTemplate(render, encode, source if isinstance(source, str) else "", special_id)


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    tools: ToolPlan
    reasoning: Reasoning | None  # None: the model does not think


def chat_prompt(
    req: ChatCompletionRequest,
    encode_chat: ChatTemplate | Callable[[Any], list[int]],
    limits: Limits,
    reply: dict[str, Any] | None = None,
) -> ChatPrompt:
    """The request's prompt ids, and the plan for its tools and reasoning. `reply`: the
    response_format's schema, for a reply that is not calls."""
    template = as_template(encode_chat)
    syntax = template.tool_syntax
    plan = tool_plan(req.tools, req.tool_choice, syntax, req.parallel_tool_calls, reply=reply)
    messages = chat_messages(req.messages, plan, syntax is not None)
    check_prompt_chars(sum(len(str(m.get("content") or "")) for m in messages), limits, "messages")
    kwargs = req.chat_template_kwargs
    ids, inside = template.prompt(messages, plan.template_tools(), kwargs)
    if not template.thinks:
        return ChatPrompt(ids, plan, None)
    if plan.calls:  # the calls may follow a think block
        think = "inside" if inside else "block"
        plan = tool_plan(req.tools, req.tool_choice, syntax, req.parallel_tool_calls, think, reply)
    return ChatPrompt(ids, plan, Reasoning(inside))


def chat_messages(
    messages: list[ChatMessage], plan: ToolPlan, structured: bool
) -> list[dict[str, Any]]:
    """Chat messages as the chat template takes them (text parts joined, developer = system).
    `structured`: the template takes earlier calls as `tool_calls` (else as their JSON text)."""
    out: list[dict[str, Any]] = []
    if (listing := plan.system_message()) is not None:
        out.append(listing)
    for i, m in enumerate(messages):
        content = (
            m.content
            if isinstance(m.content, str)
            else "\n".join(part.text for part in m.content or [])
        )
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
        field_name = f"messages[{i}].tool_calls"
        if m.tool_calls and structured:
            message["tool_calls"] = history_calls(m.tool_calls, field_name)
        elif m.tool_calls:  # an earlier call, as the model wrote it
            content = calls_text(m.tool_calls, field_name)
        message["content"] = content
        if structured and m.role == "tool" and m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if structured and m.name is not None:
            message["name"] = m.name
        out.append(message)
    return out
