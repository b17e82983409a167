//! The one error type of the CLI: a one-line message and an exit code.
//!
//! Exit codes:
//! - [`EXIT_FAILED`] (1): the command ran and the answer is "no": lint found an
//!   Error (or could not parse a manifest), the object is missing, the action
//!   does not apply to the rollout's current state, a stage cannot be planned.
//! - [`EXIT_USAGE`] (2): the command could not run: bad flags, an unreadable
//!   file, no usable kubeconfig, the API server unreachable or refusing the
//!   request (other than "not found").

use std::fmt;

/// The command ran and found a problem (see the module docs).
pub const EXIT_FAILED: u8 = 1;
/// Usage, kubeconfig or connection error (see the module docs).
pub const EXIT_USAGE: u8 = 2;

/// An error to print as `error: <message>` before exiting with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    /// Exit code 1: the command ran and the answer is a failure.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_FAILED,
            message: one_line(&message.into()),
        }
    }

    /// Exit code 2: usage, kubeconfig or connection error.
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: one_line(&message.into()),
        }
    }

    /// Maps a kube error of a request about `what` (e.g. `SafeRollout gpu/foo`):
    /// 404 is "not found" (exit 1), anything else a connection/API error (exit 2).
    pub fn kube(err: kube::Error, what: &str) -> Self {
        match &err {
            kube::Error::Api(status) if status.code == 404 => {
                // A 404 without details comes from a resource type the server
                // does not serve (the CRD is not installed), not from a missing object.
                let missing_type = status.details.is_none()
                    && (status
                        .message
                        .contains("could not find the requested resource")
                        || status.message.contains("page not found"));
                if missing_type {
                    Self::usage(format!(
                        "{what}: the API server does not serve this resource type (is the CRD installed?)"
                    ))
                } else {
                    Self::failed(format!("{what} not found"))
                }
            }
            kube::Error::Api(status) => {
                let reason = if status.reason.is_empty() {
                    format!("HTTP {}", status.code)
                } else {
                    status.reason.clone()
                };
                let message = if status.message.is_empty() {
                    reason.clone()
                } else {
                    format!("{} ({reason})", status.message)
                };
                Self::usage(format!("{what}: {message}"))
            }
            _ => Self::usage(format!("{what}: {}", error_chain(&err))),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// An error and its sources on one line, `outer: inner: innermost`, skipping a
/// source whose text the previous message already contains (many errors print
/// their source in their own message).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![err.to_string()];
    let mut source = err.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    one_line(&parts.join(": "))
}

/// Collapses line breaks and runs of whitespace into single spaces.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One line for a clap error (usage error): clap prints several lines (the
/// error, the usage, a tip); keep the error text up to the usage.
pub fn clap_one_line(rendered: &str) -> String {
    let text: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let joined = one_line(&text.join(" "));
    let joined = joined.strip_prefix("error:").unwrap_or(&joined).trim();
    format!("{joined} (see --help)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn chains_are_one_line_without_repeats() {
        let e = E(
            "HyperError: client error (Connect)",
            Some(Box::new(E(
                "client error (Connect)",
                Some(Box::new(E("tcp connect error:\nConnection refused", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "HyperError: client error (Connect): tcp connect error: Connection refused"
        );
    }

    #[test]
    fn not_found_is_exit_1_and_names_the_object() {
        let status = kube::core::Status::failure("saferollouts \"foo\" not found", "NotFound")
            .with_code(404)
            .with_details(serde_json::from_value(serde_json::json!({"name": "foo"})).unwrap());
        let err = CliError::kube(kube::Error::Api(Box::new(status)), "SafeRollout gpu/foo");
        assert_eq!(err, CliError::failed("SafeRollout gpu/foo not found"));

        let no_crd =
            kube::core::Status::failure("404 page not found", "Failed to parse error data")
                .with_code(404);
        let err = CliError::kube(kube::Error::Api(Box::new(no_crd)), "SafeRollout gpu/foo");
        assert_eq!(err.code, EXIT_USAGE);
        assert!(err.message.contains("CRD"), "{}", err.message);
    }

    #[test]
    fn other_api_errors_are_exit_2_without_debug_dumps() {
        let status =
            kube::core::Status::failure("saferollouts is forbidden: User \"x\"", "Forbidden")
                .with_code(403);
        let err = CliError::kube(kube::Error::Api(Box::new(status)), "SafeRollout gpu/foo");
        assert_eq!(err.code, EXIT_USAGE);
        assert_eq!(
            err.message,
            "SafeRollout gpu/foo: saferollouts is forbidden: User \"x\" (Forbidden)"
        );
    }

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  <NAME>\n\nUsage: kubectl saferollout approve <NAME>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_one_line(rendered),
            "the following required arguments were not provided: <NAME> (see --help)"
        );
    }
}
