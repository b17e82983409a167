//! The alert rules (deploy/prometheus-rules.yaml) with a real Prometheus
//! (Debian's `prometheus` package, unpacked by tests/tools/build-bins):
//! promtool's unit tests of every alert, firing and not firing; and a
//! Prometheus that scrapes the operator (one static loopback target, nothing
//! else) during a `-broken` rollout on the local cluster, whose
//! /api/v1/alerts shows the gate-failed and rollback alerts firing.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use saferollout_api::Phase;
use saferollout_testkit::{cluster, repo_root};
use serde_json::Value;
use support::*;

const OPERATOR_SA: &str = "system:serviceaccount:saferollout-system:saferollout-operator";

fn promtool(args: &[&str]) -> anyhow::Result<String> {
    run(Command::new(tool("promtool"))
        .current_dir(repo_root())
        .args(args))
}

#[test]
fn promtool_unit_tests_cover_every_alert_firing_and_not_firing() -> anyhow::Result<()> {
    let check = promtool(&["check", "rules", "deploy/prometheus-rules.yaml"])?;
    assert!(check.contains("SUCCESS"), "{check}");
    let test = promtool(&["test", "rules", "tests/alerts/rules_test.yaml"])?;
    assert!(test.contains("SUCCESS"), "{test}");

    // Every alert of the file has a case where it fires and one where it does not.
    let rules: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("deploy/prometheus-rules.yaml"),
    )?)?;
    let alerts: BTreeSet<String> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect();
    assert!(alerts.len() >= 6, "{alerts:?}");
    let tests: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("tests/alerts/rules_test.yaml"),
    )?)?;
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for t in tests["tests"].as_array().unwrap() {
        for case in t["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_string();
            let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            let entry = cases.entry(name).or_default();
            if fires {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    for alert in &alerts {
        let (fire, quiet) = cases.get(alert).copied().unwrap_or_default();
        assert!(
            fire > 0 && quiet > 0,
            "{alert}: {fire} firing and {quiet} not-firing cases in tests/alerts/rules_test.yaml"
        );
        // Each alert tells on-call what to run.
        let rule = rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter())
            .find(|r| r["alert"] == alert.as_str())
            .unwrap();
        for key in ["summary", "description", "runbook"] {
            assert!(rule["annotations"][key].is_string(), "{alert} has no {key}");
        }
        assert!(
            rule["annotations"]["runbook"]
                .as_str()
                .unwrap()
                .contains("kubectl saferollout"),
            "{alert}'s runbook names kubectl saferollout"
        );
        assert!(
            rule["labels"]["severity"].is_string(),
            "{alert} has no severity"
        );
    }
    Ok(())
}

/// A Prometheus that scrapes exactly one static loopback target (the
/// operator) every second, and evaluates deploy/prometheus-rules.yaml every
/// second.
fn start_prometheus(target_port: u16) -> anyhow::Result<Prometheus> {
    let rules = repo_root().join("deploy/prometheus-rules.yaml");
    Prometheus::start(
        "alerts",
        &format!(
            "rule_files: [{rules:?}]\n\
             scrape_configs:\n\
             - job_name: saferollout-operator\n  honor_labels: true\n\
             \x20 static_configs:\n  - targets: ['127.0.0.1:{target_port}']\n",
        ),
    )
}

#[tokio::test]
async fn prometheus_fires_gate_failed_and_rollback_alerts_on_a_broken_rollout() -> anyhow::Result<()>
{
    let c = cluster();
    support::install(c)?;
    let ns = c.namespace("alerts").await?;
    let client = c.client().await?;
    let resource = "example.com/gpu-alerts";

    // The operator's metrics on a loopback port this test picks.
    let metrics = free_loopback_port()?;
    let _op = Operator::start(
        Identity::Impersonate(c.kubeconfig(), OPERATOR_SA),
        &[
            "--namespace".into(),
            ns.name.clone(),
            "--metrics-addr".into(),
            format!("127.0.0.1:{metrics}"),
        ],
        "alerts",
    )?;
    poll("the operator's /metrics", TIMEOUT, || {
        Ok(http_get(metrics, "/metrics")
            .ok()
            .filter(|(code, _)| *code == 200))
    })
    .await?;
    let prom = start_prometheus(metrics)?;
    poll("Prometheus ready", TIMEOUT, || {
        Ok(http_get(prom.port, "/-/ready")
            .ok()
            .filter(|(code, _)| *code == 200))
    })
    .await?;

    let (v1, broken) = (
        "registry.example/plugin:v1",
        "registry.example/plugin:v2-broken",
    );
    create_plugin_daemonset(&client, &ns.name, resource, v1).await?;
    create_rollout(&client, &ns.name, "plugin", default_spec(resource, v1)).await?;
    wait_adopted(&client, &ns.name, "plugin").await?;

    // Prometheus scrapes the operator, and nothing else.
    poll("the operator's target up", TIMEOUT, || {
        let data = prom.api("/api/v1/targets")?;
        let active = data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for t in &active {
            let url = t["scrapeUrl"].as_str().unwrap_or_default();
            anyhow::ensure!(
                url.starts_with(&format!("http://127.0.0.1:{metrics}/")),
                "a target that is not the operator on loopback: {url}"
            );
        }
        Ok((active.len() == 1 && active[0]["health"] == "up").then_some(()))
    })
    .await?;
    // A healthy rollout fires nothing.
    for alert in ["SafeRolloutGateFailed", "SafeRolloutRolledBack"] {
        let f = prom.firing(alert)?;
        assert!(f.is_empty(), "{alert} before any failure: {f:#?}");
    }

    set_template_image(&client, &ns.name, "plugin", resource, broken).await?;
    wait_status(&client, &ns.name, "plugin", TIMEOUT, |st| {
        st.phase == Some(Phase::Degraded)
    })
    .await?;
    let degraded_at = Instant::now();
    let (gate, rollback) = poll(
        "SafeRolloutGateFailed and SafeRolloutRolledBack firing",
        Duration::from_secs(60),
        || {
            let gate = prom.firing("SafeRolloutGateFailed")?;
            let rollback = prom.firing("SafeRolloutRolledBack")?;
            Ok((!gate.is_empty() && !rollback.is_empty()).then_some((gate, rollback)))
        },
    )
    .await?;
    eprintln!(
        "MEASURE Degraded -> both alerts firing: {:?}",
        degraded_at.elapsed()
    );

    assert_eq!(gate.len(), 1, "{gate:#?}");
    let labels = &gate[0]["labels"];
    assert_eq!(labels["namespace"], ns.name.as_str());
    assert_eq!(labels["name"], "plugin");
    assert_eq!(labels["gate"], format!("allocatable/{resource}").as_str());
    assert_eq!(labels["severity"], "warning");
    let runbook = gate[0]["annotations"]["runbook"]
        .as_str()
        .unwrap_or_default();
    assert!(
        runbook.contains(&format!("kubectl saferollout -n {} status plugin", ns.name)),
        "{runbook}"
    );
    assert_eq!(rollback.len(), 1, "{rollback:#?}");
    assert_eq!(rollback[0]["labels"]["namespace"], ns.name.as_str());
    assert_eq!(rollback[0]["labels"]["name"], "plugin");
    Ok(())
}
