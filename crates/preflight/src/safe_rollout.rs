//! Linting a SafeRollout manifest: the API's own validation (the CRD's schema
//! and CEL rules, client-side) as `SR0xx` findings, and `spec.template`, when
//! set, through the pod-template rules.

use saferollout_api::{FieldError, SafeRollout};

use crate::kind::detect_template_kind;
use crate::{Finding, Gating, PsaLevel, codes, lint_agent_template, object_ref};

/// Every finding for a SafeRollout: its field errors, then the findings of
/// `spec.template` (object `SafeRollout ns/name spec.template`), which this
/// SafeRollout rolls out with its own gates. The update strategy rules do not
/// apply: with a SafeRollout the operator replaces the pods itself.
pub fn lint_safe_rollout(sr: &SafeRollout, psa: Option<PsaLevel>) -> Vec<Finding> {
    let object = object_ref(
        "SafeRollout",
        sr.metadata.namespace.as_deref(),
        sr.metadata.name.as_deref(),
    );
    let mut findings: Vec<Finding> = sr
        .validate()
        .iter()
        .map(|e| field_error_finding(&object, e))
        .collect();
    let gates = sr.spec.gates.as_ref();
    let probes = [
        (
            "spec.gates.probe.image",
            gates
                .and_then(|g| g.probe.as_ref())
                .map(|p| p.image.as_str()),
        ),
        (
            "spec.gates.claims.probe.image",
            gates
                .and_then(|g| g.claims.as_ref())
                .and_then(|c| c.probe.as_ref())
                .map(|p| p.image.as_str()),
        ),
    ];
    for (field, image) in probes {
        if let Some(image) = image {
            findings.extend(crate::images::mutable_probe_image(&object, field, image));
        }
    }
    match sr.typed_template() {
        Ok(None) => {}
        Ok(Some(template)) => {
            let kind = detect_template_kind(&sr.spec.target_ref.name, &template);
            let template_object = format!("{object} spec.template");
            findings.extend(lint_agent_template(
                &template_object,
                &template,
                kind,
                psa,
                Gating::by(&sr.spec),
            ));
        }
        Err(e) => findings.push(Finding::error(
            codes::TEMPLATE,
            &object,
            format!("spec.template is not a PodTemplateSpec: {e}"),
            "write spec.template as a pod template: metadata.labels and spec.containers, as in a DaemonSet's spec.template",
        )),
    }
    findings
}

/// The code for a field error of `SafeRollout::validate()`, from its path.
pub fn field_error_code(path: &str) -> &'static str {
    // Stage and gate paths carry an index: compare without it.
    let field = strip_indices(path);
    match field.as_str() {
        "spec.targetRef.name" => codes::TARGET_NAME,
        "spec.stages" => codes::STAGES,
        "spec.stages.nodes" => codes::STAGE_NODES,
        "spec.stages.soak"
        | "spec.progressDeadline"
        | "spec.gates.podsReady.timeout"
        | "spec.gates.allocatable.soak"
        | "spec.gates.nodeConditions.soak"
        | "spec.gates.resourceSlices.soak"
        | "spec.gates.deviceTaints.soak"
        | "spec.gates.deviceHealth.handover"
        | "spec.gates.claims.probe.timeout"
        | "spec.gates.probe.timeout"
        | "spec.gates.probe.delay"
        | "spec.gates.logs.window"
        | "spec.gates.logs.interval"
        | "spec.gates.prometheus.interval"
        | "spec.gates.prometheus.timeout" => codes::DURATION,
        "spec.maxUnavailable" => codes::MAX_UNAVAILABLE,
        "spec.gates.allocatable" | "spec.gates.allocatable.resource" => codes::ALLOCATABLE_RESOURCE,
        "spec.gates.allocatable.min" | "spec.gates.allocatable.max" => codes::ALLOCATABLE_BOUNDS,
        _ => codes::INVALID_FIELD,
    }
}

fn field_error_finding(object: &str, error: &FieldError) -> Finding {
    let code = field_error_code(&error.path);
    let fix = match code {
        codes::TARGET_NAME => {
            "use the DaemonSet's name: lowercase letters, digits, '-' and '.'".to_string()
        }
        codes::STAGES => "list between 1 and 10 stages".to_string(),
        codes::STAGE_NODES | codes::MAX_UNAVAILABLE => {
            "use a count of at least 1 or a percentage from 1% to 100%".to_string()
        }
        codes::DURATION => {
            "use a duration such as 30s, 10m or 1h30m (greater than zero where required)"
                .to_string()
        }
        codes::ALLOCATABLE_RESOURCE => {
            "use at most 8 gates, one per extended resource with a domain, e.g. nvidia.com/gpu"
                .to_string()
        }
        codes::ALLOCATABLE_BOUNDS => {
            "use baseline, a number of at least 0, or (max only) capacityLabel:<node-label>, with min <= max"
                .to_string()
        }
        _ => format!("correct {} (kubectl explain saferollout.spec)", error.path),
    };
    Finding::error(code, object, error.to_string(), fix)
}

/// `spec.stages[2].nodes` -> `spec.stages.nodes`.
fn strip_indices(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            _ if !in_index => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::codes_of;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use saferollout_api::{AllocatableGate, Gates, SafeRolloutSpec, Stage};

    fn rollout(spec: SafeRolloutSpec) -> SafeRollout {
        let mut sr = SafeRollout::new("nvidia", spec);
        sr.metadata.namespace = Some("gpu".into());
        sr
    }

    #[test]
    fn codes_by_path() {
        for (path, code) in [
            ("spec.targetRef.name", "SR001"),
            ("spec.stages", "SR002"),
            ("spec.stages[3].nodes", "SR003"),
            ("spec.stages[0].soak", "SR004"),
            ("spec.progressDeadline", "SR004"),
            ("spec.gates.podsReady.timeout", "SR004"),
            ("spec.gates.allocatable[1].soak", "SR004"),
            ("spec.maxUnavailable", "SR005"),
            ("spec.gates.allocatable", "SR006"),
            ("spec.gates.allocatable[0]", "SR006"),
            ("spec.gates.allocatable[0].resource", "SR006"),
            ("spec.gates.allocatable[0].min", "SR007"),
            ("spec.gates.allocatable[0].max", "SR007"),
            ("spec.somethingNew", "SR009"),
        ] {
            assert_eq!(field_error_code(path), code, "{path}");
        }
    }

    #[test]
    fn a_valid_rollout_has_no_findings() {
        let sr = rollout(SafeRolloutSpec::for_daemonset("nvidia-device-plugin"));
        assert!(lint_safe_rollout(&sr, Some(PsaLevel::Restricted)).is_empty());
    }

    #[test]
    fn field_errors_become_error_findings() {
        let mut spec = SafeRolloutSpec::for_daemonset("Bad_Name");
        spec.stages = Some(vec![Stage::new(IntOrString::String("0%".into()))]);
        spec.max_unavailable = IntOrString::Int(0);
        spec.progress_deadline = "soon".into();
        let mut gate = AllocatableGate::new("gpu");
        gate.min = IntOrString::Int(3);
        gate.max = IntOrString::Int(1);
        spec.gates = Some(Gates {
            allocatable: vec![gate],
            ..Default::default()
        });
        let findings = lint_safe_rollout(&rollout(spec), None);
        assert_eq!(
            codes_of(&findings),
            ["SR001", "SR003", "SR005", "SR004", "SR006", "SR007"]
        );
        assert!(findings.iter().all(Finding::is_error));
        assert_eq!(findings[0].object, "SafeRollout gpu/nvidia");
        assert!(findings[0].message.starts_with("spec.targetRef.name: "));
    }

    #[test]
    fn the_template_goes_through_the_pod_rules() {
        let mut spec = SafeRolloutSpec::for_daemonset("nvidia-device-plugin-daemonset");
        spec.template = Some(serde_json::json!({
            "metadata": {"labels": {"name": "nvidia-device-plugin-ds"}},
            "spec": {
                "priorityClassName": "system-node-critical",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                "containers": [{
                    "name": "ctr",
                    "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                    "env": [{"name": "NGC_API_KEY", "value": "nvapi-literal"}],
                    "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "64Mi"}},
                }],
            },
        }));
        let findings = lint_safe_rollout(&rollout(spec), None);
        // The target's name makes it a device plugin: the socket mount is missing.
        assert_eq!(codes_of(&findings), ["SR101", "SR102"]);
        assert_eq!(findings[0].object, "SafeRollout gpu/nvidia spec.template");
        assert!(
            !serde_json::to_string(&findings)
                .unwrap()
                .contains("nvapi-literal")
        );
    }

    #[test]
    fn a_template_that_is_not_a_pod_template() {
        let mut spec = SafeRolloutSpec::for_daemonset("plugin");
        spec.template = Some(serde_json::json!({"spec": {"containers": {"name": "x"}}}));
        let findings = lint_safe_rollout(&rollout(spec), None);
        assert_eq!(codes_of(&findings), ["SR010"]);
    }
}
