//! Revision identity by template content.
//!
//! A DaemonSet's revisions are its ControllerRevisions (`data.spec.template`,
//! named by `controller-revision-hash`). Which one the DaemonSet is on is the
//! one whose template equals the DaemonSet's template, not the one with the
//! highest number: the DaemonSet controller renumbers an old revision when a
//! template goes back to it, and those updates can arrive out of order, so
//! "the newest number" briefly names the wrong revision after every restore.
//! Content does not lie.

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use saferollout_api::REVISION_HASH_LABEL;
use sha2::{Digest, Sha256};

/// One revision of a DaemonSet, with its template parsed.
#[derive(Debug, Clone, Copy)]
pub struct RevisionTemplate<'a> {
    /// `controller-revision-hash`.
    pub hash: &'a str,
    /// ControllerRevision `revision` (newest is highest).
    pub number: i64,
    pub template: &'a PodTemplateSpec,
}

/// The template a DaemonSet ControllerRevision holds (`data.spec.template`),
/// without the `$patch` directive; `None` when it holds none.
pub fn revision_template_json(cr: &ControllerRevision) -> Option<serde_json::Value> {
    let mut t = cr.data.0.get("spec")?.get("template")?.clone();
    if let Some(m) = t.as_object_mut() {
        m.remove("$patch");
    }
    Some(t)
}

/// [`revision_template_json`], typed.
pub fn revision_template(cr: &ControllerRevision) -> Option<PodTemplateSpec> {
    serde_json::from_value(revision_template_json(cr)?).ok()
}

/// The `controller-revision-hash` label of a ControllerRevision.
pub fn revision_hash(cr: &ControllerRevision) -> Option<&str> {
    cr.metadata
        .labels
        .as_ref()?
        .get(REVISION_HASH_LABEL)
        .map(String::as_str)
}

/// Two templates are the same revision: equal, reading an empty `metadata`
/// (`{creationTimestamp: null}` in a ControllerRevision) as an absent one.
pub fn same_template(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    a.spec == b.spec
        && a.metadata.clone().unwrap_or_default() == b.metadata.clone().unwrap_or_default()
}

/// The revision whose template is `template`; the newest when several are.
pub fn current_revision<'a>(
    template: &PodTemplateSpec,
    revisions: &[RevisionTemplate<'a>],
) -> Option<&'a str> {
    revisions
        .iter()
        .filter(|r| same_template(r.template, template))
        .max_by_key(|r| r.number)
        .map(|r| r.hash)
}

/// A JSON value as text with object keys sorted at every level: equal
/// values (whatever their key order or spacing) give equal text.
fn canonical(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            out.push('{');
            for k in keys {
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push(':');
                canonical(&m[k], out);
                out.push(',');
            }
            out.push('}');
        }
        serde_json::Value::Array(a) => {
            out.push('[');
            for x in a {
                canonical(x, out);
                out.push(',');
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A stable short hash of a JSON value (object keys sorted at every level):
/// the identity of a `spec.template`.
pub fn template_hash(value: &serde_json::Value) -> String {
    let mut s = String::new();
    canonical(value, &mut s);
    let digest = Sha256::digest(s.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The content hash of a template a last-good backup holds: `sha256:` and
/// the whole digest of its canonical JSON (not cut short like
/// [`template_hash`]: a backup planted by someone else must not be made to
/// match the operator's).
pub fn content_hash(value: &serde_json::Value) -> String {
    let mut s = String::new();
    canonical(value, &mut s);
    let digest = Sha256::digest(s.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The template a last-good backup ControllerRevision holds (`data.template`).
pub fn backup_template_json(cr: &ControllerRevision) -> Option<&serde_json::Value> {
    cr.data.0.get("template")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    use super::*;

    fn template(image: &str) -> PodTemplateSpec {
        serde_json::from_value(json!({"spec": {"containers": [{"name": "c", "image": image}]}}))
            .unwrap()
    }

    #[test]
    fn the_current_revision_is_found_by_content_not_by_number() {
        let (v1, v2) = (template("x:1"), template("x:2"));
        // After a restore the DaemonSet is back on v1's content while v2 still
        // has the highest number (the renumbering of v1 not seen yet).
        let revs = [
            RevisionTemplate {
                hash: "h1",
                number: 1,
                template: &v1,
            },
            RevisionTemplate {
                hash: "h2",
                number: 2,
                template: &v2,
            },
        ];
        assert_eq!(current_revision(&v1, &revs), Some("h1"));
        assert_eq!(current_revision(&v2, &revs), Some("h2"));
        assert_eq!(
            current_revision(&template("x:3"), &revs),
            None,
            "not recorded yet"
        );
    }

    #[test]
    fn revision_template_strips_the_patch_directive_and_parses() {
        let cr = ControllerRevision {
            data: RawExtension(json!({"spec": {"template": {"$patch": "replace",
                "metadata": {"creationTimestamp": null},
                "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}})),
            ..Default::default()
        };
        assert_eq!(
            revision_template_json(&cr),
            Some(
                json!({"metadata": {"creationTimestamp": null}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}})
            )
        );
        // `creationTimestamp: null` and an absent metadata are the same template.
        assert!(same_template(
            &revision_template(&cr).unwrap(),
            &template("x:1")
        ));
        assert!(!same_template(
            &revision_template(&cr).unwrap(),
            &template("x:2")
        ));
    }

    #[test]
    fn template_hash_ignores_key_order() {
        let a = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"containers": []}});
        let b = json!({"spec": {"containers": []}, "metadata": {"labels": {"b": "2", "a": "1"}}});
        assert_eq!(template_hash(&a), template_hash(&b));
        let c = json!({"spec": {"containers": [{"image": "x:2"}]}});
        assert_ne!(template_hash(&a), template_hash(&c));
        assert_eq!(template_hash(&a).len(), 16);
    }
}
