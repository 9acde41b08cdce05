"""Team: the TP ranks and their collectives, for PyTorch tensors on the current stream."""

import dataclasses
from typing import Optional

import torch

from . import _capture, _lib, _multicast, _ops, _quant
from ._fallback import TorchFallback
from .errors import NotServed


@dataclasses.dataclass(frozen=True)
class CommConfig:
    """What a team's collectives are built for (their buffers are made once, at
    construction, on every rank): calls beyond it are not served.

    hidden: widest all_reduce / ar_norm row (elements). rows: most rows per call.
    gather_row_bytes: widest gathered row, size · shard bytes (0: hidden · 2).
    algorithm: "auto" (mailbox where it serves, measured crossover), "one-shot",
    "two-shot", or "stock" (always NCCL / the local equivalent).
    timeout_ms: deadline of every wait (0: TPDECODE_TIMEOUT_MS or 5000).
    pdl: programmatic dependent launch for tpdecode's kernels.
    batch_invariant: a row's output bits do not depend on the call's row count or
    the path that runs it (rows beyond ``rows`` run as further mailbox calls; the
    stock path sums in rank order too): what an engine's batch-invariant mode needs
    (include/tpdecode/comm.hpp, CommConfig::batch_invariant)."""

    hidden: int = 8192
    rows: int = 64
    gather_row_bytes: int = 0
    algorithm: str = "auto"
    timeout_ms: int = 0
    pdl: bool = True
    batch_invariant: bool = False


class _Runner:
    """Runs a collective eagerly: the team's C++ call, or the torch fallback where that
    raises NotServed. The custom ops run it too (their trace records only the op). One
    method per collective, each calling the extension directly: an eager call is a
    few microseconds, so every Python step of it shows."""

    def __init__(self, handle, fallback):
        self.fallback = fallback
        self.device = handle.device
        self.path = "none"  # of the last call
        # The extension's calls, looked up once.
        self._all_reduce = handle.all_reduce
        self._ar_norm = handle.ar_norm
        self._gather = handle.gather

    def all_reduce(self, x, out):
        # Why: a capture on another device would not take this call (_capture.py).
        if _current_device() != self.device:
            _capture.check_capture_device(self.device, "Team.all_reduce")
        try:
            self.path = _lib.COMM_PATHS[self._all_reduce(x, out)]
        except NotServed as refusal:
            self._fall_back(refusal, "all_reduce", x, out)

    def ar_norm(self, x, residual, weight, eps, out, residual_out, kind, scale, scales):
        """The extension takes an FP8 output as its bytes and the one scale tensor the
        kind reads (static) or writes (group)."""
        if _current_device() != self.device:
            _capture.check_capture_device(self.device, "Team.ar_norm")
        try:
            if kind == "none":
                code = self._ar_norm(x, residual, weight, eps, out, residual_out, kind, None)
            else:
                # Why here: the extension sees the FP8 output as bytes, any 1-byte dtype alike.
                if out.dtype != torch.float8_e4m3fn:
                    raise TypeError(f"Team.ar_norm: an FP8 out is torch.float8_e4m3fn, not {out.dtype}")
                code = self._ar_norm(x, residual, weight, eps, out.view(torch.uint8), residual_out, kind,
                                     scale if kind == "static" else scales)
            self.path = _lib.COMM_PATHS[code]
        except NotServed as refusal:
            self._fall_back(refusal, "ar_norm", x, residual, weight, eps, out, residual_out, kind, scale, scales)

    def gather(self, shard, out):
        if _current_device() != self.device:
            _capture.check_capture_device(self.device, "Team.gather")
        try:
            self.path = _lib.COMM_PATHS[self._gather(shard, out)]
        except NotServed as refusal:
            self._fall_back(refusal, "gather", shard, out)

    def _fall_back(self, refusal, op, *args):
        """What the extension refused: the torch fallback's, else the refusal raised."""
        if self.fallback is None:
            raise refusal
        getattr(self.fallback, op)(*args)
        self.path = "torch"


class _Closed:
    """A closed team's runner and handle: every call and field raises (the team's
    handle is dropped)."""

    path = "none"

    def __getattr__(self, name):
        raise RuntimeError(f"tpdecode.Team.{name}: the team is closed")


_current_device = _capture.current_device_query()


def _caller_stream(device: int) -> int:
    """The stream this process's calls on `device` run on: torch's current one."""
    return torch.cuda.current_stream(device).cuda_stream


def _not_capturing(what):
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what} allocates symmetric buffers on every rank: do it before CUDA-graph capture")


def _device_index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise ValueError(f"a team lives on a CUDA device, not {d}")
    return torch.cuda.current_device() if d.index is None else d.index


class Team:
    """The ranks of one tensor-parallel group and tpdecode's collectives over them.

    Build with ``Team.from_process_group`` (one process per GPU, e.g. torchrun) or
    ``Team.local(n)`` (n ranks emulated on one GPU, for tests). Building is
    collective and happens before any CUDA-graph capture. Every call runs on the
    current torch stream, takes BF16 rows (gather: 16-bit floats, float32, int32)
    and must be made in the same order with the same shapes on every rank.

    On an NCCL team a tensor is ``[..., columns]`` (leading dimensions are rows). On
    a local team of n ranks every tensor is ``[n, ..., columns]``: block i is rank
    i's (ar_norm's weight is shared: ``[hidden]``).

    A call tpdecode does not take (see ``CommConfig``; a dtype it does not reduce)
    raises ``NotServed``, or runs with torch when built with ``fallback="torch"``.
    A peer that never arrives raises ``tpdecode.TimeoutError`` (from the call, or
    ``check_errors``/``synchronize``); every rank then calls ``reset()``."""

    def __init__(self, handle, config: CommConfig, group=None, fallback: Optional[str] = None):
        """Use ``Team.local`` or ``Team.from_process_group``."""
        if fallback not in (None, "torch"):
            raise ValueError(f"fallback={fallback!r}: None (raise NotServed) or 'torch'")
        handle.build_comm(config.hidden, config.rows, config.gather_row_bytes, config.algorithm, config.batch_invariant)
        self._handle = handle
        self._run = _Runner(handle, TorchFallback(group, handle.size) if fallback else None)
        self._id = _ops.register(self._run)
        self.config = config
        self.group = group

    # ---- construction ----
    @classmethod
    def local(cls, n: int, *, device=None, fallback: Optional[str] = None, **config) -> "Team":
        """n ranks (1, 2, 4, 8 or 16) emulated on one GPU; ``config``: ``CommConfig``'s fields."""
        cfg = CommConfig(**config)
        _not_capturing("Team.local")
        handle = _lib.module.local_team(int(n), _device_index(device), cfg.timeout_ms, cfg.pdl)
        return cls(handle, cfg, None, fallback)

    @classmethod
    def from_process_group(
        cls, group=None, *, device=None, fallback: Optional[str] = None, communicator: str = "own", **config
    ) -> "Team":
        """This process's rank of ``group`` (default: the world) on ``device`` (default:
        the current CUDA device); collective over the group.

        communicator="own": rank 0 makes an NCCL unique id, broadcast through
        torch.distributed, and every rank joins tpdecode's own communicator.
        communicator="split": tpdecode splits its communicator from the group's NCCL
        communicator (needs a torch that exposes it; the group's is never used
        again by tpdecode). Either way the group keeps working as before."""
        import torch.distributed as dist

        cfg = CommConfig(**config)
        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialized: call init_process_group first")
        group = dist.group.WORLD if group is None else group
        _not_capturing("Team.from_process_group")
        if _multicast.late:
            _multicast.warn_late()
        dev = _device_index(device)
        if communicator == "own":
            uid = _broadcast_unique_id(group, dev)
            handle = _lib.module.nccl_team(uid, dist.get_rank(group), dist.get_world_size(group), dev,
                                           cfg.timeout_ms, cfg.pdl)
        elif communicator == "split":
            handle = _lib.module.nccl_team_from_comm(_group_comm(group, dev), dev, cfg.timeout_ms, cfg.pdl)
        else:
            raise ValueError(f"communicator={communicator!r}: 'own' or 'split'")
        return cls(handle, cfg, group, fallback)

    # ---- what it is ----
    rank = property(lambda self: self._handle.rank, doc="This process's rank (a local team: 0).")
    size = property(lambda self: self._handle.size, doc="Ranks in the team.")
    device = property(lambda self: torch.device("cuda", self._handle.device))
    kind = property(lambda self: self._handle.kind, doc='"local" or "nccl".')
    shares_memory = property(
        lambda self: self._handle.shares_memory,
        doc="Whether the ranks reach each other's memory (mailbox paths); else every call runs NCCL.",
    )

    def __repr__(self):
        if isinstance(self._handle, _Closed):
            return "tpdecode.Team(closed)"
        return f"tpdecode.Team({self._handle.description}, {self.config})"

    @property
    def last_path(self):
        """(path, why) of the last eager call: "one-shot", "two-shot", "stock" (NCCL on
        tpdecode's communicator, or its local equivalent) or "torch" (the fallback),
        and why not a mailbox path."""
        return self._run.path, self._handle.last_why()

    def set_algorithm(self, algorithm: str) -> None:
        """Switch all_reduce / ar_norm between "auto", "one-shot", "two-shot" and "stock"."""
        self._handle.set_algorithm(algorithm)

    # ---- collectives ----
    def all_reduce(self, x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sum of every rank's ``x`` (BF16 partials summed in FP32 in rank order, rounded
        once: the same bits on every rank). Returns ``out`` (new unless given; may be x)."""
        out = torch.empty_like(x) if out is None else out
        if torch.compiler.is_compiling():
            torch.ops.tpdecode.all_reduce(x, out, self._id)
        else:
            self._run.all_reduce(x, out)
        return out

    def ar_norm(
        self,
        x: torch.Tensor,
        residual: Optional[torch.Tensor],
        weight: torch.Tensor,
        eps: float = 1e-6,
        *,
        out: Optional[torch.Tensor] = None,
        residual_out: Optional[torch.Tensor] = None,
        quant=None,
        scales_out: Optional[torch.Tensor] = None,
    ):
        """All-reduce of ``x``, plus ``residual`` (None: the embedding, no residual),
        then RMSNorm with ``weight``. Returns ``(out, residual_out)``: the normalised
        rows and the new residual (new tensors unless given; residual_out may be
        ``residual`` itself for an in-place update). ``eps``: finite, >= 0.

        quant: the normalised rows as FP8 (torch.float8_e4m3fn), quantised in the same
        kernel (the new residual stays BF16): a float32 tensor of one element (a static
        scale, read on the device at every call and replay: out = e4m3(v · (1 / scale)),
        as vLLM's static-FP8 rms_norm computes it), or "group" /
        "group-ue8m0" (vLLM's per_token_group_quant_fp8 with groups of 128 columns; the
        float32 scales [..., hidden / 128] written to ``scales_out`` and returned as a
        third value). The values are exactly the BF16 output quantised
        (tpdecode._quant; reference/fp8_quant.hpp says where that differs from vLLM)."""
        kind = _quant.kind_of(quant)
        if out is None:
            out = torch.empty_like(x) if kind == "none" else torch.empty_like(x, dtype=torch.float8_e4m3fn)
        residual_out = torch.empty_like(x) if residual_out is None else residual_out
        scale = quant if kind == "static" else None
        if kind in ("group", "group-ue8m0") and scales_out is None:
            scales_out = x.new_empty((*x.shape[:-1], x.shape[-1] // _quant.GROUP), dtype=torch.float32)
        if torch.compiler.is_compiling():
            # The op's schema takes a tensor of scales whatever the kind.
            scales = scales_out if scales_out is not None else x.new_empty(0, dtype=torch.float32)
            torch.ops.tpdecode.ar_norm(x, residual, weight, float(eps), out, residual_out, kind, scale, scales,
                                       self._id)
        else:
            self._run.ar_norm(x, residual, weight, float(eps), out, residual_out, kind, scale, scales_out)
        return (out, residual_out) if scale is not None or kind == "none" else (out, residual_out, scales_out)

    def gather(self, shard: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Every rank's ``shard`` [..., S] side by side: [..., size · S], rank r's at
        columns r·S. Bytes move unchanged, except a -0.0 word may arrive as +0.0."""
        if out is None:
            out = shard.new_empty((*shard.shape[:-1], self.size * shard.shape[-1]))
        if torch.compiler.is_compiling():
            torch.ops.tpdecode.gather(shard, out, self._id)
        else:
            self._run.gather(shard, out)
        return out

    # ---- failures ----
    def check_errors(self) -> None:
        """Raises tpdecode.TimeoutError if a call of this rank recorded a timeout or
        found the team aborted, tpdecode.TeamBroken once an NCCL team is unusable (its
        communicator was aborted: build a new team); cheap: no synchronisation."""
        self._handle.check_errors()

    def synchronize(self, timeout_s: Optional[float] = None) -> None:
        """Waits for this rank's work (at most ``timeout_s``, default the team's
        timeout + 1 s), then raises tpdecode.TimeoutError if any rank failed, a
        peer's timeout included; tpdecode.TeamBroken where the work did not drain in
        time and no rank recorded a failure (an NCCL team's communicator is then
        aborted: build a new team; a local team works again after ``reset`` once its
        work has drained)."""
        self._handle.synchronize(0 if timeout_s is None else max(1, int(timeout_s * 1000)),
                                 _caller_stream(self._handle.device))

    def reset(self) -> None:
        """Collective (every rank): re-arms every mailbox and clears the errors, so the
        team works again after a timeout."""
        self._handle.reset(_caller_stream(self._handle.device))

    def close(self) -> None:
        """Releases the team's buffers and communicator (collective on an NCCL team:
        every rank closes, or drops its last reference, at the same point), once the
        calls queued on the current stream have run (a bounded wait, as
        ``synchronize``; a team that failed is released all the same). Dropping the
        last reference releases it without that wait: synchronize first if calls may
        still be queued. Programs and blocks built on the team (``TeamProgram``,
        ``MlpBlock(team=...)``) hold it: its memory goes with the last of them. Every
        call on a closed team raises RuntimeError."""
        handle = getattr(self, "_handle", None)
        if handle is None or isinstance(handle, _Closed):
            return
        try:
            handle.synchronize(0, _caller_stream(handle.device))
        except Exception:  # noqa: BLE001  (a timeout was the calls' to report; the team goes either way)
            pass
        self._release()

    def _release(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and not isinstance(handle, _Closed):
            _ops.unregister(self._id)
            self._handle = self._run = _Closed()  # the runner holds the extension's team too

    __del__ = _release


def _broadcast_unique_id(group, device: int) -> bytes:
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    # Why: an NCCL-only group broadcasts CUDA tensors; one with a CPU backend, CPU ones.
    where = torch.device("cuda", device) if "gloo" not in backend and "nccl" in backend else torch.device("cpu")
    buf = torch.zeros(128, dtype=torch.uint8, device=where)
    if dist.get_rank(group) == 0:
        buf.copy_(torch.frombuffer(bytearray(_lib.module.nccl_unique_id()), dtype=torch.uint8))
    dist.broadcast(buf, src=dist.get_global_rank(group, 0), group=group)
    return bytes(buf.cpu().tolist())


def _group_comm(group, device: int) -> int:
    """The group's NCCL communicator (made now if torch has not made it yet)."""
    import torch.distributed as dist

    backend = group._get_backend(torch.device("cuda", device))
    if not hasattr(backend, "_comm_ptr"):
        raise NotImplementedError(
            "this torch does not expose its NCCL communicator (_comm_ptr): use communicator='own'"
        )
    # Why: torch makes a group's communicator at its first collective on the device.
    dist.all_reduce(torch.zeros(1, device=torch.device("cuda", device)), group=group)
    return int(backend._comm_ptr())
