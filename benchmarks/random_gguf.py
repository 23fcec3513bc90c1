"""A random-weight model as a published GGUF is made: llama.cpp's own converter and quantiser.

Where a real file cannot be downloaded, this makes the closest stand-in: `random_model`'s
checkpoint of a shape (gemma3-270m: gemma-3-270m's config), a SentencePiece `tokenizer.model`
of the shape's whole vocabulary (as Gemma's is), `convert_hf_to_gguf.py` to bf16 and
`llama-quantize` to the type asked (Q4_K_M). Both servers then read the same file as they
would the published one; only the weights (and so the text) are random.

The tokenizer: Gemma 3's special tokens at Gemma's ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3,
<mask> 4, <start_of_turn> 105, <end_of_turn> 106; tokenizer.json lists them, as Gemma's does,
for the converter to find their ids) and its chat template, the 256 byte pieces, then the
embedded SmolLM2's BPE vocabulary respelled as SentencePiece pieces in its merge order (score
-rank, so llama.cpp's scores and transformers' file order agree), then filler pieces of two
private-use characters that no text merges into, up to the vocabulary's size.

    LLAMA_SERVER=$(bash scripts/build_llama_server.sh) \
        python -m benchmarks.random_gguf --shape gemma3-270m --out bench-out/gemma3-270m
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.random_model import SHAPES, write_random_model

# Gemma 3's chat template (tokenizer_config.json of the gemma-3 checkpoints), text parts only
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
_SPECIAL = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>"}
_SPECIAL |= {105: "<start_of_turn>", 106: "<end_of_turn>"}
_FIRST_BYTE = 107  # the 256 byte pieces follow the specials and unused ids
_PRIVATE = 0xF0000  # Supplementary Private Use Area-A: no text merges into its fillers


def sentencepiece_model(vocab_size: int, bpe_vocab: dict[str, int], skip: set[str]) -> bytes:
    """A serialised SentencePiece BPE ModelProto of exactly `vocab_size` pieces (above);
    `bpe_vocab`'s tokens in `skip` (its specials) are left out."""
    from sentencepiece import sentencepiece_model_pb2
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    pb: Any = sentencepiece_model_pb2  # generated protobuf classes, which mypy cannot see

    kind = pb.ModelProto.SentencePiece.Type
    proto = pb.ModelProto()
    spec = proto.trainer_spec
    spec.model_type, spec.vocab_size, spec.byte_fallback = 2, vocab_size, True  # 2: BPE
    spec.pad_id, spec.eos_id, spec.bos_id, spec.unk_id = 0, 1, 2, 3
    spec.pad_piece, spec.eos_piece, spec.bos_piece = "<pad>", "<eos>", "<bos>"
    norm = proto.normalizer_spec
    norm.name, norm.add_dummy_prefix, norm.remove_extra_whitespaces = "identity", False, False
    norm.escape_whitespaces = True
    pieces: list[tuple[str, float, int]] = []
    for i in range(_FIRST_BYTE):
        text = _SPECIAL.get(i, f"<unused{i}>")
        pieces.append((text, 0.0, kind.UNKNOWN if i == 3 else kind.CONTROL))
    pieces += [(f"<0x{b:02X}>", 0.0, kind.BYTE) for b in range(256)]
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    seen = {p[0] for p in pieces} | {"\0"}  # SentencePiece takes a NUL piece as unused
    for spelled, _ in sorted(bpe_vocab.items(), key=lambda kv: kv[1]):
        if spelled in skip:
            continue
        try:
            text = bytes(byte_of[c] for c in spelled).decode("utf-8").replace(" ", "\u2581")
        except (KeyError, UnicodeDecodeError):
            continue  # a special token, or part of a character: byte fallback covers it
        if text not in seen:
            seen.add(text)
            pieces.append((text, -float(len(pieces)), kind.NORMAL))
    for n in range(vocab_size - len(pieces)):
        text = chr(_PRIVATE + n // 65534) + chr(_PRIVATE + n % 65534)
        pieces.append((text, -float(len(pieces)), kind.NORMAL))
    for text, score, type_ in pieces[:vocab_size]:
        proto.pieces.add(piece=text, score=score, type=type_)
    return bytes(proto.SerializeToString())


def write_tokenizer(model_dir: Path, vocab_size: int) -> None:
    """tokenizer.model, tokenizer_config.json (specials, chat template) and the special tokens'
    tokenizer.json into `model_dir`."""
    from specserve.models.loader import resolve_model_dir

    smollm = json.loads((resolve_model_dir(None) / "tokenizer.json").read_text())
    specials = {t["content"] for t in smollm["added_tokens"]}
    (model_dir / "tokenizer.model").write_bytes(
        sentencepiece_model(vocab_size, smollm["model"]["vocab"], specials)
    )
    config: dict[str, Any] = {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "chat_template": GEMMA_TEMPLATE,
    }  # fmt: skip
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    added = [{"id": i, "content": t, "special": True} for i, t in sorted(_SPECIAL.items())]
    (model_dir / "tokenizer.json").write_text(json.dumps({"added_tokens": added}))


def llama_cpp_dir(llama_server: str) -> Path:
    """The llama.cpp source tree a scripts/build_llama_server.sh binary was built from."""
    return Path(llama_server).resolve().parents[2]


def convert(model_dir: Path, out: Path, llama_server: str, qtype: str) -> Path:
    """`model_dir` through convert_hf_to_gguf.py (bf16) and llama-quantize to `qtype`."""
    src = llama_cpp_dir(llama_server)
    bf16 = out / f"{model_dir.name}-bf16.gguf"
    env = os.environ | {"PYTHONPATH": str(src / "gguf-py")}  # the converter's own gguf
    script = str(src / "convert_hf_to_gguf.py")
    cmd = [sys.executable, script, str(model_dir), "--outtype", "bf16", "--outfile", str(bf16)]
    subprocess.run(cmd, check=True, env=env)
    final = out / f"{model_dir.name}-{qtype}.gguf"
    quantize = str(Path(llama_server).parent / "llama-quantize")
    subprocess.run([quantize, str(bf16), str(final), qtype], check=True)
    return final


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.random_gguf")
    p.add_argument("--shape", choices=sorted(SHAPES), default="gemma3-270m")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--type", default="Q4_K_M", help="llama-quantize's type")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"), required=False)
    args = p.parse_args(argv)
    if not args.llama_server:
        p.error("--llama-server or $LLAMA_SERVER (scripts/build_llama_server.sh) is needed")
    import torch

    config = SHAPES[args.shape]
    model_dir = write_random_model(config, args.out / args.shape, args.seed, torch.bfloat16)
    write_tokenizer(model_dir, int(config["vocab_size"]))
    print(convert(model_dir, args.out, args.llama_server, args.type))
    return 0


if __name__ == "__main__":
    sys.exit(main())
