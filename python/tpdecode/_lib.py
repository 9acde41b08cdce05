"""Loads the extension (python/src, a shared library tvm-ffi loads) and names its
object types."""

import os
import sys
from typing import Optional

try:
    # Why first: the extension needs libcudart, libcublas and libnccl; with PyTorch's
    # copies already loaded it binds to those (one CUDA runtime and one NCCL in the
    # process) instead of the ones the build found.
    import torch  # noqa: F401
except ImportError:
    pass

import tvm_ffi

from . import errors  # noqa: F401  (registers the error kinds first)

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtpdecode_ffi.so")
module = tvm_ffi.load_module(PATH)


def cuda_mismatch(torch_cuda: Optional[str], built_major: int) -> str:
    """Why this extension cannot share a process with a torch built for another CUDA
    major version ("" where it can, or torch has no CUDA): the process would load two
    CUDA runtimes and two cuBLAS, and tensors would cross between them."""
    if not torch_cuda:
        return ""
    major = int(torch_cuda.split(".")[0])
    if major == built_major:
        return ""
    return (f"tpdecode was built with CUDA {built_major} and torch is a CUDA {torch_cuda} build: install a "
            f"CUDA {built_major} build of torch, or build tpdecode with CUDA {major}")


_why = cuda_mismatch(getattr(getattr(sys.modules.get("torch"), "version", None), "cuda", None),
                     int(module.built_cuda_major()))
if _why:
    raise ImportError(_why)


@tvm_ffi.register_object("tpdecode.Team")
class TeamHandle(tvm_ffi.Object):
    """A C++ team and its comm (python/src/team_object.hpp)."""


@tvm_ffi.register_object("tpdecode.DecodeGemm")
class GemmHandle(tvm_ffi.Object):
    """A C++ DecodeGemm (python/src/gemm_object.hpp)."""


@tvm_ffi.register_object("tpdecode.GemmProgram")
class GemmProgramHandle(tvm_ffi.Object):
    """A C++ GemmProgram built op by op (python/src/gemm_program_object.hpp)."""


@tvm_ffi.register_object("tpdecode.MlpBlock")
class MlpBlockHandle(tvm_ffi.Object):
    """A C++ MlpBlockProgram (python/src/mlp_block_object.hpp)."""


@tvm_ffi.register_object("tpdecode.TeamMlpBlock")
class TeamMlpBlockHandle(tvm_ffi.Object):
    """A C++ TeamMlpBlock (python/src/team_mlp_block_object.hpp)."""


# CommPath and GemmPath of the C++ API, by value.
COMM_PATHS = ("one-shot", "two-shot", "stock")
GEMM_PATHS = ("warp", "cublas", "cublaslt", "wgmma", "wgmma-wide")  # GemmPath order
