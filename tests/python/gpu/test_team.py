"""Team collectives against the exactness contract: all_reduce bitwise equal to the
rank-order FP32 sum, ar_norm's residual bitwise and its output within BF16
tolerance, gather moving bytes; CUDA-graph capture, torch.compile, refusals and
fallback, argument errors, synchronize and reset waiting for the caller's stream, and
(NCCL team) a missing rank's timeout and reset."""

import pytest
import torch

import tpdecode
from conftest import HIDDEN, ROWS, rank_order_sum

SHAPES = [(1, HIDDEN), (3, 1024), (8, HIDDEN), (ROWS, 2048), (5, 8)]


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_all_reduce_is_the_rank_order_sum(world, rows, cols):
    team = world.team
    for seed in range(3):  # fresh data each check, same shape (epochs and re-arm reused)
        x = world.random(100 + seed, rows, cols)
        expected = world.mine(rank_order_sum(world.every_rank(x)))
        assert torch.equal(team.all_reduce(x), expected)
        out = torch.full_like(x, float("nan"))
        team.all_reduce(x, out=out)
        assert torch.equal(out, expected)
        assert team.last_path[0] in ("one-shot", "stock")
    team.all_reduce(x, out=x)  # in place
    assert torch.equal(x, expected)


def test_mailbox_serves_when_memory_is_shared(world):
    world.team.all_reduce(world.random(1, 4, HIDDEN))
    if world.team.shares_memory and world.size > 1:
        assert world.team.last_path == ("one-shot", "")


def ar_norm_reference(world, x, residual, weight, eps):
    reduced = rank_order_sum(world.every_rank(x))
    mine_res = world.every_rank(residual)[0] if residual is not None else None
    new = reduced if mine_res is None else (reduced.float() + mine_res.float()).to(torch.bfloat16)
    v = new.float()
    rstd = torch.rsqrt(v.pow(2).sum(-1, keepdim=True) / v.shape[-1] + eps)
    return world.mine((v * rstd * weight.float()).to(torch.bfloat16)), world.mine(new)


@pytest.mark.parametrize("rows,hidden", [(1, HIDDEN), (7, 1024), (ROWS, 2048)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_ar_norm_matches_torch_math(world, rows, hidden, with_residual):
    team = world.team
    for seed in range(2):
        x = world.random(200 + seed, rows, hidden)
        # The residual is the same on every rank (it is the replicated hidden state).
        residual = world.mine(world.shared(300 + seed, rows, hidden)).contiguous() if with_residual else None
        weight = world.shared(400 + seed, hidden)
        out, new_residual = team.ar_norm(x, residual, weight, 1e-5)
        want_out, want_res = ar_norm_reference(world, x, residual, weight, 1e-5)
        assert torch.equal(new_residual, want_res)
        torch.testing.assert_close(out.float(), want_out.float(), rtol=2**-7, atol=2**-7)
    if with_residual:  # the residual updated in place
        out2, res2 = team.ar_norm(x, residual, weight, 1e-5, residual_out=residual)
        assert res2 is residual and torch.equal(residual, want_res)


@pytest.mark.parametrize("dtype,cols", [(torch.bfloat16, 512), (torch.float16, 64), (torch.float32, 256), (torch.int32, 128)])
def test_gather_moves_bytes(world, dtype, cols):
    shard = world.random(500, 6, cols, dtype=dtype)
    out = world.team.gather(shard)
    parts = world.every_rank(shard)
    expected = world.mine(torch.cat(parts.unbind(0), dim=-1))
    assert out.shape == expected.shape
    assert torch.equal(out.view(torch.uint8), expected.contiguous().view(torch.uint8))


def test_cuda_graph_capture_and_replay(world):
    team = world.team
    x = world.random(600, 4, HIDDEN)
    residual = world.mine(world.shared(601, 4, HIDDEN)).contiguous()
    weight = world.shared(602, HIDDEN)
    summed, out, res_out = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        team.all_reduce(x, out=summed)
        team.ar_norm(x, residual, weight, 1e-6, out=out, residual_out=res_out)
    for seed in range(3):  # fresh inputs each replay
        x.copy_(world.random(610 + seed, 4, HIDDEN))
        residual.copy_(world.mine(world.shared(620 + seed, 4, HIDDEN)))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(summed, world.mine(rank_order_sum(world.every_rank(x))))
        want_out, want_res = ar_norm_reference(world, x, residual, weight, 1e-6)
        assert torch.equal(res_out, want_res)
        torch.testing.assert_close(out.float(), want_out.float(), rtol=2**-7, atol=2**-7)
    world.team.check_errors()


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
def test_capture_on_another_device_raises(world):
    # torch.cuda.graph without stream= captures on one per-process stream, made on the
    # device current at its first use: it may be another than the team's.
    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second GPU to capture on")
    team = world.team
    other = (team.device.index + 1) % torch.cuda.device_count()
    x = world.random(650, 2, 1024)
    out = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="which is not capturing"):
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(other)):
            team.all_reduce(x, out=out)  # nothing launched: every rank raises here
    assert torch.cuda.current_device() == team.device.index
    assert torch.equal(team.all_reduce(x), world.mine(rank_order_sum(world.every_rank(x))))
    team.check_errors()


def test_torch_compile_traces_the_ops(world):
    team = world.team

    @torch.compile(fullgraph=True)
    def step(x, residual, weight):
        return team.ar_norm(team.all_reduce(x), residual, weight, 1e-6)

    x = world.random(700, 2, 1024)
    residual = world.mine(world.shared(701, 2, 1024)).contiguous()
    weight = world.shared(702, 1024)
    out, new_res = step(x, residual, weight)
    summed = team.all_reduce(x)
    want_out, want_res = team.ar_norm(summed, residual, weight, 1e-6)
    assert torch.equal(new_res, want_res) and torch.equal(out, want_out)


def test_refusals_name_the_reason(world):
    team = world.team
    with pytest.raises(tpdecode.NotServed, match="multiples of 8"):
        team.all_reduce(world.random(800, 2, 12))
    with pytest.raises(tpdecode.NotServed, match="built for 32"):
        team.all_reduce(world.random(801, ROWS + 1, 64))
    with pytest.raises(tpdecode.NotServed, match="hidden"):
        team.all_reduce(world.random(802, 2, HIDDEN + 8))
    with pytest.raises(tpdecode.NotServed, match="multiples of 64"):
        team.ar_norm(world.random(803, 2, 96), None, world.shared(804, 96))
    with pytest.raises(TypeError, match="float16"):
        team.all_reduce(world.random(805, 2, 64, dtype=torch.float16))


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf")])
def test_ar_norm_refuses_a_bad_eps(world, eps):
    x = world.random(850, 2, 1024)
    with pytest.raises(ValueError, match="eps"):
        world.team.ar_norm(x, None, world.shared(851, 1024), eps)
    world.team.check_errors()  # nothing launched


def test_argument_errors(world):
    team = world.team
    x = world.random(900, 4, 256)
    with pytest.raises(ValueError, match="contiguous"):
        team.all_reduce(x.transpose(-1, -2).contiguous().transpose(-1, -2))
    with pytest.raises(ValueError):
        team.all_reduce(x, out=torch.empty_like(x)[..., :128])
    with pytest.raises(TypeError, match="bfloat16 is required"):
        team.all_reduce(x, out=torch.empty_like(x, dtype=torch.float32))
    flat = torch.empty(x.numel() + 8, dtype=x.dtype, device=x.device)
    with pytest.raises(ValueError, match="16-byte aligned"):
        team.all_reduce(flat[1 : 1 + x.numel()].view(x.shape))
    with pytest.raises(ValueError, match="cpu"):
        team.all_reduce(x.cpu())
    team.check_errors()  # none of these launched anything


def test_fallback_runs_torch(world):
    kwargs = dict(hidden=1024, rows=8, fallback="torch")
    team = (tpdecode.Team.local(world.size, **kwargs) if world.local
            else tpdecode.Team.from_process_group(**kwargs))
    x = world.random(1000, 16, 256)  # 16 rows: above rows=8
    out = team.all_reduce(x)
    assert team.last_path[0] == "torch"
    torch.testing.assert_close(out.float(), world.mine(rank_order_sum(world.every_rank(x))).float(),
                               rtol=2**-7, atol=2**-6)
    y = world.random(1001, 2, 64, dtype=torch.float32)
    torch.testing.assert_close(team.all_reduce(y), world.mine(world.every_rank(y).sum(0)))
    team.all_reduce(world.random(1002, 2, 256))
    assert team.last_path[0] != "torch"
    torch.cuda.synchronize()
    team.close()


def test_synchronize_and_reset_wait_for_the_callers_stream(world):
    # The team does not see torch's stream, which its calls (an NCCL team's) ran on.
    team = world.team
    torch.cuda._sleep(200_000_000)  # ~0.1 s of work queued on the current stream
    team.synchronize()
    assert torch.cuda.current_stream().query()
    torch.cuda._sleep(200_000_000)
    team.reset()
    assert torch.cuda.current_stream().query()
    x = world.random(1120, 2, HIDDEN)
    assert torch.equal(team.all_reduce(x), world.mine(rank_order_sum(world.every_rank(x))))


def test_missing_rank_times_out_then_reset_recovers(world):
    if world.local or world.size < 2:
        pytest.skip("needs an NCCL team: a local team drives every rank itself")
    team = world.team
    if team.rank == 0:
        team.all_reduce(world.random(1100, 2, 1024))  # rank 1 never makes this call
        with pytest.raises(tpdecode.TimeoutError):
            team.synchronize()  # waits for the call on torch's stream: it gives up after the team's timeout
    world.barrier()
    if team.rank != 0:
        with pytest.raises(tpdecode.TimeoutError):
            team.synchronize()  # learns of rank 0's timeout through the abort word
    team.reset()
    x = world.random(1101, 3, HIDDEN)
    assert torch.equal(team.all_reduce(x), world.mine(rank_order_sum(world.every_rank(x))))
    team.synchronize()
