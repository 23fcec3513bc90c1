"""A validated request body -> `Prepared` (prompt ids, `SamplingParams` with its grammar and
the tenant's cache salt, the tool plan), in one pass: `prepare(body, Preparation(...))`.

The request models have checked every range and type already (server/schemas.py,
openai_schemas.py); what is left needs the server: its limits (server/param_checks.py), its
tokenizer and chat template (server/chat_template.py, which plans the tools), the tenant of the
request's API key. Every rejection is an `ApiError` whose message names the field and the
limit; all of them come before the request reaches the engine, so a stream never starts for a
request the engine would refuse. Each API's builder makes its `SamplingParams` once, with
every field, the grammar and the tenant's salt in it: nothing copies a `Prepared` afterwards.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from specserve.request import GrammarSpec, SamplingParams
from specserve.server.caps import check_prompt_chars, check_reply_work
from specserve.server.chat_template import ChatTemplate, chat_prompt
from specserve.server.errors import invalid
from specserve.server.grammars import response_format, tgi_grammar
from specserve.server.openai_schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from specserve.server.param_checks import (
    check_choices,
    check_logit_bias,
    check_model,
    check_prompt,
    check_speculate,
    check_stop,
    resolve_max_new,
)
from specserve.server.reasoning import Reasoning
from specserve.server.schemas import GenerateRequest, ignored_fields
from specserve.server.settings import Limits
from specserve.server.tools import NO_TOOLS, ToolPlan

logger = logging.getLogger(__name__)
TGI_DEFAULT_MAX_NEW_TOKENS = 100
Encode = Callable[[str], list[int]]
EncodeChat = ChatTemplate | Callable[[Any], list[int]]
NAMED_IGNORED = 8  # unknown fields named in one log line (a body may carry thousands)


@dataclass(frozen=True)
class Prepared:
    prompt_ids: list[int]
    params: SamplingParams  # its grammar and cache salt (the tenant's) included
    tools: ToolPlan = NO_TOOLS  # chat: what its tools ask of the reply
    reasoning: Reasoning | None = None  # chat: the model thinks (server/reasoning.py)

    @property
    def seed(self) -> int | None:
        return None if self.params.greedy else self.params.seed


@dataclass(frozen=True)
class Preparation:
    """What preparing a request takes besides its body."""

    limits: Limits
    encode: Encode  # a text prompt -> ids (no special tokens added)
    chat: EncodeChat | None = None  # chat requests: the chat template
    tenant: str | None = None  # the API key's tenant (None: one key or none)
    stream: bool = False  # TGI: the reply streams (an OpenAI body says so itself)


Body = GenerateRequest | CompletionRequest | ChatCompletionRequest


def prepare(body: Body, how: Preparation) -> Prepared:
    """`body` (validated by its model) -> Prepared, checked against the server's limits."""
    if isinstance(body, GenerateRequest):
        return prepare_tgi(body, how.encode, how.limits, how.stream, how.tenant)
    if isinstance(body, CompletionRequest):
        return prepare_completion(body, how.encode, how.limits, how.tenant)
    if how.chat is None:
        raise TypeError("a chat request is prepared with the chat template")
    return prepare_chat(body, how.chat, how.limits, how.tenant)


def salted(tenant: str | None, own: str | None) -> str | None:
    """The cache salt of a tenant's request: the tenant (with several API keys, each key is
    one), with the request's own `cache_salt` under it, so that it reuses cached prompt blocks
    and suffix drafts of its own tenant's requests only."""
    if tenant is None:
        return own
    return tenant if own is None else f"{tenant}/{own}"


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
    req: GenerateRequest,
    encode: Encode,
    limits: Limits,
    stream: bool = False,
    tenant: str | None = None,
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
    stop = check_stop(p.stop, limits, "parameters.stop")
    speculate = check_speculate(p.speculate, limits, "parameters.speculate")
    grammar = grammar_for(tgi_grammar(p.grammar), p.ignore_eos, "parameters.grammar")
    params = SamplingParams(
        max_new_tokens=max_new,
        temperature=(p.temperature or 1.0) if sampling else 0.0,
        top_k=p.top_k or 0,
        top_p=p.top_p or 1.0,
        repetition_penalty=p.repetition_penalty or 1.0,
        frequency_penalty=p.frequency_penalty or 0.0,
        seed=(fresh_seed() if p.seed is None else p.seed) if sampling else None,
        stop=stop,
        ignore_eos=p.ignore_eos,
        speculate=speculate,
        speculation_policy=p.speculation_policy,
        # TGI reports every token's logprob (and the top_n_tokens alternatives)
        logprobs=p.top_n_tokens or 0,
        prompt_logprobs=p.decoder_input_details,
        grammar=grammar,
        cache_salt=salted(tenant, p.cache_salt),
    )
    return Prepared(ids, params)


# ---------------------------------------------------------------------------------- OpenAI
def prepare_completion(
    req: CompletionRequest, encode: Encode, limits: Limits, tenant: str | None = None
) -> Prepared:
    check_model(req.model, limits)
    check_choices(req.n, limits)
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # the model allows one
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), limits, "prompt")
    ids = encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    check_prompt(ids, limits, "prompt")
    max_new = resolve_max_new(req.max_tokens, None, len(ids), limits, "max_tokens")
    if req.logprobs is not None and not req.stream:
        check_reply_work(req.n, max_new, req.logprobs, "logprobs")
    params = openai_params(req, max_new, limits, req.logprobs, None, "", tenant)
    return Prepared(ids, params)


def prepare_chat(
    req: ChatCompletionRequest,
    encode_chat: EncodeChat,
    limits: Limits,
    tenant: str | None = None,
) -> Prepared:
    check_model(req.model, limits)
    check_choices(req.n, limits)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    asked_format = response_format(req.response_format)
    # with tools, a reply that is not calls follows the format (OpenAI's semantics)
    reply = json.loads(asked_format.source) if asked_format is not None and req.tools else None
    prompt = chat_prompt(req, encode_chat, limits, reply)  # tools, reasoning: chat_template.py
    ids, tools = prompt.ids, prompt.tools
    check_prompt(ids, limits, "messages")
    field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    asked = req.max_completion_tokens or req.max_tokens  # equal if both: the model checks
    max_new = resolve_max_new(asked, None, len(ids), limits, field)
    if logprobs is not None and not req.stream:
        check_reply_work(req.n, max_new, logprobs, "top_logprobs")
    grammar, field = (tools.grammar, "tools") if tools.calls else (asked_format, "response_format")
    params = openai_params(req, max_new, limits, logprobs, grammar, field, tenant)
    return Prepared(ids, params, tools, prompt.reasoning)


def openai_params(
    req: SamplingFields,
    max_new: int,
    limits: Limits,
    logprobs: int | None,
    grammar: GrammarSpec | None,
    grammar_field: str,
    tenant: str | None,
) -> SamplingParams:
    """An OpenAI request's SamplingParams, every field at once."""
    temperature = 1.0 if req.temperature is None else req.temperature
    logit_bias = check_logit_bias(req.logit_bias, limits)
    stop = check_stop(req.stop, limits, "stop")
    speculate = check_speculate(req.speculate, limits, "speculate")
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=temperature,
        top_k=max(req.top_k or 0, 0),
        top_p=req.top_p or 1.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=logit_bias,
        min_p=req.min_p or 0.0,
        seed=None if temperature == 0 else (fresh_seed() if req.seed is None else req.seed),
        stop=stop,
        ignore_eos=req.ignore_eos,
        speculate=speculate,
        speculation_policy=req.speculation_policy,
        logprobs=logprobs,
        grammar=grammar_for(grammar, req.ignore_eos, grammar_field),
        cache_salt=salted(tenant, req.cache_salt),
    )


def grammar_for(grammar: GrammarSpec | None, ignore_eos: bool, field: str) -> GrammarSpec | None:
    """`grammar`, which ends the output where it ends: not with `ignore_eos`."""
    if grammar is not None and ignore_eos:
        raise invalid(field, "cannot be combined with ignore_eos: the output ends where it does")
    return grammar
