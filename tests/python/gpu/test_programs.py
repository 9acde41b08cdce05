"""GemmProgram and MlpBlock on this process's GPU: each MlpBlock form (a program up
to 16 rows, launches above), and a GemmProgram built op by op, against a float64 torch reference that rounds to bfloat16
where the unfolded program stores; bits repeatable over calls, over a CUDA graph's
replays and under torch.compile; refusals of ops that do not chain."""

import pytest
import torch

import tpdecode
from tpdecode.program import Gemm, GemmProgram, Norm

H, I, A, Q = 1024, 1536, 768, 640
EPS = 1e-6


def bf16(t):
    return t.to(torch.bfloat16)


def rand(*shape, scale=1.0, g):
    return bf16(torch.randn(*shape, generator=g, device="cuda", dtype=torch.float64) * scale)


def add_norm(residual, x, gamma):
    """residual <- bf16(residual + x); returns bf16(rmsnorm(residual) * gamma)."""
    residual.copy_(bf16(residual.double() + x.double()))
    r = residual.double()
    rstd = torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS)
    return bf16(r * rstd * gamma.double())


def reference(w, attn, residual):
    """(out, residual) of the block in float64, rounded where the unfolded program stores."""
    residual = residual.clone()
    o = bf16(attn.double() @ w["o_proj"].double().t()) if w["o_proj"] is not None else attn
    h = add_norm(residual, o, w["post_norm"])
    gu = bf16(h.double() @ w["gate_up"].double().t()).double()
    gate, up = gu[:, :I], gu[:, I:]
    y = bf16(bf16(gate * torch.sigmoid(gate) * up).double() @ w["down"].double().t())
    if w["next_norm"] is None:
        return y.double(), residual
    h2 = add_norm(residual, y, w["next_norm"])
    return (h2.double() @ w["qkv"].double().t() if w["qkv"] is not None else h2.double()), residual


def relative(got, want):
    assert not torch.isnan(got.float()).any(), "an output element was not written"
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


FORMS = [  # o_proj, next_norm, qkv, fold
    (True, True, True, True), (True, True, True, False), (False, True, True, True), (True, True, False, True),
    (True, False, False, True)]


@pytest.mark.parametrize("o_proj,next_norm,qkv,fold", FORMS)
@pytest.mark.parametrize("m", [1, 7, 28, 48])
def test_mlp_block_matches_its_reference(m, o_proj, next_norm, qkv, fold):
    g = torch.Generator(device="cuda").manual_seed(m * 16 + len(FORMS))
    w = {"o_proj": rand(H, A, scale=0.05, g=g) if o_proj else None, "post_norm": rand(H, g=g),
         "gate_up": rand(2 * I, H, scale=0.05, g=g), "down": rand(H, I, scale=0.05, g=g),
         "next_norm": rand(H, g=g) if next_norm else None, "qkv": rand(Q, H, scale=0.05, g=g) if qkv else None}
    attn = rand(m, A if o_proj else H, g=g)
    r0 = rand(m, H, scale=2.0, g=g)
    residual = r0.clone()
    out = torch.empty(m, Q if qkv else H, device="cuda", dtype=torch.bfloat16)
    block = tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out, eps=EPS, fold=fold)
    launches = m > 16
    assert block.form == ("launches" if launches else "program")
    assert block.post_norm_folded == (not launches and fold and o_proj)
    assert block.next_norm_folded == (not launches and fold and o_proj and qkv)
    want_out, want_res = reference(w, attn, r0)
    results = []
    for pdl in (False, True):
        residual.copy_(r0)
        out.fill_(float("nan"))
        assert block(pdl=pdl) is out
        results.append((out.clone(), residual.clone()))
    assert relative(out, want_out) < (1.5e-2 if block.post_norm_folded else 1e-2)
    # y, which the second add takes, moves by a folded post norm's roundings (~1 %).
    assert relative(residual, want_res) < (8e-3 if block.post_norm_folded else 3e-3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        block()
    residual.copy_(r0)
    out.fill_(float("nan"))
    graph.replay()
    results.append((out.clone(), residual.clone()))
    for o, r in results[1:]:
        assert torch.equal(o, results[0][0]) and torch.equal(r, results[0][1])


@pytest.mark.parametrize("form", ["program", "launches"])
def test_mlp_block_in_the_form_asked_for(form):
    m = 8
    g = torch.Generator(device="cuda").manual_seed(5)
    w = {"o_proj": None, "post_norm": rand(H, g=g), "gate_up": rand(2 * I, H, scale=0.05, g=g),
         "down": rand(H, I, scale=0.05, g=g), "next_norm": None, "qkv": None}
    attn, r0 = rand(m, H, g=g), rand(m, H, scale=2.0, g=g)
    residual, out = r0.clone(), torch.empty(m, H, device="cuda", dtype=torch.bfloat16)
    block = tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out, eps=EPS, form=form)
    assert block.form == form
    out.fill_(float("nan"))
    block()
    want_out, want_res = reference(w, attn, r0)
    assert relative(out, want_out) < 1e-2 and relative(residual, want_res) < 3e-3
    with pytest.raises(ValueError, match="form must be"):
        tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out, form="fused")
    strided = torch.empty(m, H + 64, device="cuda", dtype=torch.bfloat16)[:, :H]
    with pytest.raises(ValueError, match="launch form does not serve"):
        tpdecode.MlpBlock(**w, attn=attn, residual=strided, out=out, form="launches")


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_programs_under_torch_compile(backend):
    """New inputs written inside the compiled function reach the kernel and its
    results reach the caller's tensors, whether or not the compiler hands the op its
    own copies of them (aot_eager does not re-inplace)."""
    m = 4
    g = torch.Generator(device="cuda").manual_seed(7)
    w = {"o_proj": rand(H, A, scale=0.05, g=g), "post_norm": rand(H, g=g), "gate_up": rand(2 * I, H, scale=0.05, g=g),
         "down": rand(H, I, scale=0.05, g=g), "next_norm": rand(H, g=g), "qkv": rand(Q, H, scale=0.05, g=g)}
    attn, r0 = rand(m, A, g=g), rand(m, H, scale=2.0, g=g)
    residual, out = r0.clone(), torch.empty(m, Q, device="cuda", dtype=torch.bfloat16)
    block = tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out)
    x_new = rand(m, A, g=g)
    attn.copy_(x_new)
    block()
    eager = (out.clone(), residual.clone())

    # A two-op program reading a window of its first op's out.
    w1, w2 = rand(H, H, scale=0.05, g=g), rand(Q, H // 2, scale=0.05, g=g)
    x, p, z = rand(m, H, g=g), torch.empty(m, H, device="cuda", dtype=torch.bfloat16), torch.empty(
        m, Q, device="cuda", dtype=torch.bfloat16)
    program = GemmProgram([Gemm(w1, x, p), Gemm(w2, p[:, H // 2:], z, after=0)])
    x_next = rand(m, H, g=g)
    x.copy_(x_next)
    program()
    eager_z = z.clone()

    @torch.compile(fullgraph=True, backend=backend)
    def step(a, b):
        attn.copy_(a)
        x.copy_(b)
        program()
        return block() * 1, z * 1  # the results read after the ops ran

    attn.copy_(rand(m, A, g=g))  # stale values the compiled step must overwrite
    x.copy_(rand(m, H, g=g))
    residual.copy_(r0)
    out.fill_(float("nan"))
    z.fill_(float("nan"))
    got, got_z = step(x_new, x_next)
    assert torch.equal(got, eager[0]) and torch.equal(out, eager[0]) and torch.equal(residual, eager[1])
    assert torch.equal(got_z, eager_z) and torch.equal(z, eager_z)


def test_gemm_program_built_op_by_op():
    """x → o (plain) → folded add + norm (residual in place) → SiLU-mul → down → an
    unfolded add + norm reading the folded stream; against the reference above."""
    m = 5
    g = torch.Generator(device="cuda").manual_seed(11)
    wo, g1, wgu, wd, g2 = (rand(H, A, scale=0.05, g=g), rand(H, g=g), rand(2 * I, H, scale=0.05, g=g),
                           rand(H, I, scale=0.05, g=g), rand(H, g=g))
    attn, r0 = rand(m, A, g=g), rand(m, H, scale=2.0, g=g)
    residual = r0.clone()
    o, h, act, y, out = (torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for n in (H, H, I, H, H))
    program = GemmProgram([
        Gemm(wo, attn, o),
        Norm(o, g1, h, after=0, eps=EPS, residual=residual, residual_out=residual, folded=True),
        Gemm(wgu, h, act, after=1, silu_mul=True),
        Gemm(wd, act, y, after=2),
        Norm(y, g2, out, after=3, eps=EPS, residual=residual, residual_out=residual),
    ])
    assert program.rows == m
    want_out, want_res = reference({"o_proj": wo, "post_norm": g1, "gate_up": wgu, "down": wd, "next_norm": g2,
                                    "qkv": None}, attn, r0)
    h.fill_(float("nan"))
    results = []
    for run in range(3):
        residual.copy_(r0)
        out.fill_(float("nan"))
        if run < 2:
            program(pdl=run == 1)
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                program()
            residual.copy_(r0)
            graph.replay()
        results.append((out.clone(), residual.clone()))
    assert relative(out, want_out) < 1.5e-2
    assert relative(residual, want_res) < 8e-3
    assert torch.isnan(h.float()).all(), "a folded norm's out was written"
    for o_, r_ in results[1:]:
        assert torch.equal(o_, results[0][0]) and torch.equal(r_, results[0][1])


def test_gemm_program_refusals():
    m = 2
    w = torch.zeros(H, H, device="cuda", dtype=torch.bfloat16)
    x = torch.zeros(m, H, device="cuda", dtype=torch.bfloat16)
    out, out2 = torch.empty_like(x), torch.empty_like(x)
    with pytest.raises(ValueError, match="an earlier op's index"):
        GemmProgram([Gemm(w, x, out, after=0)])
    with pytest.raises(ValueError, match="no GEMM reading its out"):
        GemmProgram([Gemm(w, x, out), Norm(out, torch.ones(H, device="cuda", dtype=torch.bfloat16), out2, after=0,
                                           folded=True)])
    with pytest.raises(TypeError, match="Gemm or Norm expected"):
        GemmProgram([(w, x, out)])
    with pytest.raises(TypeError, match="bfloat16 is required"):
        GemmProgram([Gemm(w.float(), x, out)])
