#!/usr/bin/env python3
"""Whether a GemmProgram's late CTAs are slow SMs or per-op noise, from the per-CTA
times `tpdecode bench chain --timeline --json FILE` writes (program_timeline_runs).

Per chain row: an op's lateness of a CTA is its last MMA end minus the op's median
CTA's. Prints how stable each SM's mean lateness is between the first and second half
of the recorded runs, and the op's last lateness in the second half with and without
each SM's first-half mean removed (what a plan weighted per SM could gain at most).
    python3 scripts/timeline_lateness.py FILE
"""
import json
import statistics as st
import sys
from collections import defaultdict


def lateness(runs):
    """(run, op, sm, lateness in us) of every CTA that ran the op (an end of 0: it did not)."""
    out = []
    for r, run in enumerate(runs):
        ctas = len(run["sm"])
        ops = len(run["mma_end_ns"]) // ctas
        for o in range(ops):
            ends = [(run["mma_end_ns"][c * ops + o], c) for c in range(ctas) if run["mma_end_ns"][c * ops + o] > 0]
            median = st.median(e for e, _ in ends)
            out.extend((r, o, run["sm"][c], (e - median) / 1e3) for e, c in ends)
    return out


def summary(runs):
    """The figures for one row's runs (at least 2): the correlation of the SMs' mean
    lateness between the two halves of the runs, the spread (sd) of the first half's
    means, and the op's last lateness in the second half, as measured and with each
    SM's first-half mean removed (both means over the ops, us)."""
    half = len(runs) // 2
    rows = lateness(runs)
    halves = (defaultdict(list), defaultdict(list))
    for r, _, sm, late in rows:
        halves[r >= half][sm].append(late)
    first, second = ({sm: st.mean(v) for sm, v in h.items()} for h in halves)
    common = [sm for sm in first if sm in second]
    measured, adjusted = defaultdict(list), defaultdict(list)
    for r, o, sm, late in rows:
        if r >= half:
            measured[(r, o)].append(late)
            adjusted[(r, o)].append(late - first.get(sm, 0.0))
    return {
        "correlation": st.correlation([first[s] for s in common], [second[s] for s in common]),
        "sm_sd_us": st.pstdev(list(first.values())),
        "last_us": st.mean(max(v) for v in measured.values()),
        "last_without_sm_us": st.mean(max(v) - st.median(v) for v in adjusted.values()),
    }


def main(path):
    for row in json.load(open(path))["rows"]:
        runs = row.get("program_timeline_runs")
        if not runs or len(runs) < 2:
            continue
        s = summary(runs)
        half = len(runs) // 2
        print(f"TP {row['tp']} M {row['m']} {row['chain']}: per-SM mean lateness, runs 0-{half - 1} against "
              f"{half}-{len(runs) - 1}: correlation {s['correlation']:.2f}; spread (sd) of the SMs' means "
              f"{s['sm_sd_us']:.2f} us; an op's last CTA late by {s['last_us']:.2f} us, "
              f"{s['last_without_sm_us']:.2f} with each SM's earlier mean removed")


if __name__ == "__main__":
    main(sys.argv[1])
