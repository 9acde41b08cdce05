"""Where an eager linear's host time goes, at the Llama shapes examples/install_decode.py
runs: µs per call (the calls queued without synchronising) of F.linear, the
DecodeGemm's extension call alone (its output given), DecodeGemm(x),
tpdecode.torch.linear and an installed nn.Linear; beside them the GPU time per call
inside a torch CUDA graph (F.linear and the DecodeGemm) and the path the DecodeGemm
takes.

    python examples/bench_linear.py [--rows 1 8]
"""

import argparse

import torch
import torch.nn.functional as F

from bench_communicator import host_us  # this folder's: host µs per call, batches of 100
from bench_ops import in_graph_us  # this folder's: GPU µs per call inside a graph
from tpdecode.torch import install, linear, uninstall

SHAPES = [("q_proj, o_proj", 4096, 4096), ("k_proj, v_proj", 1024, 4096), ("gate_proj, up_proj", 14336, 4096),
          ("down_proj", 4096, 14336), ("lm_head", 32768, 4096)]


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}; host: µs per eager call; graph: GPU µs per call in a torch graph of 50")
    print(f"{'linear':<19} {'N x K':>12} {'M':>3} {'graph F.linear':>14} {'graph ours':>10} | "
          f"{'F.linear':>8} {'handle':>7} {'DecodeGemm':>10} {'linear()':>8} {'installed':>9}  path")
    for name, n, k in SHAPES:
        module = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        w = module.weight
        for m in args.rows:
            install(module, rows=[m])
            gemm = module._tpdecode_gemm
            x = torch.randn(m, 1, k, device="cuda").to(torch.bfloat16)  # as a decode step's [batch, 1, hidden]
            x2 = x.view(m, k)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            host = [host_us(lambda: F.linear(x, w)), host_us(lambda: gemm._run(x2, out)), host_us(lambda: gemm(x2)),
                    host_us(lambda: linear(x, w)), host_us(lambda: module(x))]
            graph = [in_graph_us(lambda: F.linear(x, w)), in_graph_us(lambda: gemm(x2, out=out))]
            print(f"{name:<19} {f'{n}x{k}':>12} {m:>3} {graph[0]:>14.2f} {graph[1]:>10.2f} | "
                  + " ".join(f"{h:>{width}.2f}" for h, width in zip(host, (8, 7, 10, 8, 9)))
                  + f"  {gemm.path(m)}: {gemm.decision(m)}")
            uninstall(module)


if __name__ == "__main__":
    main()
