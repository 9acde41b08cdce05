"""The collective and GEMM ops under torch.compile when a caller hands views of one
buffer as several of an op's tensors (out and residual_out as two rows of one
allocation, x beside its out): each op's runner replaced by the same math on the CPU,
the compiled step's results and buffers must be the eager step's, with inductor and
aot_eager. This holds the ops' declared writes (`mutates_args`) to what the kernels
write: an output left undeclared is one the compiler may read before the op or drop.
Needs torch (skipped without it)."""

import pytest

torch = pytest.importorskip("torch")

from tpdecode import _ops  # noqa: E402

M, H = 3, 8


class CpuRunner:
    """A team's and a DecodeGemm's calls, as the C++ computes them, on the CPU."""

    def __init__(self, weight):
        self.weight = weight

    def ar_norm(self, x, residual, weight, eps, out, residual_out, quant, scale, scales):
        h = x + residual if residual is not None else x.clone()
        out.copy_(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight)
        residual_out.copy_(h)

    def all_reduce(self, x, out):
        out.copy_(2 * x)  # two ranks holding the same x

    def gather(self, shard, out):
        out.copy_(torch.cat([shard, shard], -1))

    def __call__(self, x, out):  # a DecodeGemm
        out.copy_(x @ self.weight.t())


@pytest.fixture
def runner():
    g = torch.Generator().manual_seed(1)
    r = CpuRunner(torch.randn(H, H, generator=g))
    i = _ops.register(r)
    yield i
    _ops.unregister(i)


def ar_norm_rows(buf, x, gamma, i):
    # out and residual_out: rows 0 and 1 of one buffer; the residual read from row 1
    torch.ops.tpdecode.ar_norm(x, buf[1], gamma, 1e-6, buf[0], buf[1], "none", None, torch.empty(0), i)
    return buf[0] + buf[1]


def ar_norm_x_beside_out(buf, gamma, i):
    # x is row 0, out row 1, residual_out row 2 of one buffer
    torch.ops.tpdecode.ar_norm(buf[0], None, gamma, 1e-6, buf[1], buf[2], "none", None, torch.empty(0), i)
    return buf[1] * buf[2]


def all_reduce_in_one_buffer(buf, i):
    torch.ops.tpdecode.all_reduce(buf[0], buf[1], i)
    torch.ops.tpdecode.all_reduce(buf[1], buf[2], i)  # reads what the first call wrote
    return buf[2] - buf[0]


def gather_in_one_buffer(buf, i):
    torch.ops.tpdecode.gather(buf[0, :, : H // 2], buf[1], i)
    return buf[1] * 1


def gemm_chain_in_one_buffer(buf, i):
    torch.ops.tpdecode.decode_gemm(buf[0], buf[1], i)
    torch.ops.tpdecode.decode_gemm(buf[1], buf[2], i)
    return buf[2] * 1


def inputs(case, g):
    rows = 2 if case in (ar_norm_rows, gather_in_one_buffer) else 3
    buf = torch.randn(rows, M, H, generator=g)
    buf[1:] = float("nan")  # outputs start poisoned (ar_norm_rows reads row 1: a residual)
    if case is ar_norm_rows:
        buf[1] = torch.randn(M, H, generator=g)
        return [buf, torch.randn(M, H, generator=g), torch.randn(H, generator=g)]
    if case is ar_norm_x_beside_out:
        return [buf, torch.randn(H, generator=g)]
    return [buf]


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize(
    "case", [ar_norm_rows, ar_norm_x_beside_out, all_reduce_in_one_buffer, gather_in_one_buffer,
             gemm_chain_in_one_buffer], ids=lambda f: f.__name__)
def test_views_of_one_buffer_give_the_eager_results(runner, case, backend):
    g = torch.Generator().manual_seed(7)
    eager = inputs(case, g)
    compiled = [t.clone() for t in eager]
    want = case(*eager, runner)
    torch._dynamo.reset()
    got = torch.compile(case, backend=backend, fullgraph=True)(*compiled, runner)
    assert not want.isnan().any(), "the eager step left a poisoned value"
    assert torch.equal(got, want)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b), "a buffer differs after the compiled step"
