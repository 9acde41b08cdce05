"""PyTorch custom ops, so torch.compile traces tpdecode calls and CUDA graphs capture
them. Every op writes into tensors it is given (the fake implementations have nothing
to infer; a program's op, whose kernel works on fixed buffers, copies into those it
is given where they are others) and names what runs it by the id ``register`` gave
it: a team's runner (its method of the op's name: the C++ call, or the fallback), a
DecodeGemm's call or a program's runner (GemmProgram, MlpBlock). Eager calls skip
the dispatcher and run the same thing directly."""

import itertools
from typing import List, Optional

import torch

objects: dict = {}
_ids = itertools.count(1)


def register(run) -> int:
    i = next(_ids)
    objects[i] = run
    return i


def unregister(i: int) -> None:
    objects.pop(i, None)


def _live(i: int):
    """What runs a compiled call's op (RuntimeError once its object was closed or freed)."""
    run = objects.get(i)
    if run is None:
        raise RuntimeError(f"tpdecode: a compiled call's team, DecodeGemm or program (id {i}) was closed or freed")
    return run


@torch.library.custom_op("tpdecode::all_reduce", mutates_args=("out",))
def _all_reduce(x: torch.Tensor, out: torch.Tensor, team: int) -> None:
    _live(team).all_reduce(x, out)


@torch.library.custom_op("tpdecode::ar_norm", mutates_args=("out", "residual_out", "scales"))
def _ar_norm(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor,
    quant: str,
    scale: Optional[torch.Tensor],
    scales: torch.Tensor,
    team: int,
) -> None:
    # quant: "none", "static" (scale read) or "group"/"group-ue8m0" (scales written).
    _live(team).ar_norm(x, residual, weight, eps, out, residual_out, quant, scale, scales)


@torch.library.custom_op("tpdecode::gather", mutates_args=("out",))
def _gather(shard: torch.Tensor, out: torch.Tensor, team: int) -> None:
    _live(team).gather(shard, out)


@torch.library.custom_op("tpdecode::decode_gemm", mutates_args=("out",))
def _decode_gemm(x: torch.Tensor, out: torch.Tensor, gemm: int) -> None:
    _live(gemm)(x, out)


@torch.library.custom_op("tpdecode::program", mutates_args=("writes",))
def _program(reads: List[torch.Tensor], writes: List[torch.Tensor], program: int, pdl: bool) -> None:
    # A GemmProgram or MlpBlock runs on the buffers it was built on; the compiler may
    # hand copies of them (the runner copies values in and out where it does).
    _live(program)(reads, writes, pdl)


def _writes_only(*args) -> None:
    """Fake implementation: outputs are the caller's tensors, nothing to infer."""


for _op in (_all_reduce, _ar_norm, _gather, _decode_gemm, _program):
    _op.register_fake(_writes_only)
