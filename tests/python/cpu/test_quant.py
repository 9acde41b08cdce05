"""tpdecode._quant, the torch form of ar_norm's FP8 epilogues (the torch fallback runs
it; the GPU tests compare the kernels' output with it), on the reference quantiser's
known values (tests/cpu/fp8_quant_reference_test.cpp): saturation, ties to even,
subnormals, NaN, the group scales and UE8M0. Needs torch (skipped without it)."""

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from tpdecode import _quant  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def bits(t):
    return t.view(torch.uint8).tolist()


def test_e4m3_saturates_rounds_to_even_and_keeps_nan():
    x = torch.tensor([0.0, -0.0, 1.0, 448.0, 449.0, 464.0, 1e30, float("inf"), -float("inf"), 2**-9, 2**-10,
                      3 * 2**-10, 15 * 2**-10, 1.0625, 1.1875, 15.5, float("nan")])
    assert bits(_quant.e4m3(x)) == [0x00, 0x80, 0x38, 0x7e, 0x7e, 0x7e, 0x7e, 0x7e, 0xfe, 0x01, 0x00, 0x02, 0x08,
                                     0x38, 0x3a, 0x58, 0x7f]


def test_group_scales_and_ue8m0():
    v = torch.zeros(2, 256, dtype=torch.bfloat16)
    v[0, 0], v[0, 1], v[1, 128] = 4.0, -2.0, -500.0
    v[1, 0] = float("nan")
    s = _quant.group_scales(v, False)
    assert s[0, 0].item() == (torch.tensor(4.0) / 448).item() and s[0, 1].item() == (torch.tensor(1e-10) / 448).item()
    assert torch.isnan(s[1, 0])
    u = _quant.group_scales(v, True)
    assert u[0, 0].item() == 2**-6 and u[0, 1].item() == 2**-42 and u[1, 1].item() == 2.0
    q, scales = _quant.group(v, True)
    assert torch.equal(scales.view(torch.int32), u.view(torch.int32))
    assert bits(q[0, :2]) == [0x78, 0xf0] and bits(q[1, 128:129]) == [0xf8]  # 256, -128, -250 -> -256
    assert (q[1, :128].view(torch.uint8) & 0x7f == 0x7f).all()  # a NaN poisons its group


def test_static_multiplies_by_the_inverse():
    v = torch.tensor([1.0, -3.0, 1000.0], dtype=torch.bfloat16)
    scale = torch.tensor([0.3])
    inverse = 1.0 / scale
    assert bits(_quant.static(v, scale)) == bits(_quant.e4m3(v.float() * inverse))
    assert bits(_quant.static(v, scale))[2] == 0x7e


def test_quant_arguments():
    assert _quant.kind_of(None) == "none" and _quant.kind_of("group-ue8m0") == "group-ue8m0"
    assert _quant.kind_of(torch.tensor([0.5])) == "static"
    with pytest.raises(ValueError, match="one element"):
        _quant.kind_of(torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="quant="):
        _quant.kind_of("fp8")
    with pytest.raises(TypeError, match="float16"):  # a dtype error is a TypeError (tpdecode.errors)
        _quant.kind_of(torch.tensor([0.5], dtype=torch.float16))


@pytest.mark.parametrize("device", DEVICES)
def test_group_scale_is_the_correctly_rounded_quotient(device):
    # Every positive finite BF16 amax: the scale is fl(amax / 448), as the kernels'
    # __fdiv_rn and the C++ reference; on CUDA, torch's `t / 448.0` multiplies by
    # fl(1 / 448) instead, one ulp off for about half of these.
    amax = torch.arange(0x0080, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    v = torch.zeros(amax.numel(), _quant.GROUP, dtype=torch.bfloat16)
    v[:, 5] = amax
    v[::2, 5] = -amax[::2]  # the magnitude counts
    got = _quant.group_scales(v.to(device), False)[:, 0].cpu().numpy()
    a = amax.float().numpy()
    want = np.maximum(a, np.float32(_quant.AMAX_FLOOR)) / np.float32(_quant.E4M3_MAX)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (f"{bad.size} scales differ; first: amax {a[bad[0]]!r}: {got[bad[0]]!r} "
                           f"where fl(amax / 448) = {want[bad[0]]!r}")
    q, _ = _quant.group(v.to(device), False)
    expected = _quant.e4m3(v.float() / torch.from_numpy(want)[:, None])
    assert torch.equal(q.cpu().view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
def test_ue8m0_and_static_on_the_device_match_the_cpu(device):
    g = torch.Generator().manual_seed(7)
    v = (torch.randn(6, 1024, generator=g) * torch.logspace(-8, 4, 6)[:, None]).to(torch.bfloat16)
    for ue8m0 in (False, True):
        q, s = _quant.group(v.to(device), ue8m0)
        q_cpu, s_cpu = _quant.group(v, ue8m0)
        assert torch.equal(s.cpu().view(torch.int32), s_cpu.view(torch.int32))
        assert torch.equal(q.cpu().view(torch.uint8), q_cpu.view(torch.uint8))
    scale = torch.tensor([0.0123])
    assert torch.equal(_quant.static(v.to(device), scale.to(device)).cpu().view(torch.uint8),
                       _quant.static(v, scale).view(torch.uint8))
