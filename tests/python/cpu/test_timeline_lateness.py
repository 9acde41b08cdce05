"""scripts/timeline_lateness.py on synthetic timelines: per-op noise reads as noise
(the SMs' means unstable, nothing to gain by removing them), a few systematically slow
SMs read as slow SMs (stable means, most of the lateness removed with them), and a CTA
that did not run an op is left out of it."""
import random

from repo_file import load as load_file


def load():
    return load_file("scripts/timeline_lateness.py", "timeline_lateness")


def runs(slow_sms=(), ctas=132, ops=12, count=8, seed=1):
    """Runs as `bench chain --timeline --json` writes them: CTA c's op o at c * ops + o,
    each CTA's MMA end the op's base time plus noise (0.8 us sd) plus 3 us on slow SMs;
    CTA 0 has no unit of op 0 (its times are 0). The CTAs land on SMs in a new order
    every run."""
    rng = random.Random(seed)
    out = []
    for r in range(count):
        sm = list(range(ctas))
        rng.shuffle(sm)
        ends = [0] * (ctas * ops)
        for c in range(ctas):
            for o in range(ops):
                if c == 0 and o == 0:
                    continue
                late_us = rng.gauss(0.0, 0.8) + (3.0 if sm[c] in slow_sms else 0.0)
                ends[c * ops + o] = int(1e6 * r + 20_000 * (o + 1) + 1e3 * late_us)
        out.append({"sm": sm, "mma_end_ns": ends, "start_ns": ends, "epilogue_end_ns": ends})
    return out


def test_noise_reads_as_noise():
    s = load().summary(runs())
    assert abs(s["correlation"]) < 0.4
    assert s["last_us"] > 1.5  # the maximum of 131-132 draws of 0.8 us sd
    assert abs(s["last_without_sm_us"] - s["last_us"]) < 0.35 * s["last_us"]


def test_slow_sms_read_as_slow_sms():
    s = load().summary(runs(slow_sms=(3, 40, 77)))
    assert s["correlation"] > 0.5
    assert s["last_us"] > 3.0
    assert s["last_without_sm_us"] < 0.75 * s["last_us"]


def test_a_cta_without_the_op_is_left_out():
    rows = load().lateness(runs(count=2))
    assert all(not (r == 0 and o == 0 and late < -1000) for r, o, _, late in rows)
    assert sum(1 for r, o, _, _ in rows if r == 0 and o == 0) == 131
