#!/usr/bin/env python3
"""Where a serial replacement's time goes, from the API server's audit log.

Reads an audit log written with bench/audit-policy-pod-writes.yaml by a
`bench/run --overhead-runs native:1,saferollout:1:100%` run (maxUnavailable 1:
one replacement at a time, so the log's writes follow one another) and
prints, for the native rollout (the DaemonSet controller deletes) and the
saferollout one (the operator deletes), the mean, p50 and p90 of each step:

  DEL     the old pod's deletion (DaemonSet controller or operator)
  KDEL    KWOK's final deletion of the terminating pod
  CREATE  the DaemonSet controller's new pod
  BIND    the scheduler's binding
  READY   the fixture's pod status (Running, Ready)
  next    the next deletion, after the Ready write completed

"recv" is when the API server received the request, "dur" how long it took
to answer it (stageTimestamp - requestReceivedTimestamp).

Usage: bench/tools/replacement-chain.py AUDIT_LOG
"""

import bisect
import collections
import json
import sys
from datetime import datetime

DELETERS = ("daemon-set-controller", "saferollout-operator")
STEPS = ["DEL", "KDEL", "CREATE", "BIND", "READY"]


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def step(user, verb, resource, subresource):
    if resource != "pods":
        return None
    if verb == "delete":
        if user in DELETERS:
            return "DEL"
        if user == "kwok":
            return "KDEL"
    if verb == "create" and subresource is None:
        return "CREATE"
    if subresource == "binding":
        return "BIND"
    if subresource == "status" and user == "saferollout-sim":
        return "READY"
    return None


def main(path):
    events = []
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            o = e.get("objectRef", {})
            user = e["user"]["username"].split(":")[-1]
            kind = step(user, e["verb"], o.get("resource"), o.get("subresource"))
            if kind:
                events.append((ts(e["requestReceivedTimestamp"]), ts(e["stageTimestamp"]), user, kind))
    events.sort()
    for who in DELETERS:
        dels = [e for e in events if e[3] == "DEL" and e[2] == who]
        if not dels:
            continue
        first, last = dels[0][0], dels[-1][1]
        window = [e for e in events if first <= e[0] <= last + 1]
        by_step = {k: [e for e in window if e[3] == k] for k in STEPS}
        recv = {k: [e[0] for e in v] for k, v in by_step.items()}
        stats = collections.defaultdict(list)
        for d in by_step["DEL"][:-1]:
            stats["DEL dur"].append(d[1] - d[0])
            cur = d
            for k in STEPS[1:]:
                i = bisect.bisect_left(recv[k], cur[0])
                if i >= len(by_step[k]):
                    break
                nxt = by_step[k][i]
                stats[f"{k} recv after the step before"].append(nxt[0] - cur[0])
                stats[f"{k} dur"].append(nxt[1] - nxt[0])
                cur = nxt
            else:
                i = bisect.bisect_left(recv["DEL"], cur[0])
                if i < len(by_step["DEL"]):
                    stats["next DEL recv after READY done"].append(by_step["DEL"][i][0] - cur[1])
        print(f"{who}: {len(dels)} deletions in {last - first:.1f} s")
        for k, v in stats.items():
            v = sorted(x * 1e3 for x in v)
            print(f"  {k:34} mean {sum(v) / len(v):6.1f}  p50 {v[len(v) // 2]:6.1f}  p90 {v[int(len(v) * 0.9)]:6.1f} ms")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
