"""A GGUF file read in place: its header parsed strictly, its tensors as views of one mapping.

A GGUF is untrusted input: every count, length, offset and size comes from the file. Each is
checked against the bytes that are actually there before it is used, so a truncated, corrupted
or hostile file is refused with a `GGUFError` naming what is wrong (and the tensor, where one
is), never a crash, a huge allocation or a read outside the mapping. The checks:
- magic, version 2 or 3; the tensor and key counts no larger than the bytes left could hold;
- every string and array length within the bytes left; arrays nest at most `MAX_ARRAY_DEPTH`;
- per tensor: a known type, 1..4 dimensions, each >= 1, the row a whole number of blocks, the
  data aligned to `general.alignment`, inside the file, and overlapping no other tensor.

Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv (string key, u32
type, value); n_tensors (string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset); then,
aligned, the data section, offsets relative to its start. A string is u64 length + UTF-8 bytes.
"""

from __future__ import annotations

import itertools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
MAX_ARRAY_DEPTH = 2
MAX_DIMS = 4
MAX_NAME_BYTES = 1 << 16
DEFAULT_ALIGNMENT = 32

# value type -> struct format of a scalar (8: string, 9: array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF we can read safely; the message says where and why."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length (ne0)
    type: GGMLQuantizationType
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def row_length(self) -> int:
        return self.dims[0]

    @property
    def rows(self) -> int:
        return int(np.prod(self.dims[1:], dtype=np.int64)) if len(self.dims) > 1 else 1


class _Cursor:
    """Reads from `buf` at `pos`, refusing to step past its end."""

    def __init__(self, buf: mmap.mmap | bytes, pos: int = 0) -> None:
        self.buf, self.pos, self.end = buf, pos, len(buf)

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.end - self.pos:
            raise GGUFError(f"{what}: needs {n} bytes at {self.pos}; the file ends at {self.end}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(out)

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return int(self.scalar("<I", what))

    def u64(self, what: str) -> int:
        return int(self.scalar("<Q", what))

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"{what} length")
        if limit is not None and n > limit:
            raise GGUFError(f"{what}: length {n} exceeds {limit}")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{what}: not UTF-8 ({exc})") from None

    def left(self) -> int:
        return self.end - self.pos


def _value(cur: _Cursor, vtype: int, what: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype], what)
    if vtype == _STRING:
        return cur.string(what)
    if vtype != _ARRAY:
        raise GGUFError(f"{what}: unknown value type {vtype}")
    if depth >= MAX_ARRAY_DEPTH:
        raise GGUFError(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
    etype, count = cur.u32(f"{what} element type"), cur.u64(f"{what} count")
    if etype in _SCALARS and etype != 7:
        dtype = np.dtype(_SCALARS[etype])
        raw = cur.take(count * dtype.itemsize, what)
        return np.frombuffer(raw, dtype=dtype).tolist()
    if count > cur.left() // (8 if etype in (_STRING, _ARRAY) else 1):  # each needs bytes
        raise GGUFError(f"{what}: {count} elements cannot fit in the {cur.left()} bytes left")
    return [_value(cur, etype, f"{what}[{i}]", depth + 1) for i in range(count)]


def _tensor_info(cur: _Cursor, index: int) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string(f"tensor {index} name", MAX_NAME_BYTES)
    n_dims = cur.u32(f"tensor {name!r} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFError(f"tensor {name!r}: {n_dims} dimensions (1..{MAX_DIMS} supported)")
    dims = tuple(cur.u64(f"tensor {name!r} dimension") for _ in range(n_dims))
    return name, dims, cur.u32(f"tensor {name!r} type"), cur.u64(f"tensor {name!r} offset")


def _check_tensor(
    name: str, dims: tuple[int, ...], type_id: int, offset: int, data_start: int, size: int,
    alignment: int,
) -> TensorInfo:  # fmt: skip
    try:
        qtype = GGMLQuantizationType(type_id)
        block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise GGUFError(f"tensor {name!r}: unknown tensor type {type_id}") from None
    if any(d < 1 or d > size * 8 for d in dims):  # a weight is at least a bit
        raise GGUFError(f"tensor {name!r}: dimensions {list(dims)} out of range")
    if dims[0] % block:
        raise GGUFError(
            f"tensor {name!r}: rows of {dims[0]} values are not whole {qtype.name} blocks "
            f"of {block}"
        )
    count = 1
    for d in dims:
        count *= d
    nbytes = count // block * type_size
    if offset % alignment:
        raise GGUFError(f"tensor {name!r}: offset {offset} is not aligned to {alignment}")
    start = data_start + offset
    if nbytes > size or start > size - nbytes:
        raise GGUFError(
            f"tensor {name!r}: {nbytes} bytes at offset {start} run past the end of the file "
            f"({size} bytes)"
        )
    return TensorInfo(name, dims, qtype, start, nbytes)


class GGUFFile:
    """A GGUF's metadata (`fields`) and tensors (`tensors`, by name, in file order), its data
    mapped read-only; `array(name)` is a tensor's bytes [rows, row_bytes] without a copy."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open("rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # ValueError: an empty file
            raise GGUFError(f"cannot map {path}: {exc}") from None
        try:
            self.fields, self.tensors = self._parse()
        except GGUFError as exc:
            self._map.close()
            raise GGUFError(f"{path}: {exc}") from None

    def _parse(self) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
        cur, size = _Cursor(self._map), len(self._map)
        magic = cur.take(4, "magic")
        if magic != MAGIC:
            raise GGUFError(f"starts with {magic!r}, expected {MAGIC!r}")
        version = cur.u32("version")
        if version not in (2, 3):
            raise GGUFError(f"GGUF version {version} (2 and 3 are supported)")
        n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
        if n_tensors > cur.left() // 24 or n_kv > cur.left() // 12:  # their smallest entries
            raise GGUFError(f"{n_tensors} tensors and {n_kv} keys cannot fit in {size} bytes")
        fields: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}", MAX_NAME_BYTES)
            fields[key] = _value(cur, cur.u32(f"{key} type"), key)
        raw = [_tensor_info(cur, i) for i in range(n_tensors)]
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise GGUFError(f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-cur.pos // alignment) * alignment
        tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset in raw:
            if name in tensors:
                raise GGUFError(f"tensor {name!r} appears twice")
            tensors[name] = _check_tensor(name, dims, type_id, offset, data_start, size, alignment)
        _check_no_overlap(list(tensors.values()))
        return fields, tensors

    def array(self, name: str) -> np.ndarray:  # uint8 [rows, row_bytes], read-only
        info = self.tensors[name]
        data = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        return data.reshape(info.rows, info.nbytes // info.rows)

    def string(self, key: str, default: str = "") -> str:
        value = self.fields.get(key, default)
        return value if isinstance(value, str) else default

    @property
    def architecture(self) -> str:
        return self.string("general.architecture")


def _check_no_overlap(tensors: list[TensorInfo]) -> None:
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        if a.offset + a.nbytes > b.offset:
            raise GGUFError(f"tensors {a.name!r} and {b.name!r} overlap")
