"""tpdecode._quant, the torch form of ar_norm's FP8 epilogues (the torch fallback runs
it; the GPU tests compare the kernels' output with it), on the reference quantiser's
known values (tests/cpu/fp8_quant_reference_test.cpp): saturation, ties to even,
subnormals, NaN, the group scales and UE8M0. Needs torch (skipped without it)."""

import pytest

torch = pytest.importorskip("torch")

from tpdecode import _quant  # noqa: E402


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
