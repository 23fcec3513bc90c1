"""Chat templates for the tiny test models: one that takes tools in Hermes/Qwen syntax, one that
thinks (its generation prompt opens `<think>` unless `enable_thinking` is false, as DeepSeek-R1's
and Qwen3's do)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny import make_tiny_model

HERMES_TOOLS = (
    "{%- if tools %}<|im_start|>system\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "Call a function as <tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{%- endif %}\n"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant"
    "{%- for tc in m.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}'
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content.split('</think>')[-1] if m.content else '' }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{% endif %}{% endif %}"
)


def model_with_template(path: Path, template: str) -> Path:
    """The tiny test model, its tokenizer speaking `template`."""
    make_tiny_model(path)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    return path
