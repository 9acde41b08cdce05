"""ar_norm's FP8 epilogues in torch: what the kernels write, for the torch fallback and
the tests (bit for bit on finite values: reference/fp8_quant.hpp has the math and
where it differs from vLLM's quantisers).

quant arguments, as every tpdecode call takes them: None (BF16 output), a float32
tensor of one element (the static scale: out = e4m3(v · (1 / scale))), "group" or
"group-ue8m0" (per 128 columns scale = max(amax, 1e-10) / 448, UE8M0 rounded up to a
power of two; out = e4m3(v / scale)), where v is the BF16 normalised value.

Every division here is tensor by tensor. Why: torch's CUDA division by a Python
number (or a CPU scalar) multiplies by the number's rounded reciprocal, which is
not the correctly rounded quotient: amax · fl(1/448) differs from fl(amax / 448) in
the last bit for some amax, and with it the group's scale and its FP8 values (the
kernels and reference/fp8_quant.cpp divide, rounded once)."""

from typing import Optional, Tuple

import torch

E4M3_MAX = 448.0
GROUP = 128
AMAX_FLOOR = 1e-10
KINDS = ("none", "static", "group", "group-ue8m0")


def kind_of(quant) -> str:
    """The quant argument's kind (TypeError for a scale of another dtype, ValueError for
    anything else)."""
    if quant is None:
        return "none"
    if isinstance(quant, torch.Tensor):
        if quant.dtype != torch.float32:
            raise TypeError(f"a static FP8 scale is a float32 tensor of one element, not {quant.dtype}")
        if quant.numel() != 1:
            raise ValueError(f"a static FP8 scale is a float32 tensor of one element, not {quant.numel()} elements")
        return "static"
    if quant in ("group", "group-ue8m0"):
        return quant
    raise ValueError(f"quant={quant!r}: None, a float32 scale tensor (static), 'group' or 'group-ue8m0'")


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest even, saturating at ±448 (torch's cast alone turns overflow into NaN); NaN stays."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _divide(a: torch.Tensor, b) -> torch.Tensor:
    """a / b rounded once on every device (b a number or a tensor; see the module)."""
    if not isinstance(b, torch.Tensor):
        b = torch.full_like(a, b)
    return torch.div(a, b)


def static(v: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    s = scale.reshape(()).float().to(v.device)
    inverse = _divide(torch.ones_like(s), s)  # 1 / scale rounded once, as the kernels' __fdiv_rn
    return e4m3(v.float() * inverse)


def group_scales(v: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    """[..., hidden / 128] float32 scales of BF16 rows v."""
    g = v.float().unflatten(-1, (-1, GROUP))
    amax = g.abs().amax(-1)  # a NaN stays NaN
    floored = torch.where(amax < AMAX_FLOOR, torch.full_like(amax, AMAX_FLOOR), amax)
    scale = _divide(floored, E4M3_MAX)
    if ue8m0:
        # The smallest power of two >= scale, on the bits (as the kernels): the exponent
        # raised by one unless the mantissa is zero; infinities and NaN stay. The floor
        # keeps every finite scale a normal float.
        bits = scale.view(torch.int32)
        exponent = bits & 0x7F800000
        up = ((bits & 0x007FFFFF) != 0) & (exponent != 0x7F800000)
        scale = torch.where(up, exponent + 0x00800000, bits).view(torch.float32)
    return scale


def group(v: torch.Tensor, ue8m0: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    scale = group_scales(v, ue8m0)
    q = e4m3(_divide(v.float().unflatten(-1, (-1, GROUP)), scale.unsqueeze(-1))).flatten(-2)
    return q, scale


def quantise(v: torch.Tensor, kind: str, scale: Optional[torch.Tensor]):
    """(e4m3 values, group scales or None) of the BF16 normalised rows v."""
    if kind == "static":
        return static(v, scale), None
    return group(v, kind == "group-ue8m0")
