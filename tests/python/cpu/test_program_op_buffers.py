"""A program's torch.compile op without a GPU (the kernel replaced by the same math on
the CPU, on the buffers the program was built on): the op is handed whole tensors,
each once, where the program's buffers are views of one tensor (each rank's rows of a
local team's buffer, as the GPU tests build them), and the compiled call's results
are the eager call's, with inductor and aot_eager. torch 2.11's inductor handed such
views wrong values as separate arguments. Needs torch (skipped without it)."""

import pytest

torch = pytest.importorskip("torch")

from tpdecode import program as P  # noqa: E402

TP, M, K, H, N = 2, 3, 8, 4, 5


class CpuProgram:
    """The extension's team program on the CPU: records each rank's buffers (the
    detached views the Python side passes) and runs the layer's math on them."""

    def __init__(self):
        self.driven, self.device, self.rows, self.ctas = TP, -1, 0, 1
        self.ranks = [dict() for _ in range(TP)]

    def add_gemm(self, rank, weight, x, out, after, silu_mul):
        self.ranks[rank].setdefault("gemms", []).append((weight, x, out))

    def add_norm(self, rank, x, after, weight, eps, residual, residual_out, out, folded, all_reduce):
        self.ranks[rank]["norm"] = (x, weight, residual, out)

    def build(self, m):
        self.rows = m

    def run(self, on, pdl):
        for r in self.ranks:  # the row-parallel GEMM: each rank's partial
            w, x, out = r["gemms"][0]
            out.copy_(x @ w.t())
        total = sum(r["norm"][0] for r in self.ranks)  # the all-reduce, in rank order
        for r in self.ranks:
            _, gamma, residual, h = r["norm"]
            residual.add_(total)  # in place: read and written
            h.copy_(residual * gamma)
            w, x, out = r["gemms"][1]
            out.copy_(x @ w.t())


class Module:
    def __init__(self):
        self.made = []

    def team_program(self, team_handle):
        self.made.append(CpuProgram())
        return self.made[-1]


class FakeTeam:
    _handle = object()


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_the_compiled_op_gets_whole_tensors_and_the_eager_results(monkeypatch, backend):
    module = Module()
    monkeypatch.setattr(P._lib, "module", module)
    monkeypatch.setattr(P, "_not_capturing", lambda what: None)
    monkeypatch.setattr(P, "_current_device", lambda: -1)  # the CpuProgram's device: no CUDA query
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    nan = lambda *shape: torch.full(shape, float("nan"))  # noqa: E731
    t = {"attn": rand(TP, M, K), "o_proj": rand(TP, H, K), "partial": nan(TP, M, H), "gamma": rand(H),
         "residual": rand(TP, M, H), "h": nan(TP, M, H), "qkv": rand(TP, N, H), "out": nan(TP, M, N)}
    ops = [[P.Gemm(t["o_proj"][r], t["attn"][r], t["partial"][r]),
            P.Norm(t["partial"][r], t["gamma"], t["h"][r], after=0, residual=t["residual"][r],
                   residual_out=t["residual"][r], all_reduce=True),
            P.Gemm(t["qkv"][r], t["h"][r], t["out"][r], after=1)] for r in range(TP)]
    program = P.TeamProgram(FakeTeam(), ops)
    # Whole tensors, each once: the rank views' bases, the residual a write only.
    whole = lambda names: sorted(id(t[n]) for n in names)  # noqa: E731
    assert sorted(id(x) for x in program._writes) == whole(["partial", "residual", "h", "out"])
    assert sorted(id(x) for x in program._reads) == whole(["attn", "gamma"])

    r0, attn = t["residual"].clone(), rand(TP, M, K)

    def fresh():
        t["residual"].copy_(r0)
        for name in ("partial", "h", "out"):
            t[name].fill_(float("nan"))
        t["attn"].copy_(rand(TP, M, K))  # stale: the step must write its own

    fresh()
    t["attn"].copy_(attn)
    program()
    eager = {name: t[name].clone() for name in ("out", "residual", "h")}

    @torch.compile(fullgraph=True, backend=backend)
    def step(a):
        t["attn"].copy_(a)
        program()
        return t["out"] * 1

    for _ in range(2):
        fresh()
        got = step(attn)
        assert torch.equal(got, eager["out"])
        for name, want in eager.items():
            assert torch.equal(t[name], want), name
