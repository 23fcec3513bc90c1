"""RoPE tables: a `RopeSpec`'s inverse frequencies and the cos/sin rows of the positions asked.

The tables grow by fixed chunks of positions, each computed once in float64 and rounded to
float32, so a position's row is the same bits whichever step first needed it (and the same
as transformers' to float rounding). They are plain tensors, not buffers: building a model on
the meta device and `to_empty` leave them intact.
"""

from __future__ import annotations

import math

import torch

from specserve.models.arch import RopeSpec

CHUNK = 1024  # positions per table chunk
CPU = torch.device("cpu")  # explicit: a model may be built under torch.device("meta")


def inverse_frequencies(spec: RopeSpec) -> torch.Tensor:  # [rotary_dim / 2] float64
    """theta^(-2i/d), then the scaling of `spec.kind` (see `RopeSpec`)."""
    d = spec.rotary_dim
    inv = 1.0 / spec.theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=CPU) / d)
    if spec.kind == "linear":
        return inv / spec.factor
    if spec.kind == "llama3":
        return _llama3(inv, spec)
    if spec.kind == "yarn":
        return _yarn(inv, spec)
    if spec.kind == "longrope":
        factors = spec.long_factor if spec.long_context else spec.short_factor
        return inv / torch.tensor(factors, dtype=torch.float64, device=CPU)
    return inv


def _llama3(inv: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    old = spec.original_max_position
    low_wavelen, high_wavelen = old / spec.low_freq_factor, old / spec.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / spec.factor, inv)
    # between the two wavelengths: a blend of inv / factor and inv, by old / wavelen
    smooth = (old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)
    blended = (1 - smooth) * scaled / spec.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def _yarn(inv: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    d, old = spec.rotary_dim, spec.original_max_position

    def dim_of(rotations: float) -> float:  # the dim whose wavelength fits `rotations` in old
        return d * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(spec.theta))

    low, high = dim_of(spec.beta_fast), dim_of(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    high += 0.001 if low == high else 0
    ramp = ((torch.arange(d // 2, dtype=torch.float64, device=CPU) - low) / (high - low)).clamp(
        0, 1
    )
    extrapolate = 1 - ramp  # 1: keep the frequency, 0: interpolate it (/ factor)
    return inv / spec.factor * (1 - extrapolate) + inv * extrapolate


class Rope:
    """cos and sin of one `RopeSpec` at given positions (see the module docstring)."""

    def __init__(self, spec: RopeSpec) -> None:
        self.spec = spec
        self.inv_freq = inverse_frequencies(spec)  # [rotary_dim / 2] float64
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [T] -> cos, sin [T, 1, rotary_dim] float32, broadcast over heads
        cos, sin = self._covering(positions.device, int(positions.max()) + 1)
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def _covering(self, device: torch.device, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables.get(device, (None, None))
        have = 0 if cos is None else cos.shape[0]
        if have >= n:
            assert cos is not None and sin is not None
            return cos, sin
        chunks = [self._chunk(start) for start in range(have, n, CHUNK)]
        new_cos = torch.cat([c for c, _ in chunks]).to(device)
        new_sin = torch.cat([s for _, s in chunks]).to(device)
        if cos is not None and sin is not None:
            new_cos, new_sin = torch.cat([cos, new_cos]), torch.cat([sin, new_sin])
        self._tables[device] = (new_cos, new_sin)
        return new_cos, new_sin

    def _chunk(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + CHUNK, dtype=torch.float64, device=CPU)
        angles = torch.outer(positions, self.inv_freq)
        emb = torch.cat([angles, angles], dim=-1)  # [CHUNK, rotary_dim]
        scale = self.spec.attention_factor
        return (emb.cos() * scale).float(), (emb.sin() * scale).float()
