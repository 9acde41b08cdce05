"""tpdecode.Communicator, an engine's all-reduce backend: calls it takes give the team's
results (FP8 epilogues bitwise equal to tpdecode._quant of the BF16 output), calls it
does not take return None, torch.compile(fullgraph=True) traces it, CUDA graphs
capture it inside capture(), batch-invariant rows keep their bits. On a local team
of 2 on one GPU (under torchrun: the world's NCCL team)."""

import pytest
import torch

import tpdecode
from tpdecode import _quant
from conftest import HIDDEN, assert_same_bits, rank_order_sum


@pytest.fixture(scope="module")
def comm(world):
    if not world.local:
        c = tpdecode.Communicator(hidden=HIDDEN, rows=32)
        assert not c.disabled, c.disabled_reason
    else:
        c = tpdecode.Communicator.local(world.size, hidden=HIDDEN, rows=32)
    yield c
    torch.cuda.synchronize()
    c.close()


def test_all_reduce_is_the_team_sum(world, comm):
    x = world.random(1, 4, HIDDEN)
    assert comm.should_all_reduce(x)
    assert torch.equal(comm.all_reduce(x), world.mine(rank_order_sum(world.every_rank(x))))


def test_calls_it_does_not_take_return_none(world, comm):
    assert comm.all_reduce(world.random(2, 4, HIDDEN, dtype=torch.float16)) is None
    assert comm.all_reduce(world.random(3, 4, HIDDEN + 8)) is None  # wider than built for
    assert comm.all_reduce(world.random(4, 33, 64)) is None  # more rows than built for
    assert comm.all_reduce(world.random(5, 8, 256).transpose(-1, -2)) is None  # not contiguous
    lead = (world.size,) if world.local else ()
    n = world.size * 8 * 256 if world.local else 8 * 256
    flat = torch.empty(n + 8, dtype=torch.bfloat16, device=world.device)
    assert comm.fused_add_rms_norm(world.random(6, 2, 96), None, world.shared(7, 96), 1e-6) is None
    comm.team.check_errors()  # nothing launched
    # Not 16-byte aligned: taken all the same, from an aligned copy (every rank must take
    # the same calls; an address may differ from rank to rank).
    misaligned = flat[1 : 1 + n].view(*lead, 8, 256)
    misaligned.copy_(world.random(8, 8, 256))
    assert torch.equal(comm.all_reduce(misaligned), world.mine(rank_order_sum(world.every_rank(misaligned))))


def test_size_cap_and_disabled():
    c = tpdecode.Communicator.local(2, hidden=1024, rows=8, max_bytes=1024)
    x = torch.zeros(2, 1, 512, dtype=torch.bfloat16, device="cuda")
    assert c.should_all_reduce(x)
    assert not c.should_all_reduce(torch.zeros(2, 2, 512, dtype=torch.bfloat16, device="cuda"))
    c.close()
    assert c.disabled and c.all_reduce(x) is None
    off = tpdecode.Communicator.local(2, hidden=1024, rows=8, max_bytes=0)
    assert off.disabled and off.all_reduce(x) is None and off.team is None
    assert "size cap 0" in off.disabled_reason
    off.close()


@pytest.mark.parametrize("quant", [None, "static", "group", "group-ue8m0"])
def test_fused_add_rms_norm_and_its_fp8_epilogues(world, comm, quant):
    x = world.random(10, 5, HIDDEN)
    residual = world.mine(world.shared(11, 5, HIDDEN)).contiguous()
    weight = world.shared(12, HIDDEN)
    bf16_out, bf16_res = comm.team.ar_norm(x, residual, weight, 1e-6)
    q = torch.tensor([0.02], device=world.device) if quant == "static" else quant
    got = comm.fused_add_rms_norm(x, residual, weight, 1e-6, quant=q)
    assert torch.equal(got[1], bf16_res)
    if quant is None:
        assert torch.equal(got[0], bf16_out)
        return
    want, scales = _quant.quantise(bf16_out, _quant.kind_of(q), q if quant == "static" else None)
    assert got[0].dtype == torch.float8_e4m3fn
    if scales is not None:  # first: a scale that differs explains the values that do
        assert_same_bits(got[2], scales, f"{quant} scales")
    assert_same_bits(got[0], want, f"{quant} FP8 values", source=bf16_out)


def test_outputs_given_and_the_residual_in_place(world, comm):
    x = world.random(13, 3, HIDDEN)
    residual = world.mine(world.shared(14, 3, HIDDEN)).contiguous()
    weight = world.shared(15, HIDDEN)
    want_out, want_res = comm.fused_add_rms_norm(x, residual, weight, 1e-6)
    out = torch.full_like(x, float("nan"))
    got = comm.fused_add_rms_norm(x, residual, weight, 1e-6, out=out, residual_out=residual)
    assert got[0] is out and got[1] is residual
    assert torch.equal(out, want_out) and torch.equal(residual, want_res)
    summed = torch.full_like(x, float("nan"))
    assert comm.all_reduce(x, out=summed) is summed
    assert torch.equal(summed, world.mine(rank_order_sum(world.every_rank(x))))


def test_torch_compile_traces_the_communicator(world, comm):
    weight = world.shared(20, HIDDEN)

    @torch.compile(fullgraph=True)
    def step(x, residual):
        y = comm.all_reduce(x)
        out, res, scales = comm.fused_add_rms_norm(y, residual, weight, 1e-6, quant="group")
        return out, res, scales

    x = world.random(21, 2, HIDDEN)
    residual = world.mine(world.shared(22, 2, HIDDEN)).contiguous()
    out, res, scales = step(x, residual)
    e_out, e_res, e_scales = comm.fused_add_rms_norm(comm.all_reduce(x), residual, weight, 1e-6, quant="group")
    assert torch.equal(out.view(torch.uint8), e_out.view(torch.uint8))
    assert torch.equal(res, e_res) and torch.equal(scales, e_scales)


def test_capture_and_replay(world, comm):
    x = world.random(30, 3, HIDDEN)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with comm.capture():
        with torch.cuda.graph(graph):
            y = comm.all_reduce(x)
    for seed in range(3):
        x.copy_(world.random(31 + seed, 3, HIDDEN))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, world.mine(rank_order_sum(world.every_rank(x))))


def test_batch_invariant_rows_keep_their_bits_beyond_the_rows_built_for(world):
    if not world.local:
        pytest.skip("one local team is enough")
    c = tpdecode.Communicator.local(world.size, hidden=1024, rows=8, batch_invariant=True)
    x = world.random(40, 20, 1024)  # 20 rows on mailboxes of 8
    whole = c.all_reduce(x)
    assert whole is not None
    for m in (1, 3, 9):
        assert torch.equal(c.all_reduce(x[:, :m].contiguous()), whole[:, :m])
    c.close()
