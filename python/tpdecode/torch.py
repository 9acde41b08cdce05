"""tpdecode's linear for PyTorch models: ``linear(x, weight, bias)`` (a torch custom op,
``tpdecode::linear``) and ``install(module)``, which routes a model's BF16 linears
through it.

``linear`` runs the weight's DecodeGemm for the row counts it serves (1 ..
``DecodeGemm.max_rows``, read from the object) and ``F.linear`` otherwise: the
dispatch engines use for skinny GEMMs. A weight's DecodeGemm is made on its first
eager call (or by ``install``, which also prepares its row counts) and kept while the
weight lives (it holds no reference to it: a weight made per step is not kept
alive), or until ``forget(weight)`` or ``uninstall``. Making one measures its row
counts' paths as they come, so a weight made anew for every call runs slower than
``F.linear``.

The weights' DecodeGemms share the device's cuBLAS context, which keeps a 32 MB
workspace for each stream that runs a cuBLAS path: routed linears may run at once on
several streams."""

import fnmatch
import weakref
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .gemm import DecodeGemm

_ATTR = "_tpdecode_gemm"
_gemms: dict = {}  # (data_ptr, shape, strides, device index, batch invariant) -> its DecodeGemm, while it lives


def _key(weight: torch.Tensor, batch_invariant: bool = False):
    return weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.get_device(), batch_invariant


def _eligible(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.is_cuda and weight.stride(-1) == 1


def _gemm_for(weight: torch.Tensor, batch_invariant: bool = False) -> Optional[DecodeGemm]:
    """The weight's DecodeGemm (its batch-invariant one), made now where it may be
    (never during a capture; None where the weight does not suit one)."""
    if not _eligible(weight):
        return None
    key = _key(weight, batch_invariant)
    gemm = _gemms.get(key)
    if gemm is None and not torch.cuda.is_current_stream_capturing():
        try:
            gemm = DecodeGemm(weight, batch_invariant=batch_invariant, _hold_weight=False)
        except ValueError:
            if not batch_invariant:
                raise
            return None  # neither engine takes this weight
        _gemms[key] = gemm
        # Why when the weight goes (before its memory can be reused): a later weight
        # at the same address must not find this one's DecodeGemm.
        weakref.finalize(weight, _gemms.pop, key, None)
    return gemm


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _rows_served(gemm: Optional[DecodeGemm], x: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    # Why not where a gradient is wanted: DecodeGemm has no backward (F.linear has).
    # Why the unit column stride: the rows DecodeGemm takes (a transposed x goes to F.linear).
    if (gemm is None or x.dtype != torch.bfloat16 or x.get_device() != gemm.device_index or x.stride(-1) != 1
            or _needs_grad(x, weight, bias)):
        return False
    return x.shape[-1] == gemm.k and 1 <= x.numel() // gemm.k <= gemm.max_rows


def _run(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], batch_invariant: bool) -> torch.Tensor:
    if batch_invariant:
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] == 0:  # no row to keep invariant (and nothing for torch.cat)
            return F.linear(x, weight, bias)
        gemm = _gemm_for(weight, True)
        # Why contiguous and aligned: the batch-invariant DecodeGemm refuses other rows
        # (cuBLAS would give them other bits than its order's).
        rows = rows.contiguous()
        if rows.data_ptr() % 16:
            rows = rows.clone()
        if _rows_served(gemm, rows[:1], weight, bias):
            # The batch-invariant DecodeGemm: one summation order at every row count,
            # so calls of more rows than it takes run as calls of at most max_rows.
            y = torch.cat([gemm(rows[i : i + gemm.max_rows]) for i in range(0, rows.shape[0], gemm.max_rows)])
            y = y.view(*x.shape[:-1], weight.shape[0])
            return y if bias is None else y.add_(bias)
        # Why one row at a time where it does not serve: each row then takes the same
        # kernel and summation order whatever the batch (cuBLAS picks its kernel, and
        # with it the order, by the row count).
        y = torch.cat([F.linear(rows[i : i + 1], weight, bias) for i in range(rows.shape[0])])
        return y.view(*x.shape[:-1], weight.shape[0])
    gemm = _gemm_for(weight)
    if not _rows_served(gemm, x, weight, bias):
        return F.linear(x, weight, bias)
    y = gemm(x.reshape(-1, gemm.k)).view(*x.shape[:-1], gemm.n)
    return y if bias is None else y.add_(bias)


@torch.library.custom_op("tpdecode::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], batch_invariant: bool) -> torch.Tensor:
    return _run(x, weight, bias, batch_invariant)


@_linear_op.register_fake
def _(x, weight, bias, batch_invariant):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _save_for_backward(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    # A linear's gradients (a compiled graph that trains through the op needs them).
    x, weight = ctx.saved_tensors
    g = grad.reshape(-1, weight.shape[0])
    grad_x = (g @ weight).view(x.shape)
    grad_weight = g.t() @ x.reshape(-1, weight.shape[1])
    return grad_x, grad_weight, g.sum(0) if ctx.has_bias else None, None


_linear_op.register_autograd(_linear_backward, setup_context=_save_for_backward)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           batch_invariant: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: the weight's DecodeGemm for the rows it serves
    (BF16 operands on one device, 1 .. ``DecodeGemm.max_rows`` flattened rows, no
    gradient wanted; the bias added after, rounded again), ``F.linear`` otherwise.

    batch_invariant: a row's result does not depend on how many rows the call has
    (what an engine's batch-invariant mode needs): the weight's batch-invariant
    DecodeGemm in calls of at most ``max_rows`` rows, or, where neither engine
    takes the weight, every row as its own one-row ``F.linear``."""
    if torch.compiler.is_compiling():
        return torch.ops.tpdecode.linear(x, weight, bias, batch_invariant)
    return _run(x, weight, bias, batch_invariant)


def forget(weight: torch.Tensor) -> None:
    """Drops the weight's DecodeGemm (its decisions; made again at the next call)."""
    for batch_invariant in (False, True):
        _gemms.pop(_key(weight, batch_invariant), None)


class _RoutedForward:
    """An installed linear's forward: tpdecode.torch.linear on its weight and bias,
    with the checks of an eager call on the DecodeGemm made at install done here
    (the same conditions as ``linear``'s, without its lookups); batch-invariant:
    ``linear(..., batch_invariant=True)`` itself (gemm: its DecodeGemm, or None where
    neither engine takes the weight)."""

    def __init__(self, module: nn.Linear, gemm: Optional[DecodeGemm], batch_invariant: bool = False):
        self.module = module
        self.gemm = gemm
        self.batch_invariant = batch_invariant
        # Why the dict: nn.Module.__getattr__ costs more per call than the checks below
        # (assigning module.weight replaces the entry, which the identity check sees).
        self._parameters = module._parameters
        self._weight_ptr = gemm.weight.data_ptr() if gemm is not None else 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return linear(x, self.module.weight, self.module.bias, batch_invariant=self.batch_invariant)
        weight = self._parameters["weight"]
        bias = self._parameters.get("bias")
        if self.batch_invariant:
            return _run(x, weight, bias, True)
        gemm = self.gemm
        if (weight is gemm.weight and weight.data_ptr() == self._weight_ptr and x.dtype == torch.bfloat16
                and x.shape[-1] == gemm.k and x.get_device() == gemm.device_index and x.stride(-1) == 1
                and not _needs_grad(x, weight, bias)):
            rows = x.numel() // gemm.k
            if 1 <= rows <= gemm.max_rows:
                y = gemm(x.reshape(rows, gemm.k)).view(*x.shape[:-1], gemm.n)
                return y if bias is None else y.add_(bias)
        return _run(x, weight, bias, False)


def install(module: nn.Module, *, exclude: Iterable[str] = (), rows: Iterable[int] = range(1, 9),
            batch_invariant: bool = False) -> int:
    """Routes every BF16 ``nn.Linear`` under ``module`` (2-D weight on a CUDA device)
    through ``linear``, except those whose qualified name matches a pattern in
    ``exclude`` (fnmatch, e.g. ``"lm_head"``, ``"*.kv_b_proj"``) and those whose
    forward is not ``nn.Linear``'s own (a subclass that overrides it, or a forward set
    on the module by another wrapper, such as a hook: left as they are). Makes and prepares
    each weight's DecodeGemm for ``rows`` now, so a CUDA graph captured later finds
    them ready. batch_invariant: through ``linear(..., batch_invariant=True)`` (a
    row's result does not depend on the batch; each weight's batch-invariant
    DecodeGemm, which prepares every row count). Returns how many linears were
    routed (already routed ones count again; none is wrapped twice; one routed in the
    other mode is routed again in this one)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("install prepares DecodeGemms: call it before CUDA-graph capture")
    exclude = list(exclude)
    rows = list(rows)
    count = 0
    for name, sub in module.named_modules():
        if not isinstance(sub, nn.Linear) or any(fnmatch.fnmatchcase(name, p) for p in exclude):
            continue
        if not _eligible(sub.weight) or not _plain_forward(sub):
            continue
        routed = sub.__dict__.get("forward")
        if not isinstance(routed, _RoutedForward) or routed.batch_invariant != batch_invariant:
            gemm = _gemm_for(sub.weight, batch_invariant)
            if gemm is not None and not batch_invariant:
                gemm.prepare(rows)
            setattr(sub, _ATTR, gemm)
            sub.forward = _RoutedForward(sub, gemm, batch_invariant)
        count += 1
    return count


def _plain_forward(sub: nn.Linear) -> bool:
    """Whether the module's forward is nn.Linear's (or one install set)."""
    own = sub.__dict__.get("forward")
    return type(sub).forward is nn.Linear.forward and (own is None or isinstance(own, _RoutedForward))


def uninstall(module: nn.Module) -> int:
    """Restores every linear ``install`` routed under ``module`` and drops their
    DecodeGemms; returns how many."""
    count = 0
    for sub in module.modules():
        if hasattr(sub, _ATTR):
            if isinstance(sub.__dict__.get("forward"), _RoutedForward):
                del sub.forward  # the instance attribute: the class's forward shows again
            gemm = getattr(sub, _ATTR)
            weight = gemm.weight if gemm is not None else None
            forget(weight if weight is not None else sub.weight)
            delattr(sub, _ATTR)
            count += 1
    return count
