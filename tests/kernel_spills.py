"""Compiles one CUDA source with ptxas's resource report and fails where a kernel
named by --must-not-spill spills registers (or where no kernel matches it): a
spilling hot loop costs bandwidth silently, and a change elsewhere in a kernel (a
rarely used path compiled into it) can make ptxas spill everywhere.

usage: kernel_spills.py NVCC SOURCE --must-not-spill REGEX [...] -- NVCC_FLAGS...
"""

import argparse
import re
import subprocess
import sys
import tempfile


def entries(report: str):
    """{kernel: (stack frame, spill stores, spill loads)} from ptxas -v's report."""
    found, entry, function = {}, None, None
    for line in report.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            entry = m.group(1)
        elif m := re.search(r"Function properties for (\S+)", line):
            function = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            if entry is not None and function == entry:
                found[entry] = tuple(int(g) for g in m.groups())
    return found


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("nvcc")
    parser.add_argument("source")
    parser.add_argument("--must-not-spill", action="append", required=True)
    args = parser.parse_args(argv[:split])
    flags = argv[split + 1:]
    with tempfile.NamedTemporaryFile(suffix=".o") as out:
        run = subprocess.run([args.nvcc, *flags, "-Xptxas", "-v", "-c", args.source, "-o", out.name],
                             capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout + run.stderr)
        return 1
    found = entries(run.stderr + run.stdout)
    failed = False
    for pattern in args.must_not_spill:
        matched = {k: v for k, v in found.items() if re.search(pattern, k)}
        if not matched:
            print(f"no kernel of {args.source} matches {pattern!r} (kernels: {len(found)})")
            failed = True
        for kernel, (frame, stores, loads) in sorted(matched.items()):
            bad = stores > 0 or loads > 0
            failed |= bad
            print(f"{'SPILLS' if bad else 'ok':6s} {kernel}: {frame} bytes stack frame, "
                  f"{stores} bytes spill stores, {loads} bytes spill loads")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
