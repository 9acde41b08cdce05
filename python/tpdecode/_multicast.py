"""NVLink multicast stays off (the machines tpdecode runs on must never use it).

NCCL reads ``NCCL_NVLS_ENABLE`` once per process, when it makes its first
communicator, and keeps that value for every later one. ``import tpdecode`` sets it
to 0 (with PyTorch's and NVSHMEM's switches); if PyTorch had made an NCCL
communicator before, that value was already read, and every communicator of the
process, tpdecode's included, may use NVLink multicast (NVLS) where the hardware
offers it. Set the variables in the environment, or import tpdecode before
``torch.distributed.init_process_group``."""

import os
import sys
import warnings

OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# Whether torch.distributed was initialized before `import tpdecode` set the variables.
late = False


def keep_off():
    global late
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        dist = sys.modules.get("torch.distributed")
        late = bool(dist is not None and dist.is_available() and dist.is_initialized())
    for name, value in OFF.items():
        if os.environ.get(name, value) != value:
            warnings.warn(f"tpdecode sets {name}={value} (it was {os.environ[name]}): NVLink multicast stays off")
        os.environ[name] = value
    if late:
        warn_late()


def warn_late():
    warnings.warn(
        "torch.distributed was initialized before tpdecode set NCCL_NVLS_ENABLE=0: if PyTorch has made an NCCL "
        "communicator, NCCL already read the variable and this process's communicators (tpdecode's included) may "
        "use NVLink multicast. Set NCCL_NVLS_ENABLE=0 in the environment, or import tpdecode before "
        "init_process_group.",
        stacklevel=3,
    )
