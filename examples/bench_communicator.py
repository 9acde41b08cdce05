"""Host cost of tpdecode.Communicator's eager calls (µs per call, the calls queued
without synchronising; target <= 10 µs), against the team call it wraps, and the
same calls' GPU time inside a torch CUDA graph. FP8 epilogues included; the
extension's calls alone (outputs given, no Python checks) show what of the host time
is not Python's.

    python examples/bench_communicator.py                         # a local team of 2 on one GPU
    python examples/bench_communicator.py --ranks 1               # one rank: a process's own launch, as on an NCCL team
    torchrun --nproc-per-node 2 examples/bench_communicator.py    # the world's NCCL team

A local team of n > 1 drives its n ranks from one thread (n launches, the stream
fork and join); a rank of an NCCL team, like a local team of 1, launches once on the
caller's stream. The rows without a graph time are steps of an eager call alone, to
attribute its host time: the tvm-ffi crossing of the extension call's arguments
(tvm-ffi's no-op function given the same tensors: the extension call less it is the
C++ and the launch), the output's allocation (and torch.empty, the other route), the
compile check, the current-device query (the capture check), the torch queries of x
the communicator's refusal reads per call, and the refusal itself.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import tvm_ffi

import tpdecode
from bench_ops import in_graph_us  # this folder's: the same in-graph timing


def host_us(fn, calls=2000, batch=100):
    """Median over batches of `batch` calls of the host time per call; the GPU drains
    between batches, so the launch queue never fills (a full queue blocks the host)."""
    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(calls // batch):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter() - t0) * 1e6 / batch)
        torch.cuda.synchronize()
    return sorted(per_call)[len(per_call) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--ranks", type=int, default=2, help="the local team's ranks (without torchrun)")
    args = p.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        comm = tpdecode.Communicator(hidden=args.hidden, rows=max(args.rows))
        lead = ()
    else:
        # Why max_bytes for one rank: the size-cap table has no world size 1.
        comm = tpdecode.Communicator.local(args.ranks, hidden=args.hidden, rows=max(args.rows),
                                           max_bytes=(64 << 20) if args.ranks == 1 else None)
        lead = (comm.team.size,)
    if comm.disabled:
        raise SystemExit(f"communicator disabled: {comm.disabled_reason}")
    team = comm.team
    weight = torch.randn(args.hidden, device="cuda").to(torch.bfloat16)
    scale = torch.tensor([0.02], device="cuda")
    nop = tvm_ffi.get_global_func("testing.nop", allow_missing=True)  # tvm-ffi's own no-op
    lines = []
    for rows in args.rows:
        x = torch.randn(*lead, rows, args.hidden, device="cuda").to(torch.bfloat16)
        residual = torch.randn_like(x)
        given = [torch.empty_like(x) for _ in range(3)]
        in_place = residual.clone()
        handle = team._handle  # the extension's calls alone: their outputs given, no Python checks
        shape, kw = tuple(x.shape), {"dtype": x.dtype, "device": x.device}
        calls = {
            "extension all_reduce": lambda: handle.all_reduce(x, given[0]),
            "extension ar_norm": lambda: handle.ar_norm(x, residual, weight, 1e-6, given[1], given[2], "none", None),
            "Communicator.all_reduce": lambda: comm.all_reduce(x),
            "Team.all_reduce": lambda: team.all_reduce(x),
            "Team.all_reduce, out given": lambda: team.all_reduce(x, out=given[0]),
            "Communicator.all_reduce, out given": lambda: comm.all_reduce(x, out=given[0]),
            "Communicator.fused_add_rms_norm": lambda: comm.fused_add_rms_norm(x, residual, weight, 1e-6),
            # vLLM's form: the residual updated in place, the output into a kept buffer.
            "fused_add_rms_norm, outputs given": lambda: comm.fused_add_rms_norm(x, in_place, weight, 1e-6,
                                                                                 out=given[1], residual_out=in_place),
            "Team.ar_norm": lambda: team.ar_norm(x, residual, weight, 1e-6),
            "Team.ar_norm, outputs given": lambda: team.ar_norm(x, residual, weight, 1e-6, out=given[1],
                                                                residual_out=given[2]),
            "fused_add_rms_norm, static FP8": lambda: comm.fused_add_rms_norm(x, residual, weight, 1e-6, quant=scale),
            "fused_add_rms_norm, group FP8": lambda: comm.fused_add_rms_norm(x, residual, weight, 1e-6, quant="group"),
            # torch's own ops on the same tensors: the floor of an eager op that returns
            # a new tensor (one allocation, one launch), and of one without allocation.
            "torch.add (torch's op, new output)": lambda: torch.add(x, residual),
            "Tensor.copy_ (torch's op, out given)": lambda: given[0].copy_(x),
        }
        steps = {  # nothing launched
            "torch.empty_like": lambda: torch.empty_like(x),
            "torch.empty(shape, dtype, device)": lambda: torch.empty(shape, **kw),
            "torch.compiler.is_compiling": torch.compiler.is_compiling,
            "torch.cuda.current_device": torch.cuda.current_device,
            "torch._C._cuda_getDevice": torch._C._cuda_getDevice,
            "x.is_contiguous, get_device, data_ptr": lambda: (x.is_contiguous(), x.get_device(), x.data_ptr()),
            "Communicator.refusal": lambda: comm.refusal("all_reduce", x),
        }
        if nop is not None:
            steps["tvm-ffi crossing, all_reduce's args"] = lambda: nop(x, given[0])
            steps["tvm-ffi crossing, ar_norm's args"] = lambda: nop(x, residual, weight, 1e-6, given[1], given[2],
                                                                    "none", None)
        for name, fn in calls.items():
            lines.append((rows, name, host_us(fn), in_graph_us(fn)))
        for name, fn in steps.items():
            lines.append((rows, name, host_us(fn), None))
    team.check_errors()
    if team.rank == 0:
        print(f"{team!r} on {torch.cuda.get_device_name()}, hidden {args.hidden}")
        print(f"{'rows':>4}  {'call':<38} {'host us/call':>12} {'graph us/call':>14}")
        for rows, name, host, graph in lines:
            print(f"{rows:>4}  {name:<38} {host:>12.2f} {'-' if graph is None else f'{graph:.2f}':>14}")
        print("host: eager calls queued back to back (median per call over batches of 100); graph: GPU time per "
              "call inside a torch CUDA graph of 50")
    comm.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
