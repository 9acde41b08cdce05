"""tpdecode's exceptions. The extension raises them by kind name (python/src/errors.hpp);
argument errors are plain ``ValueError`` (shape, device, layout, alignment) and
``TypeError`` (dtype)."""

import builtins

import tvm_ffi


class Error(Exception):
    """Base of tpdecode's own exceptions."""


class NotServed(Error, builtins.ValueError):
    """A well-formed call tpdecode does not take: a row width its kernels do not
    handle, or rows or widths above what the team was built for. A team built with
    ``fallback="torch"`` runs such calls with torch instead of raising."""


class UnsupportedDType(NotServed, builtins.TypeError):
    """A dtype tpdecode does not take for this call (``fallback="torch"`` runs it)."""


class CapacityError(NotServed):
    """A request above a capacity fixed when the team or its buffers were built."""


class TimeoutError(Error, builtins.TimeoutError):
    """A rank's wait passed its deadline (a peer never arrived), or a call found the
    team aborted by such a rank. Every rank must call ``team.reset()``."""


class TeamBroken(Error):
    """The team cannot go on (a rank did not reach a barrier in time, or tpdecode's
    NCCL communicator was aborted): build a new one."""


class Unavailable(Error):
    """A backend or capability this machine or build does not have (no GPU, no NCCL)."""


class CudaError(Error, builtins.RuntimeError):
    """A CUDA runtime call failed (the message names the call)."""


for _cls in (Error, NotServed, UnsupportedDType, CapacityError, TimeoutError, TeamBroken, Unavailable, CudaError):
    tvm_ffi.register_error("tpdecode." + _cls.__name__, _cls)
