"""GPU tests: under torchrun (WORLD_SIZE > 1) on an NCCL team of the world, else on
a local team of 2 ranks on one GPU. Skipped without torch or a GPU.

The `world` fixture hides the difference: on the NCCL team a tensor is this rank's
[rows, cols]; on the local team [ranks, rows, cols] holds every rank's block."""

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

import tpdecode  # noqa: E402

HIDDEN = 4096
ROWS = 32
TIMEOUT_MS = 1500

# Why at import, not in the `world` fixture: every test of the process runs on its
# rank's GPU, those that run before the fixture too (test_gemm.py). torch.cuda.graph
# keeps one capture stream per process, made on the device current at its first
# use; made on cuda:0 by an earlier test, it captured rank 1's team graph on cuda:0
# while the team's calls ran at once on cuda:1 (an empty graph: wrong all-reduce).
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


class World:
    def __init__(self, team):
        self.team = team
        self.local = team.kind == "local"
        self.size = team.size
        self.device = team.device

    def random(self, seed, *shape, dtype=torch.bfloat16):
        """This process's tensor: every rank its own values (seeded by rank)."""
        g = torch.Generator(device=self.device).manual_seed(seed * 1000 + self.team.rank)
        lead = (self.size,) if self.local else ()
        t = torch.randn(*lead, *shape, generator=g, device=self.device, dtype=torch.float32)
        return t.to(dtype) if dtype.is_floating_point else (t * 1000).to(dtype)

    def shared(self, seed, *shape):
        """The same values on every rank (e.g. a norm weight)."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randn(*shape, generator=g, device=self.device).to(torch.bfloat16)

    def every_rank(self, t):
        """[size, ...]: every rank's block of t."""
        if self.local:
            return t
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous())
        return torch.stack(parts)

    def mine(self, expected):
        """What this process should hold when every rank gets `expected`."""
        return expected.expand(self.size, *expected.shape) if self.local else expected

    def barrier(self):
        if not self.local:
            dist.barrier()


@pytest.fixture(scope="session")
def world():
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        team = tpdecode.Team.from_process_group(hidden=HIDDEN, rows=ROWS, timeout_ms=TIMEOUT_MS)
    else:
        team = tpdecode.Team.local(2, hidden=HIDDEN, rows=ROWS, timeout_ms=TIMEOUT_MS)
    yield World(team)
    torch.cuda.synchronize()
    team.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_order_sum(parts):
    """The contract's all-reduce: FP32 sum in rank order 0..TP-1, rounded once to BF16."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(torch.bfloat16)


def assert_same_bits(got, want, what, source=None):
    """got and want bit for bit (any dtype, compared as bytes of their elements); else
    fails with how many elements differ and the first one: its index, both values and,
    where `source` (the tensor quantised, same leading shape) is given, its value there."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    g, w = got.contiguous().view(as_int), want.contiguous().view(as_int)
    differ = (g != w).nonzero()
    if differ.numel() == 0:
        return
    first = tuple(differ[0].tolist())
    message = (f"{what}: {differ.shape[0]} of {got.numel()} elements differ; first at {first}: got "
               f"{got[first].float().item()!r} (bits {g[first].item() & ((1 << 8 * got.element_size()) - 1):#x}), "
               f"expected {want[first].float().item()!r} (bits "
               f"{w[first].item() & ((1 << 8 * got.element_size()) - 1):#x})")
    if source is not None and source.shape == got.shape:
        message += f"; the value quantised there {source[first].float().item()!r}"
    raise AssertionError(message)
