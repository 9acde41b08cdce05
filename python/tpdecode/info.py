"""What this machine and build offer (``tpdecode info`` of the command-line tool)."""

from collections.abc import Mapping

import tvm_ffi

from . import _lib


def _plain(value):
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tvm_ffi.Array, list, tuple)):
        return [_plain(v) for v in value]
    return value


def info() -> dict:
    """GPUs (name, compute capability, SMs, memory, multicast attribute), peer
    access, CUDA and NCCL versions and which team backends can serve here. Without
    a GPU, ``no_gpu_reason`` says why and ``gpus`` is empty."""
    d = _plain(_lib.module.info())
    d["tvm_ffi_version"] = tvm_ffi.__version__
    d["extension"] = _lib.PATH
    return d
