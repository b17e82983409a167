//! `saferollout-bench`: saferollout side by side with the native DaemonSet
//! rollout on the local real control plane (tests/cluster/up, KWOK nodes),
//! its reaction time to failing gates, its footprint and the cluster's; writes
//! results.json, a Markdown report and PNG plots. Run it through `bench/run`,
//! which builds the release binaries first.

mod cluster;
mod ctx;
mod k8s;
mod multi;
mod overhead;
mod plots;
mod procfs;
mod reaction;
mod report;
mod results;
mod stats;
mod watch;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use jiff::Timestamp;
use saferollout_testkit::{client_for, repo_root};

use crate::cluster::Cluster;
use crate::ctx::{Ctx, secs};
use crate::reaction::Fault;
use crate::results::{Component, Machine, Results, SizeResult};

/// Benchmarks saferollout at fleet scale on the local real control plane.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Cluster sizes (KWOK nodes), one fresh cluster each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    nodes: Vec<usize>,
    /// Reaction trials per fault.
    #[arg(long, default_value_t = 30)]
    trials: usize,
    /// Where the report, plots and results.json go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scenarios to run: overhead, reaction, multi.
    #[arg(long, value_delimiter = ',', default_value = "overhead,reaction,multi")]
    scenarios: Vec<String>,
    /// Faults of the reaction scenario: crashloop, allocatable, dra. `dra`
    /// is not in the default: without soak the resourceSlices gate judges
    /// the slices the old driver left (the kubelet wipes a stopped plugin's
    /// slices only later, which is why that gate soaks by design), so the
    /// canary passes and the fault is caught at the next stage.
    #[arg(long, value_delimiter = ',', default_value = "crashloop,allocatable")]
    faults: Vec<String>,
    /// The gates of the DRA fault's SafeRollout (JSON of spec.gates).
    #[arg(
        long,
        default_value = r#"{"resourceSlices": {"driver": "gpu.sim.saferollout.dev", "minDevices": "baseline", "soak": "0s"}}"#
    )]
    dra_gates: String,
    /// SafeRollouts of the multi scenario (one namespace and node pool each).
    #[arg(long, default_value_t = 50)]
    multi: usize,
    /// Skip the maxUnavailable 1 runs above this many nodes (they replace one node at a time).
    #[arg(long)]
    k1_max_nodes: Option<usize>,
    /// The overhead runs, in order: `native:K` or `saferollout:K:STAGES`
    /// (stages separated by `/`), or the control `native-labelled:K` (the
    /// native rollout while the benchmark writes the labels saferollout's
    /// 100% stage puts on every node). Default: native and saferollout at K = 1,
    /// then at K = 10%, then saferollout staged 1/10%/50%/100% at K = 10%.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native:1,saferollout:1:100%,saferollout:10%:100%,native:10%,saferollout:10%:1/10%/50%/100%"
    )]
    overhead_runs: Vec<String>,
    /// The API server's audit policy. The default logs only the operator's
    /// requests; bench/audit-policy-pod-writes.yaml also logs every
    /// component's pod and node writes, for bench/tools/replacement-chain.py
    /// (it costs the API server a little, on both sides of a comparison).
    #[arg(long)]
    audit_policy: Option<PathBuf>,
    /// The operator binary (bench/run passes the release build).
    #[arg(long, env = "SAFEROLLOUT_BENCH_OPERATOR")]
    operator_bin: PathBuf,
    /// Parent of the clusters' state directories.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    state_root: PathBuf,
    /// How long each new agent pod of the overhead runs takes to turn Ready
    /// and advertise its devices, in seconds, on both sides (the fixture's
    /// `-slow` agents): 0, the default, is at once, where the rollout is
    /// bound by the machine's CPU; a real device plugin takes seconds to
    /// start and register with the kubelet.
    #[arg(long, default_value_t = 0)]
    agent_start_secs: u64,
    /// Leave the last cluster running.
    #[arg(long)]
    keep: bool,
    /// Only remake the report and plots from DIR/results.json.
    #[arg(long, value_name = "DIR")]
    report_only: Option<PathBuf>,
}

/// The median of three [`k8s::stream_floor`] measurements (`None`, noted on
/// stderr, if one fails).
async fn stream_floor(client: &kube::Client) -> Option<f64> {
    let mut times = Vec::new();
    for _ in 0..3 {
        match k8s::stream_floor(client).await {
            Ok(t) => times.push(t),
            Err(e) => {
                eprintln!("bench: the API server's stream floor: {e:#}");
                return None;
            }
        }
    }
    times.sort_by(f64::total_cmp);
    eprintln!("bench: the API server streams every node and agent pod in {times:.2?} s");
    Some(times[1])
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.report_only {
        let results: Results = serde_json::from_slice(
            &std::fs::read(dir.join("results.json")).context("reading results.json")?,
        )?;
        let name = write_report(dir, &results)?;
        eprintln!("bench: wrote {}", dir.join(name).display());
        return Ok(());
    }
    let faults: Vec<Fault> = args
        .faults
        .iter()
        .map(|f| Fault::parse(f))
        .collect::<anyhow::Result<_>>()?;
    let dra_gates: serde_json::Value =
        serde_json::from_str(&args.dra_gates).context("--dra-gates is not JSON")?;
    if let Some(bad) = args
        .overhead_runs
        .iter()
        .find(|r| parse_overhead_run(r).is_none())
    {
        bail!(
            "--overhead-runs: {bad:?} is not native:K, native-labelled:K or saferollout:K:STAGES"
        );
    }
    for s in &args.scenarios {
        if !["overhead", "reaction", "multi"].contains(&s.as_str()) {
            bail!("unknown scenario {s:?} (overhead, reaction, multi)");
        }
    }
    if !args.operator_bin.is_file() {
        bail!("no operator binary at {}", args.operator_bin.display());
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| repo_root().join("bench/results"));
    std::fs::create_dir_all(&out)?;
    let log_dir =
        std::env::temp_dir().join(format!("saferollout-bench-logs-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir)?;
    let mut results = Results {
        started: Some(Timestamp::now()),
        machine: machine(),
        commit: git_commit(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        agent_start_secs: args.agent_start_secs,
        ..Default::default()
    };
    for (i, &nodes) in args.nodes.iter().enumerate() {
        let last = i + 1 == args.nodes.len();
        let size = run_size(
            &args,
            nodes,
            &faults,
            &dra_gates,
            &log_dir,
            last && args.keep,
        )
        .await;
        match size {
            Ok(s) => results.sizes.push(s),
            Err(e) => {
                eprintln!("bench: {nodes} nodes failed: {e:#}");
                results.sizes.push(SizeResult {
                    nodes,
                    notes: vec![format!("the run failed: {e:#}")],
                    ..Default::default()
                });
            }
        }
        results.finished = Some(Timestamp::now());
        results.machine.load_end = procfs::load_average();
        std::fs::write(
            out.join("results.json"),
            serde_json::to_vec_pretty(&results)?,
        )?;
        let name = write_report(&out, &results)?;
        eprintln!("bench: wrote {}", out.join(name).display());
    }
    eprintln!("bench: operator logs in {}", log_dir.display());
    if results
        .sizes
        .iter()
        .any(|s| s.notes.iter().any(|n| n.starts_with("the run failed")))
    {
        bail!("some sizes failed (see the report)");
    }
    Ok(())
}

async fn run_size(
    args: &Args,
    nodes: usize,
    faults: &[Fault],
    dra_gates: &serde_json::Value,
    log_dir: &std::path::Path,
    keep: bool,
) -> anyhow::Result<SizeResult> {
    let mut size = SizeResult {
        nodes,
        load_start: procfs::load_average(),
        ..Default::default()
    };
    let state = args.state_root.join(format!("saferollout-bench-{nodes}"));
    eprintln!(
        "bench: starting a cluster of {nodes} nodes in {}",
        state.display()
    );
    let t = Timestamp::now();
    let cluster = Cluster::up(
        nodes,
        k8s::GPUS as usize,
        &state,
        args.audit_policy.as_deref(),
        args.agent_start_secs,
    )?;
    size.cluster_up_secs = secs(t, Timestamp::now());
    let result = async {
        let client = client_for(&cluster.kubeconfig).await?;
        let op_kubeconfig = cluster.install_operator()?;
        let names = k8s::node_names(&client).await?;
        let ctx = Ctx::new(
            Cluster {
                kubeconfig: cluster.kubeconfig.clone(),
                state_dir: cluster.state_dir.clone(),
                nodes,
            },
            client,
            args.operator_bin.clone(),
            op_kubeconfig,
            log_dir.to_path_buf(),
            names,
            args.agent_start_secs,
        );
        overhead::setup(&ctx).await?;
        size.stream_floor_secs = stream_floor(&ctx.client).await;
        let before = cluster.component_stats()?;
        let wants = |s: &str| args.scenarios.iter().any(|x| x == s);
        if wants("overhead") {
            let k1 = args.k1_max_nodes.is_none_or(|m| nodes <= m);
            if !k1 {
                size.notes.push(format!(
                    "maxUnavailable 1 not run at {nodes} nodes (--k1-max-nodes)"
                ));
            }
            // Native and saferollout alternate (ABBA), so a slow spell of the
            // machine weighs on both.
            let runs: Vec<(&str, &str, Vec<&str>)> = args
                .overhead_runs
                .iter()
                .filter_map(|r| parse_overhead_run(r))
                .filter(|(_, k, _)| k1 || *k != "1")
                .collect();
            for (i, (mode, k, stages)) in runs.iter().enumerate() {
                let (mode, k) = (*mode, *k);
                let repeat = runs[..i].iter().filter(|r| *r == &runs[i]).count();
                let run = if mode != "saferollout" {
                    overhead::native(&ctx, k, mode == "native-labelled").await
                } else {
                    overhead::saferollout(&ctx, k, stages, repeat).await
                };
                match run {
                    Ok(r) => size.rollouts.push(r),
                    Err(e) => {
                        eprintln!("bench: {mode} maxUnavailable {k} {stages:?}: {e:#}");
                        size.notes.push(format!(
                            "{mode} rollout, maxUnavailable {k}, stages {stages:?}: {e:#}"
                        ));
                        overhead::recover(&ctx).await?;
                    }
                }
            }
        }
        if wants("reaction") && !faults.is_empty() {
            match reaction::run(&ctx, faults, args.trials, dra_gates).await {
                Ok(r) => size.reaction = r,
                Err(e) => size.notes.push(format!("reaction: {e:#}")),
            }
        }
        if wants("multi") && args.multi > 0 {
            match multi::run(&ctx, args.multi).await {
                Ok(m) => size.multi = Some(m),
                Err(e) => size.notes.push(format!("multi: {e:#}")),
            }
        }
        let after = cluster.component_stats()?;
        size.components = after
            .into_iter()
            .map(|(name, end)| {
                let start = before
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(0.0, |(_, s)| s.cpu_secs);
                Component {
                    cpu_secs_bench: end.cpu_secs - start,
                    name,
                    end,
                }
            })
            .collect();
        anyhow::Ok(())
    }
    .await;
    size.load_end = procfs::load_average();
    if let Err(e) = result {
        size.notes.push(format!("the run failed: {e:#}"));
        eprintln!(
            "bench: {nodes} nodes: {e:#}; cluster logs in {}",
            state.display()
        );
        if !keep {
            let kept = std::env::temp_dir().join(format!("saferollout-bench-failed-{nodes}"));
            let _ = std::fs::remove_dir_all(&kept);
            let _ = std::process::Command::new("cp")
                .arg("-r")
                .arg(state.join("logs"))
                .arg(&kept)
                .status();
            eprintln!("bench: kept the cluster's logs in {}", kept.display());
        }
    }
    // The operator's requests, for a closer look (not part of the report).
    let _ = std::fs::copy(
        cluster.audit_log(),
        log_dir.join(format!("audit-{nodes}.log")),
    );
    if !keep {
        cluster.down()?;
    }
    Ok(size)
}

/// `native:K`, `native-labelled:K` or `saferollout:K:S1/S2/...` as (mode,
/// K, stages).
fn parse_overhead_run(run: &str) -> Option<(&str, &str, Vec<&str>)> {
    let mut parts = run.splitn(3, ':');
    let (mode, k) = (parts.next()?, parts.next()?);
    if k.is_empty() {
        return None;
    }
    match (mode, parts.next()) {
        ("native" | "native-labelled", None) => Some((mode, k, vec![])),
        ("saferollout", Some(stages)) if !stages.is_empty() => {
            Some((mode, k, stages.split('/').collect()))
        }
        _ => None,
    }
}

fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let memory_kib: f64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0);
    Machine {
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: memory_kib / 1024.0 / 1024.0,
        cpu_model: read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_default(),
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        load_start: procfs::load_average(),
        load_end: 0.0,
    }
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(repo_root())
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Writes `<date>.md` and its PNGs into `dir`; returns the report's file
/// name. Here, not in `report`, so the report's text and the plots (which
/// read the report's selections of runs) do not import each other.
fn write_report(dir: &std::path::Path, r: &Results) -> anyhow::Result<String> {
    let date = report::date(r);
    let pngs = plots::draw(dir, &date, r)?;
    let name = format!("{date}.md");
    std::fs::write(dir.join(&name), report::markdown(r, &pngs))?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::parse_overhead_run;

    #[test]
    fn overhead_runs_parse() {
        assert_eq!(
            parse_overhead_run("native:1"),
            Some(("native", "1", vec![]))
        );
        assert_eq!(
            parse_overhead_run("native-labelled:10%"),
            Some(("native-labelled", "10%", vec![]))
        );
        assert_eq!(
            parse_overhead_run("saferollout:10%:1/10%/100%"),
            Some(("saferollout", "10%", vec!["1", "10%", "100%"]))
        );
        for bad in [
            "native",
            "native:",
            "native:1:100%",
            "native-labelled:1:100%",
            "saferollout:1",
            "saferollout:1:",
            "other:1",
        ] {
            assert_eq!(parse_overhead_run(bad), None, "{bad}");
        }
    }
}
