//! Builders shared by the unit tests, and tests of the crate-level API.

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, HostPathVolumeSource, PodSpec, PodTemplateSpec,
    SecretKeySelector, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

/// A DaemonSet `name` in namespace `gpu` with one container (also called
/// `name`) running `image`, mounting each `(volume, hostPath)` at the same path.
pub(crate) fn daemonset(name: &str, image: &str, host_paths: &[(&str, &str)]) -> DaemonSet {
    let volumes: Vec<Volume> = host_paths
        .iter()
        .map(|(volume, path)| Volume {
            name: volume.to_string(),
            host_path: Some(HostPathVolumeSource {
                path: path.to_string(),
                type_: None,
            }),
            ..Default::default()
        })
        .collect();
    let mounts: Vec<VolumeMount> = host_paths
        .iter()
        .map(|(volume, path)| VolumeMount {
            name: volume.to_string(),
            mount_path: path.to_string(),
            ..Default::default()
        })
        .collect();
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("gpu".into()),
            ..Default::default()
        },
        spec: DaemonSetSpec {
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: name.into(),
                        image: Some(image.into()),
                        volume_mounts: (!mounts.is_empty()).then_some(mounts),
                        ..Default::default()
                    }],
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        status: None,
    }
}

/// The pod spec of a DaemonSet built by [`daemonset`].
pub(crate) fn pod_of(ds: &mut DaemonSet) -> &mut PodSpec {
    ds.spec
        .template
        .spec
        .as_mut()
        .expect("built with a pod spec")
}

pub(crate) fn env_literal(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

pub(crate) fn env_secret_ref(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: None,
            }),
            ..Default::default()
        }),
    }
}

pub(crate) fn codes_of(findings: &[Finding]) -> Vec<&'static str> {
    findings.iter().map(|f| f.code).collect()
}

#[test]
fn finding_serialises_in_camel_case_with_pascal_case_severity() {
    let f = Finding::error("SR101", "DaemonSet a/b", "line one\nline two", "fix\r\nit");
    assert_eq!(f.message, "line one line two");
    assert_eq!(f.fix, "fix  it");
    assert_eq!(
        serde_json::to_value(&f).unwrap(),
        serde_json::json!({
            "severity": "Error",
            "code": "SR101",
            "object": "DaemonSet a/b",
            "message": "line one line two",
            "fix": "fix  it",
        })
    );
    assert!(Severity::Info < Severity::Warning && Severity::Warning < Severity::Error);
    assert_eq!(
        f.to_string(),
        "Error SR101 DaemonSet a/b: line one line two (fix: fix  it)"
    );
}

#[test]
fn object_names() {
    assert_eq!(
        object_ref("DaemonSet", Some("gpu"), Some("p")),
        "DaemonSet gpu/p"
    );
    assert_eq!(object_ref("DaemonSet", None, Some("p")), "DaemonSet p");
    assert_eq!(
        object_ref("DaemonSet", Some(""), None),
        "DaemonSet <unnamed>"
    );
}

#[test]
fn lint_daemonset_detects_the_kind_unless_told() {
    // A device plugin by name, without the socket mount.
    let mut ds = daemonset(
        "nvidia-device-plugin",
        "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
        &[],
    );
    let codes = codes_of(&lint_daemonset(&ds, Kind::Unknown, None, Gating::ALONE));
    assert_eq!(codes, ["SR102", "SR107", "SR108", "SR109"]);

    // The caller knows better: it is a DRA driver.
    let codes = codes_of(&lint_daemonset(&ds, Kind::DraDriver, None, Gating::ALONE));
    assert_eq!(codes, ["SR103", "SR107", "SR108", "SR109"]);

    // PSA findings come last, only when a level is given.
    pod_of(&mut ds).host_network = Some(true);
    let codes = codes_of(&lint_daemonset(
        &ds,
        Kind::Unknown,
        Some(PsaLevel::Baseline),
        Gating::ALONE,
    ));
    assert_eq!(codes, ["SR102", "SR107", "SR108", "SR109", "SR203"]);
    let codes = codes_of(&lint_daemonset(
        &ds,
        Kind::Unknown,
        Some(PsaLevel::Privileged),
        Gating::ALONE,
    ));
    assert_eq!(codes, ["SR102", "SR107", "SR108", "SR109"]);

    // An empty DaemonSet does not panic.
    let empty = DaemonSet::default();
    let codes = codes_of(&lint_daemonset(
        &empty,
        Kind::DevicePlugin,
        Some(PsaLevel::Restricted),
        Gating::ALONE,
    ));
    assert_eq!(codes, ["SR102", "SR108", "SR109"]);
}
