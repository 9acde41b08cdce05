"""Persistent programs: ``GemmProgram``, a chain of decode GEMMs and RMSNorms as one
kernel (the C++ GemmProgram, TP 1); ``TeamProgram``, one such kernel per rank of a team
whose norms may all-reduce (TP > 1); and ``MlpBlock``, a decoder layer's MLP block with
the projections beside it built as one, or at TP 1 above 16 rows as launches (the C++
MlpBlockProgram; with a team, TeamMlpBlock)."""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import torch

from . import _capture, _lib, _ops
from .team import _Closed


def _team_handle(team, what: str):
    """The extension's team of a tpdecode.Team (ValueError once the team is closed)."""
    handle = getattr(team, "_handle", None)
    if handle is None or isinstance(handle, _Closed):
        raise ValueError(f"{what}: the team is closed")
    return handle


_current_device = _capture.current_device_query()


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # Why: DLPack does not export tensors that require grad (parameters).
    return None if t is None else t.detach()


def _runner(handle, reads: List[torch.Tensor], writes: List[torch.Tensor]):
    """What the custom op ``tpdecode::program`` runs (holding the handle and detached
    views of the buffers, not the Python program object). The kernel reads and writes
    the buffers the program was built on; where the compiler hands other tensors
    (copies of them, as functionalization makes), their values are copied in before
    the run and the results out after."""
    built_reads, built_writes = [t.detach() for t in reads], [t.detach() for t in writes]
    on = built_writes[0]

    def run(given_reads: List[torch.Tensor], given_writes: List[torch.Tensor], pdl: bool) -> None:
        # A written buffer may be read too (a residual updated in place): both copied in.
        for given, built in zip([*given_reads, *given_writes], [*built_reads, *built_writes]):
            if given.data_ptr() != built.data_ptr():
                built.copy_(given)
        handle.run(on, pdl)
        for given, built in zip(given_writes, built_writes):
            if given.data_ptr() != built.data_ptr():
                given.copy_(built)

    return run


class _Program:
    """What a built program's call does: run on the current stream (one kernel, or an
    MlpBlock's launches, on the buffers it was built on), or under torch.compile the custom op
    ``tpdecode::program``, given the buffers it reads (inputs, a norm op's weight) and
    writes. The GEMMs' weights (and a folded norm's) are copied at build: updating
    them later changes nothing; an unfolded norm's weight is read at every run."""

    def _bind(self, handle, reads: List[torch.Tensor], writes: List[torch.Tensor]) -> None:
        self._handle = handle
        self._device = handle.device
        # The op is given whole tensors, each once: a view's base, not the view. Why:
        # views of one tensor as separate arguments (each rank's rows of a local
        # team's buffer, outs in column windows of one buffer) alias each other, and
        # torch 2.11's inductor handed the op wrong values for such arguments. One
        # read and written (a residual in place, a residual stream) is a write.
        def once(tensors, skip=()):
            wholes = {}
            for t in tensors:
                w = t if t._base is None else t._base
                k = w.data_ptr(), tuple(w.shape), tuple(w.stride())
                if k not in skip:
                    wholes[k] = w
            return wholes

        written = once(writes)
        self._writes = list(written.values())
        self._reads = list(once(reads, written).values())
        self._given = list(reads) + list(writes)  # the storage check: the tensors as the caller gave them
        self._pointers = [t.data_ptr() for t in self._given]
        self._on = self._writes[0].detach()  # the extension takes torch's current stream from it
        self._run = handle.run
        self._id = _ops.register(_runner(handle, self._reads, self._writes))

    def __del__(self):
        _ops.unregister(getattr(self, "_id", 0))

    def _launch(self, pdl: bool) -> None:
        if torch.compiler.is_compiling():
            torch.ops.tpdecode.program(self._reads, self._writes, self._id, pdl)
            return
        if any(t.data_ptr() != p for t, p in zip(self._given, self._pointers)):
            # Why: the kernel reads and writes the addresses it was built on.
            raise RuntimeError(f"{type(self).__name__}: a buffer's storage moved (its .data was replaced): build "
                               "a new program for it, or copy values in place")
        if _current_device() != self._device:
            _capture.check_capture_device(self._device, type(self).__name__)
        self._run(self._on, bool(pdl))


def _not_capturing(what: str) -> None:
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what} under CUDA-graph capture: build it before capturing")


@dataclass
class Gemm:
    """``out = x · weightᵀ`` (weight [N, K], x [M, K], out [M, N]); with ``silu_mul``
    the weight is an MLP's gate_up (N/2 gate rows, then N/2 up rows) and out [M, N/2]
    is silu(gate) · up. ``after``: the index of the earlier op whose out x is a column
    window of (None: x is an input of the program)."""

    weight: torch.Tensor
    x: torch.Tensor
    out: torch.Tensor
    after: Optional[int] = None
    silu_mul: bool = False


@dataclass
class Norm:
    """An RMSNorm of x's rows: h = x (+ residual), stored to residual_out where given;
    out = h · rsqrt(mean(h²) + eps) · weight. ``residual``: an input, or an earlier
    Norm's residual_out (a residual stream; in place if you like). ``folded``: the
    GEMMs that read out take the norm into their weights and sums instead (out is then
    not written; see docs/integration.md). ``all_reduce`` (a ``TeamProgram``'s norm
    only, not folded): x is the rank's partial of a row-parallel GEMM, summed over the
    team (FP32 in rank order, one BF16 rounding: the one-shot all-reduce's bits)
    before the residual add."""

    x: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    after: Optional[int] = None
    eps: float = 1e-6
    residual: Optional[torch.Tensor] = None
    residual_out: Optional[torch.Tensor] = None
    folded: bool = False
    all_reduce: bool = False


def _add_ops(who: str, ops, add_gemm, add_norm, reads: List[torch.Tensor], writes: List[torch.Tensor]) -> None:
    """Adds ``ops`` (one program's, in order) through the handle's add_gemm / add_norm,
    and lists the buffers the kernel touches: an x that is an earlier op's out is read
    from the program's own copy; a folded norm's out is not written."""
    for i, op in enumerate(ops):
        if not isinstance(op, (Gemm, Norm)):
            raise TypeError(f"{who}: op {i} is a {type(op).__name__}; tpdecode.program.Gemm or Norm expected")
        after = -1 if op.after is None else int(op.after)
        if not -1 <= after < i:
            raise ValueError(f"{who}: op {i}'s after is {op.after}: an earlier op's index or None")
        if after < 0:
            reads.append(op.x)
        if isinstance(op, Gemm):
            add_gemm(_detached(op.weight), _detached(op.x), _detached(op.out), after, bool(op.silu_mul))
            writes.append(op.out)
        else:
            add_norm(_detached(op.x), after, _detached(op.weight), float(op.eps), _detached(op.residual),
                     _detached(op.residual_out), _detached(op.out), bool(op.folded), bool(op.all_reduce))
            reads += [t for t in (op.residual, None if op.folded else op.weight) if t is not None]
            writes += [t for t in (None if op.folded else op.out, op.residual_out) if t is not None]


class GemmProgram(_Program):
    """A chain of ``Gemm`` and ``Norm`` ops on fixed buffers (BF16, one CUDA device,
    1 to 64 rows: x's rows) run as one persistent kernel: one CTA per SM runs every
    op in order, the next ops' weights stream while an op finishes, and an op's math
    waits only for the outputs it reads. Bits are repeatable from run to run (not
    torch's nor DecodeGemm's order). It packs its own copy of every weight (as much
    memory once more) and keeps the tensors referenced.

    It needs every SM of the GPU while it runs (its CTAs wait on each other): do not
    run it beside kernels that hold SMs for good; run one call of a program at a time.
    A norm with ``all_reduce`` needs a ``TeamProgram`` (ValueError here). Build it
    outside CUDA-graph capture; calls may be captured (a graph replays on the
    program's memory: keep the program while the graph lives). The GEMMs' weights
    (and a folded norm's) are copied at build; a norm op reads its weight at every
    run. Ops the program does not take raise ValueError naming the op (TypeError for
    a dtype, ``tpdecode.Unavailable`` for what the GPU or the program's limits do not
    serve)."""

    def __init__(self, ops: Sequence[Union[Gemm, Norm]]):
        _not_capturing("GemmProgram")
        if not ops:
            raise ValueError("GemmProgram: no ops")
        handle = _lib.module.gemm_program()
        reads, writes = [], []
        _add_ops("GemmProgram", ops, handle.add_gemm, handle.add_norm, reads, writes)
        rows = ops[0].x.numel() // ops[0].x.shape[-1]
        handle.build(rows)
        self.rows = rows
        self.ops = list(ops)
        self._bind(handle, reads, writes)

    def __call__(self, *, pdl: bool = True) -> None:
        """Runs every op on the current stream. With ``pdl`` the kernel's weights start
        streaming during the previous kernel's tail (its inputs are read after that
        kernel completes)."""
        self._launch(pdl)


class TeamProgram(_Program):
    """A ``GemmProgram`` on every rank of a ``tpdecode.Team`` (the C++ TeamProgram),
    whose ``Norm`` ops may all-reduce their x over the team (``all_reduce=True``): the
    TP > 1 decode layer as one persistent kernel per rank. A row-parallel GEMM's out
    (the rank's partial) is such a norm's x; the norm pushes it into every rank's
    mailbox, sums the team's in rank order (the one-shot all-reduce's bits), adds the
    residual and normalises, while the next ops' weights already stream. Every rank
    gets the same bits, run after run.

    ``ops``: one op list per rank this team object drives, each as ``GemmProgram``
    takes it: on an NCCL team (torchrun) this process's rank's list (``[ops]``, or the
    list itself); on a local team of n, n lists (list i rank i's, each on its own
    tensors, e.g. block i of ``[n, ...]`` buffers). Every rank has the same row count
    and the same all-reduce norms (order and widths). Building is collective over the
    team and happens before any CUDA-graph capture; ranks that do not share memory
    (an NCCL team without peer access) raise ``tpdecode.Unavailable``. Each rank's
    program takes the SMs of its GPU divided by the ranks sharing it (every rank's
    program must be resident at once). A rank that never arrives raises through the
    team (``Team.synchronize``; then ``Team.reset`` on every rank: the program is usable
    again). What ``GemmProgram`` says of memory, weights, bits, errors and capture
    holds."""

    def __init__(self, team, ops):
        _not_capturing("TeamProgram")
        handle = _lib.module.team_program(_team_handle(team, "TeamProgram"))
        lists = list(ops)
        if handle.driven == 1 and lists and isinstance(lists[0], (Gemm, Norm)):
            lists = [lists]
        if any(isinstance(o, (Gemm, Norm)) for o in lists):
            raise TypeError(f"TeamProgram: a flat op list for a team object driving {handle.driven} ranks: "
                            "one list per rank")
        if len(lists) != handle.driven:
            raise ValueError(f"TeamProgram: {len(lists)} op lists for a team object driving {handle.driven} "
                             f"rank(s): one list per rank")
        reads, writes = [], []
        for rank, rank_ops in enumerate(lists):
            rank_ops = list(rank_ops)
            if not rank_ops:
                raise ValueError(f"TeamProgram: no ops for rank {rank}")
            _add_ops(f"TeamProgram (rank {rank})", rank_ops,
                     lambda *a, r=rank: handle.add_gemm(r, *a), lambda *a, r=rank: handle.add_norm(r, *a),
                     reads, writes)
        first = lists[0][0].x
        handle.build(first.numel() // first.shape[-1])
        self.rows = handle.rows
        self.ctas = handle.ctas
        self.team = team
        self.ops = [list(o) for o in lists]
        self._bind(handle, reads, writes)

    def __call__(self) -> None:
        """Runs every driven rank's program from the current stream (a local team's
        ranks on the team's streams, forked from it and joined back); programmatic
        dependent launch as the team's ``pdl`` says."""
        self._launch(True)


class MlpBlock(_Program):
    """A dense decoder layer's stretch between two attentions at TP 1, run on the
    current torch stream as one kernel up to 16 rows (``form`` "program") and above as
    a GEMM per linear with the norm and SiLU-mul kernels between them (``form``
    "launches", which measured faster there)::

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
    bfloat16 on one CUDA device; weights [N, K] (o_proj [H, A], gate_up [2I, H],
    down [H, I], qkv [Q, H]), norm weights [H]; H, I and A multiples of 64; M from 1
    to 64. Each norm is folded into the GEMMs that read it where the block's form and
    the program serve that (``post_norm_folded``, ``next_norm_folded``);
    ``fold=False`` keeps norm ops. What ``GemmProgram`` says of memory, SMs, weights,
    bits, errors and capture holds (the launches: weights copied, bits repeatable, the
    GEMMs' paths decided here). ``form`` asks for one form ("program" or "launches";
    ValueError where the launches do not serve the tensors).

    With ``team`` (a ``tpdecode.Team``), the block at TP > 1 (the C++ TeamMlpBlock):
    o_proj and down are row-parallel (o_proj [H, A/tp], attn [M, A/tp]; down [H,
    I/tp]), their partials all-reduced into the residual before each norm; gate_up
    ([2I/tp, H]: the rank's gate rows, then its up rows) and qkv ([Q/tp, H])
    column-parallel. Without o_proj, attn [M, H] is the rank's partial. ``next_norm``
    is required and no norm folds. By default, up to 16 rows one kernel per rank with
    the all-reduces inside where each rank has its GPU and the ranks share memory (an
    NCCL team over NVLink), else launches with the team's ``ar_norm`` (a local team's
    ranks share one GPU, where the launches measured faster). ``form="program"`` asks
    for the kernel wherever it is served (a local team too); where it is not (ranks
    that do not share memory, a norm's share of a rank's CTAs above what they hold):
    ``tpdecode.Unavailable``. Tensors are the rank's (a
    local team of n: ``[n, ...]``, block i rank i's), contiguous; the norm weights [H]
    are every rank's. Every rank's residual holds the same bits after a call. The
    block keeps the team alive; a rank that never arrives raises through the team
    (``Team.synchronize``; then ``Team.reset`` on every rank). The launches of a
    team's blocks of one H, row count and ``comm_group`` share one ``ar_norm``
    communicator: call them one after another (a model's layers); blocks that may run
    at the same time (two micro-batches on two streams under torchrun) need other
    ``comm_group`` values, else they meet in its mailboxes (wrong values or a
    timeout, not an error). A ``comm_group`` other than 0 runs as launches (the
    program form holds a rank's SMs and waits on its peers; ``form="program"`` with
    it: ValueError)."""

    def __init__(self, *, post_norm: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                 attn: torch.Tensor, residual: torch.Tensor, out: torch.Tensor,
                 o_proj: Optional[torch.Tensor] = None, next_norm: Optional[torch.Tensor] = None,
                 qkv: Optional[torch.Tensor] = None, eps: float = 1e-6, fold: bool = True,
                 form: Optional[str] = None, team=None, comm_group: int = 0):
        if team is None and comm_group != 0:
            raise ValueError("MlpBlock: comm_group is a team block's (team=...)")
        if isinstance(comm_group, bool) or not isinstance(comm_group, int) or comm_group < 0:
            raise ValueError(f"MlpBlock: comm_group must be an int, 0 or more (got {comm_group!r})")
        _not_capturing("MlpBlock")
        weights = [o_proj, post_norm, gate_up, down, next_norm, qkv]
        if team is None:
            handle = _lib.module.mlp_block(*map(_detached, weights), float(eps), _detached(attn),
                                           _detached(residual), _detached(out), bool(fold), form or "")
            self.post_norm_folded = handle.post_norm_folded
            self.next_norm_folded = handle.next_norm_folded
            self.form = "launches" if handle.launches else "program"
        else:
            if next_norm is None:
                raise ValueError("MlpBlock: a team block needs next_norm (down's partial is all-reduced into it)")
            handle = _lib.module.team_mlp_block(_team_handle(team, "MlpBlock"), *map(_detached, weights), float(eps), _detached(attn),
                                                _detached(residual), _detached(out), form or "", int(comm_group))
            self.post_norm_folded = self.next_norm_folded = False
            self.form = "launches" if handle.launches else "program"
        self.rows = handle.rows
        self.team = team
        self.attn, self.residual, self.out = attn, residual, out
        norm_weights = [post_norm] if not self.post_norm_folded else []
        if next_norm is not None and not self.next_norm_folded:
            norm_weights.append(next_norm)
        self._bind(handle, [attn] + norm_weights, [out, residual])

    def __call__(self, *, pdl: bool = True) -> torch.Tensor:
        """Runs the block on the current stream and returns ``out``. With ``pdl`` the
        first kernel's weights start streaming during the previous kernel's tail (its
        inputs are read after that kernel completes), and each of the launches form's
        kernels is a dependent of the one before. A block built with ``team`` launches
        as the team's ``pdl`` (CommConfig) says, whatever ``pdl`` is given here."""
        self._launch(pdl)
        return self.out
