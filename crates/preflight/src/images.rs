//! SR110: mutable image references. A DaemonSet revision names its image by
//! reference, and each node resolves that reference when it pulls: with a
//! tag that moves (none at all, `latest`, a branch or channel name) or with
//! `imagePullPolicy: Always` and no digest, nodes that pulled at different
//! times run different code under the same revision. The rollout's stages
//! and gates judge a revision on the nodes they replaced; a node that pulls
//! later runs code no gate looked at. Only a digest fixes what runs.

use k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::kind::Kind;
use crate::{Finding, Gating, codes};

/// Tags that name a branch or a release channel rather than a release: each
/// is pushed again as the branch or channel moves.
///
/// - `latest`: the registry's default tag, and what a reference without a
///   tag pulls; by convention the newest push.
/// - `main`, `master`, `trunk`, `head`, `devel`, `develop`, `dev`: branch
///   builds, pushed on every merge (Intel's device plugins publish `devel`
///   from their main branch; it is what their base manifests deploy).
/// - `edge`, `nightly`, `unstable`, `canary`, `snapshot`, `rolling`: channels
///   rebuilt on a schedule or on each change.
/// - `stable`: a channel too: it is moved to each new release.
///
/// A version tag (`v0.17.1`, `1.31.0.1`) is not in the list even though a
/// registry lets anyone push it again: vendors do not move release tags as a
/// practice, and a floating minor tag (`v0.17`) cannot be told from a
/// release by its name. `imagePullPolicy: Always` without a digest is caught
/// on its own, whatever the tag.
pub const MOVING_TAGS: &[&str] = &[
    "latest", "main", "master", "trunk", "head", "devel", "develop", "dev", "edge", "nightly",
    "unstable", "canary", "snapshot", "rolling", "stable",
];

/// An image reference as the container runtime reads it:
/// `[registry[:port]/]repository[:tag][@digest]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRef<'a> {
    /// Registry and repository, without tag or digest.
    pub name: &'a str,
    pub tag: Option<&'a str>,
    /// `algorithm:hex`, e.g. `sha256:...`.
    pub digest: Option<&'a str>,
}

impl<'a> ImageRef<'a> {
    /// Splits `image` (trimmed). A `:` before the last `/` is a registry's
    /// port, not a tag (`registry:5000/plugin`).
    pub fn parse(image: &'a str) -> Self {
        let image = image.trim();
        let (rest, digest) = match image.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest)),
            None => (image, None),
        };
        let last_part = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_part..].rfind(':') {
            Some(i) => (&rest[..last_part + i], Some(&rest[last_part + i + 1..])),
            None => (rest, None),
        };
        Self { name, tag, digest }
    }

    /// Whether a digest pins it: `@algorithm:encoded`, both parts non-empty
    /// (the runtime then pulls exactly that content, whatever the tag says).
    pub fn pinned(&self) -> bool {
        self.digest
            .and_then(|d| d.split_once(':'))
            .is_some_and(|(algorithm, encoded)| !algorithm.is_empty() && !encoded.is_empty())
    }

    /// The moving tag it uses, if any: a tag of [`MOVING_TAGS`] (in any case),
    /// or one with `latest` as a dash-separated part (`latest-ubi9`,
    /// `ubuntu22.04-latest`), which vendors use for "latest of a variant".
    pub fn moving_tag(&self) -> Option<&'a str> {
        let tag = self.tag?;
        let lower = tag.to_ascii_lowercase();
        let moving =
            MOVING_TAGS.contains(&lower.as_str()) || lower.split('-').any(|part| part == "latest");
        moving.then_some(tag)
    }
}

/// Why an image reference is mutable, for the message.
fn mutable_because(container: &Container, image: &ImageRef) -> Option<String> {
    if image.pinned() {
        return None;
    }
    let always = container.image_pull_policy.as_deref() == Some("Always");
    match (image.tag, image.moving_tag()) {
        (None, _) => Some(
            "has no tag or digest: the runtime pulls \":latest\", which moves with every push"
                .to_string(),
        ),
        (_, Some(tag)) => Some(format!(
            "uses the moving tag {tag:?}, which is pushed again as its branch or channel moves"
        )),
        (Some(_), None) if always => Some(
            "is pulled with imagePullPolicy: Always and has no digest: a tag pushed again reaches every node whose pod starts after it"
                .to_string(),
        ),
        _ => None,
    }
}

/// SR110: a gated agent's containers (and init containers, which run the
/// agent's setup on each node) must name their images immutably. Applies
/// when the agent is a device plugin or DRA driver, or when a SafeRollout
/// rolls it out ([`Gating::rolled_out`]); other DaemonSets of a bundle are
/// not the agent a gate watches. The finding is about the container's
/// `image` field (`spec.template.spec.containers[i].image`).
pub fn mutable_images(object: &str, pod: &PodSpec, kind: Kind, gating: Gating) -> Vec<Finding> {
    if !gating.rolled_out && kind == Kind::Unknown {
        return Vec::new();
    }
    let no_init = Vec::new();
    let lists = [
        ("container", "containers", &pod.containers),
        (
            "init container",
            "initContainers",
            pod.init_containers.as_ref().unwrap_or(&no_init),
        ),
    ];
    let mut findings = Vec::new();
    for (what, field, containers) in lists {
        for (i, container) in containers.iter().enumerate() {
            let Some(text) = container.image.as_deref().filter(|i| !i.trim().is_empty()) else {
                continue;
            };
            let image = ImageRef::parse(text);
            let Some(why) = mutable_because(container, &image) else {
                continue;
            };
            let tagged = match image.tag {
                Some(tag) => format!("{}:{tag}", image.name),
                None => image.name.to_string(),
            };
            findings.push(
                Finding::error(
                    codes::MUTABLE_IMAGE,
                    object,
                    format!(
                        "{what} {:?}: image {text:?} {why}; nodes that pull at different times run different code under one DaemonSet revision, which no gate sees",
                        container.name
                    ),
                    format!(
                        "pin the image by digest: {}@sha256:<digest> (or {tagged}@sha256:<digest> to keep the tag readable); `crane digest {tagged}` prints the digest the tag points at now",
                        image.name
                    ),
                )
                .at(format!("{}.{field}[{i}].image", crate::POD_SPEC_PATH)),
            );
        }
    }
    findings
}

/// SR110 for a probe's image (`gates.probe.image`,
/// `gates.claims.probe.image`): the probe is the gate's judge, and a moving
/// reference lets the judge change between stages (or between nodes of
/// one stage) without any revision changing. The operator's probe pods pull
/// `IfNotPresent`, so only the reference itself can move.
pub fn mutable_probe_image(object: &str, field: &str, text: &str) -> Option<Finding> {
    let text_trimmed = text.trim();
    if text_trimmed.is_empty() {
        return None;
    }
    let image = ImageRef::parse(text_trimmed);
    let why = mutable_because(&Container::default(), &image)?;
    let tagged = match image.tag {
        Some(tag) => format!("{}:{tag}", image.name),
        None => image.name.to_string(),
    };
    Some(
        Finding::error(
            codes::MUTABLE_IMAGE,
            object,
            format!(
                "the probe's image {text:?} {why}; nodes that pull it at different times run different probes, so one stage's verdict is not the next one's"
            ),
            format!(
                "pin the probe's image by digest: {}@sha256:<digest> (or {tagged}@sha256:<digest>)",
                image.name
            ),
        )
        .at(field),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{codes_of, daemonset, pod_of};

    const OBJ: &str = "DaemonSet gpu/plugin";
    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_probes_moving_image_is_an_error_at_its_field_and_a_digest_passes() {
        let f = mutable_probe_image(
            "SafeRollout gpu/p",
            "spec.gates.probe.image",
            "nvcr.io/nvidia/cloud-native/dcgm:latest",
        )
        .expect("latest moves");
        assert_eq!(f.code, codes::MUTABLE_IMAGE);
        assert_eq!(f.field.as_deref(), Some("spec.gates.probe.image"));
        assert!(f.message.contains("probe"), "{}", f.message);
        let pinned = format!("nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1@{DIGEST}");
        assert!(mutable_probe_image("o", "f", &pinned).is_none());
        assert!(
            mutable_probe_image(
                "o",
                "f",
                "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
            )
            .is_none()
        );
        assert!(
            mutable_probe_image("o", "f", "busybox").is_some(),
            "no tag pulls latest"
        );
    }

    #[test]
    fn references_split_as_the_runtime_reads_them() {
        let r = |s| ImageRef::parse(s);
        assert_eq!(
            r("rocm/k8s-device-plugin"),
            ImageRef {
                name: "rocm/k8s-device-plugin",
                tag: None,
                digest: None
            }
        );
        assert_eq!(
            r("registry:5000/team/plugin"),
            ImageRef {
                name: "registry:5000/team/plugin",
                tag: None,
                digest: None
            }
        );
        assert_eq!(
            r("registry:5000/plugin:v1"),
            ImageRef {
                name: "registry:5000/plugin",
                tag: Some("v1"),
                digest: None
            }
        );
        let both = r(" nvcr.io/nvidia/k8s-device-plugin:v0.17.1@sha256:abc ");
        assert_eq!(both.name, "nvcr.io/nvidia/k8s-device-plugin");
        assert_eq!(both.tag, Some("v0.17.1"));
        assert_eq!(both.digest, Some("sha256:abc"));
        assert!(both.pinned());
        assert!(!r("plugin@sha256:").pinned());
        assert!(!r("plugin@").pinned());
        assert!(r("plugin@sha512:ff").pinned());
    }

    #[test]
    fn moving_tags() {
        for moving in [
            "p:latest",
            "p:Latest",
            "p:devel",
            "p:main",
            "p:master",
            "p:edge",
            "p:nightly",
            "p:dev",
            "p:unstable",
            "p:stable",
            "p:latest-ubi9",
            "p:ubuntu22.04-latest",
        ] {
            assert!(ImageRef::parse(moving).moving_tag().is_some(), "{moving}");
        }
        for fixed in [
            "p:v0.17.1",
            "p:1.31.0.1",
            "p:0.32.0",
            "p:develop-20240101",
            "p:dev1",
            "p:latestish",
            "p",
        ] {
            assert!(ImageRef::parse(fixed).moving_tag().is_none(), "{fixed}");
        }
    }

    fn lint(image: &str, policy: Option<&str>, kind: Kind, gating: Gating) -> Vec<Finding> {
        let mut ds = daemonset("plugin", image, &[]);
        pod_of(&mut ds).containers[0].image_pull_policy = policy.map(Into::into);
        mutable_images(OBJ, pod_of(&mut ds), kind, gating)
    }

    fn plugin(image: &str, policy: Option<&str>) -> Vec<Finding> {
        lint(image, policy, Kind::DevicePlugin, Gating::ALONE)
    }

    #[test]
    fn mutable_references_of_an_agent_are_errors_at_the_image_field() {
        let f = plugin("rocm/k8s-device-plugin", None);
        assert_eq!(codes_of(&f), ["SR110"]);
        assert!(f[0].is_error());
        assert_eq!(
            f[0].field.as_deref(),
            Some("spec.template.spec.containers[0].image")
        );
        assert!(
            f[0].message.contains("no tag or digest"),
            "{}",
            f[0].message
        );
        assert!(
            f[0].fix.contains("rocm/k8s-device-plugin@sha256:<digest>"),
            "{}",
            f[0].fix
        );
        let f = plugin("intel/intel-gpu-plugin:devel", Some("IfNotPresent"));
        assert_eq!(codes_of(&f), ["SR110"]);
        assert!(
            f[0].message.contains("moving tag \"devel\""),
            "{}",
            f[0].message
        );
        assert!(
            f[0].fix
                .contains("intel/intel-gpu-plugin:devel@sha256:<digest>"),
            "{}",
            f[0].fix
        );
        let f = plugin("nvcr.io/nvidia/k8s-device-plugin:v0.17.1", Some("Always"));
        assert_eq!(codes_of(&f), ["SR110"]);
        assert!(
            f[0].message.contains("imagePullPolicy: Always"),
            "{}",
            f[0].message
        );

        // A version tag pulled IfNotPresent (or by default) is fine.
        assert!(plugin("nvcr.io/nvidia/k8s-device-plugin:v0.17.1", None).is_empty());
        assert!(
            plugin(
                "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                Some("IfNotPresent")
            )
            .is_empty()
        );
        // A digest never fires, whatever the tag and policy.
        for pinned in [
            format!("rocm/k8s-device-plugin@{DIGEST}"),
            format!("intel/intel-gpu-plugin:devel@{DIGEST}"),
            format!("nvcr.io/nvidia/k8s-device-plugin:latest@{DIGEST}"),
        ] {
            assert!(plugin(&pinned, Some("Always")).is_empty(), "{pinned}");
        }
        // No image at all is not this rule's business.
        assert!(plugin(" ", None).is_empty());
    }

    #[test]
    fn who_is_a_gated_agent() {
        let rolled = Gating {
            rolled_out: true,
            counts_devices: None,
        };
        // A DaemonSet of unknown kind is checked only when a SafeRollout rolls it out.
        assert!(lint("x", None, Kind::Unknown, Gating::ALONE).is_empty());
        assert_eq!(codes_of(&lint("x", None, Kind::Unknown, rolled)), ["SR110"]);
        assert_eq!(
            codes_of(&lint("x:main", None, Kind::DraDriver, Gating::ALONE)),
            ["SR110"]
        );
    }

    #[test]
    fn init_containers_too_each_at_its_own_field() {
        let mut ds = daemonset("plugin", "p:v1", &[]);
        let pod = pod_of(&mut ds);
        let mut init = pod.containers[0].clone();
        init.name = "setup".into();
        init.image = Some("intel/intel-gpu-initcontainer:devel".into());
        let mut fine = init.clone();
        fine.image = Some("setup:v1".into());
        pod.init_containers = Some(vec![fine, init]);
        let f = mutable_images(OBJ, pod, Kind::DevicePlugin, Gating::ALONE);
        assert_eq!(codes_of(&f), ["SR110"]);
        assert!(
            f[0].message.starts_with("init container \"setup\""),
            "{}",
            f[0].message
        );
        assert_eq!(
            f[0].field.as_deref(),
            Some("spec.template.spec.initContainers[1].image")
        );
    }
}
