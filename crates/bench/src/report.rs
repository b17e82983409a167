//! The Markdown report of a run, with its plots, made from [`Results`].

use std::fmt::Write as _;

use crate::results::{OperatorRun, Results, RolloutRun, SizeResult};

/// The report's date (UTC), which also names its files.
pub fn date(r: &Results) -> String {
    r.started
        .map(|t| t.strftime("%Y-%m-%d").to_string())
        .unwrap_or_else(|| "undated".into())
}

/// `, agents start in N s` for the targets' rows when the overhead runs'
/// agents took time to start (`--agent-start-secs`), else nothing.
fn agents_start(r: &Results) -> String {
    if r.agent_start_secs > 0 {
        format!(", agents start in {} s", r.agent_start_secs)
    } else {
        String::new()
    }
}

fn f1(v: f64) -> String {
    format!("{v:.1}")
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("-".into(), f)
}

/// Each native run with saferollout's single-stage run at the same
/// maxUnavailable, in order: the n-th native run of a K with the n-th
/// saferollout run of it (runs repeated in one invocation alternate, and
/// each pair is compared once).
pub fn pairs(s: &SizeResult) -> Vec<(&RolloutRun, &RolloutRun)> {
    let single_stage = |k: &str| -> Vec<&RolloutRun> {
        s.rollouts
            .iter()
            .filter(|r| r.mode == "saferollout" && r.max_unavailable == k && r.stages == "100%")
            .collect()
    };
    let mut out = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for native in s.rollouts.iter().filter(|r| r.mode == "native") {
        let k = native.max_unavailable.as_str();
        let nth = seen.iter().filter(|x| **x == k).count();
        seen.push(k);
        if let Some(sr) = single_stage(k).get(nth) {
            out.push((native, *sr));
        }
    }
    out
}

/// Each control run (`native-labelled`) with the native and the
/// single-stage saferollout run of its maxUnavailable it is compared with:
/// the n-th control of a K with the n-th of each.
pub fn controls(s: &SizeResult) -> Vec<(&RolloutRun, Option<&RolloutRun>, Option<&RolloutRun>)> {
    let nth = |mode: &str, k: &str, n: usize| {
        s.rollouts
            .iter()
            .filter(|r| r.mode == mode && r.max_unavailable == k)
            .filter(|r| mode != "saferollout" || r.stages == "100%")
            .nth(n)
    };
    let labelled: Vec<&RolloutRun> = s
        .rollouts
        .iter()
        .filter(|r| r.mode == "native-labelled")
        .collect();
    labelled
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let k = c.max_unavailable.as_str();
            let n = labelled[..i]
                .iter()
                .filter(|x| x.max_unavailable == k)
                .count();
            (*c, nth("native", k, n), nth("saferollout", k, n))
        })
        .collect()
}

/// The control table: what the stage's node label writes alone cost the
/// native rollout on this machine, against what saferollout took.
fn controls_table(out: &mut String, r: &Results) {
    if r.sizes.iter().all(|s| controls(s).is_empty()) {
        return;
    }
    let _ = writeln!(
        out,
        "Control: the native `RollingUpdate` again while the benchmark writes the labels saferollout's \
         100% stage puts on every node (`saferollout.dev/stage`, `saferollout.dev/rollout`; the operator's \
         patch, 32 in flight like its label writer), from the template write on; removed after the timed \
         run, as the operator removes them after `Succeeded`. It tells what those writes alone cost the \
         rollout on this machine; the last column is what saferollout costs beyond them.\n"
    );
    let _ = writeln!(
        out,
        "| nodes | maxUnavailable | native (s) | native with the labels (s) | labels written in (s) | saferollout net (s) | labelled / native | saferollout / labelled |\n|---|---|---|---|---|---|---|---|"
    );
    for s in &r.sizes {
        for (c, native, sr) in controls(s) {
            let labelled = c.daemonset_complete_secs;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                s.nodes,
                c.max_unavailable,
                opt(native.map(|n| n.daemonset_complete_secs), f1),
                f1(labelled),
                opt(c.labels_secs, f1),
                opt(sr.and_then(net), f1),
                opt(
                    native.map(|n| labelled / n.daemonset_complete_secs),
                    |x| format!("{x:.2}x")
                ),
                opt(sr.and_then(net).map(|t| t / labelled), |x| format!(
                    "{x:.2}x"
                )),
            );
        }
    }
    let _ = writeln!(out);
}

/// saferollout's time to Succeeded, its soak by design subtracted, over the
/// native time to a complete DaemonSet.
pub fn ratio(native: &RolloutRun, sr: &RolloutRun) -> Option<f64> {
    Some(net(sr)? / native.daemonset_complete_secs)
}

/// Time to Succeeded less the soak by design.
pub fn net(sr: &RolloutRun) -> Option<f64> {
    Some(sr.succeeded_secs? - sr.soak_secs)
}

/// What the cluster itself spent during each timed rollout: on 2 cores the
/// API server is the shared resource, and this says how much of it each
/// kind of rollout took.
fn cluster_cpu_table(out: &mut String, r: &Results) {
    let runs: Vec<(usize, &RolloutRun)> = r
        .sizes
        .iter()
        .flat_map(|s| s.rollouts.iter().map(move |run| (s.nodes, run)))
        .filter(|(_, run)| !run.cluster_cpu.is_empty())
        .collect();
    let Some((_, first)) = runs.first() else {
        return;
    };
    let names: Vec<&str> = first.cluster_cpu.iter().map(|(n, _)| n.as_str()).collect();
    let _ = writeln!(
        out,
        "CPU seconds each cluster component used during each timed run, from the template write to its \
         end (native: the DaemonSet complete; saferollout: `Succeeded`, soak included), from /proc of \
         the PIDs `tests/cluster/up` recorded (the operator's own CPU is in the footprint table below). \
         Two cores give at most 2 CPU-seconds per second of wall time.\n"
    );
    let _ = writeln!(
        out,
        "| nodes | run | maxUnavailable | wall (s) | {} | cluster (CPU-s) | cluster per second of wall |\n|---|---|---|---|{}---|---|",
        names.join(" | "),
        "---|".repeat(names.len())
    );
    for (nodes, run) in runs {
        let cpu = |name: &str| {
            run.cluster_cpu
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, c)| *c)
        };
        let total: f64 = run.cluster_cpu.iter().map(|(_, c)| c).sum();
        let _ = writeln!(
            out,
            "| {nodes} | {} | {} | {} | {} | {} | {} |",
            run.mode,
            run.max_unavailable,
            f1(run.timed_secs),
            names
                .iter()
                .map(|n| opt(cpu(n), f1))
                .collect::<Vec<_>>()
                .join(" | "),
            f1(total),
            if run.timed_secs > 0.0 {
                format!("{:.2}", total / run.timed_secs)
            } else {
                "-".into()
            }
        );
    }
    let _ = writeln!(out);
}

/// What woke the operator's reconciles, per run: the requests queued by
/// cause against the reconciles that ran (requests for a rollout already
/// queued merge into one reconcile).
fn wakes_table(out: &mut String, r: &Results) {
    let mut causes: Vec<&str> = Vec::new();
    for s in &r.sizes {
        for o in operator_runs(s) {
            for (c, _) in &o.wakes {
                if !causes.contains(&c.as_str()) {
                    causes.push(c);
                }
            }
        }
    }
    if causes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nReconcile requests by cause (`saferollout_wakes_total`; requests for a rollout already queued merge into one reconcile):\n"
    );
    let _ = writeln!(
        out,
        "| nodes | run | reconciles | {} |\n|---|---|---|{}",
        causes.join(" | "),
        "---|".repeat(causes.len())
    );
    for s in &r.sizes {
        for o in operator_runs(s).into_iter().filter(|o| !o.wakes.is_empty()) {
            let counts: Vec<String> = causes
                .iter()
                .map(|c| {
                    let n = o.wakes.iter().find(|(x, _)| x == c).map_or(0.0, |w| w.1);
                    format!("{n:.0}")
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {} |",
                s.nodes,
                o.label,
                o.reconciles,
                counts.join(" | ")
            );
        }
    }
    let _ = writeln!(out);
}

/// Every operator process of a size.
pub fn operator_runs(s: &SizeResult) -> Vec<&OperatorRun> {
    let mut runs: Vec<&OperatorRun> = s
        .rollouts
        .iter()
        .filter_map(|r| r.operator.as_ref())
        .collect();
    let mut seen = Vec::new();
    for f in &s.reaction {
        if let Some(o) = &f.operator
            && !seen.contains(&o.label)
        {
            seen.push(o.label.clone());
            runs.push(o);
        }
    }
    if let Some(m) = &s.multi {
        runs.push(&m.operator);
    }
    runs
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

fn targets(r: &Results, out: &mut String) {
    let Some(big) = r
        .sizes
        .iter()
        .filter(|s| s.notes.iter().all(|n| !n.starts_with("the run failed")))
        .max_by_key(|s| s.nodes)
    else {
        return;
    };
    let n = big.nodes;
    let _ = writeln!(out, "## Targets\n");
    let _ = writeln!(out, "| target | measured | |\n|---|---|---|");
    for s in &r.sizes {
        for (native, sr) in pairs(s) {
            if let Some(x) = ratio(native, sr) {
                let _ = writeln!(
                    out,
                    "| gated rollout, no soak <= 1.1x native (maxUnavailable {}, {} nodes{}) | {x:.2}x ({}s vs {}s) | {} |",
                    native.max_unavailable,
                    s.nodes,
                    agents_start(r),
                    f1(net(sr).unwrap_or_default()),
                    f1(native.daemonset_complete_secs),
                    verdict(x <= 1.1)
                );
            }
        }
    }
    for f in &big.reaction {
        if let Some(rv) = &f.revert {
            let _ = writeln!(
                out,
                "| reaction p50 <= 100 ms, p99 <= 500 ms at {n} nodes ({}) | p50 {:.0} ms, p99 {:.0} ms ({} trials) | {} |",
                f.fault,
                rv.p50,
                rv.p99,
                rv.count,
                verdict(rv.p50 <= 100.0 && rv.p99 <= 500.0)
            );
        } else if let Some(why) = &f.skipped {
            let _ = writeln!(
                out,
                "| reaction at {n} nodes ({}) | not measured: {why} | - |",
                f.fault
            );
        }
    }
    if let Some(m) = &big.multi {
        let _ = writeln!(
            out,
            "| operator RSS <= 64 MiB at {n} nodes and {} SafeRollouts | peak {:.1} MiB | {} |",
            m.rollouts,
            m.operator.stat.peak_rss_mib,
            verdict(m.operator.stat.peak_rss_mib <= 64.0)
        );
    }
    let runs = operator_runs(big);
    if let Some(worst) = runs
        .iter()
        .filter(|o| o.rollouts == 1)
        .filter_map(|o| o.startup_secs)
        .reduce(f64::max)
    {
        // The API server's own time to stream the same nodes and pods to a
        // bare client, measured on the same cluster: the floor under it.
        let floor = big
            .stream_floor_secs
            .map(|f| format!(" (the API server streams every node and agent pod to a bare client in {f:.2} s)"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| start-up to first status write <= 3 s at {n} nodes | worst of {} starts {worst:.2} s{floor} | {} |",
            runs.iter().filter(|o| o.rollouts == 1).count(),
            verdict(worst <= 3.0)
        );
    }
    let lists: usize = r
        .sizes
        .iter()
        .flat_map(operator_runs)
        .map(|o| o.lists_after_startup.len())
        .sum();
    let _ = writeln!(
        out,
        "| zero periodic LISTs after start-up | {lists} LIST(s) after the first status write, over every operator run | {} |",
        verdict(lists == 0)
    );
    let _ = writeln!(out);
}

pub fn markdown(r: &Results, pngs: &[(String, String)]) -> String {
    let mut out = String::new();
    let m = &r.machine;
    let _ = writeln!(out, "# saferollout benchmark, {}\n", date(r));
    let _ = writeln!(
        out,
        "Machine: {} cores ({}), {:.0} GiB, Linux {}; 1-minute load {:.1} at the start, {:.1} at the end \
         (other people's builds and tests share the machine: absolute times are noisy, the ratios \
         compare runs made side by side on the same cluster). Commit `{}`. Command: `{}`.\n",
        m.cores, m.cpu_model, m.memory_gib, m.kernel, m.load_start, m.load_end, r.commit, r.command
    );
    targets(r, &mut out);
    for (title, file) in pngs {
        let _ = writeln!(out, "![{title}]({file})\n");
    }

    let _ = writeln!(
        out,
        "## Rollout time: saferollout against the native RollingUpdate\n"
    );
    let _ = writeln!(
        out,
        "The same DaemonSet (a simulated device plugin on every node) gets a new image. Native: \
         `RollingUpdate` with `maxUnavailable` K, timed from the template write to the DaemonSet status \
         showing every pod updated and available. saferollout: the same update (the Helm path: the \
         DaemonSet's template is written) under a SafeRollout with one `100%` stage, the same \
         `maxUnavailable`, podsReady and allocatable gates, timed to the DaemonSet complete and to the \
         SafeRollout `Succeeded`. The allocatable gate soaks 2 s: without soak it falsely reverted healthy \
         releases here (a replaced plugin's node reads 0 devices for a moment after its new pod turns \
         Ready). A stage passes only after its gates held for the soak, so the ratio uses `Succeeded` less \
         2 s per stage (the net column). The soak starts at the whole second after the gate first sees \
         every node within bounds (the status keeps whole seconds), so it lasts 2-3 s: the net charges \
         saferollout that rounding, half a second a stage on average. The staged row (1, 10%, 50%, 100%) \
         is for reference.\n"
    );
    if r.agent_start_secs > 0 {
        let _ = writeln!(
            out,
            "Each new agent pod of these runs, on both sides, turns Ready and advertises its devices {} s \
             after it starts (`--agent-start-secs`; the fixture's `-slow` agents), as a real device plugin \
             takes seconds to start and register with the kubelet: the rollouts wait on the agents rather \
             than on the machine's CPU.\n",
            r.agent_start_secs
        );
    }
    let _ = writeln!(
        out,
        "| nodes | maxUnavailable | native (s) | saferollout: DaemonSet complete (s) | saferollout: Succeeded (s) | net of soak (s) | ratio |\n|---|---|---|---|---|---|---|"
    );
    for s in &r.sizes {
        for (native, sr) in pairs(s) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                s.nodes,
                native.max_unavailable,
                f1(native.daemonset_complete_secs),
                f1(sr.daemonset_complete_secs),
                opt(sr.succeeded_secs, f1),
                opt(net(sr), f1),
                opt(ratio(native, sr), |x| format!("{x:.2}x"))
            );
        }
        for sr in s
            .rollouts
            .iter()
            .filter(|r| r.mode == "saferollout" && r.stages != "100%")
        {
            let _ = writeln!(
                out,
                "| {} | {} (stages {}) | - | {} | {} | {} | - |",
                s.nodes,
                sr.max_unavailable,
                sr.stages,
                f1(sr.daemonset_complete_secs),
                opt(sr.succeeded_secs, f1),
                opt(net(sr), f1)
            );
        }
    }
    let _ = writeln!(out);
    controls_table(&mut out, r);
    cluster_cpu_table(&mut out, r);

    let _ = writeln!(out, "## Reaction time\n");
    let _ = writeln!(
        out,
        "From the watch event that makes the gate fail on the canary to the watch event of the operator's \
         revert write (the DaemonSet's template restored) and of its status write (the revision blocked), \
         both delivered by the API server to the benchmark (stamped on arrival; the delivery delay is the \
         same for both). Every gate runs with soak 0s, so no soak is subtracted. One new faulty template \
         per trial, faults interleaved. A gate judges a node only on evidence written after its new agent \
         became Ready (for allocatable, the node's status written in a later second than the pod's Ready), \
         so the failing event is the first such evidence; \"evidence wait\" is the time from the new pod's \
         Ready event to it. A trial whose canary stage passes the faulty release (the failure then caught at \
         the next stage) is counted as a false pass and left out of the times (without that rule, a broken \
         plugin passed whenever its pod turned Ready a moment before its node's allocatable dropped).\n"
    );
    let _ = writeln!(
        out,
        "| nodes | fault | trials | revert p50 | p90 | p99 | max | status p50 | status p99 | evidence wait p50 | p90 | false passes at the canary | failed trials |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for s in &r.sizes {
        for f in &s.reaction {
            if let Some(why) = &f.skipped {
                let _ = writeln!(
                    out,
                    "| {} | {} | not measured: {why} |||||||||",
                    s.nodes, f.fault
                );
                continue;
            }
            let ms = |v: f64| format!("{v:.0} ms");
            let failed = f.trials.iter().filter(|t| t.error.is_some()).count();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {failed} |",
                s.nodes,
                f.fault,
                f.trials.len(),
                opt(f.revert.map(|x| x.p50), ms),
                opt(f.revert.map(|x| x.p90), ms),
                opt(f.revert.map(|x| x.p99), ms),
                opt(f.revert.map(|x| x.max), ms),
                opt(f.status.map(|x| x.p50), ms),
                opt(f.status.map(|x| x.p99), ms),
                opt(f.evidence_wait.map(|x| x.p50), ms),
                opt(f.evidence_wait.map(|x| x.p90), ms),
                f.trials.iter().filter(|t| t.false_pass).count(),
            );
        }
    }
    let descriptions: Vec<(&str, &str)> = r
        .sizes
        .iter()
        .flat_map(|s| &s.reaction)
        .map(|f| (f.fault.as_str(), f.description.as_str()))
        .collect();
    let mut seen = Vec::new();
    for (fault, d) in descriptions {
        if !seen.contains(&fault) {
            seen.push(fault);
            let _ = writeln!(out, "- `{fault}`: {d}");
        }
    }
    let _ = writeln!(out);

    let _ = writeln!(out, "## The operator's footprint\n");
    let _ = writeln!(
        out,
        "One operator process per run (release build, its ServiceAccount's token, leader election on, \
         watching all namespaces). Peak RSS is the kernel's VmHWM; CPU is user + system time of the \
         process; requests are the API server's audit log of the ServiceAccount; start-up is from the \
         process start to its first status write (the request's arrival at the API server).\n"
    );
    let floors: Vec<String> = r
        .sizes
        .iter()
        .filter_map(|s| {
            s.stream_floor_secs
                .map(|f| format!("{} nodes {f:.2} s", s.nodes))
        })
        .collect();
    if !floors.is_empty() {
        let _ = writeln!(
            out,
            "The start-up's floor: the API server's time to stream every node and every DaemonSet pod \
             (streaming lists, both at once, as the operator's caches start) to a bare client that \
             only reads the bytes, median of 3 before the size's runs: {}.\n",
            floors.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "| nodes | run | SafeRollouts | start-up (s) | wall (s) | peak RSS (MiB) | CPU (s) | requests | LISTs after start-up | reconciles | mean reconcile (ms) |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for s in &r.sizes {
        for o in operator_runs(s) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {:.0} | {:.2} |",
                s.nodes,
                o.label,
                o.rollouts,
                opt(o.startup_secs, |x| format!("{x:.2}")),
                f1(o.wall_secs),
                o.stat.peak_rss_mib,
                o.stat.cpu_secs,
                o.requests.values().sum::<usize>(),
                o.lists_after_startup.len(),
                o.reconciles,
                o.reconcile_mean_ms
            );
        }
    }
    let _ = writeln!(out);
    for s in &r.sizes {
        for o in operator_runs(s) {
            for l in &o.lists_after_startup {
                let _ = writeln!(out, "- {} nodes, {}: {l}", s.nodes, o.label);
            }
        }
    }
    wakes_table(&mut out, r);
    if let Some((s, o)) = r.sizes.iter().rev().find_map(|s| {
        s.rollouts
            .iter()
            .find(|x| x.mode == "saferollout" && x.stages == "100%")
            .and_then(|x| x.operator.as_ref())
            .map(|o| (s, o))
    }) {
        let _ = writeln!(
            out,
            "\nRequests by verb and resource of the run `{}` at {} nodes (start-up, adoption, one rollout, deletion):\n",
            o.label, s.nodes
        );
        let _ = writeln!(out, "| request | count |\n|---|---|");
        for (k, v) in &o.requests {
            let _ = writeln!(out, "| `{k}` | {v} |");
        }
    }
    let _ = writeln!(
        out,
        "\n### Requests per stage\n\nThe staged rollout (1, 10%, 50%, 100%, maxUnavailable 10%): the operator's requests while each stage ran, against the nodes the stage added.\n"
    );
    let _ = writeln!(
        out,
        "| nodes | stage | new nodes | duration (s) | requests | per new node | of which LIST |\n|---|---|---|---|---|---|---|"
    );
    for s in &r.sizes {
        for run in s
            .rollouts
            .iter()
            .filter(|x| !x.stage_requests.is_empty() && x.stages != "100%")
        {
            for st in &run.stage_requests {
                let total: usize = st.requests.values().sum();
                let lists: usize = st
                    .requests
                    .iter()
                    .filter(|(k, _)| k.starts_with("list "))
                    .map(|(_, v)| v)
                    .sum();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {total} | {:.1} | {lists} |",
                    s.nodes,
                    st.index + 1,
                    st.new_nodes,
                    f1(st.secs),
                    total as f64 / st.new_nodes.max(1) as f64
                );
            }
        }
    }
    let _ = writeln!(out);

    let _ = writeln!(out, "## Many SafeRollouts\n");
    let _ = writeln!(
        out,
        "N DaemonSets in N namespaces, each on its own pool of nodes, each with a SafeRollout (default \
         stages 1, 10%, 50%, 100%; maxUnavailable 1; the allocatable gate with the soak in the table); \
         the other scenarios' DaemonSet is deleted first; the operator starts with all of them present; \
         then every template changes at once. A false revert is a healthy release blocked.\n"
    );
    let _ = writeln!(
        out,
        "| nodes | SafeRollouts | nodes each | soak (s) | start to all adopted (s) | all rolled out (s) | false reverts | peak RSS (MiB) | CPU (s) | requests |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut reverts = Vec::new();
    for s in &r.sizes {
        if let Some(m) = &s.multi {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} |",
                s.nodes,
                m.rollouts,
                m.nodes_each,
                m.soak_secs,
                f1(m.adopt_secs),
                f1(m.rollout_secs),
                m.false_reverts.len(),
                m.operator.stat.peak_rss_mib,
                m.operator.stat.cpu_secs,
                m.operator.requests.values().sum::<usize>()
            );
            reverts.extend(
                m.false_reverts
                    .iter()
                    .map(|r| format!("{} nodes, {r}", s.nodes)),
            );
        }
    }
    for r in reverts {
        let _ = writeln!(out, "- false revert: {r}");
    }
    let _ = writeln!(out);

    let _ = writeln!(out, "## The cluster's own cost\n");
    let _ = writeln!(
        out,
        "RSS (now / peak) and CPU seconds of each component while the benchmark ran on that size (the \
         cluster's start excluded), from /proc of the PIDs `tests/cluster/up` recorded. Two cores give \
         at most 2 CPU-seconds per second.\n"
    );
    let mut names: Vec<&str> = Vec::new();
    for s in &r.sizes {
        for c in &s.components {
            if !names.contains(&c.name.as_str()) {
                names.push(&c.name);
            }
        }
    }
    let _ = write!(out, "| nodes | cluster start (s) |");
    for n in &names {
        let _ = write!(out, " {n} |");
    }
    let _ = write!(out, "\n|---|---|");
    for _ in &names {
        let _ = write!(out, "---|");
    }
    let _ = writeln!(out);
    for s in &r.sizes {
        let _ = write!(out, "| {} | {} |", s.nodes, f1(s.cluster_up_secs));
        for n in &names {
            match s.components.iter().find(|c| c.name == *n) {
                Some(c) => {
                    let _ = write!(
                        out,
                        " {:.0} / {:.0} MiB, {:.0} s |",
                        c.end.rss_mib, c.end.peak_rss_mib, c.cpu_secs_bench
                    );
                }
                None => {
                    let _ = write!(out, " - |");
                }
            }
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out);
    let notes: Vec<String> = r
        .sizes
        .iter()
        .flat_map(|s| {
            s.notes
                .iter()
                .map(move |n| format!("- {} nodes: {n}", s.nodes))
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "## Notes\n\n{}\n", notes.join("\n"));
    }
    let _ = writeln!(
        out,
        "Load average per size (start / end): {}.\n",
        r.sizes
            .iter()
            .map(|s| format!("{} nodes {:.1} / {:.1}", s.nodes, s.load_start, s.load_end))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::SizeResult;

    fn run(mode: &str, k: &str, secs: f64, cpu: &[(&str, f64)]) -> RolloutRun {
        RolloutRun {
            mode: mode.into(),
            max_unavailable: k.into(),
            stages: String::new(),
            daemonset_complete_secs: secs,
            succeeded_secs: None,
            soak_secs: 0.0,
            operator: None,
            stage_requests: Vec::new(),
            cluster_cpu: cpu.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
            timed_secs: secs,
            labels_secs: None,
        }
    }

    /// A saferollout run of one 100% stage, `Succeeded` after `secs`, of
    /// which `soak` seconds soak by design.
    fn one_stage(k: &str, secs: f64, soak: f64) -> RolloutRun {
        RolloutRun {
            stages: "100%".into(),
            succeeded_secs: Some(secs),
            soak_secs: soak,
            ..run("saferollout", k, secs, &[])
        }
    }

    #[test]
    fn the_cluster_cpu_table_has_a_row_per_run_with_its_total_per_second() {
        let mut r = Results::default();
        r.sizes.push(SizeResult {
            nodes: 1000,
            rollouts: vec![
                run(
                    "native",
                    "1",
                    50.0,
                    &[("kube-apiserver", 40.0), ("etcd", 10.0)],
                ),
                run(
                    "saferollout",
                    "1",
                    40.0,
                    &[("kube-apiserver", 60.0), ("etcd", 12.0)],
                ),
                // A result of a build before the measure: no row.
                run("native", "10%", 20.0, &[]),
            ],
            ..Default::default()
        });
        let mut out = String::new();
        cluster_cpu_table(&mut out, &r);
        let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| 1000")).collect();
        assert_eq!(
            rows,
            [
                "| 1000 | native | 1 | 50.0 | 40.0 | 10.0 | 50.0 | 1.00 |",
                "| 1000 | saferollout | 1 | 40.0 | 60.0 | 12.0 | 72.0 | 1.80 |",
            ]
        );
        assert!(out.contains("| kube-apiserver | etcd |"), "{out}");
    }

    #[test]
    fn repeated_runs_pair_in_order_each_once() {
        let sr = |k: &str, secs: f64| one_stage(k, secs, 0.0);
        let s = SizeResult {
            nodes: 1000,
            rollouts: vec![
                run("native", "1", 65.0, &[]),
                sr("1", 66.0),
                run("native", "1", 67.0, &[]),
                sr("1", 73.0),
                run("native", "10%", 29.0, &[]),
                sr("10%", 39.0),
                // A native run left without its saferollout run: no pair.
                run("native", "1", 70.0, &[]),
            ],
            ..Default::default()
        };
        let got: Vec<(f64, f64)> = pairs(&s)
            .into_iter()
            .map(|(n, r)| (n.daemonset_complete_secs, r.daemonset_complete_secs))
            .collect();
        assert_eq!(got, [(65.0, 66.0), (67.0, 73.0), (29.0, 39.0)]);
    }

    #[test]
    fn a_control_run_compares_with_the_native_and_saferollout_runs_of_its_order() {
        let sr = |k: &str, secs: f64| one_stage(k, secs, 2.0);
        let labelled = |k: &str, secs: f64| RolloutRun {
            labels_secs: Some(4.0),
            ..run("native-labelled", k, secs, &[])
        };
        let mut r = Results::default();
        r.sizes.push(SizeResult {
            nodes: 1000,
            rollouts: vec![
                run("native", "10%", 20.0, &[]),
                labelled("10%", 25.0),
                sr("10%", 32.0),
                run("native", "10%", 24.0, &[]),
                // A staged run is not the one compared.
                RolloutRun {
                    stages: "1,100%".into(),
                    ..sr("10%", 90.0)
                },
                labelled("10%", 27.0),
                // The second control has no saferollout run: no ratio to it.
            ],
            ..Default::default()
        });
        let mut out = String::new();
        controls_table(&mut out, &r);
        let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| 1000")).collect();
        assert_eq!(
            rows,
            [
                "| 1000 | 10% | 20.0 | 25.0 | 4.0 | 30.0 | 1.25x | 1.20x |",
                "| 1000 | 10% | 24.0 | 27.0 | 4.0 | - | 1.12x | - |",
            ]
        );
        // No control run, no table.
        r.sizes[0].rollouts.retain(|x| x.mode != "native-labelled");
        let mut out = String::new();
        controls_table(&mut out, &r);
        assert_eq!(out, "");
    }

    #[test]
    fn agents_that_take_time_to_start_are_named_in_the_targets_and_the_rollout_section() {
        let mut r = Results::default();
        r.sizes.push(SizeResult {
            nodes: 1000,
            rollouts: vec![run("native", "10%", 75.0, &[]), one_stage("10%", 80.0, 2.0)],
            ..Default::default()
        });
        let target = "| gated rollout, no soak <= 1.1x native (maxUnavailable 10%, 1000 nodes";
        let at_once = markdown(&r, &[]);
        assert!(at_once.contains(&format!("{target}) | 1.04x (78.0s vs 75.0s) | met |")));
        assert!(!at_once.contains("agents start in"));
        assert!(!at_once.contains("--agent-start-secs"));
        r.agent_start_secs = 5;
        let slow = markdown(&r, &[]);
        assert!(slow.contains(&format!("{target}, agents start in 5 s) | 1.04x")));
        assert!(slow.contains("advertises its devices 5 s after it starts"));
    }

    #[test]
    fn no_cluster_cpu_no_table() {
        let mut r = Results::default();
        r.sizes.push(SizeResult {
            nodes: 10,
            rollouts: vec![run("native", "1", 5.0, &[])],
            ..Default::default()
        });
        let mut out = String::new();
        cluster_cpu_table(&mut out, &r);
        assert_eq!(out, "");
    }
}
