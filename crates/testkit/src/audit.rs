//! The API server's audit log (`tests/cluster/up --audit-policy`, JSON
//! lines): each request with its verb, resource, object, the user it acted
//! as, when it was received and answered, and its body where the policy's
//! level keeps one. Read by the benchmarks (bench/audit-policy.yaml logs the
//! operator's requests, counted by verb and resource) and by the fault tests
//! (the operator's pod deletions and node writes, each replica's apart).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use jiff::Timestamp;
use serde::Deserialize;

/// One request, as the API server logged it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub verb: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// The request's URI (path and query).
    pub uri: String,
    /// The object's namespace and name, when the request named them.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub received: Timestamp,
    /// When the logged stage was reached: the answer's end, or for a watch
    /// its start.
    pub answered: Timestamp,
    /// The user the request acted as: the impersonated user when there was
    /// one, else the authenticated user.
    pub user: String,
    /// That user's extra fields (`Impersonate-Extra-*` when impersonated).
    pub user_extra: BTreeMap<String, Vec<String>>,
    pub code: Option<i32>,
    /// The request's body, logged at level `Request` or `RequestResponse`.
    pub request_object: Option<serde_json::Value>,
}

impl Request {
    /// `verb resource`, e.g. `patch saferollouts/status`.
    pub fn key(&self) -> String {
        format!("{} {}", self.verb, self.resource)
    }

    /// The first value of the acting user's extra field `key`.
    pub fn extra(&self, key: &str) -> Option<&str> {
        self.user_extra.get(key)?.first().map(String::as_str)
    }

    /// The value of the query parameter `key`, as sent (percent-encoded).
    pub fn param(&self, key: &str) -> Option<&str> {
        self.uri
            .split_once('?')?
            .1
            .split('&')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    }

    /// Answered with a 2xx code.
    pub fn succeeded(&self) -> bool {
        self.code.is_some_and(|c| (200..300).contains(&c))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Line {
    stage: String,
    verb: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    request_received_timestamp: Timestamp,
    stage_timestamp: Timestamp,
    user: User,
    #[serde(default)]
    impersonated_user: Option<User>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
    #[serde(default)]
    request_object: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct User {
    username: String,
    #[serde(default)]
    extra: BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: Option<i32>,
}

/// Parses audit log lines: one request per watch (when it started) and per
/// other request (when it completed); lines of other stages are skipped.
pub fn parse(text: &str) -> anyhow::Result<Vec<Request>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let l: Line =
            serde_json::from_str(line).with_context(|| format!("audit log line {}", i + 1))?;
        let counted = if l.verb == "watch" {
            l.stage == "ResponseStarted"
        } else {
            l.stage == "ResponseComplete" || l.stage == "Panic"
        };
        if !counted {
            continue;
        }
        let resource = match &l.object_ref {
            Some(o) if !o.resource.is_empty() => match &o.subresource {
                Some(s) if !s.is_empty() => format!("{}/{s}", o.resource),
                _ => o.resource.clone(),
            },
            // Non-resource requests (/version, /apis discovery).
            _ => l
                .request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        let user = l.impersonated_user.unwrap_or(l.user);
        let (namespace, name) = l
            .object_ref
            .map(|o| (o.namespace, o.name))
            .unwrap_or_default();
        out.push(Request {
            verb: l.verb,
            resource,
            uri: l.request_uri,
            namespace,
            name,
            received: l.request_received_timestamp,
            answered: l.stage_timestamp,
            user: user.username,
            user_extra: user.extra,
            code: l.response_status.and_then(|s| s.code),
            request_object: l.request_object,
        });
    }
    Ok(out)
}

/// Reads and parses the audit log at `path` (empty when it does not exist yet).
pub fn read(path: &Path) -> anyhow::Result<Vec<Request>> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Requests received in `[from, to)`, counted by `verb resource`.
pub fn count_between(
    requests: &[Request],
    from: Timestamp,
    to: Timestamp,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.received >= from && r.received < to)
    {
        *counts.entry(r.key()).or_insert(0) += 1;
    }
    counts
}

/// LIST requests received in `[from, to)`.
pub fn lists_between(requests: &[Request], from: Timestamp, to: Timestamp) -> Vec<Request> {
    requests
        .iter()
        .filter(|r| r.verb == "list" && r.received >= from && r.received < to)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/nodes?limit=500","verb":"list","user":{"username":"system:serviceaccount:saferollout-system:saferollout-operator"},"objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-01T10:00:00.000100Z","stageTimestamp":"2026-12-01T10:00:00.020000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"b","stage":"ResponseStarted","requestURI":"/api/v1/nodes?watch=true","verb":"watch","user":{"username":"op"},"objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-01T10:00:01Z","stageTimestamp":"2026-12-01T10:00:01Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"b","stage":"ResponseComplete","requestURI":"/api/v1/nodes?watch=true","verb":"watch","user":{"username":"op"},"objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-01T10:00:01Z","stageTimestamp":"2026-12-01T10:30:01Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"c","stage":"ResponseComplete","requestURI":"/apis/saferollout.dev/v1alpha1/namespaces/b/saferollouts/p/status","verb":"patch","user":{"username":"op"},"objectRef":{"resource":"saferollouts","namespace":"b","name":"p","apiGroup":"saferollout.dev","apiVersion":"v1alpha1","subresource":"status"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-01T10:00:02Z","stageTimestamp":"2026-12-01T10:00:02.005Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"d","stage":"ResponseComplete","requestURI":"/version","verb":"get","user":{"username":"op"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-01T10:00:03Z","stageTimestamp":"2026-12-01T10:00:03Z"}
"#;

    #[test]
    fn counts_each_request_once_by_verb_and_resource() {
        let reqs = parse(LOG).unwrap();
        let keys: Vec<String> = reqs.iter().map(Request::key).collect();
        assert_eq!(
            keys,
            [
                "list nodes",
                "watch nodes",
                "patch saferollouts/status",
                "get /version"
            ]
        );
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let counts = count_between(&reqs, t("2026-12-01T10:00:00Z"), t("2026-12-01T10:00:02Z"));
        assert_eq!(counts.len(), 2);
        assert_eq!(counts["list nodes"], 1);
        assert_eq!(
            lists_between(&reqs, t("2026-12-01T10:00:01Z"), t("2026-12-01T11:00:00Z")).len(),
            0,
            "the only LIST came before"
        );
        assert_eq!(reqs[0].code, Some(200));
    }

    #[test]
    fn an_impersonated_request_acts_as_the_impersonated_user_with_its_extra_and_body() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Request","auditID":"e","stage":"ResponseComplete","requestURI":"/api/v1/nodes/n1","verb":"patch","user":{"username":"kubernetes-admin","groups":["system:masters"]},"impersonatedUser":{"username":"system:serviceaccount:s:op","extra":{"test.saferollout.dev/replica":["1"]}},"objectRef":{"resource":"nodes","name":"n1","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestObject":{"metadata":{"labels":{"a":"b"}}},"requestReceivedTimestamp":"2026-12-01T10:00:00.1Z","stageTimestamp":"2026-12-01T10:00:00.3Z"}"#;
        let reqs = parse(line).unwrap();
        let r = &reqs[0];
        assert_eq!(r.user, "system:serviceaccount:s:op");
        assert_eq!(r.extra("test.saferollout.dev/replica"), Some("1"));
        assert_eq!(r.name.as_deref(), Some("n1"));
        assert_eq!(r.namespace, None);
        assert_eq!(r.uri, "/api/v1/nodes/n1");
        let watch = &parse(LOG).unwrap()[1];
        assert_eq!(watch.param("watch"), Some("true"));
        assert_eq!(watch.param("resourceVersion"), None);
        assert_eq!(
            r.request_object.as_ref().unwrap()["metadata"]["labels"]["a"],
            "b"
        );
        assert!(r.succeeded());
        assert_eq!(
            r.answered.duration_since(r.received).as_millis(),
            200,
            "{r:?}"
        );
        // Not impersonated: the authenticated user, with no extra.
        let first = &parse(LOG).unwrap()[0];
        assert_eq!(
            first.user,
            "system:serviceaccount:saferollout-system:saferollout-operator"
        );
        assert!(first.user_extra.is_empty());
        assert_eq!(first.name, None);
    }

    #[test]
    fn a_bad_line_is_an_error_naming_it() {
        let err = parse("{\"stage\": 1}\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
    }
}
