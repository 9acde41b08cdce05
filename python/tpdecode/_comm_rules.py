"""What the engine communicator (tpdecode.Communicator) decides without torch or a GPU:
the size cap per (architecture, world size), its environment override, and whether a
call is served, each as a pure function (tested on the CPU)."""

import os
from typing import Mapping, Optional, Sequence, Tuple

# The largest x (bytes) the communicator takes by default, per (compute capability
# major, world size); above it the caller's next backend runs. Why these: tpdecode's
# mailbox paths were measured faster than NCCL for every row count up to 64 rows of
# 7168 BF16 (896 KiB) at TP 2 and TP 4 on H200s (src/comm/crossover.hpp, docs/
# performance.md); TP 8 on 8 GPUs is not measured, so it takes the cap vLLM's custom
# all-reduce uses there on SM90 (256 KiB) until it is. Other architectures: none
# (tpdecode's kernels are sm_90a).
MAX_BYTES = {(9, 2): 896 << 10, (9, 4): 896 << 10, (9, 8): 256 << 10}
MAX_BYTES_ENV = "TPDECODE_COMM_MAX_BYTES"
WORLD_SIZES = (1, 2, 4, 8, 16)
HIDDEN_MAX = 16384  # the row norm's widest row (comm.hpp: kArNormMaxHidden)
GROUP = 128


def max_bytes(capability: Tuple[int, int], world: int, capacity: Optional[int], override: Optional[int] = None,
              env: Mapping[str, str] = os.environ) -> int:
    """The size cap: `override` (the constructor's), else the environment's, else the
    table's; never above `capacity` (the mailboxes' rows · hidden · 2; None: no bound,
    as in batch-invariant mode, where more rows run as further calls). 0: not served."""
    if override is None and env.get(MAX_BYTES_ENV):
        try:
            override = int(env[MAX_BYTES_ENV])
        except ValueError:
            raise ValueError(f"{MAX_BYTES_ENV}={env[MAX_BYTES_ENV]!r}: a number of bytes") from None
    if override is not None and override < 0:
        raise ValueError(f"max_bytes {override}: >= 0")
    cap = override if override is not None else MAX_BYTES.get((capability[0], world), 0)
    return cap if capacity is None else min(cap, capacity)


def setup_refusal(capability: Tuple[int, int], world: int, nccl_team: bool) -> str:
    """Why this rank cannot set the communicator up ("" where it can): checked on every
    rank before anything collective, and agreed (any rank's refusal disables all)."""
    if capability[0] != 9:
        return f"compute capability {capability[0]}.{capability[1]}: tpdecode's kernels are sm_90a (Hopper)"
    if world not in WORLD_SIZES:
        return f"world size {world}: tpdecode takes teams of {', '.join(map(str, WORLD_SIZES))}"
    if not nccl_team:
        return "this tpdecode build has no NCCL team (NCCL >= 2.28.9 missing at build)"
    return ""


def call_refusal(op: str, dtype: str, shape: Sequence[int], contiguous: bool, same_device: bool, nbytes: int,
                 cap: int, hidden: int, rows_cap: int, batch_invariant: bool, ranks_lead: int = 0,
                 quant: str = "none") -> str:
    """Why `op` ("all_reduce" or "fused_add_rms_norm") does not take x ("" where it
    does): the same conditions under which the team's call would raise NotServed, plus
    the size cap. ranks_lead: a local team's leading dimension of ranks (0: none)."""
    if dtype != "bfloat16":
        return f"{op}: dtype {dtype}; tpdecode reduces bfloat16"
    if not same_device:
        return f"{op}: x is not on the communicator's device"
    if not contiguous:
        return f"{op}: x is not contiguous"
    if len(shape) < 1 + (1 if ranks_lead else 0) or (ranks_lead and shape[0] != ranks_lead):
        return f"{op}: shape {tuple(shape)}; a local team of {ranks_lead} ranks takes [{ranks_lead}, ..., columns]"
    cols = shape[-1]
    rows = 1
    for d in shape[(1 if ranks_lead else 0):-1]:
        rows *= d
    if rows < 1 or cols < 1:
        return f"{op}: x is empty"
    per_rank = nbytes // ranks_lead if ranks_lead else nbytes
    if per_rank > cap:
        return f"{op}: {per_rank} bytes, above the cap of {cap} ({MAX_BYTES_ENV} overrides it)"
    if cols % 8 != 0:
        return f"{op}: rows of {cols} elements; tpdecode takes multiples of 8"
    if cols > hidden:
        return f"{op}: rows of {cols} elements; the communicator was built for {hidden}"
    if rows > rows_cap and not batch_invariant:
        return f"{op}: {rows} rows; the communicator was built for {rows_cap}"
    if op == "fused_add_rms_norm":
        if cols % 64 != 0 or cols > HIDDEN_MAX:
            return f"{op}: hidden {cols}; the norm takes multiples of 64 up to {HIDDEN_MAX}"
        if quant in ("group", "group-ue8m0") and cols % (8 * GROUP) != 0:
            return f"{op}: hidden {cols}; the group quantisation takes multiples of {8 * GROUP}"
    return ""
