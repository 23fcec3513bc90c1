"""A Responses reply from the chat path's result: its output items (a message, or a function
call where the reply is one), the response object, and what is stored for the next turn.

Status: "completed", or "incomplete" (with `incomplete_details.reason` "max_output_tokens") when
the reply stopped at the token limit; a reply that is a whole call is complete, as in chat
completions.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from specserve.outputs import RequestOutput
from specserve.request import FinishReason
from specserve.server.openai_usage import usage
from specserve.server.responses_schemas import (
    FunctionCall,
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    Status,
)
from specserve.server.responses_store import ResponseStore, Stored
from specserve.server.tools import ToolPlan, as_call


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Turn:
    """One Responses request on its way: what its reply is built from and stored with."""

    rid: str
    created: int
    model: str
    req: ResponsesRequest
    tools: ToolPlan
    conversation: list[dict[str, Any]]  # chat messages up to the reply, instructions left out
    tenant: str | None = None
    message_id: str = field(default_factory=lambda: item_id("msg"))

    def response(
        self, status: Status, output: list[OutputItem], final: RequestOutput | None = None
    ) -> ResponseObject:
        req = self.req
        return ResponseObject(
            id=self.rid,
            created_at=self.created,
            status=status,
            incomplete_details=IncompleteDetails() if status == "incomplete" else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=self.model,
            output=output,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            previous_response_id=req.previous_response_id,
            store=req.store,
            temperature=req.temperature,
            top_p=req.top_p,
            text=req.text if req.text and req.text.get("format") else {"format": {"type": "text"}},
            tool_choice=req.tool_choice or ("auto" if req.tools else "none"),
            tools=req.tools or [],
            metadata=req.metadata or {},
            usage=None if final is None else response_usage(final),
        )

    def message(self, text: str, status: Status) -> OutputMessage:
        return OutputMessage(id=self.message_id, status=status, content=[OutputText(text=text)])

    def finished(self, text: str, final: RequestOutput) -> ResponseObject:
        """The response to a reply generated whole (`text`, ending with `final`)."""
        call = as_call(text, self.tools)
        if call is not None:
            return self.response("completed", [call_item(call)], final)
        status = status_of(final)
        return self.response(status, [self.message(text, status)], final)


def status_of(final: RequestOutput) -> Status:
    return "incomplete" if final.finish_reason == FinishReason.LENGTH else "completed"


def call_item(call: dict[str, Any], status: Status = "completed") -> FunctionCall:
    """A chat tool call (server/tools.py's `as_call`) as a Responses function_call item."""
    fn = call["function"]
    return FunctionCall(
        id=item_id("fc"),
        call_id=call["id"],
        name=fn["name"],
        arguments=fn["arguments"],
        status=status,
    )


def response_usage(final: RequestOutput) -> ResponseUsage:
    chat = usage([final])
    details = chat.completion_tokens_details
    return ResponseUsage(
        input_tokens=chat.prompt_tokens,
        input_tokens_details=InputTokensDetails(),
        output_tokens=chat.completion_tokens,
        output_tokens_details=OutputTokensDetails(
            accepted_prediction_tokens=details.accepted_prediction_tokens,
            rejected_prediction_tokens=details.rejected_prediction_tokens,
        ),
        total_tokens=chat.total_tokens,
    )


def reply_messages(output: list[OutputItem]) -> list[dict[str, Any]]:
    """The output items as the chat messages a later turn shows the model."""
    out: list[dict[str, Any]] = []
    for item in output:
        if isinstance(item, OutputMessage):
            out.append({"role": "assistant", "content": "".join(c.text for c in item.content)})
        else:
            fn = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": fn}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return out


def remember(store: ResponseStore, turn: Turn, response: ResponseObject) -> None:
    """Keep `response` for a later turn, if the request asked for it (`store`, the default)."""
    if turn.req.store:
        messages = [*turn.conversation, *reply_messages(response.output)]
        store.put(turn.tenant, Stored(response, messages))
