"""MlpBlock: a decoder layer's MLP block, with the projections beside it, as one
persistent kernel (the C++ MlpBlockProgram)."""

from typing import Optional

import torch

from . import _capture, _lib, _ops

_current_device = _capture.current_device_query()


class MlpBlock:
    """A dense decoder layer's stretch between two attentions at TP 1, run as one
    kernel on the current torch stream::

        o = attn · o_projᵀ                              (with o_proj; else o = attn)
        residual += o;  h = rmsnorm(residual) · post_norm
        a = silu(h · gateᵀ) · (h · upᵀ)                (gate_up: the gate rows, then the up rows)
        y = a · downᵀ
        with next_norm:  residual += y;  h' = rmsnorm(residual) · next_norm
                         out = h' · qkvᵀ (with qkv)  or  out = h'
        without:         out = y

    The buffers (attn [M, A] or [M, H], residual [M, H] updated in place, out) are
    fixed here, as CUDA graphs want them: write the inputs into ``attn`` and
    ``residual``, call the block, read ``out`` and ``residual``. Every tensor is
    bfloat16 on one CUDA device; weights [N, K] (gate_up [2I, H], down [H, I]),
    norm weights [H]; H and I multiples of 64; M from 1 to 64. Each norm is folded
    into the GEMMs that read it where the program serves that (``post_norm_folded``,
    ``next_norm_folded``); ``fold=False`` keeps norm ops. The block packs its own copy
    of the weights (as much memory once more) and keeps the tensors referenced. Bits
    are repeatable from run to run (not those of torch's or DecodeGemm's order).

    It needs every SM of the GPU while it runs (its CTAs wait on each other): do not
    run it beside kernels that hold SMs for good, and run one call of a block at a
    time. Build it outside CUDA-graph capture; calls may be captured."""

    def __init__(self, *, post_norm: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                 attn: torch.Tensor, residual: torch.Tensor, out: torch.Tensor,
                 o_proj: Optional[torch.Tensor] = None, next_norm: Optional[torch.Tensor] = None,
                 qkv: Optional[torch.Tensor] = None, eps: float = 1e-6, fold: bool = True):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("MlpBlock under CUDA-graph capture: build it before capturing")
        tensors = (o_proj, post_norm, gate_up, down, next_norm, qkv, attn, residual, out)
        # Why detach: DLPack does not export tensors that require grad (parameters).
        o_proj, post_norm, gate_up, down, next_norm, qkv, attn, residual, out = (
            None if t is None else t.detach() for t in tensors)
        self._handle = _lib.module.mlp_block(o_proj, post_norm, gate_up, down, next_norm, qkv, float(eps), attn,
                                             residual, out, bool(fold))
        self._tensors = tensors  # the C++ object reads and writes their memory
        self._device = self._handle.device
        self.rows = self._handle.rows
        self.post_norm_folded = self._handle.post_norm_folded
        self.next_norm_folded = self._handle.next_norm_folded
        self.attn, self.residual, self.out = tensors[6:]
        self._buffers = (attn, residual, out)  # detached: what run() passes to the extension
        self._run = self._handle.run
        self._id = _ops.register(self._run)

    def __del__(self):
        _ops.unregister(getattr(self, "_id", 0))

    def __call__(self, *, pdl: bool = True) -> torch.Tensor:
        """Runs the block on the current stream and returns ``out``. With ``pdl`` the
        kernel's weights start streaming during the previous kernel's tail (its inputs
        are read after that kernel completes). Under torch.compile it is the custom op
        ``tpdecode::mlp_block`` (it mutates ``residual`` and ``out``)."""
        if torch.compiler.is_compiling():
            torch.ops.tpdecode.mlp_block(self.attn, self.residual, self.out, self._id, pdl)
            return self.out
        if _current_device() != self._device:
            _capture.check_capture_device(self._device, "MlpBlock")
        self._run(*self._buffers, bool(pdl))
        return self.out
