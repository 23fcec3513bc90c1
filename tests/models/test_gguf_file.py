"""A GGUF is untrusted input (#52 item 5): truncated, corrupted and hostile headers are refused
with a GGUFError naming what is wrong, never a crash, a huge allocation or a read outside the
mapping; a small fuzz run over a real file's bytes."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from specserve.models.gguf_file import GGUFError, GGUFFile
from tests.gguf_files import T, write_gguf
from tests.tiny import make_model_dir


def _str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def build(
    tensors: list[tuple[str, tuple[int, ...], int, int]],
    data: bytes = b"",
    kv: bytes | None = None,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    version: int = 3,
) -> bytes:
    """A GGUF by hand: (name, dims, type, offset) per tensor, then `data` aligned to 32."""
    kv = _str("general.architecture") + struct.pack("<I", 8) + _str("llama") if kv is None else kv
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 1 if n_kv is None else n_kv)  # fmt: skip
    infos = b"".join(
        _str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", qtype, offset)
        for name, dims, qtype, offset in tensors
    )  # fmt: skip
    body = head + kv + infos
    return body + b"\0" * (-len(body) % 32) + data


F32 = int(T.F32)
GOOD = [("a.weight", (8, 2), F32, 0), ("b.weight", (8,), F32, 64)]


def load(tmp_path: Path, raw: bytes) -> GGUFFile:
    path = tmp_path / "x.gguf"
    path.write_bytes(raw)
    return GGUFFile(path)


def test_a_hand_built_file_reads(tmp_path: Path) -> None:
    g = load(tmp_path, build(GOOD, bytes(96)))
    assert g.architecture == "llama" and list(g.tensors) == ["a.weight", "b.weight"]
    assert g.array("a.weight").shape == (2, 32) and g.array("b.weight").shape == (1, 32)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (build(GOOD, bytes(95)), "'b.weight': 32 bytes at offset .* run past the end"),
        (build([("a.weight", (8, 2), F32, 1 << 62)], bytes(64)), "'a.weight'.*past the end"),
        (build([("a", (8, 2), F32, 0), ("b", (8,), F32, 32)], bytes(96)), "overlap"),
        (build([("a.weight", (8,), F32, 4)], bytes(64)), "not aligned"),
        (build([("a.weight", (40,), int(T.Q4_0), 0)], bytes(64)), "not whole Q4_0 blocks"),
        (build([("a.weight", (8,), 99, 0)], bytes(64)), "unknown tensor type 99"),
        (build([("a.weight", (8, 0), F32, 0)], bytes(64)), "dimensions .* out of range"),
        (build([("a.weight", (2,) * 5, F32, 0)], bytes(64)), "5 dimensions"),
        (build([("a", (8,), F32, 0), ("a", (8,), F32, 32)], bytes(64)), "appears twice"),
        (build(GOOD, bytes(96), n_tensors=1 << 60), "cannot fit"),
        (build(GOOD, bytes(96), n_kv=1 << 60), "cannot fit"),
        (build(GOOD, bytes(96), version=7), "version 7"),
        (build(GOOD, kv=_str("k") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 62)), "k: needs"),
        (build(GOOD, kv=_str("k") + struct.pack("<IIQ", 9, 4, 1 << 61)), "k: needs"),
        (build(GOOD, kv=_str("k") + struct.pack("<IIQ", 9, 8, 1 << 40)), "cannot fit"),
        (build(GOOD, kv=_str("k") + struct.pack("<IIQIQIQ", 9, 9, 1, 9, 1, 4, 1)), "nested deeper"),
        (build(GOOD, kv=_str("k") + struct.pack("<I", 77)), "unknown value type 77"),
        (build(GOOD, kv=_str(b"\xff\xfe") + struct.pack("<I", 4) + bytes(4)), "not UTF-8"),
        (build(GOOD, kv=_str("general.alignment") + struct.pack("<II", 4, 3)), "power of two"),
        (b"GGML" + bytes(60), "expected b'GGUF'"),
        (b"", "cannot map"),
    ],
)
def test_a_bad_header_is_refused_by_name(tmp_path: Path, raw: bytes, message: str) -> None:
    with pytest.raises(GGUFError, match=message):
        load(tmp_path, raw)


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    raw = build(GOOD, bytes(96))
    for cut in range(len(raw)):
        with pytest.raises(GGUFError):
            load(tmp_path, raw[:cut])


def test_fuzzed_files_parse_or_are_refused(tmp_path: Path) -> None:
    """Random byte changes over a real (tiny) GGUF: each either reads, with every tensor inside
    the file, or is a GGUFError; nothing else escapes."""
    model = make_model_dir(tmp_path / "hf", "llama", hidden=64, layers=1, seed=2)
    original = write_gguf(model, tmp_path / "tiny.gguf", lambda _: T.Q8_0).read_bytes()
    header = original.find(b"blk.0.attn_q.weight") + 4096  # the metadata and tensor infos
    rng = random.Random(0)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        raw = bytearray(original)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(min(header, len(raw)))
            raw[at] = rng.randrange(256)
        try:
            g = load(tmp_path, bytes(raw))
        except GGUFError:
            outcomes["refused"] += 1
            continue
        outcomes["read"] += 1
        for info in g.tensors.values():
            assert info.offset + info.nbytes <= len(raw)
            assert g.array(info.name).nbytes == info.nbytes
    assert outcomes["read"] > 0 and outcomes["refused"] > 0, outcomes
