"""MlpBlock with a team (TP > 1, the C++ TeamMlpBlock) and TeamProgram on this test
session's team (a local team of 2 on one GPU, or the NCCL team under torchrun). The
block as the program and as launches: every rank's shards against a float64 torch reference of the sharded
block (each partial rounded as the block stores it, summed in rank order in FP32 as
the one-shot all-reduce); every rank's residual the same bits; the bits repeatable
over calls and a CUDA graph's replays; refusals. TeamProgram's all-reducing norm: the
residual stream bit for bit from the program's own partials, every rank's h the same
bits, the GEMMs against float64; repeat runs and a graph replay bitwise; refusals."""

import dataclasses

import pytest
import torch

import tpdecode
from conftest import rank_order_sum

H, I, A, Q = 1024, 2048, 1024, 1024
EPS = 1e-6


def add_norm(residual, x, gamma):
    """residual <- bf16(residual + x); returns bf16(rmsnorm(residual) * gamma)."""
    residual.copy_((residual.double() + x.double()).to(torch.bfloat16))
    r = residual.double()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * gamma.double()).to(torch.bfloat16)


def shards(world, m, o_proj, qkv):
    tp = world.size
    s = lambda seed, *shape, scale=0.05: (world.random(seed, *shape).float() * scale).to(torch.bfloat16)  # noqa: E731
    w = {"o_proj": s(1, H, A // tp) if o_proj else None, "gate_up": s(2, 2 * I // tp, H), "down": s(3, H, I // tp),
         "qkv": s(4, Q // tp, H) if qkv else None, "post_norm": world.shared(5, H), "next_norm": world.shared(6, H)}
    attn = s(7, m, A // tp if o_proj else H, scale=1.0 if o_proj else 1.0 / tp)
    return w, attn


def reference(world, w, attn, residual):
    """Every rank's out ([tp, m, ...]) and the residual stream ([m, H])."""
    every = lambda t: None if t is None else world.every_rank(t)  # noqa: E731
    wo, wgu, wd, wq, a = every(w["o_proj"]), every(w["gate_up"]), every(w["down"]), every(w["qkv"]), every(attn)
    residual = residual.clone()
    tp, inter = world.size, I // world.size
    o = [(a[r].double() @ wo[r].double().t()).to(torch.bfloat16) for r in range(tp)] if wo is not None else list(a)
    h = add_norm(residual, rank_order_sum(o), w["post_norm"])
    y = []
    for r in range(tp):
        gu = (h.double() @ wgu[r].double().t()).to(torch.bfloat16).double()
        act = (gu[:, :inter] * torch.sigmoid(gu[:, :inter]) * gu[:, inter:]).to(torch.bfloat16)
        y.append((act.double() @ wd[r].double().t()).to(torch.bfloat16))
    h2 = add_norm(residual, rank_order_sum(y), w["next_norm"])
    outs = [h2.double() @ wq[r].double().t() for r in range(tp)] if wq is not None else [h2.double()] * tp
    return torch.stack(outs), residual


def relative(got, want):
    assert not torch.isnan(got.float()).any(), "an output element was not written"
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("full", [True, False], ids=["o_proj+qkv", "bare"])
@pytest.mark.parametrize("m,form", [(1, None), (7, None), (16, None), (24, None), (1, "program"), (7, "program"),
                                    (16, "program")])
def test_team_mlp_block_matches_the_sharded_reference(world, m, form, full):
    w, attn = shards(world, m, full, full)
    r0 = world.shared(8, m, H).float().mul(2).to(torch.bfloat16)
    lead = (world.size,) if world.local else ()
    residual = r0.expand(*lead, m, H).contiguous()
    out = torch.empty(*lead, m, Q // world.size if full else H, device=world.device, dtype=torch.bfloat16)
    block = tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out, eps=EPS, team=world.team, form=form)
    if form == "program" and not world.team.shares_memory:
        pytest.skip("the program needs ranks that share memory")
    # By default the program up to 16 rows where each rank has its GPU (and memory is
    # shared); launches on a local team.
    program = form == "program" or (form is None and m <= 16 and world.team.shares_memory and not world.local)
    assert (block.form, block.post_norm_folded, block.next_norm_folded) == (
        "program" if program else "launches", False, False)
    assert block.rows == m
    want_out, want_res = reference(world, w, attn, r0)
    results = []
    for _ in range(2):
        residual.copy_(r0.expand_as(residual))
        out.fill_(float("nan"))
        assert block() is out
        world.team.synchronize()
        results.append((out.clone(), residual.clone()))
    every_out, every_res = world.every_rank(out), world.every_rank(residual)
    assert relative(every_out, want_out) < 1e-2
    # The second add takes y, whose error against the float64 chain is of out's order.
    assert relative(every_res[0], want_res) < 6e-3
    for r in range(world.size):
        assert torch.equal(every_res[r], every_res[0]), f"rank {r}'s residual stream differs from rank 0's"
        if not full:
            assert torch.equal(every_out[r], every_out[0]), f"rank {r}'s h' differs from rank 0's"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        block()
    residual.copy_(r0.expand_as(residual))
    out.fill_(float("nan"))
    graph.replay()
    world.team.synchronize()
    results.append((out.clone(), residual.clone()))
    for o, r in results[1:]:
        assert torch.equal(o, results[0][0]) and torch.equal(r, results[0][1])
    world.barrier()


def test_team_mlp_block_refusals(world):
    m = 2
    w, attn = shards(world, m, True, True)
    lead = (world.size,) if world.local else ()
    residual = torch.zeros(*lead, m, H, device=world.device, dtype=torch.bfloat16)
    out = torch.empty(*lead, m, Q // world.size, device=world.device, dtype=torch.bfloat16)
    kw = dict(attn=attn, residual=residual, out=out, team=world.team)
    with pytest.raises(ValueError, match="next_norm"):
        tpdecode.MlpBlock(**{**w, "next_norm": None}, **kw)
    with pytest.raises(ValueError, match="form must be"):
        tpdecode.MlpBlock(**w, **kw, form="fused")
    with pytest.raises(ValueError, match="down"):  # I / tp does not chain: the C++ check, naming the tensor
        tpdecode.MlpBlock(**{**w, "down": w["down"][..., :-64].contiguous()}, **kw)
    with pytest.raises(TypeError):
        tpdecode.MlpBlock(**{**w, "gate_up": w["gate_up"].float()}, **kw)
    world.barrier()


def team_program_ops(world, tensors):
    """Every driven rank's op list: o = attn · o_projᵀ (the rank's partial), then the
    all-reducing norm (residual in place, h), then out = h · qkvᵀ."""
    ranks = range(world.size) if world.local else [None]
    pick = lambda t, r: t if r is None else t[r]  # noqa: E731
    P = tpdecode.program
    return [[P.Gemm(pick(tensors["o_proj"], r), pick(tensors["attn"], r), pick(tensors["o"], r)),
             P.Norm(pick(tensors["o"], r), tensors["gamma"], pick(tensors["h"], r), after=0, eps=EPS,
                    residual=pick(tensors["residual"], r), residual_out=pick(tensors["residual"], r),
                    all_reduce=True),
             P.Gemm(pick(tensors["qkv"], r), pick(tensors["h"], r), pick(tensors["out"], r), after=1)]
            for r in ranks]


def team_program_tensors(world, m):
    tp = world.size
    lead = (tp,) if world.local else ()
    s = lambda seed, *shape, scale=0.05: (world.random(seed, *shape).float() * scale).to(torch.bfloat16)  # noqa: E731
    empty = lambda *shape: torch.full((*lead, *shape), float("nan"), device=world.device,  # noqa: E731
                                      dtype=torch.bfloat16)
    return {"o_proj": s(11, H, A // tp), "attn": s(12, m, A // tp, scale=1.0), "qkv": s(13, Q // tp, H),
            "gamma": world.shared(14, H), "residual": world.shared(15, m, H).expand(*lead, m, H).contiguous(),
            "o": empty(m, H), "h": empty(m, H), "out": empty(m, Q // tp)}


@pytest.mark.parametrize("m", [1, 5, 16])
def test_team_program_all_reduces_inside_its_norm(world, m):
    if not world.team.shares_memory:
        pytest.skip("the program needs ranks that share memory")
    t = team_program_tensors(world, m)
    r0 = t["residual"].clone()
    program = tpdecode.TeamProgram(world.team, team_program_ops(world, t))
    assert program.rows == m and program.ctas >= 1
    results = []
    for _ in range(2):
        t["residual"].copy_(r0)
        for name in ("o", "h", "out"):
            t[name].fill_(float("nan"))
        program()
        world.team.synchronize()
        results.append([t[name].clone() for name in ("o", "h", "out", "residual")])
    o, h, out, res = (world.every_rank(t[name]) for name in ("o", "h", "out", "residual"))
    attn, wo, wq = (world.every_rank(t[name]) for name in ("attn", "o_proj", "qkv"))
    base = world.every_rank(r0)[0]
    for r in range(world.size):
        assert relative(o[r], attn[r].double() @ wo[r].double().t()) < 1e-2
    # The residual stream: the program's partials summed in rank order (FP32, one
    # rounding), plus the residual, rounded: bit for bit, the same on every rank.
    want_res = (rank_order_sum(list(o)).float() + base.float()).to(torch.bfloat16)
    for r in range(world.size):
        assert torch.equal(res[r], want_res), f"rank {r}'s residual stream"
        assert torch.equal(h[r], h[0]), f"rank {r}'s h differs from rank 0's"
    x = want_res.double()
    want_h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * t["gamma"].double()
    assert relative(h[0], want_h) < 1e-2
    for r in range(world.size):
        assert relative(out[r], h[0].double() @ wq[r].double().t()) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        program()
    t["residual"].copy_(r0)
    for name in ("o", "h", "out"):
        t[name].fill_(float("nan"))
    graph.replay()
    world.team.synchronize()
    results.append([t[name].clone() for name in ("o", "h", "out", "residual")])
    for run in results[1:]:
        for got, want in zip(run, results[0]):
            assert torch.equal(got, want)
    world.barrier()


def test_team_program_refusals(world):
    m = 2
    t = team_program_tensors(world, m)
    ops = team_program_ops(world, t)
    with pytest.raises(ValueError, match="cannot be folded"):
        tpdecode.TeamProgram(world.team, [[*o[:1], dataclasses.replace(o[1], folded=True), o[2]] for o in ops])
    with pytest.raises(ValueError, match="op lists for a team object driving"):
        tpdecode.TeamProgram(world.team, ops + ops)
    with pytest.raises(ValueError, match="no ops for rank"):
        tpdecode.TeamProgram(world.team, [[] for _ in ops])
    with pytest.raises(ValueError, match="build it in a TeamProgram"):
        tpdecode.GemmProgram(ops[0])
    world.barrier()


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_team_objects_under_torch_compile(world, backend):
    """TeamProgram and a team MlpBlock inside torch.compile: new inputs written in the
    compiled function reach every rank's kernels, and their results reach the
    caller's tensors with the eager calls' bits (whether or not the compiler hands
    the op copies of the buffers)."""
    if not world.team.shares_memory:
        pytest.skip("the program needs ranks that share memory")
    if not world.local:
        # Each process compiles apart: the first to launch would wait for its peers'
        # compiles longer than the test team's deadline.
        pytest.skip("compiled on the local team (under torchrun the ranks compile at their own pace)")
    m, tp = 3, world.size
    lead = (tp,) if world.local else ()
    t = team_program_tensors(world, m)
    r0 = t["residual"].clone()
    program = tpdecode.TeamProgram(world.team, team_program_ops(world, t))
    w, attn = shards(world, m, True, True)
    b0 = world.shared(8, m, H).float().mul(2).to(torch.bfloat16).expand(*lead, m, H).contiguous()
    residual = b0.clone()
    out = torch.empty(*lead, m, Q // tp, device=world.device, dtype=torch.bfloat16)
    block = tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out, eps=EPS, team=world.team)
    program_attn, block_attn = world.random(21, m, A // tp), world.random(22, m, A // tp)

    def fresh(stale):
        t["residual"].copy_(r0)
        residual.copy_(b0)
        for o in (t["o"], t["h"], t["out"], out):
            o.fill_(float("nan"))
        if stale:  # values the compiled step must overwrite
            t["attn"].copy_(world.random(23, m, A // tp))
            attn.copy_(world.random(24, m, A // tp))

    fresh(False)
    t["attn"].copy_(program_attn)
    attn.copy_(block_attn)
    program()
    block()
    world.team.synchronize()
    eager = [t["out"].clone(), t["residual"].clone(), out.clone(), residual.clone()]

    @torch.compile(fullgraph=True, backend=backend)
    def step(pa, ba):
        t["attn"].copy_(pa)
        attn.copy_(ba)
        program()
        return t["out"] * 1, block() * 1  # the results read after the ops ran

    fresh(True)
    got_program, got_block = step(program_attn, block_attn)
    world.team.synchronize()
    assert torch.equal(got_program, eager[0]) and torch.equal(t["out"], eager[0])
    assert torch.equal(t["residual"], eager[1])
    assert torch.equal(got_block, eager[2]) and torch.equal(out, eager[2])
    assert torch.equal(residual, eager[3])
    world.barrier()
