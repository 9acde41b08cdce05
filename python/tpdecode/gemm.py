"""DecodeGemm: one linear's ``x · Wᵀ`` for decode-sized row counts."""

import weakref
from typing import Iterable, Optional, Union

import torch

from . import _capture, _lib, _ops

_current_device = _capture.current_device_query()


def _check_storage(weight, data_ptr: int) -> None:
    """RuntimeError where a held weight's storage was replaced (a weak reference, as
    tpdecode.torch's objects hold, is looked up by its address and never refused).
    Why: the C++ object reads the address it was made with, which the replaced
    storage may have left to another tensor."""
    if isinstance(weight, torch.Tensor) and weight.data_ptr() != data_ptr:
        raise RuntimeError("DecodeGemm: the weight's storage moved (weight.data was replaced): make a new "
                           "DecodeGemm for it, or copy new values in place (weight.copy_)")


def _checked(run, weight, data_ptr: int):
    """The call torch.compile's op runs (by id): the eager call's storage check, then run."""
    def call(x: torch.Tensor, out: torch.Tensor) -> None:
        _check_storage(weight, data_ptr)
        run(x, out)
    return call


class DecodeGemm:
    """``out[M, N] = x[M, K] · weight[N, K]ᵀ`` (BF16 operands, FP32 accumulation, one
    BF16 rounding) on the current torch stream.

    For M ≤ ``max_rows`` rows the path is measured: the first eager call (or
    ``prepare``) of a shape bucket times the engines (wgmma, warp split-K: bitwise
    identical run to run) and cuBLAS/cuBLASLt on the real weight and keeps the
    fastest; cuBLAS runs everything else. ``prepare`` the row counts before
    CUDA-graph capture: a call under capture never measures (it runs the cached
    decision, else the static rule).
    One object is called by one Python thread at a time (a call may make its row
    count's decision; the calls release the GIL); different objects may be called
    from several threads.

    weight: [N, K] bfloat16 on a CUDA device (kept referenced by this object). Update
    it in place (``weight.copy_``): a call whose weight's storage was replaced
    (``weight.data = ...``) raises RuntimeError (under torch.compile, when the op runs).
    shared_cublas: use the device's shared cuBLAS context (one 32 MB workspace per
    stream that runs a cuBLAS path, for all DecodeGemms of the device), else a
    private one.
    chain: this GEMM is a link of a chain of kernels launched with programmatic
    dependent launch (e.g. consecutive DecodeGemms in one graph): a cuBLAS
    candidate is charged what a link that does not overlap its neighbours costs
    them (``chain`` can be changed later; that drops the decisions made so far).
    Leave it off where the neighbours are ordinary kernels.
    batch_invariant: see the property of that name."""

    max_rows = 64

    @property
    def weight(self) -> Optional[torch.Tensor]:
        """The weight (None only for tpdecode.torch's objects, once their weight is gone)."""
        w = self._weight
        return w if isinstance(w, torch.Tensor) else w()

    def __init__(self, weight: torch.Tensor, *, shared_cublas: bool = True, chain: bool = False,
                 batch_invariant: bool = False, _hold_weight: bool = True):
        # Why a weak reference may do (tpdecode.torch's cache): the cache must not keep
        # a weight alive, and it drops the object when the weight goes.
        self._weight = weight if _hold_weight else weakref.ref(weight)
        self._data_ptr = weight.data_ptr()  # what the C++ object reads
        # Why detach: DLPack does not export tensors that require grad (parameters).
        self._handle = _lib.module.decode_gemm(weight.detach(), shared_cublas)
        self._run = self._handle.decode_gemm
        # Why not self._run: a compiled graph's op would skip the eager call's check.
        self._id = _ops.register(_checked(self._run, self._weight, self._data_ptr))
        self.n, self.k = self._handle.n, self._handle.k
        self._device = self._handle.device  # read once: a field of the C++ object costs a call
        self.device_index = self._device  # the CUDA device's index (torch's Tensor.get_device())
        if chain:
            self.chain = True
        if batch_invariant:
            self.batch_invariant = True

    @property
    def chain(self) -> bool:
        """Whether the decisions are made for a link of a PDL chain (see the class)."""
        return self._handle.chain()

    @chain.setter
    def chain(self, on: bool) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("DecodeGemm.chain under CUDA-graph capture: set it before capturing")
        self._handle.set_chain(bool(on))

    @property
    def batch_invariant(self) -> bool:
        """Batch-invariant mode: every row count 1 .. ``max_rows`` runs one summation
        order (an engine, its CTA shape and split) fixed for the shape, so a row's bits
        do not depend on how many rows a call has (the fastest order at the hint's row
        count, tuned once per shape and hint like the default decisions; every bucket is
        prepared when it is turned on); x must then be contiguous and 16-byte aligned
        (ValueError: cuBLAS would give its rows other bits). Setting it
        raises ValueError where neither engine takes the weight. Setting True where it
        is off is ``set_batch_invariant(True)`` (the engine chosen for calls of 8
        rows); where it is on, it keeps the hint."""
        return self._handle.batch_invariant()

    @batch_invariant.setter
    def batch_invariant(self, on: bool) -> None:
        if not (on and self.batch_invariant):
            self.set_batch_invariant(on)

    @property
    def batch_invariant_rows(self) -> int:
        """The row hint batch-invariant mode was last set with (set_batch_invariant)."""
        return self._handle.batch_invariant_rows()

    def set_batch_invariant(self, on: bool, rows: int = 8) -> None:
        """Batch-invariant mode on or off; ``rows`` (1 .. 64, read when on), the row
        count the calls mostly have, picks the summation order every row count then
        keeps: the fastest engine, CTA shape and split timed at that many rows (once
        per shape and hint; with tuning off, a static rule). Calls far above the hint
        pay for it (an order fast at 8 rows ran 1.0-3.7 x the default at 16-64, the
        narrow CTA's up to 5.5 x). Another
        hint decides again (a row's bits may change between hints, never between
        calls)."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("DecodeGemm.batch_invariant under CUDA-graph capture: set it before capturing")
        if on and not 1 <= int(rows) <= self.max_rows:
            raise ValueError(f"DecodeGemm.set_batch_invariant: rows {rows} (1..{self.max_rows})")
        self._handle.set_batch_invariant(bool(on), int(rows) if on else 1)

    def __del__(self):
        _ops.unregister(getattr(self, "_id", 0))

    @property
    def engine_eligible(self) -> bool:
        """The weight's shape, layout and alignment suit the engine."""
        return self._handle.engine_eligible

    def prepare(self, ms: Union[int, Iterable[int]]) -> "DecodeGemm":
        """Prepares the engine for each row count in ``ms`` (host work; not under capture)."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("DecodeGemm.prepare under CUDA-graph capture: prepare before capturing")
        for m in [ms] if isinstance(ms, int) else ms:
            self._handle.prepare(int(m))
        return self

    def path(self, m: int) -> str:
        """"warp", "wgmma", "wgmma-wide", "cublas" or "cublaslt": what a call of m contiguous rows runs now."""
        return _lib.GEMM_PATHS[self._handle.path(int(m))]

    def decision(self, m: int) -> str:
        """The decision a call of m rows runs (e.g. "warp split 8", "cublaslt #3fa9c1")."""
        return self._handle.decision(int(m))

    def __call__(self, x: torch.Tensor, *, out: torch.Tensor = None) -> torch.Tensor:
        """x: [..., K] bfloat16 on the weight's device; returns [..., N] (``out`` if given)."""
        if out is None:
            out = x.new_empty((*x.shape[:-1], self.n))
        if torch.compiler.is_compiling():
            torch.ops.tpdecode.decode_gemm(x, out, self._id)
        else:
            _check_storage(self._weight, self._data_ptr)
            if _current_device() != self._device:
                _capture.check_capture_device(self._device, "DecodeGemm")
            self._run(x, out)
        return out
