"""Mistral: the Llama decoder with sliding-window attention (window from config.json)."""

from __future__ import annotations

from specserve.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    default_attention_bias = False
