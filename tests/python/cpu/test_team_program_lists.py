"""tpdecode.TeamProgram's Python side without a GPU: its op lists reach the C++ object
(a fake of it here) rank by rank and in order, with each Norm's all_reduce; a flat
list stands for the one rank an NCCL team's object drives (elsewhere it is refused);
wrong list counts, empty lists, foreign ops, bad ``after`` indices and a closed team
are refused before any build. Needs torch (skipped without it)."""

import pytest

torch = pytest.importorskip("torch")

from tpdecode import program as P  # noqa: E402
from tpdecode.team import _Closed  # noqa: E402


class FakeProgram:
    """What the extension's team_program / gemm_program return, recording the calls."""

    def __init__(self, driven=None):
        self.driven, self.device, self.rows, self.ctas = driven, 0, 0, 0
        self.added, self.built = [], None

    def add_gemm(self, *args):
        *rank, _weight, _x, _out, after, silu_mul = args
        self.added.append((*rank, "gemm", after, silu_mul))

    def add_norm(self, *args):
        *rank, _x, after, _weight, _eps, _residual, _residual_out, _out, folded, all_reduce = args
        self.added.append((*rank, "norm", after, folded, all_reduce))

    def build(self, m):
        self.built = self.rows = m
        self.ctas = 66

    def run(self, on, pdl):
        pass


class FakeModule:
    def __init__(self, driven):
        self.driven, self.made = driven, []

    def team_program(self, team_handle):
        self.made.append(FakeProgram(self.driven))
        return self.made[-1]

    def gemm_program(self):
        self.made.append(FakeProgram())
        return self.made[-1]


class FakeTeam:
    _handle = object()


def layer(m=3):
    """One rank's ops: a row-parallel GEMM, the all-reducing norm, a column-parallel GEMM."""
    t = lambda *shape: torch.zeros(*shape, dtype=torch.bfloat16)  # noqa: E731
    partial, h = t(m, 64), t(m, 64)
    return [P.Gemm(t(64, 128), t(m, 128), partial),
            P.Norm(partial, t(64), h, after=0, all_reduce=True),
            P.Gemm(t(32, 64), h, t(m, 32), after=1)]


@pytest.fixture
def fake(monkeypatch):
    def use(driven):
        module = FakeModule(driven)
        monkeypatch.setattr(P._lib, "module", module)
        # Why: torch's capture query needs a CUDA driver, which this machine may lack.
        monkeypatch.setattr(P, "_not_capturing", lambda what: None)
        return module
    return use


def test_every_rank_gets_its_ops_in_order(fake):
    module = fake(2)
    program = P.TeamProgram(FakeTeam(), [layer(), layer()])
    handle = module.made[0]
    one = [("gemm", -1, False), ("norm", 0, False, True), ("gemm", 1, False)]
    assert handle.added == [(r, *op) for r in (0, 1) for op in one]
    assert handle.built == 3 and program.rows == 3 and program.ctas == 66
    # Each rank's outs and h are written, its x and norm weight read (6 + 4 buffers).
    assert len(program._writes) == 6 and len(program._reads) == 4


def test_a_flat_list_is_the_one_driven_rank(fake):
    module = fake(1)
    P.TeamProgram(FakeTeam(), layer())
    P.TeamProgram(FakeTeam(), [layer()])
    one = [(0, "gemm", -1, False), (0, "norm", 0, False, True), (0, "gemm", 1, False)]
    assert [h.added for h in module.made] == [one, one]


def test_refusals_before_any_build(fake):
    module = fake(2)
    with pytest.raises(ValueError, match="1 op lists for a team object driving 2 rank"):
        P.TeamProgram(FakeTeam(), [layer()])
    with pytest.raises(TypeError, match="a flat op list for a team object driving 2 ranks"):
        P.TeamProgram(FakeTeam(), layer()[:2])
    with pytest.raises(ValueError, match="no ops for rank 1"):
        P.TeamProgram(FakeTeam(), [layer(), []])
    with pytest.raises(TypeError, match=r"TeamProgram \(rank 1\): op 2 is a str"):
        P.TeamProgram(FakeTeam(), [layer(), [*layer()[:2], "qkv"]])
    bad = layer()
    bad[2].after = 2
    with pytest.raises(ValueError, match=r"TeamProgram \(rank 0\): op 2's after is 2"):
        P.TeamProgram(FakeTeam(), [bad, layer()])
    assert all(h.built is None for h in module.made)
    closed = FakeTeam()
    closed._handle = _Closed()  # what Team.close() leaves
    with pytest.raises(ValueError, match="the team is closed"):
        P.TeamProgram(closed, [layer(), layer()])


def test_gemm_program_passes_all_reduce_on(fake):
    # The C++ GemmProgram refuses it (it needs a TeamProgram); the flag must reach it.
    module = fake(None)
    P.GemmProgram(layer())
    assert module.made[0].added[1] == ("norm", 0, False, True)
