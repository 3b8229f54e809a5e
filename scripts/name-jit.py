#!/usr/bin/env python3
"""Names the JIT-compiled wasm functions in a callgrind profile.

callgrind sees wasmtime's machine code as anonymous addresses. The simulator, run with
SLUICE_PERF_MAP=1, writes /tmp/perf-PID.map (address, size, name per compiled function);
this script reads `callgrind_annotate --inclusive=yes` output and puts the names in.

    SLUICE_PERF_MAP=1 valgrind --tool=callgrind --callgrind-out-file=p.out <command>
    scripts/name-jit.py p.out /tmp/perf-PID.map [--requests N] [--top 40]
"""
import argparse
import bisect
import re
import subprocess


def load_map(path):
    ranges = []
    with open(path) as f:
        for line in f:
            start, size, name = line.rstrip("\n").split(" ", 2)
            ranges.append((int(start, 16), int(size, 16), name))
    ranges.sort()
    return ranges


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        return out if len(out) == len(names) else names
    except (OSError, subprocess.CalledProcessError):
        return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("perf_map")
    parser.add_argument("--requests", type=int, default=1, help="divide costs by this")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--inclusive", action="store_true", help="inclusive costs")
    args = parser.parse_args()
    ranges = load_map(args.perf_map)
    starts = [r[0] for r in ranges]
    annotate = subprocess.run(
        ["callgrind_annotate", "--threshold=100",
         f"--inclusive={'yes' if args.inclusive else 'no'}", args.profile],
        capture_output=True, text=True, check=True).stdout
    rows = []
    line_re = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(.*)$")
    for line in annotate.splitlines():
        m = line_re.match(line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        cost = int(m.group(1).replace(",", ""))
        what = m.group(2)
        addr = re.search(r"0x([0-9a-f]+)", what)
        if addr and "[???]" in what:
            a = int(addr.group(1), 16)
            i = bisect.bisect_right(starts, a) - 1
            if i >= 0 and a < ranges[i][0] + ranges[i][1]:
                what = "wasm: " + ranges[i][2]
            else:
                what = "jit: " + what
        else:
            what = what.split(":", 1)[-1] if what.startswith("???:") else what
        rows.append((cost, what))
    names = demangle([w for _, w in rows])
    merged = {}
    for (cost, _), name in zip(rows, names):
        merged[name] = merged.get(name, 0) + cost
    wasm = sum(c for n, c in merged.items() if n.startswith("wasm: "))
    total = sum(merged.values())
    if not args.inclusive:
        print(f"total {total / args.requests:,.0f}  in wasm {wasm / args.requests:,.0f}  "
              f"elsewhere {(total - wasm) / args.requests:,.0f}  (per request)")
    for name, cost in sorted(merged.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{cost / args.requests:>10,.0f}  {name[:150]}")


if __name__ == "__main__":
    main()
