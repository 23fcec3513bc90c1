"""The GGUF block kinds the kernels read (`ggml.py` re-exports them): the C enum's values and
each kind's block size in bytes and values."""

from __future__ import annotations

from enum import IntEnum

QK = 32  # weights per block (and per sub-block of a K-quant, and per Q8A activation block)
QK_K = 256  # weights per K-quant super-block


class BlockKind(IntEnum):
    """GGUF quantisation types the kernels read; the value is the C enum's (`block_kinds.h`,
    layouts in `subblocks.h`). The *_X8 kinds are the same blocks with rows interleaved eight
    at a time (`x8_layout.h`, `ggml.repack_x8`), which the q8 numerics multiplies with fewer
    instructions per extra activation row: Q4_1 and Q8_0 (`x8.c`, their own block sums) and
    the K-quants and Q5_1 (`x8_kquants.c`, bit for bit the plain rows' product); Q4_0 and
    Q5_0 have no interleaved form (the loader transcodes them to Q4_1 and Q8_0)."""

    Q4_1 = 0
    Q8_0 = 1
    Q4_1_X8 = 2
    Q8_0_X8 = 3
    Q4_0 = 4
    Q5_0 = 5
    Q5_1 = 6
    Q4_K = 7
    Q5_K = 8
    Q6_K = 9
    Q4_K_X8 = 10
    Q6_K_X8 = 11
    Q5_K_X8 = 12
    Q5_1_X8 = 13

    @property
    def plain(self) -> BlockKind:
        """The GGUF type the blocks hold, whatever their layout."""
        return _PLAIN.get(self, self)

    @property
    def interleaved(self) -> bool:
        return self in _PLAIN

    @property
    def has_x8(self) -> bool:
        """Whether the kind is interleaved or has an interleaved form (`x8`)."""
        return self in _X8 or self.interleaved

    @property
    def x8(self) -> BlockKind:
        """The interleaved form of this kind; ValueError for a kind without one (`has_x8`)."""
        if self.interleaved:
            return self
        if self not in _X8:
            raise ValueError(f"{self.name} blocks have no interleaved form")
        return _X8[self]

    @property
    def block_values(self) -> int:
        """Weights per block: 32, or 256 for the K-quants' super-blocks."""
        return QK_K if self.plain in _K_QUANTS else QK

    @property
    def block_bytes(self) -> int:
        return _BLOCK_BYTES[self.plain]

    def row_bytes(self, in_features: int) -> int:
        return in_features // self.block_values * self.block_bytes


_X8 = {
    BlockKind.Q4_1: BlockKind.Q4_1_X8, BlockKind.Q8_0: BlockKind.Q8_0_X8,
    BlockKind.Q4_K: BlockKind.Q4_K_X8, BlockKind.Q5_K: BlockKind.Q5_K_X8,
    BlockKind.Q6_K: BlockKind.Q6_K_X8, BlockKind.Q5_1: BlockKind.Q5_1_X8,
}  # fmt: skip
_PLAIN = {x8: plain for plain, x8 in _X8.items()}
_K_QUANTS = (BlockKind.Q4_K, BlockKind.Q5_K, BlockKind.Q6_K)
_BLOCK_BYTES = {
    BlockKind.Q4_1: 20, BlockKind.Q8_0: 34, BlockKind.Q4_0: 18, BlockKind.Q5_0: 22,
    BlockKind.Q5_1: 24, BlockKind.Q4_K: 144, BlockKind.Q5_K: 176, BlockKind.Q6_K: 210,
}  # fmt: skip
# The layouts a GGUF file stores that the kernels read.
GGUF_KINDS = (
    BlockKind.Q4_0, BlockKind.Q4_1, BlockKind.Q5_0, BlockKind.Q5_1, BlockKind.Q8_0,
    BlockKind.Q4_K, BlockKind.Q5_K, BlockKind.Q6_K,
)  # fmt: skip
