"""Communicator: tpdecode's collectives in the shape engines give their all-reduce
backends (vLLM's device communicators, SGLang's custom all-reduce).

    comm = tpdecode.Communicator(group)        # collective; before any CUDA-graph capture
    if not comm.disabled:
        y = comm.all_reduce(x)                 # a new tensor, or None: use the next backend
        out = comm.fused_add_rms_norm(x, residual, weight, eps)   # (out, new residual) or None
    with comm.capture():                       # around torch.cuda.graph capture
        ...

Setting up is all or nothing across the group: every rank checks what it can (GPU
architecture, world size, the build's NCCL team), the ranks agree on it (an
all-reduce of the verdict), build the team together, and agree again: if any rank
failed, every rank is disabled (``disabled_reason`` says why) and its calls return
None. A call is taken where ``should_all_reduce`` / ``should_fused_add_rms_norm``
say so: BF16, contiguous, on the communicator's device, within the size cap (per
architecture and world size, ``TPDECODE_COMM_MAX_BYTES`` overrides it) and what the
team was built for; None otherwise, never an error for a call it does not take.
The verdict reads nothing that may differ from rank to rank in an SPMD program: a
tensor of a call at an address that is not 16-byte aligned (x, residual, weight,
out) runs through an aligned copy instead (an output is copied back), since were one
rank to hand a call to the next backend alone, or to raise, its peers would wait for
it in tpdecode's collective."""

import contextlib
from typing import Optional

import torch

from . import _comm_rules, _lib, _quant
from .errors import NotServed
from .team import CommConfig, Team, _device_index


def _agree(ok: bool, group, device: int) -> bool:
    """Whether every rank of `group` is ok (an all-reduce of the verdict, MIN)."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    where = torch.device("cuda", device) if "nccl" in backend and "gloo" not in backend else torch.device("cpu")
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=where)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


class _Aligned:
    """A call's tensors at 16-byte aligned addresses (the kernels move 16 bytes at a
    time; the module says why a misaligned one is not refused): each misaligned one
    replaced by an aligned copy, the same copy wherever the same tensor is given (an
    in-place pair stays one), the written ones copied back by finish(). Eager calls
    only: under torch.compile the op raises for one (a traced tensor has no address).
    ``of`` gives the shared _AS_GIVEN where every address is aligned (no copies: the
    common case costs one pass over the addresses)."""

    def __init__(self, tensors):
        self.copies = {}
        for t in tensors:
            if t is not None and t.data_ptr() % 16 and id(t) not in self.copies:
                self.copies[id(t)] = t.clone()

    @staticmethod
    def of(tensors):
        bits = 0
        for t in tensors:
            if t is not None:
                bits |= t.data_ptr()
        return _Aligned(tensors) if bits % 16 else _AS_GIVEN

    def __call__(self, t):
        return self.copies.get(id(t), t) if t is not None else None

    def finish(self, written) -> None:
        for t in written:
            if t is not None and id(t) in self.copies:
                t.copy_(self.copies[id(t)])


_AS_GIVEN = _Aligned(())  # no copies: every tensor as given


def _nccl_team_available() -> bool:
    return any(b["name"] == "NCCL team" and b["serves"] for b in _lib.module.info()["backends"])


def _capability(device: int):
    return torch.cuda.get_device_capability(device)


class Communicator:
    """tpdecode's all-reduce and fused all-reduce + residual + RMSNorm (+ FP8) for an
    engine. Build with ``Communicator(group)`` (one process per GPU, collective over
    the group) or ``Communicator.local(n)`` (n ranks on one GPU, for tests: every
    tensor then leads with a dimension of n).

    hidden, rows: the widest row and the most rows per call the buffers hold (rows
    beyond them are not taken, unless batch_invariant, where they run as further
    calls); max_bytes: the size cap (default: the table in tpdecode._comm_rules, or
    TPDECODE_COMM_MAX_BYTES); batch_invariant: a row's bits do not depend on the
    batch (CommConfig.batch_invariant); timeout_ms: the team's deadline."""

    def __init__(self, group=None, *, device=None, hidden: int = 8192, rows: int = 64,
                 max_bytes: Optional[int] = None, batch_invariant: bool = False, timeout_ms: int = 0,
                 _team: Optional[Team] = None):
        self._kept = {}  # (op, quant kind) -> {key: refusal} (_eager_refusal)
        self.disabled = True
        self.disabled_reason = ""
        self.max_bytes = 0
        self.batch_invariant = batch_invariant
        self._team = None
        self._abandoned = None  # a team built here while a peer failed: kept, never used
        if _team is not None:  # Communicator.local
            self._enable(_team, max_bytes)
            return
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialized: call init_process_group first")
        group = dist.group.WORLD if group is None else group
        dev = _device_index(device)
        world = dist.get_world_size(group)
        why = _comm_rules.setup_refusal(_capability(dev), world, _nccl_team_available())
        if not _agree(not why, group, dev):
            self.disabled_reason = why or "another rank cannot set tpdecode up"
            return
        team = None
        try:
            team = Team.from_process_group(group, device=dev, hidden=hidden, rows=rows,
                                           batch_invariant=batch_invariant, timeout_ms=timeout_ms)
        except Exception as e:  # noqa: BLE001 (any failure disables, on every rank)
            why = f"setting up the team failed: {e}"
        if not _agree(team is not None, group, dev):
            self.disabled_reason = why or "setting up the team failed on another rank"
            # Why not closed: closing is collective, and a peer has no team to close.
            self._abandoned = team
            return
        self._enable(team, max_bytes)

    @classmethod
    def local(cls, n: int, *, device=None, hidden: int = 8192, rows: int = 64, max_bytes: Optional[int] = None,
              batch_invariant: bool = False, timeout_ms: int = 0) -> "Communicator":
        """n ranks on one GPU (tests, benchmarks): every tensor leads with n blocks."""
        team = Team.local(n, device=device, hidden=hidden, rows=rows, batch_invariant=batch_invariant,
                          timeout_ms=timeout_ms)
        return cls(max_bytes=max_bytes, batch_invariant=batch_invariant, _team=team)

    def _enable(self, team: Team, max_bytes: Optional[int]):
        cfg: CommConfig = team.config
        self._team = team
        self._device = team.device
        self._device_index = self._device.index
        # Why not for one rank: its tensors have no leading dimension of ranks (as Team's).
        self._lead = team.size if team.kind == "local" and team.size > 1 else 0
        capability = _capability(self._device)
        capacity = None if cfg.batch_invariant else cfg.rows * cfg.hidden * 2
        self.max_bytes = _comm_rules.max_bytes(capability, team.size, capacity, max_bytes)
        self.disabled = self.max_bytes == 0
        if self.disabled:
            self.disabled_reason = (f"size cap 0: compute capability {capability} at world size {team.size} has no "
                                    f"entry in the table, or max_bytes / {_comm_rules.MAX_BYTES_ENV} is 0")

    @property
    def team(self) -> Optional[Team]:
        """The team the calls run on (None when disabled)."""
        return None if self.disabled else self._team

    # Why properties: the kept verdicts depend on them; a change forgets them.
    @property
    def max_bytes(self) -> int:
        """The size cap: the largest x (bytes per rank) a call takes."""
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int):
        self._max_bytes = value
        self._kept.clear()

    @property
    def batch_invariant(self) -> bool:
        return self._batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, value: bool):
        self._batch_invariant = value
        self._kept.clear()

    def refusal(self, op: str, x: torch.Tensor, quant=None) -> str:
        """Why `op` ("all_reduce" or "fused_add_rms_norm") does not take x, "" where it does."""
        if op not in ("all_reduce", "fused_add_rms_norm"):
            raise ValueError(f"Communicator.refusal: op {op!r} (all_reduce or fused_add_rms_norm)")
        return self._refusal(op, x, _quant.kind_of(quant), torch.compiler.is_compiling())

    def _refusal(self, op: str, x: torch.Tensor, kind: str, compiling: bool) -> str:
        if not compiling:
            return self._eager_refusal(op, x, kind)
        if self.disabled:
            return f"disabled: {self.disabled_reason}"
        return self._rules_refusal(op, x, kind, x.is_contiguous(), x.device == self._device)

    def _eager_refusal(self, op: str, x: torch.Tensor, kind: str) -> str:
        if self.disabled:
            return f"disabled: {self.disabled_reason}"
        contiguous = x.is_contiguous()
        same_device = x.get_device() == self._device_index
        if not (contiguous and same_device):
            return self._rules_refusal(op, x, kind, contiguous, same_device)
        # Why kept: for a contiguous x on the device the rest of the verdict is the
        # dtype's and the shape's, the same call after call in a decode loop (the
        # team's sizes are fixed; a change of max_bytes or batch_invariant forgets
        # them). The key is the shape alone for bfloat16, the one dtype served (a
        # torch.Size never equals a (dtype, shape) pair).
        kept = self._kept.get((op, kind))
        if kept is None:
            kept = self._kept[(op, kind)] = {}
        key = x.shape if x.dtype is torch.bfloat16 else (x.dtype, x.shape)
        why = kept.get(key)
        if why is None:
            if len(kept) >= 1024:
                kept.clear()
            why = kept[key] = self._rules_refusal(op, x, kind, True, True)
        return why

    def _rules_refusal(self, op: str, x: torch.Tensor, kind: str, contiguous: bool, same_device: bool) -> str:
        cfg = self._team.config
        dtype = "bfloat16" if x.dtype == torch.bfloat16 else str(x.dtype).removeprefix("torch.")
        return _comm_rules.call_refusal(op, dtype, x.shape, contiguous, same_device, x.numel() * x.element_size(),
                                        self.max_bytes, cfg.hidden, cfg.rows, self.batch_invariant, self._lead, kind)

    def should_all_reduce(self, x: torch.Tensor) -> bool:
        return not self.refusal("all_reduce", x)

    def should_fused_add_rms_norm(self, x: torch.Tensor, quant=None) -> bool:
        return not self.refusal("fused_add_rms_norm", x, quant)

    def all_reduce(self, x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The sum of every rank's x (rank order, FP32, one rounding), or None where the
        communicator does not take x (the caller's next backend runs it). out: where to
        write it (x's shape and dtype; a new tensor when None): a caller that keeps its
        buffers saves the allocation's host time."""
        if torch.compiler.is_compiling():  # the refusal is the op's own: it serves
            return None if self._refusal("all_reduce", x, "none", True) else self._team.all_reduce(x, out=out)
        if self._eager_refusal("all_reduce", x, "none"):
            return None
        # Why not Team.all_reduce: the runner's call alone, one compile check per call.
        if out is None:
            out = torch.empty_like(x)
        a = _Aligned.of((x, out))
        try:
            self._team._run.all_reduce(a(x), a(out))
            a.finish((out,))
        except NotServed:
            return None
        return out

    def fused_add_rms_norm(self, x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                           eps: float, quant=None, *, out: Optional[torch.Tensor] = None,
                           residual_out: Optional[torch.Tensor] = None):
        """All-reduce of x, plus residual (None: none), RMSNorm with weight: returns
        (out, new residual), or (out, new residual, scales) for a group quant, or None
        where the communicator does not take x. quant: None (BF16 out), a float32 scale
        tensor of one element (static FP8), "group" or "group-ue8m0" (Team.ar_norm).
        out, residual_out: where to write them (new tensors when None; residual_out may
        be residual itself, the in-place update of vLLM's fused_add_rms_norm); given,
        the call spends no host time on allocations."""
        kind = "none" if quant is None else _quant.kind_of(quant)
        if torch.compiler.is_compiling():
            if self._refusal("fused_add_rms_norm", x, kind, True):
                return None
            return self._team.ar_norm(x, residual, weight, eps, quant=quant, out=out, residual_out=residual_out)
        if self._eager_refusal("fused_add_rms_norm", x, kind):
            return None
        tensors = (x, residual, weight, out, residual_out)
        a = _Aligned.of(tensors)
        try:
            if kind != "none":
                got = self._team.ar_norm(a(x), a(residual), a(weight), eps, quant=quant, out=a(out),
                                         residual_out=a(residual_out))
                a.finish((out, residual_out))
                return (got[0] if out is None else out, got[1] if residual_out is None else residual_out, *got[2:])
            # Why not Team.ar_norm for BF16: the runner's call alone (see all_reduce).
            if out is None:
                out = torch.empty_like(x)
            if residual_out is None:
                residual_out = torch.empty_like(x)
            self._team._run.ar_norm(a(x), a(residual), a(weight), float(eps), a(out), a(residual_out), kind, None,
                                    None)
            a.finish((out, residual_out))
            return out, residual_out
        except NotServed:
            return None

    @contextlib.contextmanager
    def capture(self):
        """Around a CUDA-graph capture (as engines wrap their all-reduce backends'):
        makes the communicator's device current, so a ``torch.cuda.graph`` opened
        inside captures on it (tpdecode._capture says what goes wrong otherwise).
        tpdecode's buffers are fixed when the communicator is built and its epochs
        live on the device: there is nothing to register or to copy at the end."""
        if self._team is None:
            yield
            return
        with torch.cuda.device(self._device):
            yield

    def close(self) -> None:
        """Releases the team (collective on an NCCL team: every rank at the same point)."""
        if self._team is not None:
            self._team.close()
            self._team = None
            self.disabled = True
            self.disabled_reason = "closed"
