//! Command-line definitions (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use saferollout_preflight::PsaLevel;

use crate::output::OutputFormat;

const ABOUT: &str = "Staged, gated rollouts of device-plugin and DRA-driver DaemonSets: \
lint manifests offline, watch and plan SafeRollouts, approve, pause, resume, retry or abort them, \
inventory a cluster's accelerator agents, and show the fleet policies that govern rollouts together.";

const EXAMPLES: &str = "\
Examples:
  # Lint manifests offline (no cluster needed); exit 1 if an Error is found
  kubectl saferollout lint -f daemonset.yaml -f saferollout.yaml --psa-level baseline

  # Where a rollout is, and follow it as it changes
  kubectl saferollout -n gpu status nvidia-device-plugin -w

  # Which nodes each stage would take, without changing anything
  kubectl saferollout -n gpu plan nvidia-device-plugin

  # Let a stage that waits for approval go on
  kubectl saferollout -n gpu approve nvidia-device-plugin

  # What the cluster has: versions, DRA APIs, nodes, agents, devices, warnings
  kubectl saferollout -n gpu inventory --target nvidia-device-plugin

  # Fleet policies: who holds the disruption budget, who waits and why, the next window
  kubectl saferollout policy gpu-node-stack

Exit status: 0 success; 1 lint found an Error, an object is missing or an action does not apply;
2 usage, kubeconfig or connection error.";

/// `kubectl saferollout`.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-saferollout",
    bin_name = "kubectl saferollout",
    version,
    about = ABOUT,
    after_help = EXAMPLES,
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes, as kubectl spells them.
#[derive(Debug, Clone, Default, Args)]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of the SafeRollout (default: the context's namespace, else "default").
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check DaemonSet and SafeRollout manifests offline (no cluster access).
    #[command(after_help = "\
Examples:
  kubectl saferollout lint -f nvidia-device-plugin.yaml
  helm template ./chart | kubectl saferollout lint -f - --psa-level baseline
  kubectl saferollout lint -f ds.yaml -f sr.yaml -o json

Prints one row per finding (severity, code, object, message, fix). Exit status: 0 when
no finding is an Error, 1 when one is or a manifest cannot be parsed, 2 when a file
cannot be read.")]
    Lint(LintArgs),

    /// Show a SafeRollout: phase, stage k/N, revisions, stages, gates, conditions.
    #[command(after_help = "\
Examples:
  kubectl saferollout status nvidia-device-plugin
  kubectl saferollout -n gpu status nvidia-device-plugin --watch
  kubectl saferollout -n gpu status nvidia-device-plugin -o json | jq -r .phase

-o json|yaml prints one document with stable field names (namespace, name, daemonSet,
generation, observedGeneration, phase, paused, message, currentStage, stageCount,
awaitingApproval, targetRevision, stableRevision, lastGood, stages, gates, conditions,
blockedRevisions; stage numbers 1-based); with --watch, one document per change.")]
    Status(StatusArgs),

    /// Show which nodes each stage would take now, without changing anything.
    #[command(after_help = "\
Examples:
  kubectl saferollout plan nvidia-device-plugin
  kubectl saferollout -n gpu plan nvidia-device-plugin -o json

Stages already planned by the operator (in status) are shown as recorded; the others
are planned the way the operator would plan them now.")]
    Plan(PlanArgs),

    /// Pause a rollout (sets spec.paused: true): no further agent pod is replaced.
    #[command(after_help = "\
Example:
  kubectl saferollout pause nvidia-device-plugin")]
    Pause(NameArg),

    /// Resume a paused rollout (sets spec.paused: false).
    #[command(after_help = "\
Example:
  kubectl saferollout resume nvidia-device-plugin")]
    Resume(NameArg),

    /// Approve the stage that waits for approval (a stage with pause: true).
    #[command(after_help = "\
Example:
  kubectl saferollout approve nvidia-device-plugin

Annotates saferollout.dev/approve=<status.currentStage>. Fails when no stage is waiting.")]
    Approve(NameArg),

    /// Retry a blocked (reverted) revision.
    #[command(after_help = "\
Examples:
  kubectl saferollout retry nvidia-device-plugin
  kubectl saferollout retry nvidia-device-plugin --revision 69c5dfbb5

Annotates saferollout.dev/retry=<revision>; the default is the most recently blocked one.")]
    Retry(RetryArgs),

    /// Abort the rollout in progress: revert at once and block its revision.
    #[command(after_help = "\
Example:
  kubectl saferollout abort nvidia-device-plugin

Annotates saferollout.dev/abort=<status.targetRevision>. Fails when no rollout is in progress.
Undo with `kubectl saferollout retry NAME`.")]
    Abort(NameArg),

    /// Read-only report of the cluster: versions, APIs, nodes, agents, DaemonSets, DRA, warnings.
    #[command(after_help = "\
Examples:
  kubectl saferollout -n gpu inventory
  kubectl saferollout -n gpu inventory --target nvidia-device-plugin -o yaml")]
    Inventory(InventoryArgs),

    /// Show SafeRolloutPolicies: limits, windows, ordering, the rollouts each governs and who waits.
    #[command(after_help = "\
Examples:
  kubectl saferollout policy
  kubectl saferollout policy gpu-node-stack
  kubectl saferollout policy gpu-node-stack -o json | jq -r '.policies[].rollouts[] | select(.waiting) | .name'

For each policy (cluster-scoped; -n is not used): its Ready condition, maxDisruptedNodes and
maxConcurrentRollouts, whether a maintenance window is open now and when the next opens (in the
window's time zone), its ordering rules with the governed rollouts each side matches; then each
SafeRollout it governs, in every namespace: phase, the reason and message of its Waiting condition
when the policy holds it back, the nodes it disrupts now; and the distinct nodes disrupted across
them against maxDisruptedNodes. Exit status: 0 when shown, 1 when the named policy does not exist.")]
    Policy(PolicyArgs),
}

#[derive(Debug, Clone, Args)]
pub struct LintArgs {
    /// Manifest file(s), or directories (their *.yaml, *.yml, *.json); `-` reads stdin.
    /// Multi-document YAML and List objects are read. Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true, num_args = 1..)]
    pub files: Vec<String>,
    /// Check pod templates against this Pod Security Admission level (a Namespace
    /// in the input with an enforce label overrides it for its objects).
    #[arg(long, value_enum, value_name = "LEVEL")]
    pub psa_level: Option<PsaArg>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// `--psa-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PsaArg {
    Privileged,
    Baseline,
    Restricted,
}

impl From<PsaArg> for PsaLevel {
    fn from(a: PsaArg) -> Self {
        match a {
            PsaArg::Privileged => PsaLevel::Privileged,
            PsaArg::Baseline => PsaLevel::Baseline,
            PsaArg::Restricted => PsaLevel::Restricted,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct NameArg {
    /// Name of the SafeRollout.
    pub name: String,
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Name of the SafeRollout.
    pub name: String,
    /// Keep watching and print the status again on every change (Ctrl-C to stop).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Output format: a table for people, JSON or YAML (stable fields) for scripts.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Name of the SafeRollout.
    pub name: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Clone, Args)]
pub struct RetryArgs {
    /// Name of the SafeRollout.
    pub name: String,
    /// The blocked revision to retry (default: the most recently blocked one).
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    /// Only this DaemonSet's agent pods (default: those of every DaemonSet in the namespace).
    #[arg(long, value_name = "DAEMONSET")]
    pub target: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Name of the SafeRolloutPolicy (default: every policy).
    pub name: Option<String>,
    /// Output format: a table for people, JSON or YAML (stable fields) for scripts.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = Cli::try_parse_from([
            "kubectl-saferollout",
            "status",
            "foo",
            "-n",
            "gpu",
            "--context",
            "kind",
            "-w",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("gpu"));
        assert_eq!(cli.global.context.as_deref(), Some("kind"));
        assert!(
            matches!(cli.command, Command::Status(StatusArgs { ref name, watch: true, output: OutputFormat::Table }) if name == "foo")
        );
    }

    #[test]
    fn status_takes_an_output_format() {
        let cli =
            Cli::try_parse_from(["kubectl-saferollout", "status", "foo", "-o", "yaml"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Status(StatusArgs {
                watch: false,
                output: OutputFormat::Yaml,
                ..
            })
        ));
        assert!(
            Cli::try_parse_from(["kubectl-saferollout", "status", "foo", "-o", "wide"]).is_err()
        );
    }

    #[test]
    fn policy_name_is_optional() {
        let cli = Cli::try_parse_from(["kubectl-saferollout", "policy"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Policy(PolicyArgs {
                name: None,
                output: OutputFormat::Table
            })
        ));
        let cli =
            Cli::try_parse_from(["kubectl-saferollout", "policy", "stack", "-o", "json"]).unwrap();
        assert!(
            matches!(cli.command, Command::Policy(PolicyArgs { ref name, output: OutputFormat::Json }) if name.as_deref() == Some("stack"))
        );
    }

    #[test]
    fn lint_takes_several_files() {
        let cli = Cli::try_parse_from([
            "kubectl-saferollout",
            "lint",
            "-f",
            "a.yaml",
            "-f",
            "-",
            "--psa-level",
            "restricted",
            "-o",
            "json",
        ])
        .unwrap();
        let Command::Lint(args) = cli.command else {
            panic!("not lint")
        };
        assert_eq!(args.files, ["a.yaml", "-"]);
        assert_eq!(args.psa_level, Some(PsaArg::Restricted));
        assert_eq!(args.output, OutputFormat::Json);
        assert!(Cli::try_parse_from(["kubectl-saferollout", "lint"]).is_err());
        assert!(
            Cli::try_parse_from(["kubectl-saferollout", "lint", "-f", "x", "--psa-level", "x"])
                .is_err()
        );
    }
}
