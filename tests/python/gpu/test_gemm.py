"""DecodeGemm and tpdecode.torch.install on this process's GPU."""

import pytest
import torch

import tpdecode
from tpdecode.torch import install, uninstall

SHAPES = [(1024, 4096), (4096, 4096), (512, 7168), (2048, 1536)]


def weight(n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(n, k, generator=g, device="cuda") / k**0.5).to(torch.bfloat16)


def reference(x, w):
    return (x.float() @ w.float().t()).to(torch.bfloat16)


@pytest.mark.parametrize("n,k", SHAPES)
def test_decode_gemm_matches_torch(n, k):
    w = weight(n, k)
    gemm = tpdecode.DecodeGemm(w).prepare(range(1, 9))
    for m in (1, 2, 5, 8, 17, 32, 40):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        y = gemm(x)
        torch.testing.assert_close(y.float(), reference(x, w).float(), rtol=2**-7, atol=2**-6)
        if gemm.path(m) == "warp":
            assert torch.equal(gemm(x), y)  # bitwise run to run
    x3 = torch.randn(2, 3, k, device="cuda").to(torch.bfloat16)  # leading dimensions are rows
    assert gemm(x3).shape == (2, 3, n)


def test_decode_gemm_chain_links_decide_and_stay_correct():
    w = weight(2112, 7168, seed=2)
    gemm = tpdecode.DecodeGemm(w, chain=True)
    assert gemm.chain
    gemm.prepare([1, 8])
    for m in (1, 8):
        x = torch.randn(m, 7168, device="cuda").to(torch.bfloat16)
        torch.testing.assert_close(gemm(x).float(), reference(x, w).float(), rtol=2**-7, atol=2**-6)
        assert gemm.decision(m)
    gemm.chain = False  # drops the chain decisions: the next eager call decides alone
    assert not gemm.chain
    x = torch.randn(8, 7168, device="cuda").to(torch.bfloat16)
    torch.testing.assert_close(gemm(x).float(), reference(x, w).float(), rtol=2**-7, atol=2**-6)
    assert gemm.path(8) in ("warp", "wgmma", "wgmma-wide", "cublas", "cublaslt")


def test_decode_gemm_argument_errors():
    gemm = tpdecode.DecodeGemm(weight(1024, 4096))
    with pytest.raises(ValueError, match="columns"):
        gemm(torch.zeros(2, 2048, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16 is required"):
        gemm(torch.zeros(2, 4096, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="is on cpu"):
        gemm(torch.zeros(2, 4096, dtype=torch.bfloat16))


def test_decode_gemm_in_a_cuda_graph():
    w = weight(1024, 4096, seed=1)
    gemm = tpdecode.DecodeGemm(w).prepare([4])
    x = torch.randn(4, 4096, device="cuda").to(torch.bfloat16)
    out = torch.empty(4, 1024, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(x, out=out)
        with pytest.raises(RuntimeError, match="capture"):
            gemm.prepare(5)
    for _ in range(3):
        x.copy_(torch.randn(4, 4096, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), reference(x, w).float(), rtol=2**-7, atol=2**-6)


def test_decode_gemms_of_a_device_run_at_once_on_two_streams():
    # They share the device's cuBLAS context; rows above max_rows run cuBLAS, whose
    # split of K uses the workspace: each stream has its own, so no call sees another's.
    gemms = [tpdecode.DecodeGemm(weight(1536, 7168, seed=s)) for s in (3, 4)]
    xs = [torch.randn(96, 7168, device="cuda").to(torch.bfloat16) for _ in gemms]
    alone = [g(x) for g, x in zip(gemms, xs)]
    streams = [torch.cuda.Stream() for _ in gemms]
    torch.cuda.synchronize()
    outs = [[], []]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        for i, (g, x, s) in enumerate(zip(gemms, xs, streams)):
            with torch.cuda.stream(s):
                outs[i].append(g(x))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(o, alone[i]) for o in outs[i]), f"stream {i}"


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4096, 1024, bias=True),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 4096, bias=False),
        torch.nn.Linear(4096, 512, bias=False),
    ).to("cuda", torch.bfloat16)


@torch.inference_mode()
def test_install_routes_bf16_linears_and_uninstall_restores():
    model = make_model()
    model[3].float()  # an FP32 linear: never routed
    head = model[:3]
    above = tpdecode.DecodeGemm.max_rows + 1
    xs = {m: torch.randn(m, 4096, device="cuda").to(torch.bfloat16) for m in (1, 4, 8, 33, above)}
    before = {m: head(x) for m, x in xs.items()}
    assert install(model, exclude=["2"]) == 1  # model[2] excluded, model[3] FP32
    assert install(model, exclude=["2"]) == 1  # idempotent
    for m, x in xs.items():
        torch.testing.assert_close(head(x).float(), before[m].float(), rtol=2**-6, atol=2**-6)
    assert torch.equal(head(xs[above]), before[above])  # above DecodeGemm.max_rows: the original forward
    assert uninstall(model) == 1
    assert "forward" not in vars(model[0])
    assert torch.equal(head(xs[4]), before[4])


@torch.inference_mode()
def test_batch_invariant_install_gives_a_row_the_same_bits_in_any_batch():
    model = make_model()[:3]
    x = torch.randn(130, 4096, device="cuda").to(torch.bfloat16)
    assert install(model) == 2
    assert install(model, batch_invariant=True) == 2  # routed again, in the invariant mode
    alone = [model(x[i : i + 1]) for i in range(130)]
    for m in (1, 3, 8, 17, 64, 65, 130):  # beyond 64 rows: calls of at most 64
        y = model(x[:m])
        for i in range(m):
            assert torch.equal(y[i : i + 1], alone[i]), (m, i)
    strided = x[:8].t().contiguous().t()  # the same rows, column-major
    assert torch.equal(model(strided), torch.cat(alone[:8]))
    assert uninstall(model) == 2


@torch.inference_mode()
def test_installed_model_in_a_cuda_graph():
    model = make_model()[:3]
    x = torch.randn(2, 3, 4096, device="cuda").to(torch.bfloat16)  # 6 rows
    want = model(x)
    assert install(model, rows=[6]) == 2
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), want.float(), rtol=2**-6, atol=2**-6)
    uninstall(model)


@torch.inference_mode()
def test_linear_runs_decode_gemm_for_the_rows_it_serves_else_f_linear():
    from tpdecode.torch import forget, linear

    w = weight(1024, 4096, seed=3)
    bias = torch.randn(1024, device="cuda").to(torch.bfloat16)
    gemm = tpdecode.DecodeGemm(w).prepare([3])
    for m in (1, 3, gemm.max_rows, gemm.max_rows + 1, 70):
        x = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
        y = linear(x, w, bias)
        if m <= gemm.max_rows:
            assert torch.equal(y, gemm(x).add_(bias))  # the DecodeGemm, the bias added after
        else:
            assert torch.equal(y, torch.nn.functional.linear(x, w, bias))
    x = torch.randn(2, 2, 4096, device="cuda").to(torch.bfloat16)
    assert linear(x, w).shape == (2, 2, 1024)
    assert torch.equal(linear(x.float(), w.float()), torch.nn.functional.linear(x.float(), w.float()))
    forget(w)


@torch.inference_mode()
def test_batch_invariant_linear_gives_a_row_the_same_bits_in_any_batch():
    from tpdecode.torch import linear

    w = weight(2048, 4096, seed=4)
    x = torch.randn(130, 4096, device="cuda").to(torch.bfloat16)
    alone = [linear(x[i : i + 1], w, batch_invariant=True) for i in range(130)]
    for m in (1, 2, 7, 33, 64, 65, 130):  # beyond 64 rows: calls of at most 64
        y = linear(x[:m], w, batch_invariant=True)
        for i in range(m):
            assert torch.equal(y[i : i + 1], alone[i]), (m, i)
    torch.testing.assert_close(torch.cat(alone).float(), reference(x, w).float(), rtol=2**-7, atol=2**-6)


def test_linear_is_traced_by_torch_compile_and_captured():
    from tpdecode.torch import linear

    w = weight(1024, 4096, seed=5)
    x = torch.randn(4, 4096, device="cuda").to(torch.bfloat16)

    @torch.compile(fullgraph=True)
    def f(x):
        return torch.relu(linear(x, w))

    with torch.inference_mode():
        want = torch.relu(linear(x, w))
        assert torch.equal(f(x), want)
        tpdecode.DecodeGemm(w).prepare([4])
        out = torch.empty_like(want)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(linear(x, w))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(torch.relu(out), want)
