//! Which agent a pod plays and which fault its image tag asks for.

use crate::{AGENT_DEVICE_PLUGIN, AGENT_DRA_DRIVER};

/// The agent an agent pod plays, from its `sim.saferollout.dev/agent` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentKind {
    DevicePlugin,
    DraDriver,
}

impl AgentKind {
    /// `None` for values outside the convention: such pods still get a pod
    /// status (KWOK leaves every labelled pod to the sim) but advertise nothing.
    pub fn from_label(value: &str) -> Option<Self> {
        match value {
            AGENT_DEVICE_PLUGIN => Some(Self::DevicePlugin),
            AGENT_DRA_DRIVER => Some(Self::DraDriver),
            _ => None,
        }
    }
}

/// Misbehaviour of an agent, chosen by the suffix of its image tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Ready; advertises the physical count.
    Healthy,
    /// Ready; advertises 0 devices / publishes no slices.
    Broken,
    /// Ready; advertises twice the physical count.
    Overcount,
    /// The container never runs; advertises nothing.
    Crashloop,
    /// Running but never Ready; advertises normally.
    Unready,
    /// Ready and advertising only after the slow delay.
    Slow,
    /// Ready; advertises the physical count and 0 in turn.
    Flap,
    /// Ready; advertises / publishes half the physical devices (rounded down).
    Fewer,
    /// Ready; a DRA driver publishes every device with the health taint
    /// (a device plugin, which has no taints, is healthy).
    Taint,
    /// Ready; publishes the node's faulty devices without their health taint
    /// and reports them Healthy ("health laundering").
    ClearTaints,
    /// Ready; reports its devices Unhealthy to the kubelet (a device plugin's
    /// unhealthy devices are not allocatable, as with the real device manager).
    Unhealthy,
    /// Ready; devices allocated to ResourceClaims are withdrawn from its
    /// slice and the pods using them fail (a device plugin is healthy).
    DropClaims,
    /// Healthy in every respect but logs a fatal line.
    FatalLog,
    /// Healthy in every respect but logs more than 2 MiB of routine lines,
    /// then a fatal line: a log reader that stops at its first megabyte
    /// never sees it.
    NoisyFatal,
}

impl Fault {
    /// Reads the fault from a container image reference.
    pub fn from_image(image: &str) -> Self {
        let Some(tag) = image_tag(image) else {
            return Self::Healthy;
        };
        const SUFFIXES: [(&str, Fault); 13] = [
            ("-broken", Fault::Broken),
            ("-overcount", Fault::Overcount),
            ("-crashloop", Fault::Crashloop),
            ("-unready", Fault::Unready),
            ("-slow", Fault::Slow),
            ("-flap", Fault::Flap),
            ("-fewer", Fault::Fewer),
            ("-taint", Fault::Taint),
            ("-cleartaints", Fault::ClearTaints),
            ("-unhealthy", Fault::Unhealthy),
            ("-dropclaims", Fault::DropClaims),
            ("-fatallog", Fault::FatalLog),
            ("-noisyfatal", Fault::NoisyFatal),
        ];
        SUFFIXES
            .iter()
            .find(|(suffix, _)| tag.ends_with(suffix))
            .map_or(Self::Healthy, |&(_, fault)| fault)
    }
}

/// The tag of an image reference: the text after the last ':' that comes
/// after the last '/'. A digest (`@sha256:...`) is not a tag, so it is cut
/// off first; otherwise `image@sha256:abc` would read as tag `abc`.
pub fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split_once('@').map_or(image, |(name, _)| name);
    let last_segment = without_digest
        .rsplit_once('/')
        .map_or(without_digest, |(_, segment)| segment);
    last_segment.rsplit_once(':').map(|(_, tag)| tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_is_text_after_last_colon_of_last_path_segment() {
        assert_eq!(image_tag("plugin:v1"), Some("v1"));
        assert_eq!(
            image_tag("registry.local/team/plugin:v1.2-slow"),
            Some("v1.2-slow")
        );
        // The registry port is not a tag.
        assert_eq!(image_tag("registry.local:5000/plugin"), None);
        assert_eq!(
            image_tag("registry.local:5000/plugin:2-flap"),
            Some("2-flap")
        );
        assert_eq!(image_tag("plugin"), None);
        assert_eq!(image_tag("plugin:"), Some(""));
        assert_eq!(image_tag("plugin@sha256:0123abcd"), None);
        assert_eq!(
            image_tag("plugin:v1-broken@sha256:0123abcd"),
            Some("v1-broken")
        );
    }

    #[test]
    fn fault_comes_from_tag_suffix() {
        let cases = [
            ("example/plugin:v1", Fault::Healthy),
            ("example/plugin", Fault::Healthy),
            ("example/plugin:v1-broken", Fault::Broken),
            ("example/plugin:v1-overcount", Fault::Overcount),
            ("example/plugin:v1-crashloop", Fault::Crashloop),
            ("example/plugin:v1-unready", Fault::Unready),
            ("example/plugin:v1-slow", Fault::Slow),
            ("example/plugin:v1-flap", Fault::Flap),
            ("example/plugin:v1-fewer", Fault::Fewer),
            ("example/plugin:v1-taint", Fault::Taint),
            ("example/plugin:v1-cleartaints", Fault::ClearTaints),
            ("example/plugin:v1-unhealthy", Fault::Unhealthy),
            ("example/plugin:v1-dropclaims", Fault::DropClaims),
            ("example/plugin:v1-fatallog", Fault::FatalLog),
            ("example/plugin:v1-noisyfatal", Fault::NoisyFatal),
            ("example/plugin:v1-taints", Fault::Healthy),
            ("example/plugin:broken", Fault::Healthy),
            ("example/plugin:v1-broken-not", Fault::Healthy),
            ("example/plugin:-flap", Fault::Flap),
            // Suffixes in the repository path do not count.
            ("example/plugin-broken:v1", Fault::Healthy),
            ("registry:5000/plugin-crashloop", Fault::Healthy),
        ];
        for (image, fault) in cases {
            assert_eq!(Fault::from_image(image), fault, "{image}");
        }
    }

    #[test]
    fn agent_kind_from_label() {
        assert_eq!(
            AgentKind::from_label("device-plugin"),
            Some(AgentKind::DevicePlugin)
        );
        assert_eq!(
            AgentKind::from_label("dra-driver"),
            Some(AgentKind::DraDriver)
        );
        assert_eq!(AgentKind::from_label("other"), None);
        assert_eq!(AgentKind::from_label(""), None);
    }
}
