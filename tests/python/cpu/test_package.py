"""The package without a GPU: import, info(), the error kinds, argument checks that
fail before any GPU work. Runs in CI (no torch there: torch cases skip) and on the
GPU machine (with torch)."""

import builtins
import os

import pytest

import tpdecode
from tpdecode import _lib


def test_import_keeps_multicast_off():
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert os.environ["NVSHMEM_DISABLE_NVLS"] == "1"


def test_info_describes_the_machine():
    d = tpdecode.info()
    assert d["version"]
    assert d["runtime_version"] >= 13000
    assert isinstance(d["gpus"], list) and isinstance(d["backends"], list)
    assert {b["name"] for b in d["backends"]} >= {"local team", "NCCL team"}
    assert all(isinstance(b["serves"], bool) and b["why"] for b in d["backends"])
    # Either GPUs are listed or the reason there are none is given.
    assert bool(d["gpus"]) != bool(d["no_gpu_reason"])
    for g in d["gpus"]:
        assert g["sms"] > 0 and g["memory_bytes"] > 0


def test_a_torch_of_another_cuda_major_is_refused():
    built = int(_lib.module.built_cuda_major())
    assert built >= 12
    assert _lib.cuda_mismatch(None, built) == ""  # a CPU build of torch
    assert _lib.cuda_mismatch(f"{built}.0", built) == ""
    assert _lib.cuda_mismatch(f"{built}.9", built) == ""
    why = _lib.cuda_mismatch(f"{built - 1}.8", built)
    assert f"built with CUDA {built}" in why and f"CUDA {built - 1}.8 build" in why


def test_version_is_the_librarys():
    assert tpdecode.__version__ == tpdecode.info()["version"]
    assert tpdecode.__version__.count(".") == 2


def test_error_classes():
    assert issubclass(tpdecode.TimeoutError, builtins.TimeoutError)
    assert issubclass(tpdecode.NotServed, ValueError)
    assert issubclass(tpdecode.UnsupportedDType, TypeError) and issubclass(tpdecode.UnsupportedDType, tpdecode.NotServed)
    assert issubclass(tpdecode.CapacityError, tpdecode.NotServed)
    for cls in (tpdecode.TeamBroken, tpdecode.Unavailable, tpdecode.CudaError):
        assert issubclass(cls, tpdecode.Error)


def test_gemm_weight_checks_before_any_gpu_work():
    np = pytest.importorskip("numpy")  # a CPU DLPack tensor (the `test` extra brings numpy)
    with pytest.raises(ValueError, match="is on cpu; a CUDA tensor is required"):
        _lib.module.decode_gemm(np.zeros((64, 128), np.float32), True)
    with pytest.raises(ValueError, match="must be 2-D"):
        _lib.module.decode_gemm(np.zeros((4, 64, 128), np.float32), True)


def test_mlp_block_checks_its_tensors_before_any_gpu_work():
    np = pytest.importorskip("numpy")
    w = np.zeros((64, 64), np.float32)
    with pytest.raises(ValueError, match="residual must be a CUDA tensor"):
        _lib.module.mlp_block(None, w, w, w, None, None, 1e-6, w, w, w, True, "")
    with pytest.raises(ValueError, match="form must be"):
        _lib.module.mlp_block(None, w, w, w, None, None, 1e-6, w, w, w, True, "fused")


def test_team_mlp_block_takes_only_a_team():
    np = pytest.importorskip("numpy")
    w = np.zeros((64, 64), np.float32)
    not_a_team = _lib.module.gemm_program()
    with pytest.raises(ValueError, match="team is not a tpdecode team"):
        _lib.module.team_mlp_block(not_a_team, None, w, w, w, w, None, 1e-6, w, w, w, "", 0)


def test_mlp_block_comm_group_is_a_team_blocks_and_not_negative():
    pytest.importorskip("torch")
    none = dict(post_norm=None, gate_up=None, down=None, attn=None, residual=None, out=None)
    with pytest.raises(ValueError, match="comm_group is a team block's"):
        tpdecode.MlpBlock(**none, comm_group=1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="comm_group must be an int, 0 or more"):
            tpdecode.MlpBlock(**none, team=object(), comm_group=bad)


def test_team_program_takes_only_a_team():
    not_a_team = _lib.module.gemm_program()
    with pytest.raises(ValueError, match="team is not a tpdecode team"):
        _lib.module.team_program(not_a_team)


def test_gemm_program_checks_its_ops_before_any_gpu_work():
    np = pytest.importorskip("numpy")
    w = np.zeros((64, 64), np.float32)
    program = _lib.module.gemm_program()
    with pytest.raises(ValueError, match="the first op's x must be a CUDA tensor"):
        program.add_gemm(w, w, w, -1, False)
    with pytest.raises(ValueError, match="no ops"):
        program.build(1)
    with pytest.raises(ValueError, match="run before build"):
        program.run(w, True)


def test_nccl_unique_id_length_is_checked():
    with pytest.raises(ValueError, match="128 expected"):
        _lib.module.nccl_team(b"\0" * 7, 0, 2, 0, 0, True)


def test_local_team_without_gpu_says_why():
    if tpdecode.info()["gpus"]:
        pytest.skip("a GPU is visible")
    with pytest.raises(tpdecode.Unavailable, match="needs a CUDA GPU"):
        _lib.module.local_team(2, 0, 0, True)


# ---- with torch (the GPU machine's venv; CI has none) ----


def test_torch_surface_checks_arguments():
    torch = pytest.importorskip("torch")
    from tpdecode.team import CommConfig, _device_index

    w = torch.zeros(64, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="is on cpu"):
        tpdecode.DecodeGemm(w)
    with pytest.raises(TypeError):
        CommConfig(hiden=4096)
    with pytest.raises(ValueError, match="CUDA device"):
        _device_index("cpu")


def test_custom_ops_trace_with_fake_tensors():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tpdecode.team  # noqa: F401  (registers the ops)

    with FakeTensorMode():
        x = torch.empty(4, 4096, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        torch.ops.tpdecode.all_reduce(x, out, 0)
        none = torch.empty(0, dtype=torch.float32)
        torch.ops.tpdecode.ar_norm(x, None, x[0], 1e-6, out, torch.empty_like(x), "none", None, none, 0)
        fp8 = torch.empty(4, 4096, dtype=torch.float8_e4m3fn)
        scales = torch.empty(4, 32, dtype=torch.float32)
        torch.ops.tpdecode.ar_norm(x, x, x[0], 1e-6, fp8, torch.empty_like(x), "group", None, scales, 0)
        torch.ops.tpdecode.ar_norm(x, x, x[0], 1e-6, fp8, torch.empty_like(x), "static", none[:1], none, 0)
        torch.ops.tpdecode.gather(x, torch.empty(4, 8192, dtype=torch.bfloat16), 0)
        torch.ops.tpdecode.decode_gemm(x, out, 0)


def test_install_skips_what_it_cannot_route():
    torch = pytest.importorskip("torch")
    from tpdecode.torch import install, uninstall

    model = torch.nn.Sequential(torch.nn.Linear(128, 64).bfloat16(), torch.nn.Linear(64, 64))
    assert install(model) == 0  # CPU weights: nothing routed
    assert uninstall(model) == 0


def test_linear_off_the_gpu_is_f_linear_eager_and_compiled():
    torch = pytest.importorskip("torch")
    from tpdecode.torch import linear

    w, b = torch.randn(64, 128), torch.randn(64)
    x = torch.randn(3, 128)
    want = torch.nn.functional.linear(x, w, b)
    assert torch.equal(linear(x, w, b), want)
    assert torch.equal(linear(x, w, b, batch_invariant=True)[1], torch.nn.functional.linear(x[1:2], w, b)[0])
    compiled = torch.compile(lambda x: linear(x, w, b), fullgraph=True)
    assert torch.equal(compiled(x), want)


def test_linear_keeps_gradients_eager_and_compiled():
    torch = pytest.importorskip("torch")
    from tpdecode.torch import linear

    w = torch.nn.Parameter(torch.randn(8, 16))
    b = torch.nn.Parameter(torch.randn(8))
    x = torch.randn(3, 16, requires_grad=True)
    for f in (lambda x: linear(x, w, b), torch.compile(lambda x: linear(x, w, b), fullgraph=True)):
        w.grad = b.grad = x.grad = None
        f(x).square().sum().backward()
        got = (x.grad, w.grad, b.grad)
        x.grad = w.grad = b.grad = None
        torch.nn.functional.linear(x, w, b).square().sum().backward()
        for g, want in zip(got, (x.grad, w.grad, b.grad)):
            torch.testing.assert_close(g, want)
