"""ar_norm's FP8 epilogues in torch: what the kernels write, for the torch fallback and
the tests (bit for bit on finite values: reference/fp8_quant.hpp has the math and
where it differs from vLLM's quantisers).

quant arguments, as every tpdecode call takes them: None (BF16 output), a float32
tensor of one element (the static scale: out = e4m3(v · (1 / scale))), "group" or
"group-ue8m0" (per 128 columns scale = max(amax, 1e-10) / 448, UE8M0 rounded up to a
power of two; out = e4m3(v / scale)), where v is the BF16 normalised value."""

from typing import Optional, Tuple

import torch

E4M3_MAX = 448.0
GROUP = 128
AMAX_FLOOR = 1e-10
KINDS = ("none", "static", "group", "group-ue8m0")


def kind_of(quant) -> str:
    """The quant argument's kind (ValueError for anything else)."""
    if quant is None:
        return "none"
    if isinstance(quant, torch.Tensor):
        if quant.dtype != torch.float32 or quant.numel() != 1:
            raise ValueError(f"a static FP8 scale is a float32 tensor of one element, not {quant.dtype}[{quant.numel()}]")
        return "static"
    if quant in ("group", "group-ue8m0"):
        return quant
    raise ValueError(f"quant={quant!r}: None, a float32 scale tensor (static), 'group' or 'group-ue8m0'")


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest even, saturating at ±448 (torch's cast alone turns overflow into NaN); NaN stays."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def static(v: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    inverse = 1.0 / scale.reshape(()).float()
    return e4m3(v.float() * inverse)


def group_scales(v: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    """[..., hidden / 128] float32 scales of BF16 rows v."""
    g = v.float().unflatten(-1, (-1, GROUP))
    amax = g.abs().amax(-1)  # a NaN stays NaN
    scale = torch.where(amax < AMAX_FLOOR, torch.full_like(amax, AMAX_FLOOR), amax) / E4M3_MAX
    if ue8m0:
        mantissa, exponent = torch.frexp(scale)  # scale = mantissa · 2^exponent, mantissa in [0.5, 1)
        up = torch.ldexp(torch.ones_like(scale), exponent)
        scale = torch.where((mantissa == 0.5) | ~torch.isfinite(scale), scale, up)
    return scale


def group(v: torch.Tensor, ue8m0: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    scale = group_scales(v, ue8m0)
    q = e4m3(v.float().unflatten(-1, (-1, GROUP)) / scale.unsqueeze(-1)).flatten(-2)
    return q, scale


def quantise(v: torch.Tensor, kind: str, scale: Optional[torch.Tensor]):
    """(e4m3 values, group scales or None) of the BF16 normalised rows v."""
    if kind == "static":
        return static(v, scale), None
    return group(v, kind == "group-ue8m0")
