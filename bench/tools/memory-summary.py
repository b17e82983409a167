#!/usr/bin/env python3
"""Summarises a bench/tools/sample-memory file: one row every INTERVAL
seconds (default 60) of the operator's anonymous RSS, peak RSS so far, and
jemalloc's allocated, active, partly used pages (active less allocated),
resident and metadata, in MiB; then the maxima.

    bench/tools/memory-summary.py OUT [INTERVAL]
"""
import sys

MIB = 1024 * 1024


def rows(path):
    for line in open(path):
        f = line.split()
        if len(f) < 6:
            continue
        alloc = dict(x.split("=") for x in f[6:])
        yield float(f[0]), int(f[3]) / 1024, int(f[5]) / 1024, {k: int(v) / MIB for k, v in alloc.items()}


def main():
    path = sys.argv[1]
    every = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    data = list(rows(path))
    if not data:
        sys.exit(f"{path}: no samples")
    t0 = data[0][0]
    print("| s | anon RSS | peak RSS | allocated | active | partly used pages | resident | metadata |")
    print("|---|---|---|---|---|---|---|---|")
    last = None
    for t, anon, hwm, a in data:
        if not a or (last is not None and t - last < every):
            continue
        last = t
        print(f"| {t - t0:.0f} | {anon:.1f} | {hwm:.1f} | {a['allocated']:.1f} | {a['active']:.1f} | "
              f"{a['active'] - a['allocated']:.1f} | {a['resident']:.1f} | {a['metadata']:.1f} |")
    with_alloc = [a for _, _, _, a in data if a]
    print()
    print(f"max anon RSS {max(d[1] for d in data):.1f} MiB, peak RSS {max(d[2] for d in data):.1f} MiB", end="")
    if with_alloc:
        print(f", max allocated {max(a['allocated'] for a in with_alloc):.1f} MiB, "
              f"max partly used pages {max(a['active'] - a['allocated'] for a in with_alloc):.1f} MiB")
    else:
        print()


if __name__ == "__main__":
    main()
