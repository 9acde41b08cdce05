"""Per-op cost of tpdecode's Python surface: the time of team.ar_norm, team.all_reduce
and DecodeGemm inside a torch CUDA graph (GPU µs per op, 50 ops per graph), and the
host time of an eager call (µs per op, the calls queued without synchronising).
Compare the in-graph ar_norm with ``tpdecode bench comm`` (same team, hidden, rows).

    torchrun --nproc-per-node 2 examples/bench_ops.py     # NCCL team over the GPUs
    python examples/bench_ops.py                          # a local team of 2 on one GPU
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import tpdecode


def bf16_source(seed=0):
    """rand(*shape, scale=1.0): seeded normal bfloat16 tensors on the current GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    return rand


def in_graph_us(fn, ops=50, replays=50):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(ops):
            fn()
    g.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if dist.is_initialized():
            dist.barrier()
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / ops)
    return sorted(times)[len(times) // 2]


def host_us(fn, calls=400):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed * 1e6 / calls


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[4096, 7168])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        team = tpdecode.Team.from_process_group(hidden=max(args.hidden), rows=max(args.rows))
        lead = ()
    else:
        team = tpdecode.Team.local(2, hidden=max(args.hidden), rows=max(args.rows))
        lead = (team.size,)
    table = []
    for hidden in args.hidden:
        weight = torch.randn(hidden, device="cuda").to(torch.bfloat16)
        for rows in args.rows:
            x = torch.randn(*lead, rows, hidden, device="cuda").to(torch.bfloat16)
            residual, out, res_out = torch.randn_like(x), torch.empty_like(x), torch.empty_like(x)

            def ar_norm():
                team.ar_norm(x, residual, weight, 1e-6, out=out, residual_out=res_out)

            def all_reduce():
                team.all_reduce(x, out=out)

            table.append((hidden, rows, in_graph_us(ar_norm), host_us(ar_norm), in_graph_us(all_reduce),
                          host_us(all_reduce), team.last_path[0]))
    gemm = tpdecode.DecodeGemm(torch.randn(1024, 4096, device="cuda").to(torch.bfloat16)).prepare(1)
    gx, gout = torch.randn(1, 4096, device="cuda").to(torch.bfloat16), torch.empty(1, 1024, device="cuda",
                                                                                   dtype=torch.bfloat16)
    gemm_graph, gemm_host = in_graph_us(lambda: gemm(gx, out=gout)), host_us(lambda: gemm(gx, out=gout))
    team.check_errors()
    if team.rank == 0:
        print(f"{team!r} on {torch.cuda.get_device_name()}")
        print(f"{'hidden':>6} {'rows':>4} {'ar_norm graph us':>17} {'ar_norm host us':>16} "
              f"{'all_reduce graph us':>20} {'all_reduce host us':>19}  path")
        for h, r, a, ah, b, bh, path in table:
            print(f"{h:>6} {r:>4} {a:>17.2f} {ah:>16.2f} {b:>20.2f} {bh:>19.2f}  {path}")
        print(f"DecodeGemm 1024x4096, 1 row ({gemm.path(1)}): graph {gemm_graph:.2f} us, host {gemm_host:.2f} us per call")
    team.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
