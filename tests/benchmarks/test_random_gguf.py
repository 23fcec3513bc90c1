"""benchmarks/random_gguf.py's tokenizer and the gemma3-270m shape, without llama.cpp."""

from __future__ import annotations

import math

from benchmarks.random_gguf import sentencepiece_model
from benchmarks.random_model import SHAPES, tensor_shapes


def test_gemma3_270m_shape_is_gemma_3_270m() -> None:
    config = SHAPES["gemma3-270m"]
    shapes = tensor_shapes(config)
    assert sum(math.prod(s) for s in shapes.values()) == 268_098_176  # tied: stored once
    assert shapes["model.embed_tokens.weight"] == (262144, 640)
    full = [i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention"]
    assert full == [5, 11, 17]


def test_sentencepiece_model_has_gemma_specials_and_the_whole_vocabulary() -> None:
    import sentencepiece

    # a byte-level BPE vocabulary: 'Ġ' spells a space, '<|x|>' is a special to leave out
    bpe = {"<|x|>": 0, "h": 1, "i": 2, "Ġ": 3, "hi": 4, "Ġhi": 5, "Ã": 6}
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(sentencepiece_model(1000, bpe, skip={"<|x|>"}))
    assert sp.vocab_size() == 1000
    specials = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>"}
    specials |= {105: "<start_of_turn>", 106: "<end_of_turn>", 107: "<0x00>"}
    assert {i: sp.IdToPiece(i) for i in specials} == specials
    assert (sp.bos_id(), sp.eos_id(), sp.pad_id(), sp.unk_id()) == (2, 1, 0, 3)
    assert [sp.IdToPiece(i) for i in range(363, 367)] == ["h", "i", "\u2581", "hi"]
    assert sp.encode("hi hi") == [366, 367]  # 'hi', '▁hi'
    assert sp.decode(sp.encode("hé hi")) == "hé hi"  # 'é' by byte fallback
