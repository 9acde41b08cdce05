"""The engine communicator's decisions without a GPU (tpdecode._comm_rules): the size
cap per architecture and world size and its overrides, what stops a rank from
setting up, and which calls are taken. Runs in CI (no torch needed)."""

import pytest

from tpdecode import _comm_rules as rules

CAPACITY = 64 * 8192 * 2


def test_size_cap_follows_the_table_and_the_buffers():
    assert rules.max_bytes((9, 0), 2, CAPACITY, env={}) == 896 << 10
    assert rules.max_bytes((9, 0), 4, CAPACITY, env={}) == 896 << 10
    assert rules.max_bytes((9, 0), 8, CAPACITY, env={}) == 256 << 10
    assert rules.max_bytes((9, 0), 2, 1000, env={}) == 1000  # never above what the mailboxes hold
    assert rules.max_bytes((9, 0), 2, None, env={}) == 896 << 10  # batch-invariant: more rows run as more calls
    assert rules.max_bytes((8, 0), 2, CAPACITY, env={}) == 0  # not Hopper: nothing taken
    assert rules.max_bytes((9, 0), 16, CAPACITY, env={}) == 0  # no entry: nothing taken


def test_size_cap_overrides():
    env = {rules.MAX_BYTES_ENV: "4096"}
    assert rules.max_bytes((9, 0), 8, CAPACITY, env=env) == 4096
    assert rules.max_bytes((8, 9), 8, CAPACITY, env=env) == 4096  # the override is the user's call
    assert rules.max_bytes((9, 0), 8, CAPACITY, override=100, env=env) == 100  # the constructor's beats the env
    assert rules.max_bytes((9, 0), 2, CAPACITY, env={rules.MAX_BYTES_ENV: str(10**9)}) == CAPACITY
    with pytest.raises(ValueError, match="a number of bytes"):
        rules.max_bytes((9, 0), 2, CAPACITY, env={rules.MAX_BYTES_ENV: "lots"})
    with pytest.raises(ValueError, match=">= 0"):
        rules.max_bytes((9, 0), 2, CAPACITY, override=-1, env={})


def test_setup_refusals():
    assert rules.setup_refusal((9, 0), 2, True) == ""
    assert "sm_90a" in rules.setup_refusal((8, 0), 2, True)
    assert "world size 3" in rules.setup_refusal((9, 0), 3, True)
    assert "NCCL" in rules.setup_refusal((9, 0), 2, False)


def refusal(op="all_reduce", dtype="bfloat16", shape=(4, 4096), contiguous=True, same_device=True, nbytes=None,
            cap=1 << 20, hidden=8192, rows_cap=64, batch_invariant=False, lead=0, quant="none"):
    if nbytes is None:
        nbytes = 2
        for d in shape:
            nbytes *= d
    return rules.call_refusal(op, dtype, shape, contiguous, same_device, nbytes, cap, hidden, rows_cap,
                              batch_invariant, lead, quant)


def test_call_refusals_name_the_reason():
    assert refusal() == ""
    assert "dtype float16" in refusal(dtype="float16")
    assert "device" in refusal(same_device=False)
    assert "contiguous" in refusal(contiguous=False)
    assert refusal(shape=(64, 8192), cap=1 << 20) == ""  # at the cap
    assert "above the cap" in refusal(shape=(64, 8192), cap=(1 << 20) - 1)
    assert "multiples of 8" in refusal(shape=(4, 4100))
    assert "built for 8192" in refusal(shape=(4, 8200))
    assert "built for 64" in refusal(shape=(65, 4096), cap=1 << 30)
    assert refusal(shape=(65, 4096), cap=1 << 30, batch_invariant=True) == ""  # further calls serve them
    assert "empty" in refusal(shape=(0, 4096))
    assert refusal(shape=(2, 3, 4096)) == ""  # leading dimensions are rows


def test_fused_norm_refusals():
    assert refusal("fused_add_rms_norm", shape=(4, 4096)) == ""
    assert "multiples of 64" in refusal("fused_add_rms_norm", shape=(4, 4104))
    assert refusal("fused_add_rms_norm", shape=(4, 2560), quant="static") == ""
    assert "multiples of 1024" in refusal("fused_add_rms_norm", shape=(4, 2560), quant="group")
    assert refusal("fused_add_rms_norm", shape=(4, 5120), quant="group-ue8m0") == ""


def test_a_local_team_takes_a_leading_dimension_of_ranks():
    assert refusal(shape=(2, 4, 4096), lead=2) == ""
    assert "[2, ..., columns]" in refusal(shape=(4, 4096), lead=2)
    assert "[2, ..., columns]" in refusal(shape=(3, 4, 4096), lead=2)
    # The cap applies per rank.
    assert refusal(shape=(2, 64, 4096), lead=2, cap=64 * 4096 * 2) == ""
    assert "above the cap" in refusal(shape=(2, 64, 4096), lead=2, cap=64 * 4096 * 2 - 1)
