#!/usr/bin/env python3
"""Where the operator's passes spend their time, from its own log.

Reads operator logs written with `saferollout::pass=debug` in the operator's
RUST_LOG (`SAFEROLLOUT_BENCH_OPERATOR_LOG=info,kube=warn,saferollout::pass=debug
bench/run ... --keep`; bench/run prints where the logs are) and prints, per
log, the passes with actions (pod deletions, label or template writes,
Events), the passes with none, and those whose status write went behind
the pass, with each part's mean and total:

  deref   reading the caches (dereference)
  decide  building the views and deciding
  write   the status write (when awaited) and the actions
  events  Events, best effort, after the actions

Usage: bench/tools/pass-times.py OPERATOR_LOG...
"""

import re
import statistics
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FIELD = re.compile(r"(\w+)=([\w.\-]+)")
PARTS = [
    ("deref", "dereference_ms"),
    ("decide", "decide_ms"),
    ("write", "write_and_act_ms"),
    ("events", "events_ms"),
]
KINDS = [
    ("all", lambda p: True),
    ("acting", lambda p: p["actions"] != "0"),
    ("idle", lambda p: p["actions"] == "0"),
    ("behind", lambda p: p.get("behind") == "true"),
]


def passes(path):
    with open(path, errors="replace") as f:
        for line in f:
            line = ANSI.sub("", line)
            if "saferollout::pass" in line:
                yield dict(FIELD.findall(line))


def main(paths):
    if not paths:
        sys.exit(__doc__)
    for path in paths:
        rows = list(passes(path))
        print(f"{path}: {len(rows)} passes")
        if not rows:
            print("  no pass lines: was saferollout::pass=debug in the operator's RUST_LOG?")
            continue
        print(f"  {'':7} {'passes':>7}" + "".join(f" {n + ' mean':>12} {'total s':>8}" for n, _ in PARTS))
        for kind, keep in KINDS:
            chosen = [r for r in rows if keep(r)]
            if not chosen:
                continue
            cells = ""
            for _, key in PARTS:
                values = [float(r[key]) for r in chosen]
                cells += f" {statistics.mean(values):>9.2f} ms {sum(values) / 1e3:>8.2f}"
            print(f"  {kind:7} {len(chosen):>7}{cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
