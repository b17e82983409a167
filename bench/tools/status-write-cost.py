#!/usr/bin/env python3
"""What a SafeRollout status write costs the API server, by the status's form.

    tests/cluster/up --nodes 1000 --state-dir /tmp/sw
    kubectl --kubeconfig /tmp/sw/kubeconfig apply --server-side -f deploy/crd.yaml
    bench/tools/status-write-cost.py /tmp/sw [--writes 30] [--rounds 2]

Creates SafeRollout `exp/exp` and server-side applies its status (as the
operator's field manager) `--writes` times in each form, one write at a
time, with a stage that took every node of the cluster:

- map:    the stage's baseline as `baseline`, a map with an entry per node
          (what operators before baselineGroups wrote);
- groups: the same baseline as `baselineGroups` (one group: every node
          there has the same counts);
- nodes:  neither (the stage's `nodes` list only), for reference.

Each write changes the progress message, as the operator's progress writes
do. Prints, per form and round, the kube-apiserver's CPU seconds per write
(from /proc of the PID tests/cluster/up recorded, less its idle rate measured
before) and the mean latency. Loopback only: it talks to the API server of
the state directory's kubeconfig.
"""

import argparse
import http.client
import json
import os
import ssl
import subprocess
import time


def apiserver_pid(state):
    with open(os.path.join(state, "pids")) as f:
        for line in f:
            name, pid = line.split()
            if name == "kube-apiserver":
                return int(pid)
    raise SystemExit("no kube-apiserver in pids")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(nodes, i, form):
    stage = {
        "index": 0,
        "nodes": nodes,
        "state": "Replacing",
        "startedAt": "2026-12-04T23:00:00Z",
        "gates": [
            {"gate": "podsReady", "status": "Pending", "reason": "NotReady",
             "message": f"{i}/{len(nodes)} pods ready"},
            {"gate": "allocatable/nvidia.com/gpu", "status": "Pending",
             "reason": "Waiting", "message": "ok"},
        ],
    }
    if form == "map":
        stage["baseline"] = {n: {"nvidia.com/gpu": 8} for n in nodes}
    elif form == "groups":
        stage["baselineGroups"] = [{"counts": {"nvidia.com/gpu": 8}, "nodes": nodes}]
    return {
        "apiVersion": "saferollout.dev/v1alpha1",
        "kind": "SafeRollout",
        "metadata": {"name": "exp", "namespace": "exp"},
        "status": {
            "observedGeneration": 1,
            "phase": "Progressing",
            "conditions": [
                {"type": t, "status": "False", "reason": "Progressing",
                 "message": f"stage 1 of 1: {i} of {len(nodes)} node(s) done",
                 "lastTransitionTime": "2026-12-04T23:00:00Z", "observedGeneration": 1}
                for t in ("Ready", "Progressing", "Degraded")
            ],
            "stableRevision": "6d4b7c9f8",
            "targetRevision": "5f7d8c6b4",
            "currentStage": 0,
            "stages": [stage],
            "message": f"rolling out 5f7d8c6b4: {i} done",
        },
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("state_dir")
    ap.add_argument("--writes", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    state = os.path.abspath(args.state_dir)
    kubeconfig = os.path.join(state, "kubeconfig")
    kubectl = ["kubectl", "--kubeconfig", kubeconfig]
    with open(os.path.join(state, "ports")) as f:
        ports = dict(line.split() for line in f if line.strip())
    port = int(ports["kube-apiserver"])
    pki = os.path.join(state, "pki")
    nodes = sorted(subprocess.check_output(
        kubectl + ["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"]).decode().split())
    subprocess.run(kubectl + ["create", "namespace", "exp"], capture_output=True)
    subprocess.run(kubectl + ["apply", "-f", "-"], check=True, capture_output=True,
                   input=json.dumps({"apiVersion": "saferollout.dev/v1alpha1", "kind": "SafeRollout",
                                     "metadata": {"name": "exp", "namespace": "exp"},
                                     "spec": {"targetRef": {"name": "plugin"}}}).encode())
    ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
    ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
    path = ("/apis/saferollout.dev/v1alpha1/namespaces/exp/saferollouts/exp/status"
            "?fieldManager=saferollout-operator")

    def apply(body):
        t = time.monotonic()
        conn.request("PATCH", path, body=body,
                     headers={"Content-Type": "application/apply-patch+yaml"})
        r = conn.getresponse()
        answer = r.read()
        if r.status != 200:
            raise SystemExit(f"status write: {r.status} {answer[:300]!r}")
        return time.monotonic() - t, len(answer)

    pid = apiserver_pid(state)
    c, t = cpu_seconds(pid), time.monotonic()
    time.sleep(10)
    idle = (cpu_seconds(pid) - c) / (time.monotonic() - t)
    print(f"{len(nodes)} nodes; kube-apiserver idle: {idle:.2f} CPU-s a second")
    print("form    round  CPU ms/write  latency ms  object bytes")
    for rnd in range(args.rounds):
        for form in ("map", "groups", "nodes"):
            # One write in the form first: the change of form is not measured.
            apply(json.dumps(status(nodes, 0, form)).encode())
            bodies = [json.dumps(status(nodes, i, form)).encode() for i in range(1, args.writes + 1)]
            c, t = cpu_seconds(pid), time.monotonic()
            lat = size = 0
            for b in bodies:
                dt, size = apply(b)
                lat += dt
            wall = time.monotonic() - t
            used = cpu_seconds(pid) - c - idle * wall
            print(f"{form:7} {rnd + 1:5}  {used / args.writes * 1e3:12.1f}  "
                  f"{lat / args.writes * 1e3:10.1f}  {size:12}")


if __name__ == "__main__":
    main()
