"""The refusal of a call whose device is not the one a CUDA-graph capture is
underway on (python/tpdecode/_capture.py): pure logic, no torch or GPU needed."""

from tpdecode._capture import capture_device_refusal


def test_same_device_or_no_capture_runs():
    assert capture_device_refusal(1, 1, True, True, "Team.all_reduce") == ""
    assert capture_device_refusal(1, 1, True, False, "Team.all_reduce") == ""  # one device: its own stream decides
    assert capture_device_refusal(1, 0, False, False, "Team.all_reduce") == ""  # eager, other current device


def test_capture_on_both_devices_runs():
    assert capture_device_refusal(1, 0, True, True, "Team.ar_norm") == ""


def test_capture_elsewhere_refuses_with_the_remedy():
    # rank 1's team on cuda:1 while torch.cuda.graph captures on its cached cuda:0 stream
    why = capture_device_refusal(1, 0, True, False, "Team.all_reduce")
    assert why.startswith("Team.all_reduce: a CUDA-graph capture is underway on cuda:0")
    assert "cuda:1's current stream, which is not capturing" in why
    assert "torch.cuda.Stream(1)" in why and "torch.cuda.set_device(1)" in why
