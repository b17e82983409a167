//! What deleting a SafeRollout does to its DaemonSet: the finalizer hands
//! the DaemonSet back to its own controller, but never with a release the
//! gates stopped on it.
//!
//! - The DaemonSet carries a revision the gates stopped (`onFailure: Halt`
//!   or `Quarantine`) or blocked (a revert whose restore has not landed):
//!   the last good template is written back first, and the finalizer waits
//!   for that write. Without it, the original strategy (usually
//!   RollingUpdate) would roll the stopped release to every node, unguarded.
//! - While an agent still runs a stopped revision (Halt, Quarantine), the
//!   DaemonSet stays `OnDelete`: those nodes keep what they run (a forward-
//!   only driver is never downgraded by a deletion) and no agent pod
//!   changes; a person replaces them when ready. Otherwise the original
//!   strategy is restored (a revert under way is then finished by the
//!   DaemonSet controller, towards the last good template).
//! - `saferollout.dev/on-delete: KeepTemplate` asks for the DaemonSet as it
//!   is, original strategy included: the old behaviour, stated explicitly.

use saferollout_api::{ON_DELETE_KEEP_TEMPLATE, SafeRolloutStatus};

use crate::rollout::is_blocked;

/// How the finalizer hands the DaemonSet back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandBack {
    /// Write the last good template back first, and wait for the write.
    pub restore_last_good: bool,
    /// Restore the original update strategy (else leave `OnDelete`).
    pub restore_strategy: bool,
    /// The content hash the backup written back must have.
    pub content: Option<String>,
    /// What happens and why, for the log and the Event.
    pub message: String,
}

/// What deleting a SafeRollout of a DaemonSet `owner` owns does: nothing
/// to the DaemonSet, whose template and strategy are the owner's (a stopped
/// release is put back in the owner's fields by a person, as the stop's
/// condition said).
pub fn hand_back_owned(owner: crate::owner::OwnerView) -> HandBack {
    HandBack {
        restore_last_good: false,
        restore_strategy: false,
        content: None,
        message: format!(
            "the DaemonSet is owned by {}, which writes its template and update strategy: left as it is",
            owner.describe()
        ),
    }
}

/// What deleting the SafeRollout does, from its status, the revision the
/// DaemonSet carries (`None`: unknown or no DaemonSet), whether an agent pod
/// still runs the stopped revision, the `on-delete` annotation, and the
/// content hash of the last-good backup found (`None`: none found).
///
/// A backup whose content is not what status recorded
/// (`lastGoodTemplate.templateHash`) is never written: the DaemonSet then
/// stays `OnDelete` over the stopped template (nothing rolls), and the
/// message says so. A status without a recorded hash (an older operator's)
/// uses the backup as found, as that operator did.
pub fn hand_back(
    status: &SafeRolloutStatus,
    current: Option<&str>,
    agents_on_stopped: bool,
    annotation: Option<&str>,
    backup: Option<&str>,
) -> HandBack {
    let stable = status.stable_revision.as_deref();
    let stopped = status.stopped.as_ref().map(|s| s.revision.as_str());
    if annotation == Some(ON_DELETE_KEEP_TEMPLATE) {
        return HandBack {
            restore_last_good: false,
            restore_strategy: true,
            content: None,
            message: format!(
                "handing the DaemonSet back as it is ({ON_DELETE_KEEP_TEMPLATE}): its template{} and its original update strategy",
                current
                    .map(|c| format!(" (revision {c})"))
                    .unwrap_or_default()
            ),
        };
    }
    let stopped_on_ds =
        current.is_some_and(|c| Some(c) == stopped || (Some(c) != stable && is_blocked(status, c)));
    let recorded = status
        .last_good_template
        .as_ref()
        .filter(|l| Some(l.revision.as_str()) == stable)
        .and_then(|l| l.template_hash.as_deref());
    let mismatch = match (recorded, backup) {
        (Some(r), Some(b)) => r != b,
        _ => false,
    };
    if stopped_on_ds && stable.is_some() && mismatch {
        return HandBack {
            restore_last_good: false,
            restore_strategy: false,
            content: None,
            message: format!(
                "revision {} was stopped by its gates, but the last good backup (revision {}) does not hold the template the operator wrote (BackupMismatch: content hash {}, recorded {}): nothing was written, and the DaemonSet stays OnDelete over revision {0}; restore the template by hand",
                current.unwrap_or_default(),
                stable.unwrap_or_default(),
                backup.unwrap_or_default(),
                recorded.unwrap_or_default(),
            ),
        };
    }
    let restore_last_good = stopped_on_ds && stable.is_some();
    let keep_on_delete = stopped.is_some() && (agents_on_stopped || current == stopped);
    let mut message = match (restore_last_good, current) {
        (true, Some(c)) => format!(
            "revision {c} was stopped by its gates: wrote the last good template (revision {}) back before handing the DaemonSet back",
            stable.unwrap_or_default()
        ),
        _ => "handing the DaemonSet back".to_string(),
    };
    if keep_on_delete {
        message.push_str(&format!(
            "; the DaemonSet stays OnDelete, since agents still run revision {}, which its gates stopped: no agent pod is replaced until a person replaces them or sets the update strategy",
            stopped.unwrap_or_default()
        ));
    } else {
        message.push_str("; its original update strategy is restored");
    }
    HandBack {
        restore_last_good,
        restore_strategy: !keep_on_delete,
        content: restore_last_good
            .then(|| recorded.or(backup).map(str::to_string))
            .flatten(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use saferollout_api::{BlockedRevision, OnFailure, StoppedRollout};

    use super::*;

    const GOOD: &str = "sha256:good";

    fn status(stopped: Option<OnFailure>, blocked: &[&str]) -> SafeRolloutStatus {
        SafeRolloutStatus {
            stable_revision: Some("good".into()),
            blocked_revisions: blocked
                .iter()
                .map(|r| BlockedRevision {
                    revision: r.to_string(),
                    reason: "GateFailed".into(),
                    message: String::new(),
                    template_hash: None,
                    blocked_at: Time(jiff::Timestamp::UNIX_EPOCH),
                })
                .collect(),
            stopped: stopped.map(|policy| StoppedRollout {
                revision: "bad".into(),
                policy,
                message: String::new(),
                nodes: vec!["node-0".into()],
                stopped_at: Time(jiff::Timestamp::UNIX_EPOCH),
                quarantine: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_halted_or_quarantined_release_is_replaced_by_the_last_good_and_nothing_rolls() {
        for policy in [OnFailure::Halt, OnFailure::Quarantine] {
            let h = hand_back(
                &status(Some(policy), &["bad"]),
                Some("bad"),
                true,
                None,
                Some(GOOD),
            );
            assert!(h.restore_last_good, "{policy:?}");
            assert!(!h.restore_strategy, "{policy:?}: OnDelete stays");
            assert!(h.message.contains("stays OnDelete"), "{}", h.message);
        }
    }

    #[test]
    fn a_revert_under_way_is_finished_towards_the_last_good() {
        // The restore has not landed: write it, then hand the strategy back.
        let h = hand_back(
            &status(None, &["bad"]),
            Some("bad"),
            false,
            None,
            Some(GOOD),
        );
        assert!(h.restore_last_good && h.restore_strategy, "{h:?}");
        // It landed: nothing to write.
        let h = hand_back(
            &status(None, &["bad"]),
            Some("good"),
            false,
            None,
            Some(GOOD),
        );
        assert!(!h.restore_last_good && h.restore_strategy, "{h:?}");
    }

    #[test]
    fn a_rollout_in_progress_or_done_is_handed_back_as_before() {
        let h = hand_back(&status(None, &[]), Some("new"), false, None, Some(GOOD));
        assert!(!h.restore_last_good && h.restore_strategy, "{h:?}");
        // A stopped revision no agent runs any more, the DaemonSet moved on.
        let h = hand_back(
            &status(Some(OnFailure::Halt), &["bad"]),
            Some("fix"),
            false,
            None,
            Some(GOOD),
        );
        assert!(!h.restore_last_good && h.restore_strategy, "{h:?}");
        // One still runs it: nothing is replaced.
        let h = hand_back(
            &status(Some(OnFailure::Halt), &["bad"]),
            Some("fix"),
            true,
            None,
            Some(GOOD),
        );
        assert!(!h.restore_last_good && !h.restore_strategy, "{h:?}");
    }

    #[test]
    fn keep_template_hands_back_as_is() {
        let h = hand_back(
            &status(Some(OnFailure::Halt), &["bad"]),
            Some("bad"),
            true,
            Some(ON_DELETE_KEEP_TEMPLATE),
            Some(GOOD),
        );
        assert!(!h.restore_last_good && h.restore_strategy, "{h:?}");
    }

    #[test]
    fn without_a_last_good_nothing_is_written_and_nothing_rolls() {
        let mut st = status(Some(OnFailure::Halt), &["bad"]);
        st.stable_revision = None;
        let h = hand_back(&st, Some("bad"), true, None, Some(GOOD));
        assert!(!h.restore_last_good && !h.restore_strategy, "{h:?}");
    }

    #[test]
    fn a_backup_with_other_content_is_never_written_and_nothing_rolls() {
        let mut st = status(Some(OnFailure::Halt), &["bad"]);
        st.last_good_template = Some(saferollout_api::LastGoodTemplate {
            controller_revision: "plugin-last-good-good".into(),
            revision: "good".into(),
            template_hash: Some(GOOD.into()),
        });
        let h = hand_back(&st, Some("bad"), true, None, Some(GOOD));
        assert!(
            h.restore_last_good && h.content.as_deref() == Some(GOOD),
            "{h:?}"
        );
        let h = hand_back(&st, Some("bad"), true, None, Some("sha256:planted"));
        assert!(!h.restore_last_good && !h.restore_strategy, "{h:?}");
        assert!(h.message.contains("BackupMismatch"), "{}", h.message);
        // A revert under way over a blocked revision: the same.
        let mut st = status(None, &["bad"]);
        st.last_good_template = Some(saferollout_api::LastGoodTemplate {
            controller_revision: "plugin-last-good-good".into(),
            revision: "good".into(),
            template_hash: Some(GOOD.into()),
        });
        let h = hand_back(&st, Some("bad"), false, None, Some("sha256:planted"));
        assert!(!h.restore_last_good && !h.restore_strategy, "{h:?}");
    }
}
