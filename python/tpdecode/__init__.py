"""tpdecode: decode-time tensor-parallel collectives and skinny GEMMs for PyTorch.

``Team`` (``Team.from_process_group`` under torchrun, ``Team.local(n)`` on one GPU)
runs ``all_reduce``, ``ar_norm`` and ``gather``; ``Communicator`` gives them the shape
of an engine's all-reduce backend (a disabled flag, ``should_*``, calls returning None
to fall through, ``capture()``); ``DecodeGemm`` runs one linear;
``tpdecode.torch.linear`` and ``install`` route a model's BF16 linears through it;
``GemmProgram`` runs a chain of GEMMs and norms as one kernel, ``TeamProgram`` one
such kernel per rank of a team whose norms may all-reduce, and ``MlpBlock`` a layer's
MLP block with the projections beside it (TP 1, or with ``team=`` one kernel per rank
whose norms all-reduce; ``tpdecode.program``).
Importing tpdecode keeps NVLink multicast off (``tpdecode._multicast`` says what that
needs)."""

from . import _multicast

_multicast.keep_off()

from .errors import (  # noqa: E402
    CapacityError,
    CudaError,
    Error,
    NotServed,
    TeamBroken,
    TimeoutError,
    Unavailable,
    UnsupportedDType,
)
from .info import info  # noqa: E402
from ._lib import module as _module  # noqa: E402

__version__ = str(_module.library_version())  # the C++ library's (tpdecode::version())

__all__ = [
    "CapacityError",
    "Communicator",
    "CudaError",
    "DecodeGemm",
    "Error",
    "GemmProgram",
    "MlpBlock",
    "NotServed",
    "Team",
    "TeamBroken",
    "TeamProgram",
    "TimeoutError",
    "Unavailable",
    "UnsupportedDType",
    "info",
]


def __getattr__(name):
    # Why lazily: Team, Communicator, DecodeGemm, the programs and tpdecode.torch need
    # torch; info() and the errors do not.
    if name == "Team":
        from .team import Team

        return Team
    if name == "Communicator":
        from .communicator import Communicator

        return Communicator
    if name == "DecodeGemm":
        from .gemm import DecodeGemm

        return DecodeGemm
    if name in ("GemmProgram", "MlpBlock", "TeamProgram"):
        from . import program

        return getattr(program, name)
    if name in ("torch", "program"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'tpdecode' has no attribute {name!r}")
