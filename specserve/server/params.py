"""Request bodies -> (prompt token ids, SamplingParams), checked against the server's limits.

Every rejection is an `ApiError` whose message names the field and the limit (the per-field
checks are in server/param_checks.py). These checks run before the request reaches the engine,
so a stream never starts for a request the engine would refuse.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from specserve.request import GrammarSpec, SamplingParams
from specserve.server.caps import check_prompt_chars, check_reply_work
from specserve.server.chat_template import ChatTemplate, chat_prompt
from specserve.server.errors import invalid
from specserve.server.grammars import response_format, tgi_grammar
from specserve.server.openai_schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from specserve.server.param_checks import (
    check_choices,
    check_logit_bias,
    check_model,
    check_prompt,
    check_speculate,
    check_stop,
    check_top_logprobs,
    resolve_max_new,
)
from specserve.server.reasoning import Reasoning
from specserve.server.schemas import GenerateRequest, ignored_fields
from specserve.server.settings import Limits
from specserve.server.tools import NO_TOOLS, ToolPlan, calls_text

logger = logging.getLogger(__name__)
TGI_DEFAULT_MAX_NEW_TOKENS = 100
Encode = Callable[[str], list[int]]
NAMED_IGNORED = 8  # unknown fields named in one log line (a body may carry thousands)


@dataclass(frozen=True)
class Prepared:
    prompt_ids: list[int]
    params: SamplingParams
    tools: ToolPlan = NO_TOOLS  # chat: what its tools ask of the reply
    reasoning: Reasoning | None = None  # chat: the model thinks (server/reasoning.py)

    @property
    def seed(self) -> int | None:
        return None if self.params.greedy else self.params.seed


def for_tenant(prep: Prepared, tenant: str | None) -> Prepared:
    """`prep` in its tenant's namespace (with several API keys, each key is one): its cache
    salt is the tenant's, with the request's own `cache_salt` under it, so that it reuses
    cached prompt blocks and suffix drafts of its own tenant's requests only."""
    if tenant is None:
        return prep
    own = prep.params.cache_salt
    salt = tenant if own is None else f"{tenant}/{own}"
    return replace(prep, params=replace(prep.params, cache_salt=salt))


def tenant_of(request: Request) -> str | None:
    """The tenant the guard found for the request's key (None: one key or none)."""
    tenant: str | None = getattr(request.state, "tenant", None)
    return tenant


def warn_ignored(body: BaseModel, route: str, count: Callable[[str, int], None]) -> None:
    """Log and count (`count(route, n)`) the fields of `body` that no model defines: they are
    ignored, as vLLM and TGI ignore them, not refused."""
    names = list(ignored_fields(body))
    if not names:
        return
    shown = ", ".join(repr(n[:64]) for n in names[:NAMED_IGNORED])
    more = f" and {len(names) - NAMED_IGNORED} more" if len(names) > NAMED_IGNORED else ""
    logger.warning("%s: ignored fields this server does not define: %s%s", route, shown, more)
    count(route, len(names))


def fresh_seed() -> int:
    return random.getrandbits(63)


# ------------------------------------------------------------------------------------- TGI
def prepare_tgi(
    req: GenerateRequest, encode: Encode, limits: Limits, stream: bool = False
) -> Prepared:
    p = req.parameters
    if p.truncate is None:
        check_prompt_chars(len(req.inputs), limits, "inputs")
    ids = encode(req.inputs)
    if p.truncate is not None:
        if p.truncate > limits.max_input_tokens:
            raise invalid(
                "parameters.truncate", f"must be <= {limits.max_input_tokens} (--max-input-tokens)"
            )
        ids = ids[-p.truncate :]
    check_prompt(ids, limits, "inputs")
    max_new = resolve_max_new(
        p.max_new_tokens,
        TGI_DEFAULT_MAX_NEW_TOKENS,
        len(ids),
        limits,
        "parameters.max_new_tokens",
    )
    if p.details and not stream:
        check_reply_work(1, max_new, p.top_n_tokens or 0, "parameters.max_new_tokens")
    # As TGI: any warper (temperature != 1, top_k, top_p < 1) turns sampling on.
    warpers = p.temperature not in (None, 1.0) or p.top_k is not None or p.top_p not in (None, 1.0)
    sampling = p.do_sample or warpers
    params = SamplingParams(
        max_new_tokens=max_new,
        temperature=(p.temperature or 1.0) if sampling else 0.0,
        top_k=p.top_k or 0,
        top_p=p.top_p or 1.0,
        repetition_penalty=p.repetition_penalty or 1.0,
        frequency_penalty=p.frequency_penalty or 0.0,
        seed=(fresh_seed() if p.seed is None else p.seed) if sampling else None,
        stop=check_stop(p.stop, limits, "parameters.stop"),
        ignore_eos=p.ignore_eos,
        speculate=check_speculate(p.speculate, limits, "parameters.speculate"),
        speculation_policy=p.speculation_policy,
        # TGI reports every token's logprob (and the top_n_tokens alternatives)
        logprobs=check_top_logprobs(p.top_n_tokens or 0, "parameters.top_n_tokens"),
        prompt_logprobs=p.decoder_input_details,
        cache_salt=p.cache_salt,
    )
    return Prepared(ids, with_grammar(params, tgi_grammar(p.grammar), "parameters.grammar"))


# ---------------------------------------------------------------------------------- OpenAI
def prepare_completion(req: CompletionRequest, encode: Encode, limits: Limits) -> Prepared:
    check_model(req.model, limits)
    check_choices(req.n, limits)
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise invalid("prompt", f"only one prompt per request is supported; got {len(prompt)}")
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), limits, "prompt")
    ids = encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    check_prompt(ids, limits, "prompt")
    max_new = resolve_max_new(req.max_tokens, None, len(ids), limits, "max_tokens")
    logprobs = None if req.logprobs is None else check_top_logprobs(req.logprobs, "logprobs")
    if logprobs is not None and not req.stream:
        check_reply_work(req.n, max_new, logprobs, "logprobs")
    return Prepared(ids, openai_sampling(req, max_new, limits, logprobs))


def prepare_chat(
    req: ChatCompletionRequest,
    encode_chat: ChatTemplate | Callable[[Any], list[int]],
    limits: Limits,
) -> Prepared:
    check_model(req.model, limits)
    check_choices(req.n, limits)
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs", "needs logprobs: true")
    logprobs = check_top_logprobs(req.top_logprobs or 0, "top_logprobs") if req.logprobs else None
    grammar = response_format(req.response_format)
    if req.tools and req.tool_choice != "none" and grammar is not None:
        raise invalid("response_format", "cannot be combined with tools (a call is JSON already)")
    prompt = chat_prompt(req, encode_chat, limits)  # tools, reasoning: server/chat_template.py
    ids, tools = prompt.ids, prompt.tools
    check_prompt(ids, limits, "messages")
    both = req.max_tokens is not None and req.max_completion_tokens is not None
    if both and req.max_tokens != req.max_completion_tokens:
        raise invalid(
            "max_completion_tokens",
            f"conflicts with max_tokens ({req.max_completion_tokens} != {req.max_tokens}): "
            "send one of them",
        )
    asked = req.max_completion_tokens or req.max_tokens
    field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    max_new = resolve_max_new(asked, None, len(ids), limits, field)
    if logprobs is not None and not req.stream:
        check_reply_work(req.n, max_new, logprobs, "top_logprobs")
    params = openai_sampling(req, max_new, limits, logprobs)
    if tools.calls:
        grammar, field = tools.grammar, "tools"
    else:
        field = "response_format"
    return Prepared(ids, with_grammar(params, grammar, field), tools, prompt.reasoning)


def with_grammar(params: SamplingParams, grammar: GrammarSpec | None, field: str) -> SamplingParams:
    if grammar is None:
        return params
    if params.ignore_eos:
        raise invalid(field, "cannot be combined with ignore_eos: the output ends where it does")
    return replace(params, grammar=grammar)


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Chat messages as the chat template takes them (text parts joined, developer = system)."""
    out = []
    for i, m in enumerate(messages):
        content = (
            m.content
            if isinstance(m.content, str)
            else "\n".join(part.text for part in m.content or [])
        )
        if m.tool_calls:  # an earlier call, as the model wrote it
            content = calls_text(m.tool_calls, f"messages[{i}].tool_calls")
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    return out


def openai_sampling(
    req: SamplingFields, max_new: int, limits: Limits, logprobs: int | None = None
) -> SamplingParams:
    temperature = 1.0 if req.temperature is None else req.temperature
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=temperature,
        top_k=max(req.top_k or 0, 0),
        top_p=req.top_p or 1.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=check_logit_bias(req.logit_bias, limits),
        min_p=req.min_p or 0.0,
        seed=None if temperature == 0 else (fresh_seed() if req.seed is None else req.seed),
        stop=check_stop(stops, limits, "stop"),
        ignore_eos=req.ignore_eos,
        speculate=check_speculate(req.speculate, limits, "speculate"),
        speculation_policy=req.speculation_policy,
        logprobs=logprobs,
        cache_salt=req.cache_salt,
    )
