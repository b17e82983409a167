//! Deterministic fake identifiers (IPs, container and image IDs).
//!
//! They are derived from stable inputs with FNV-1a, which unlike std's
//! `DefaultHasher` is fixed forever, so a restarted sim computes the same
//! values and does not rewrite every pod status.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `parts`, each followed by a separator so that
/// `["ab", "c"]` and `["a", "bc"]` differ.
pub fn hash(parts: &[&str]) -> u64 {
    let mut state = FNV_OFFSET;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0xff)) {
            state ^= u64::from(byte);
            state = state.wrapping_mul(FNV_PRIME);
        }
    }
    state
}

/// 64 lowercase hex digits, like a container ID or a sha256 digest.
pub fn hex_digest(parts: &[&str]) -> String {
    (0u8..4)
        .map(|round| {
            let salt = [b'0' + round];
            let salt = std::str::from_utf8(&salt).expect("ASCII digit");
            let mut salted = Vec::with_capacity(parts.len() + 1);
            salted.push(salt);
            salted.extend_from_slice(parts);
            format!("{:016x}", hash(&salted))
        })
        .collect()
}

/// A pod IP in 10.244.0.0/16, from the pod UID.
pub fn pod_ip(pod_uid: &str) -> String {
    let h = hash(&["pod-ip", pod_uid]);
    format!("10.244.{}.{}", (h >> 8) % 256, 2 + h % 253)
}

/// A host IP in 10.0.0.0/16 for a node whose InternalIP is not known.
pub fn fallback_host_ip(node_name: &str) -> String {
    let h = hash(&["host-ip", node_name]);
    format!("10.0.{}.{}", (h >> 8) % 256, 2 + h % 253)
}

/// The runtime ID of a container's `attempt`-th run (0 for the first).
pub fn container_id(pod_uid: &str, container: &str, attempt: u32) -> String {
    let digest = hex_digest(&["container", pod_uid, container, &attempt.to_string()]);
    format!("containerd://{digest}")
}

/// An image ID (`repository@sha256:...`) for an image reference.
pub fn image_id(image: &str) -> String {
    let repository = image.split_once('@').map_or(image, |(name, _)| name);
    let repository = match repository.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => repository,
    };
    format!("{repository}@sha256:{}", hex_digest(&["image", image]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_separates_parts() {
        // Pinned: a different value would make a restarted sim rewrite statuses.
        assert_eq!(hash(&[]), FNV_OFFSET);
        assert_eq!(hash(&["a"]), hash(&["a"]));
        assert_ne!(hash(&["ab", "c"]), hash(&["a", "bc"]));
    }

    #[test]
    fn ids_have_the_expected_shape() {
        let digest = hex_digest(&["x"]);
        assert_eq!(digest.len(), 64);
        assert!(
            digest
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );

        let ip = pod_ip("uid-1");
        let octets: Vec<u32> = ip.split('.').map(|o| o.parse().unwrap()).collect();
        assert_eq!(&octets[..2], &[10, 244]);
        assert!(octets[2] <= 255 && (2..=254).contains(&octets[3]));
        assert_eq!(pod_ip("uid-1"), ip);

        assert!(fallback_host_ip("node-1").starts_with("10.0."));

        let id = container_id("uid", "agent", 0);
        assert!(id.starts_with("containerd://"));
        assert_ne!(id, container_id("uid", "agent", 1));

        assert!(
            image_id("registry:5000/team/plugin:v1")
                .starts_with("registry:5000/team/plugin@sha256:")
        );
        assert!(image_id("registry:5000/plugin").starts_with("registry:5000/plugin@sha256:"));
        assert!(image_id("plugin@sha256:abc").starts_with("plugin@sha256:"));
    }
}
