use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, ContainerPort, EmptyDirVolumeSource, ImageVolumeSource,
    NFSVolumeSource, PodSecurityContext, SELinuxOptions, SeccompProfile, SecurityContext, Sysctl,
    Volume, WindowsSecurityContextOptions,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::kind::DEVICE_PLUGIN_DIR;
use crate::tests::{codes_of, daemonset, pod_of};

const OBJ: &str = "DaemonSet gpu/p";

fn template_of(pod: &PodSpec) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: None,
        spec: Some(pod.clone()),
    }
}

fn check(pod: &PodSpec, level: PsaLevel) -> Vec<&'static str> {
    codes_of(&pod_security(OBJ, &template_of(pod), level))
}

fn hardened() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    }
}

fn runtime_default() -> Option<SeccompProfile> {
    Some(SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    })
}

/// A pod that passes `restricted`: no host access, non-root, seccomp, drop ALL.
fn restricted_pod() -> PodSpec {
    let mut ds = daemonset("agent", "example.com/agent:1", &[]);
    let pod = pod_of(&mut ds);
    pod.security_context = Some(PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        seccomp_profile: runtime_default(),
        ..Default::default()
    });
    pod.containers[0].security_context = Some(hardened());
    pod.volumes = Some(vec![
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "tools".into(),
            image: Some(ImageVolumeSource {
                reference: Some("example.com/tools:1".into()),
                pull_policy: None,
            }),
            ..Default::default()
        },
    ]);
    pod.clone()
}

/// Like the upstream NVIDIA manifest: hostPath socket dir, drop ALL, no escalation.
fn nvidia_pod() -> PodSpec {
    let mut ds = daemonset(
        "nvidia-device-plugin-ctr",
        "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
        &[("dp", DEVICE_PLUGIN_DIR)],
    );
    let pod = pod_of(&mut ds);
    pod.containers[0].security_context = Some(hardened());
    pod.clone()
}

#[test]
fn levels_parse_and_print() {
    for level in [
        PsaLevel::Privileged,
        PsaLevel::Baseline,
        PsaLevel::Restricted,
    ] {
        assert_eq!(level.as_str().parse::<PsaLevel>().unwrap(), level);
        assert_eq!(
            serde_json::to_value(level).unwrap(),
            serde_json::json!(level.to_string())
        );
    }
    assert!("Restricted".parse::<PsaLevel>().is_err());
    let labels = [(ENFORCE_LABEL.to_string(), "baseline".to_string())].into();
    assert_eq!(
        PsaLevel::from_namespace_labels(&labels),
        Some(PsaLevel::Baseline)
    );
    assert_eq!(PsaLevel::from_namespace_labels(&BTreeMap::new()), None);
}

#[test]
fn privileged_level_admits_anything() {
    let mut pod = nvidia_pod();
    pod.host_network = Some(true);
    pod.containers[0].security_context = Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    assert!(check(&pod, PsaLevel::Privileged).is_empty());
}

#[test]
fn a_restricted_pod_passes_every_level() {
    let pod = restricted_pod();
    for level in [
        PsaLevel::Privileged,
        PsaLevel::Baseline,
        PsaLevel::Restricted,
    ] {
        assert!(
            check(&pod, level).is_empty(),
            "{level}: {:?}",
            check(&pod, level)
        );
    }
    // Seccomp and runAsNonRoot on every container instead of the pod also pass.
    let mut pod = restricted_pod();
    pod.security_context = None;
    let sc = pod.containers[0].security_context.as_mut().unwrap();
    sc.seccomp_profile = runtime_default();
    sc.run_as_non_root = Some(true);
    assert!(check(&pod, PsaLevel::Restricted).is_empty());
}

#[test]
fn a_device_plugin_needs_a_privileged_namespace() {
    let pod = nvidia_pod();
    assert_eq!(check(&pod, PsaLevel::Baseline), ["SR202"]);
    assert_eq!(
        check(&pod, PsaLevel::Restricted),
        ["SR202", "SR211", "SR214"]
    );
    let f = pod_security(OBJ, &template_of(&pod), PsaLevel::Baseline);
    assert!(
        f[0].message.contains("will never start"),
        "{}",
        f[0].message
    );
    assert!(f[0].message.contains(DEVICE_PLUGIN_DIR));
    assert!(f[0].message.contains("\"baseline\""));
}

#[test]
fn baseline_checks() {
    let mut pod = restricted_pod();
    pod.host_network = Some(true);
    pod.host_pid = Some(true);
    let c = &mut pod.containers[0];
    c.ports = Some(vec![ContainerPort {
        container_port: 9400,
        host_port: Some(9400),
        ..Default::default()
    }]);
    c.security_context = Some(SecurityContext {
        privileged: Some(true),
        capabilities: Some(Capabilities {
            add: Some(vec!["SYS_ADMIN".into(), "CHOWN".into()]),
            drop: Some(vec!["ALL".into()]),
        }),
        allow_privilege_escalation: Some(false),
        ..Default::default()
    });
    assert_eq!(
        check(&pod, PsaLevel::Baseline),
        ["SR201", "SR203", "SR205", "SR204"]
    );
    let f = pod_security(OBJ, &template_of(&pod), PsaLevel::Baseline);
    assert!(f[1].message.contains("hostNetwork, hostPID"));
    assert!(f[3].message.contains("SYS_ADMIN") && !f[3].message.contains("CHOWN"));
    // At restricted the capability is reported by the restricted rule only.
    assert_eq!(
        check(&pod, PsaLevel::Restricted),
        ["SR201", "SR203", "SR205", "SR213"]
    );
}

#[test]
fn baseline_other_checks() {
    let mut pod = restricted_pod();
    let psc = pod.security_context.as_mut().unwrap();
    psc.sysctls = Some(vec![
        Sysctl {
            name: "net.core.somaxconn".into(),
            value: "1024".into(),
        },
        Sysctl {
            name: "net.ipv4.tcp_syncookies".into(),
            value: "1".into(),
        },
    ]);
    psc.se_linux_options = Some(SELinuxOptions {
        type_: Some("container_t".into()),
        ..Default::default()
    });
    let sc = pod.containers[0].security_context.as_mut().unwrap();
    sc.se_linux_options = Some(SELinuxOptions {
        type_: Some("container_device_plugin_t".into()),
        user: Some("system_u".into()),
        ..Default::default()
    });
    sc.proc_mount = Some("Unmasked".into());
    sc.seccomp_profile = Some(SeccompProfile {
        type_: "Unconfined".into(),
        localhost_profile: None,
    });
    sc.app_armor_profile = Some(AppArmorProfile {
        type_: "Unconfined".into(),
        localhost_profile: None,
    });
    sc.windows_options = Some(WindowsSecurityContextOptions {
        host_process: Some(true),
        ..Default::default()
    });
    let mut template = template_of(&pod);
    template.metadata = Some(ObjectMeta {
        annotations: Some(
            [
                (
                    format!("{APPARMOR_ANNOTATION_PREFIX}agent"),
                    "unconfined".to_string(),
                ),
                (
                    format!("{APPARMOR_ANNOTATION_PREFIX}other"),
                    "runtime/default".to_string(),
                ),
            ]
            .into(),
        ),
        ..Default::default()
    });
    let findings = pod_security(OBJ, &template, PsaLevel::Baseline);
    let messages: Vec<&str> = findings.iter().map(|f| f.message.as_str()).collect();
    assert!(findings.iter().all(|f| f.code == "SR206"), "{messages:#?}");
    for expected in [
        "SELinux type \"container_device_plugin_t\"",
        "an SELinux user",
        "seccompProfile Unconfined",
        "appArmorProfile Unconfined",
        "windowsOptions.hostProcess",
        "procMount \"Unmasked\"",
        "unsafe sysctl \"net.core.somaxconn\"",
        "AppArmor annotation of container \"agent\" is \"unconfined\"",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(expected)),
            "{expected}: {messages:#?}"
        );
    }
    assert_eq!(findings.len(), 8, "{messages:#?}");
}

#[test]
fn restricted_checks() {
    // Nothing set at all: runAsNonRoot, escalation, capabilities, seccomp.
    let mut ds = daemonset("agent", "example.com/agent:1", &[]);
    let bare = pod_of(&mut ds).clone();
    assert_eq!(
        check(&bare, PsaLevel::Restricted),
        ["SR211", "SR212", "SR213", "SR214"]
    );
    assert!(check(&bare, PsaLevel::Baseline).is_empty());

    // Explicit false and root user, each reported.
    let mut pod = restricted_pod();
    pod.containers[0]
        .security_context
        .as_mut()
        .unwrap()
        .run_as_non_root = Some(false);
    pod.containers[0]
        .security_context
        .as_mut()
        .unwrap()
        .run_as_user = Some(0);
    let f = pod_security(OBJ, &template_of(&pod), PsaLevel::Restricted);
    assert_eq!(codes_of(&f), ["SR211", "SR211"]);
    assert!(f[0].message.contains("runAsNonRoot: false"));
    assert!(f[1].message.contains("runAsUser: 0"));

    // Adding NET_BIND_SERVICE is fine, anything else is not.
    let mut pod = restricted_pod();
    let caps = pod.containers[0]
        .security_context
        .as_mut()
        .unwrap()
        .capabilities
        .as_mut()
        .unwrap();
    caps.add = Some(vec!["NET_BIND_SERVICE".into()]);
    assert!(check(&pod, PsaLevel::Restricted).is_empty());
    pod.containers[0]
        .security_context
        .as_mut()
        .unwrap()
        .capabilities
        .as_mut()
        .unwrap()
        .add = Some(vec!["NET_ADMIN".into()]);
    assert_eq!(check(&pod, PsaLevel::Restricted), ["SR213"]);

    // Seccomp on one container of two is not enough.
    let mut pod = restricted_pod();
    pod.security_context.as_mut().unwrap().seccomp_profile = None;
    pod.containers[0]
        .security_context
        .as_mut()
        .unwrap()
        .seccomp_profile = runtime_default();
    let mut second = pod.containers[0].clone();
    second.name = "sidecar".into();
    second.security_context.as_mut().unwrap().seccomp_profile = None;
    pod.init_containers = Some(vec![second]);
    let f = pod_security(OBJ, &template_of(&pod), PsaLevel::Restricted);
    assert_eq!(codes_of(&f), ["SR214"]);
    assert!(
        f[0].message.contains("container \"sidecar\""),
        "{}",
        f[0].message
    );

    // Volume types: nfs is not allowed; hostPath is SR202, not SR215.
    let mut pod = restricted_pod();
    pod.volumes.as_mut().unwrap().push(Volume {
        name: "shared".into(),
        nfs: Some(NFSVolumeSource {
            server: "nfs.example.com".into(),
            path: "/x".into(),
            read_only: None,
        }),
        ..Default::default()
    });
    let f = pod_security(OBJ, &template_of(&pod), PsaLevel::Restricted);
    assert_eq!(codes_of(&f), ["SR215"]);
    assert!(
        f[0].message.contains("\"shared\" (nfs)"),
        "{}",
        f[0].message
    );
    assert!(check(&pod, PsaLevel::Baseline).is_empty());
}
