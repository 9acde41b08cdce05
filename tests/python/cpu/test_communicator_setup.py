"""The engine communicator's set-up is all or nothing: a rank that cannot set up, or
fails to, disables every rank (the verdict is all-reduced). Two CPU processes over
gloo, the GPU parts replaced; needs torch (skipped without it)."""

import multiprocessing as mp
import os
import socket

import pytest

torch = pytest.importorskip("torch")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, fail, results):
    import torch.distributed as dist

    import tpdecode
    from tpdecode import communicator

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    communicator._capability = lambda device: (9, 0)
    communicator._nccl_team_available = lambda: True
    if fail == "setup" and rank == 1:
        communicator._comm_rules.setup_refusal = lambda *a: "this rank's GPU is not Hopper"

    def build(*args, **kwargs):
        if fail == "build" and rank == 1:
            raise RuntimeError("no peer access")
        return "a team"

    communicator.Team.from_process_group = build
    communicator.Communicator._enable = lambda self, team, max_bytes: setattr(self, "disabled", False)
    c = tpdecode.Communicator(device=0)
    results.put((rank, c.disabled, c.disabled_reason, c._abandoned))
    dist.destroy_process_group()


@pytest.mark.parametrize("fail", ["setup", "build", None])
def test_every_rank_disables_when_any_rank_fails(fail):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, fail, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (d, why, abandoned)) for r, d, why, abandoned in (results.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    if fail is None:
        assert not got[0][0] and not got[1][0]
        return
    assert got[0][0] and got[1][0], got  # both disabled
    if fail == "setup":
        assert got[1][1] == "this rank's GPU is not Hopper"
        assert got[0][1] == "another rank cannot set tpdecode up"
    else:
        assert got[1][1].startswith("setting up the team failed: no peer access")
        assert got[0][1] == "setting up the team failed on another rank"
        assert got[0][2] == "a team"  # built, kept unused: closing it would wait on the peer
