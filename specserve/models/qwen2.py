"""Qwen2 / Qwen2.5: the Llama decoder with biases on the q/k/v projections."""

from __future__ import annotations

from specserve.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    default_attention_bias = True
