"""Routes a PyTorch model's BF16 linears through DecodeGemm.

``install(module)`` replaces the forward of every ``nn.Linear`` under ``module``
whose weight is a 2-D BF16 CUDA tensor: inputs with 1..DecodeGemm.max_rows
flattened rows (BF16, on the weight's device, last dimension K) run on the
linear's DecodeGemm, the bias added after; anything else runs the original
forward. ``uninstall(module)`` restores them."""

import fnmatch
from typing import Iterable

import torch
from torch import nn

from .gemm import DecodeGemm

_ATTR = "_tpdecode_gemm"


class _RoutedForward:
    """An installed linear's forward: DecodeGemm for the rows it serves."""

    def __init__(self, linear: nn.Linear, gemm: DecodeGemm):
        self.linear = linear
        self.gemm = gemm
        self.original = linear.forward  # the class's bound forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gemm, linear = self.gemm, self.linear
        k = gemm.k
        if (
            x.dtype != torch.bfloat16
            or x.shape[-1] != k
            or x.requires_grad  # tpdecode has no backward
            or x.device != gemm.weight.device
            or linear.weight is not gemm.weight  # weight replaced since install
            or not 1 <= x.numel() // k <= DecodeGemm.max_rows
        ):
            return self.original(x)
        y = gemm(x.reshape(-1, k)).view(*x.shape[:-1], gemm.n)
        return y if linear.bias is None else y.add_(linear.bias)


def install(module: nn.Module, *, exclude: Iterable[str] = (), rows: Iterable[int] = range(1, 9)) -> int:
    """Routes every BF16 ``nn.Linear`` under ``module`` (2-D weight on a CUDA device)
    through DecodeGemm, except those whose qualified name matches a pattern in
    ``exclude`` (fnmatch, e.g. ``"lm_head"``, ``"*.kv_b_proj"``). Prepares the engines
    for ``rows`` now, so a CUDA graph captured later finds them ready. Returns how
    many linears were routed (already routed ones count again; none is wrapped twice)."""
    exclude = list(exclude)
    rows = list(rows)
    count = 0
    for name, sub in module.named_modules():
        if not isinstance(sub, nn.Linear) or any(fnmatch.fnmatchcase(name, p) for p in exclude):
            continue
        w = sub.weight
        if w.dtype != torch.bfloat16 or w.dim() != 2 or not w.is_cuda:
            continue
        if not hasattr(sub, _ATTR):
            gemm = DecodeGemm(w).prepare(rows)
            setattr(sub, _ATTR, gemm)
            sub.forward = _RoutedForward(sub, gemm)
        count += 1
    return count


def uninstall(module: nn.Module) -> int:
    """Restores every linear ``install`` routed under ``module``; returns how many."""
    count = 0
    for sub in module.modules():
        if hasattr(sub, _ATTR):
            del sub.forward  # the instance attribute: the class's forward shows again
            delattr(sub, _ATTR)
            count += 1
    return count
