"""The per-call paths of an eager call without a GPU, the GPU parts replaced: an
installed linear's forward runs its DecodeGemm exactly where tpdecode.torch.linear
would (and falls back to F.linear elsewhere), and the Communicator's kept verdicts
give every call the refusal _comm_rules.call_refusal gives it. Needs torch (skipped
without it)."""

import weakref

import pytest

torch = pytest.importorskip("torch")

import tpdecode  # noqa: E402
from tpdecode import _comm_rules, communicator  # noqa: E402
from tpdecode.team import CommConfig  # noqa: E402
from tpdecode.torch import _RoutedForward  # noqa: E402


class FakeGemm:
    """DecodeGemm's attributes the forward reads, on the CPU (device index -1)."""

    max_rows = tpdecode.DecodeGemm.max_rows

    def __init__(self, weight):
        self.weight = weight
        self.n, self.k = weight.shape
        self.device_index = weight.get_device()
        self.rows = []

    def __call__(self, x):
        self.rows.append(x.shape[0])
        return torch.nn.functional.linear(x, self.weight)


def routed(bias=True):
    torch.manual_seed(0)
    module = torch.nn.Linear(64, 32, bias=bias).to(torch.bfloat16)
    gemm = FakeGemm(module.weight)
    return module, gemm, _RoutedForward(module, gemm)


@torch.inference_mode()
@pytest.mark.parametrize("bias", [True, False])
def test_installed_forward_runs_the_gemm_where_linear_would(bias):
    module, gemm, forward = routed(bias)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    y = forward(x)
    assert gemm.rows == [6] and y.shape == (2, 3, 32)
    want = torch.nn.functional.linear(x.reshape(6, 64), module.weight).view(2, 3, 32)
    assert torch.equal(y, want if module.bias is None else want.add_(module.bias))
    above = torch.randn(gemm.max_rows + 1, 64).to(torch.bfloat16)
    assert torch.equal(forward(above), torch.nn.functional.linear(above, module.weight, module.bias))
    assert torch.equal(forward(x.clone()), y)
    assert gemm.rows == [6, 6]  # rows above max_rows ran F.linear


def test_installed_forward_falls_back_where_linear_would_not_take_the_gemm():
    module, gemm, forward = routed()
    with torch.inference_mode():
        x32 = torch.randn(4, 64)
        module.float()  # the same Parameter objects, new data: the gemm's weight is stale
        assert torch.equal(forward(x32), torch.nn.functional.linear(x32, module.weight, module.bias))
    assert gemm.rows == []
    module, gemm, forward = routed()
    module.weight = torch.nn.Parameter(module.weight.detach().clone())  # a weight replaced after install
    x = torch.randn(3, 64).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(forward(x), torch.nn.functional.linear(x, module.weight, module.bias))
    assert gemm.rows == []
    module, gemm, forward = routed()
    y = forward(x.requires_grad_())  # a gradient wanted: F.linear, which has a backward
    assert gemm.rows == [] and y.requires_grad
    module, gemm, forward = routed()
    with torch.inference_mode():
        columns = torch.randn(64, 4).to(torch.bfloat16).t()  # [4, 64], column stride 4: not rows DecodeGemm takes
        assert torch.equal(forward(columns), torch.nn.functional.linear(columns, module.weight, module.bias))
        assert not tpdecode.torch._rows_served(gemm, columns, module.weight, module.bias)
        assert tpdecode.torch._rows_served(gemm, columns.contiguous(), module.weight, module.bias)
    assert gemm.rows == []


@torch.inference_mode()
def test_batch_invariant_forward_runs_linear_batch_invariant():
    module, _, _ = routed()
    forward = _RoutedForward(module, None, batch_invariant=True)  # no DecodeGemm (a CPU weight)
    x = torch.randn(5, 64).to(torch.bfloat16)
    want = torch.cat([torch.nn.functional.linear(x[i : i + 1], module.weight, module.bias) for i in range(5)])
    assert torch.equal(forward(x), want)  # each row its own one-row F.linear
    assert torch.equal(forward(x[2:3]), want[2:3])
    assert torch.equal(forward(x.view(1, 5, 64)), want.view(1, 5, 32))
    assert forward(x[:0]).shape == (0, 32)  # no rows: F.linear's empty result


def test_batch_invariant_linear_gives_its_gemm_aligned_contiguous_rows(monkeypatch):
    from tpdecode import torch as tpd_torch

    module, gemm, _ = routed(bias=False)
    seen = []

    class Recording(FakeGemm):
        def __call__(self, x):
            seen.append((x.is_contiguous(), x.data_ptr() % 16))
            return super().__call__(x)

    monkeypatch.setattr(tpd_torch, "_gemm_for", lambda weight, batch_invariant=False: Recording(weight))
    base = torch.randn(3 * 64 + 8).to(torch.bfloat16)
    with torch.inference_mode():
        for x in (base[1 : 1 + 3 * 64].view(3, 64), base[: 3 * 64].view(64, 3).t()):  # misaligned; strided
            seen.clear()
            y = tpd_torch.linear(x, module.weight, batch_invariant=True)
            assert seen == [(True, 0)] and torch.equal(y, torch.nn.functional.linear(x, module.weight))


class FakeRunner:
    """The team's runner (team._Runner): records the eager calls the Communicator makes,
    or raises NotServed as the extension does for a call it does not take."""

    def __init__(self):
        self.calls, self.not_served = [], False

    def all_reduce(self, x, out):
        self.run("all_reduce", x, out)

    def ar_norm(self, x, residual, weight, eps, out, residual_out, kind, scale, scales):
        self.run("ar_norm", x, residual, weight, eps, out, residual_out, kind, scale, scales)

    def run(self, op, *args):
        if self.not_served:
            raise tpdecode.NotServed(f"{op}: not served")
        self.calls.append((op, args))


def local_communicator(monkeypatch, kind="nccl", size=2, max_bytes=None, **config):
    class FakeTeam:
        pass

    team = FakeTeam()
    team._run = FakeRunner()
    team.config = CommConfig(**config)
    team.device, team.size, team.kind = torch.device("cpu"), size, kind
    monkeypatch.setattr(communicator, "_capability", lambda device: (9, 0))
    c = tpdecode.Communicator(max_bytes=max_bytes, _team=team)
    c._device_index = -1  # the CPU's, as Tensor.get_device() gives it
    return c


def test_kept_verdicts_are_call_refusal_for_every_call(monkeypatch):
    c = local_communicator(monkeypatch, hidden=1024, rows=8)
    assert not c.disabled

    def direct(op, x, kind):
        return _comm_rules.call_refusal(op, "bfloat16" if x.dtype == torch.bfloat16 else str(x.dtype)[6:], x.shape,
                                        x.is_contiguous(), True, x.numel() * x.element_size(), c.max_bytes, 1024, 8,
                                        c.batch_invariant, 0, kind)

    base = torch.zeros(64 * 1024 + 8, dtype=torch.bfloat16)
    cases = [base[: 4 * 1024].view(4, 1024), base[: 9 * 1024].view(9, 1024), base[: 4 * 1000].view(4, 1000),
             base[: 4 * 256].view(4, 256), base[: 8 * 1024].view(2, 4, 1024),
             base[: 4 * 1024].view(1024, 4).t(), torch.zeros(4, 1024, dtype=torch.float16)]
    for _ in range(3):  # the second and third rounds read the kept verdicts
        for x in cases:
            for op, kind in (("all_reduce", "none"), ("fused_add_rms_norm", "none"),
                             ("fused_add_rms_norm", "group")):
                assert c._refusal(op, x, kind, False) == direct(op, x, kind), (op, kind, tuple(x.shape))
                assert c._refusal(op, x, kind, True) == direct(op, x, kind)  # as torch.compile traces it
    assert c.should_all_reduce(cases[0]) and not c.should_all_reduce(cases[1])
    misaligned = base[1 : 1 + 4 * 1024].view(4, 1024)  # a served shape at an odd address
    assert c.refusal("all_reduce", misaligned) == ""  # taken from an aligned copy (test below)
    with pytest.raises(ValueError, match="op 'ar_norm'"):
        c.refusal("ar_norm", cases[0])
    c.max_bytes = 1024  # a changed cap is seen at once
    assert "above the cap" in c.refusal("all_reduce", cases[0])
    c.max_bytes = 1 << 20
    assert c.should_all_reduce(cases[0]) and not c.should_all_reduce(cases[1])
    c.batch_invariant = True  # so is a change of batch_invariant: 9 rows run as further calls
    assert c.should_all_reduce(cases[1])
    c.batch_invariant = False
    assert c.all_reduce(cases[1]) is None  # refused: None, nothing ran
    assert c._team._run.calls == []


def test_the_leading_dimension_of_ranks_is_a_local_teams_of_several(monkeypatch):
    # As Team takes them: [n, ..., columns] on a local team of n > 1, [..., columns] otherwise.
    x = torch.zeros(4, 1024, dtype=torch.bfloat16)
    one = local_communicator(monkeypatch, kind="local", size=1, max_bytes=1 << 20, hidden=1024, rows=8)
    assert one.should_all_reduce(x)  # (one rank has no size cap of its own in the table: given here)
    two = local_communicator(monkeypatch, kind="local", size=2, hidden=1024, rows=8)
    assert not two.should_all_reduce(x) and two.should_all_reduce(torch.zeros(2, 4, 1024, dtype=torch.bfloat16))


class WritingRunner(FakeRunner):
    """Writes what a one-rank team would: out = x, residual_out = x + residual."""

    def all_reduce(self, x, out):
        super().all_reduce(x, out)
        out.copy_(x)

    def ar_norm(self, x, residual, weight, eps, out, residual_out, kind, scale, scales):
        super().ar_norm(x, residual, weight, eps, out, residual_out, kind, scale, scales)
        sum_ = x if residual is None else x + residual
        residual_out.copy_(sum_)
        out.copy_(sum_ * weight)


def test_misaligned_tensors_run_through_aligned_copies(monkeypatch):
    # Why not refused: the verdict must be every rank's (an address may differ from rank
    # to rank; one rank handing the call on alone, or raising, leaves its peers waiting).
    c = local_communicator(monkeypatch, hidden=1024, rows=8)
    c._team._run = run = WritingRunner()
    base = torch.randn(6 * 4 * 1024 + 64).to(torch.bfloat16)
    odd = [base[1 + i * 4 * 1024 + 8 * i : 1 + (i + 1) * 4 * 1024 + 8 * i].view(4, 1024) for i in range(4)]
    x, residual, out, res_out = odd
    weight = base[-1025:-1]  # [1024] at an odd address too
    assert all(t.data_ptr() % 16 for t in (*odd, weight)) and c.should_all_reduce(x)
    aligned = lambda t: t.data_ptr() % 16 == 0  # noqa: E731
    assert c.all_reduce(x, out=out) is out and torch.equal(out, x)  # written back
    _, (x_in, out_in) = run.calls.pop()
    assert aligned(x_in) and aligned(out_in) and torch.equal(x_in, x)
    keep = x.clone()
    assert c.all_reduce(x, out=x) is x and torch.equal(x, keep)  # in place: one copy for both
    _, (x_in, out_in) = run.calls.pop()
    assert x_in is out_in and aligned(x_in)
    want_res, want_out = x + residual, (x + residual) * weight
    got = c.fused_add_rms_norm(x, residual, weight, 1e-6, out=out, residual_out=res_out)
    assert got[0] is out and got[1] is res_out and torch.equal(out, want_out) and torch.equal(res_out, want_res)
    _, (x_in, r_in, w_in, _, o_in, ro_in, *_) = run.calls.pop()
    assert all(aligned(t) for t in (x_in, r_in, w_in, o_in, ro_in))
    got = c.fused_add_rms_norm(x, residual, weight, 1e-6, residual_out=residual)  # vLLM's in-place residual
    assert got[1] is residual and torch.equal(residual, want_res) and torch.equal(got[0], want_out)
    _, (_, r_in, _, _, _, ro_in, *_) = run.calls.pop()
    assert r_in is ro_in and aligned(r_in)
    plain = torch.randn(4, 1024).to(torch.bfloat16)
    c.all_reduce(plain)
    assert run.calls.pop()[1][0] is plain  # no copy where none is needed


def test_eager_calls_run_the_runner_on_new_outputs(monkeypatch):
    c = local_communicator(monkeypatch, hidden=1024, rows=8)
    x = torch.randn(4, 1024).to(torch.bfloat16)
    residual, weight = torch.randn_like(x), torch.randn(1024).to(torch.bfloat16)
    out = c.all_reduce(x)
    op, (x_in, out_in) = c._team._run.calls.pop()
    assert op == "all_reduce" and x_in is x and out_in is out and out.shape == x.shape and out.dtype == x.dtype
    got = c.fused_add_rms_norm(x, residual, weight, 1e-5)
    op, (x_in, r_in, w_in, eps, out_in, res_in, kind, scale, scales) = c._team._run.calls.pop()
    assert op == "ar_norm" and x_in is x and r_in is residual and w_in is weight
    assert len(got) == 2 and got[0] is out_in and got[1] is res_in
    assert (eps, kind, scale, scales) == (1e-5, "none", None, None) and type(eps) is float
    assert got[0].shape == x.shape and got[1].dtype == torch.bfloat16 and got[0] is not got[1]
    c._team._run.not_served = True  # what the extension does not take falls through too
    assert c.all_reduce(x) is None and c.fused_add_rms_norm(x, residual, weight, 1e-5) is None
    with pytest.raises(ValueError, match="quant="):
        c.fused_add_rms_norm(x, residual, weight, 1e-5, quant="fp4")
    runner = weakref.ref(c._team._run)
    c._team.close = lambda: None
    c.close()
    assert runner() is None  # a closed communicator keeps nothing of its team's
    assert c.all_reduce(x) is None and c.fused_add_rms_norm(x, residual, weight, 1e-5) is None


def test_eager_calls_write_the_outputs_given(monkeypatch):
    c = local_communicator(monkeypatch, hidden=1024, rows=8)
    x = torch.randn(4, 1024).to(torch.bfloat16)
    residual, weight = torch.randn_like(x), torch.randn(1024).to(torch.bfloat16)
    given = torch.empty_like(x)
    assert c.all_reduce(x, out=given) is given
    assert c._team._run.calls.pop() == ("all_reduce", (x, given))
    out = torch.empty_like(x)
    got = c.fused_add_rms_norm(x, residual, weight, 1e-5, out=out, residual_out=residual)  # residual in place
    op, (_, r_in, _, _, out_in, res_in, _, _, _) = c._team._run.calls.pop()
    assert op == "ar_norm" and out_in is out and res_in is residual and r_in is residual
    assert got[0] is out and got[1] is residual
    got = c.fused_add_rms_norm(x, None, weight, 1e-5, out=out)  # only out given: a new residual
    assert got[0] is out and got[1] is not residual and got[1].shape == x.shape
    assert c._team._run.calls.pop()[1][5] is got[1]


def test_a_closed_team_releases_its_runner_and_refuses_calls(monkeypatch):
    from tpdecode import _ops, team as team_module
    from tpdecode.team import Team

    monkeypatch.setattr(team_module, "_caller_stream", lambda device: 1234)  # no GPU here

    class FakeHandle:
        waits = []

        device = 0

        def synchronize(self, limit_ms, stream):
            self.waits.append((limit_ms, stream))
            raise tpdecode.TimeoutError("a failed team is closed all the same")

    team = object.__new__(Team)  # the extension's team replaced by stand-ins
    team._handle, team._run = FakeHandle(), FakeRunner()
    team._id = _ops.register(team._run)
    runner = weakref.ref(team._run)
    team.close()
    assert FakeHandle.waits == [(0, 1234)]  # the caller's queued calls waited for first (the default limit)
    assert runner() is None and team._id not in _ops.objects  # nothing of the extension's team is kept
    x = torch.zeros(4, 1024, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="closed"):
        team.all_reduce(x)
    with pytest.raises(RuntimeError, match="closed"):
        team.ar_norm(x, None, torch.ones(1024, dtype=torch.bfloat16))
    for field in ("rank", "size", "device", "check_errors", "synchronize", "reset"):  # say so, too
        with pytest.raises(RuntimeError, match=f"Team.*the team is closed"):
            attr = getattr(team, field)
            attr() if callable(attr) else None
    assert repr(team) == "tpdecode.Team(closed)"
    team.close()  # again: nothing to do


def test_install_routes_only_linears_whose_forward_is_nn_linears(monkeypatch):
    from tpdecode import torch as tpd_torch

    class Scaled(torch.nn.Linear):  # a subclass with its own forward
        def forward(self, x):
            return super().forward(x) * 2

    class Plain(torch.nn.Linear):  # a subclass that keeps nn.Linear's
        pass

    monkeypatch.setattr(tpd_torch, "_eligible", lambda weight: True)
    class PreparedGemm(FakeGemm):
        def prepare(self, rows):
            pass

    monkeypatch.setattr(tpd_torch, "_gemm_for", lambda weight, batch_invariant=False: PreparedGemm(weight))
    # Without biases: a routed linear adds its bias after the product, rounded again.
    model = torch.nn.ModuleDict({"plain": torch.nn.Linear(64, 32, bias=False), "sub": Plain(64, 32, bias=False),
                                 "scaled": Scaled(64, 32, bias=False),
                                 "hooked": torch.nn.Linear(64, 32, bias=False)}).to(torch.bfloat16)
    hooked = model["hooked"].forward
    model["hooked"].forward = lambda x: hooked(x) + 1  # another wrapper's forward on the instance
    wrapper = model["hooked"].forward
    x = torch.randn(3, 64).to(torch.bfloat16)
    with torch.inference_mode():
        want = {name: sub(x) for name, sub in model.items()}
        assert tpd_torch.install(model, rows=()) == 2
        assert isinstance(model["plain"].__dict__.get("forward"), _RoutedForward)
        assert isinstance(model["sub"].__dict__.get("forward"), _RoutedForward)
        assert "forward" not in model["scaled"].__dict__ and model["hooked"].forward is wrapper
        for name, sub in model.items():
            assert torch.equal(sub(x), want[name]), name
        assert tpd_torch.install(model, rows=()) == 2  # again: the routed ones count again, nothing else
        assert tpd_torch.uninstall(model) == 2
        assert model["hooked"].forward is wrapper and "forward" not in model["plain"].__dict__
        for name, sub in model.items():
            assert torch.equal(sub(x), want[name]), name


def test_a_weights_gemm_is_keyed_by_its_strides_too():
    from tpdecode import torch as tpd_torch

    buf = torch.zeros(32, 128, dtype=torch.bfloat16)
    a, b = buf[:, :64], buf.view(-1)[: 32 * 64].view(32, 64)  # one address and shape, other row strides
    assert a.data_ptr() == b.data_ptr() and a.shape == b.shape
    assert tpd_torch._key(a) != tpd_torch._key(b)


def test_linear_keeps_a_weights_gemm_only_while_the_weight_lives(monkeypatch):
    import gc

    from tpdecode import torch as tpd_torch

    made = []

    class WeakGemm:
        def __init__(self, weight, *, batch_invariant=False, _hold_weight=True):
            made.append(_hold_weight)
            self._weight = weight if _hold_weight else weakref.ref(weight)

    monkeypatch.setattr(tpd_torch, "DecodeGemm", WeakGemm)
    monkeypatch.setattr(tpd_torch, "_eligible", lambda weight: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # no GPU here
    monkeypatch.setattr(tpd_torch, "_gemms", {})
    weight = torch.zeros(32, 64, dtype=torch.bfloat16)
    key = tpd_torch._key(weight)
    gemm = tpd_torch._gemm_for(weight)
    assert made == [False] and tpd_torch._gemms[key] is gemm and tpd_torch._gemm_for(weight) is gemm
    del weight
    gc.collect()
    assert key not in tpd_torch._gemms  # a weight made per step is not kept alive, nor its DecodeGemm


def test_a_gemm_holding_its_weight_weakly_says_when_it_is_gone():
    weight = torch.zeros(16, 128, dtype=torch.bfloat16)
    gemm = object.__new__(tpdecode.DecodeGemm)
    gemm._weight = weakref.ref(weight)
    assert gemm.weight is weight
    del weight
    assert gemm.weight is None
    gemm._weight = torch.ones(1)  # held: the tensor itself
    assert gemm.weight is gemm._weight


def test_a_gemm_refuses_a_weight_whose_storage_moved(monkeypatch):
    from tpdecode import gemm as gemm_module

    weight = torch.zeros(16, 128, dtype=torch.bfloat16)
    gemm = object.__new__(tpdecode.DecodeGemm)  # the C++ object replaced by a stand-in
    gemm._weight, gemm._data_ptr, gemm.n, gemm._device = weight, weight.data_ptr(), 16, -1
    ran = []
    gemm._run = lambda x, out: ran.append(x)
    monkeypatch.setattr(gemm_module, "_current_device", lambda: -1)
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    assert gemm(x).shape == (2, 16) and len(ran) == 1
    weight.data = torch.ones(16, 128, dtype=torch.bfloat16)  # new storage under the same tensor
    with pytest.raises(RuntimeError, match="storage moved"):
        gemm(x)
    assert len(ran) == 1
    gemm._weight = weakref.ref(weight)  # tpdecode.torch's objects: looked up by the address, never refused
    gemm(x)
    assert len(ran) == 2


def test_the_compiled_op_checks_the_weights_storage_too():
    from tpdecode import gemm as gemm_module

    weight = torch.zeros(16, 128, dtype=torch.bfloat16)
    ran = []
    call = gemm_module._checked(lambda x, out: ran.append(x), weight, weight.data_ptr())
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    call(x, None)
    weight.data = torch.ones(16, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="storage moved"):
        call(x, None)
    assert len(ran) == 1
    held_weakly = gemm_module._checked(lambda x, out: ran.append(x), weakref.ref(weight), 0)
    held_weakly(x, None)  # tpdecode.torch's objects: looked up by the address, never refused
    assert len(ran) == 2


def test_the_runner_falls_back_or_raises_what_the_extension_refused(monkeypatch):
    from tpdecode import team as team_module

    class Refusing:
        device = 0

        def __getattr__(self, op):
            def refuse(*args):
                raise tpdecode.NotServed(f"{op}: not served")
            return refuse

    class Fallback:
        calls = []

        def __getattr__(self, op):
            return lambda *args: self.calls.append((op, len(args)))

    monkeypatch.setattr(team_module, "_current_device", lambda: 0)
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    runner = team_module._Runner(Refusing(), Fallback())
    runner.all_reduce(x, x)
    runner.ar_norm(x, None, x[0], 1e-6, x, x, "none", None, None)
    runner.gather(x, x)
    assert Fallback.calls == [("all_reduce", 2), ("ar_norm", 9), ("gather", 2)] and runner.path == "torch"
    bare = team_module._Runner(Refusing(), None)
    with pytest.raises(tpdecode.NotServed, match="all_reduce: not served"):
        bare.all_reduce(x, x)
    assert bare.path == "none"
    # An FP8 out of another 1-byte dtype: the extension sees bytes, so the runner refuses it.
    scale = torch.ones(1)
    for wrong in (torch.float8_e5m2, torch.uint8, torch.bfloat16):
        with pytest.raises(TypeError, match="float8_e4m3fn"):
            bare.ar_norm(x, None, x[0], 1e-6, torch.empty(2, 8, dtype=wrong), x, "static", scale, None)
    with pytest.raises(tpdecode.NotServed):  # the right dtype reaches the extension
        bare.ar_norm(x, None, x[0], 1e-6, torch.empty(2, 8, dtype=torch.float8_e4m3fn), x, "static", scale, None)


def test_the_torch_fallback_refuses_what_its_math_would_broadcast():
    # The extension's NotServed can come before its tensor checks; the fallback checks
    # what torch would otherwise broadcast or copy across (a local team of 2 on CPU).
    from tpdecode._fallback import TorchFallback

    local = TorchFallback(None, 2)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)  # the 2 ranks' [3, 64]
    out = torch.empty_like(x)
    local.all_reduce(x, out)
    assert torch.equal(out[0], (x[0].float() + x[1].float()).to(torch.bfloat16)) and torch.equal(out[0], out[1])
    with pytest.raises(ValueError, match="2 ranks"):  # no rank dimension: its rows would be summed
        local.all_reduce(x[0], torch.empty_like(x[0]))
    with pytest.raises(ValueError, match="shape"):
        local.all_reduce(x, torch.empty(2, 1, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float32"):
        local.all_reduce(x, torch.empty(2, 3, 64))
    residual, weight = torch.randn(2, 3, 64).to(torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    local.ar_norm(x, residual, weight, 1e-6, out, residual_out)
    reduced = (x[0].float() + x[1].float()).to(torch.bfloat16)
    assert torch.equal(residual_out[0], (reduced.float() + residual[0].float()).to(torch.bfloat16))
    with pytest.raises(ValueError, match="residual"):  # one row, broadcast over three
        local.ar_norm(x, residual[:, :1], weight, 1e-6, out, residual_out)
    with pytest.raises(ValueError, match="weight"):
        local.ar_norm(x, residual, weight[:1], 1e-6, out, residual_out)
    shard = torch.randn(2, 3, 16).to(torch.bfloat16)
    gathered = torch.empty(2, 3, 32, dtype=torch.bfloat16)
    local.gather(shard, gathered)
    assert torch.equal(gathered[1], torch.cat([shard[0], shard[1]], dim=-1))
    with pytest.raises(ValueError, match="needed"):
        local.gather(shard, torch.empty(2, 3, 16, dtype=torch.bfloat16))
