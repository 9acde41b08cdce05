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
import math
import statistics as st
import sys
from collections import defaultdict


def correlation(xs, ys):
    mx, my = st.mean(xs), st.mean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy) if sx * sy > 0 else 0.0


def lateness(runs):
    """(run, op, sm, lateness in us) of every CTA that ran the op."""
    out = []
    for r, run in enumerate(runs):
        ctas = len(run["sm"])
        ops = len(run["mma_end_ns"]) // ctas
        for o in range(ops):
            ends = [(run["mma_end_ns"][c * ops + o], c) for c in range(ctas) if run["mma_end_ns"][c * ops + o] > 0]
            median = st.median(e for e, _ in ends)
            out.extend((r, o, run["sm"][c], (e - median) / 1e3) for e, c in ends)
    return out


def sm_means(rows):
    by_sm = defaultdict(list)
    for _, _, sm, late in rows:
        by_sm[sm].append(late)
    return {sm: st.mean(v) for sm, v in by_sm.items()}


def main(path):
    for row in json.load(open(path))["rows"]:
        runs = row.get("program_timeline_runs")
        if not runs or len(runs) < 2:
            continue
        half = len(runs) // 2
        rows = lateness(runs)
        first = sm_means([x for x in rows if x[0] < half])
        second = sm_means([x for x in rows if x[0] >= half])
        common = [sm for sm in first if sm in second]
        per_op = defaultdict(list)
        for r, o, sm, late in rows:
            if r >= half:
                per_op[(r, o)].append(late - first.get(sm, 0.0))
        by_op = defaultdict(list)
        for r, o, _, late in rows:
            if r >= half:
                by_op[(r, o)].append(late)
        raw = [max(v) for v in by_op.values()]
        adjusted = [max(v) - st.median(v) for v in per_op.values()]
        print(f"TP {row['tp']} M {row['m']} {row['chain']}: per-SM mean lateness, runs 0-{half - 1} against "
              f"{half}-{len(runs) - 1}: correlation {correlation([first[s] for s in common], [second[s] for s in common]):.2f}; "
              f"spread (sd) of the SMs' means {st.pstdev(list(first.values())):.2f} us; an op's last CTA late by "
              f"{st.mean(raw):.2f} us, {st.mean(adjusted):.2f} with each SM's earlier mean removed")


if __name__ == "__main__":
    main(sys.argv[1])
