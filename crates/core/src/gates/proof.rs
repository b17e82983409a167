//! What the probe, logs and prometheus gates observe, gathered by the
//! runtime (probe pods from its watch, agent logs through `pods/log`,
//! Prometheus queries over HTTP) and handed in through
//! [`super::Evidence::proof`]; and the text hygiene they share: what a
//! status keeps of a log line is truncated and has secrets masked.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use jiff::Timestamp;
use regex::Regex;

/// Everything the three gates observe for one SafeRollout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProofEvidence {
    /// This rollout's probe pods, as the watch sees them.
    pub probe_pods: Vec<ProbePod>,
    /// Why creating a probe pod failed, by pod name (the last error).
    pub probe_errors: BTreeMap<String, String>,
    /// What reading each agent pod's log found, by pod UID.
    pub agent_logs: BTreeMap<String, LogObservation>,
    /// The latest measurement of each prometheus gate, by gate name.
    pub measurements: BTreeMap<String, Measurement>,
}

/// A probe pod as observed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbePod {
    pub name: String,
    pub uid: String,
    /// From the probe's node label.
    pub node: String,
    pub deleting: bool,
    /// `status.phase` (Pending, Running, Succeeded, Failed, Unknown).
    pub phase: String,
    /// The PodScheduled condition when it is False: (reason, message).
    pub unschedulable: Option<(String, String)>,
    /// The first container's state: waiting reason, or terminated exit code,
    /// reason and message.
    pub waiting_reason: Option<String>,
    pub exit_code: Option<i32>,
    pub terminated_reason: Option<String>,
    pub terminated_message: Option<String>,
    /// The pod's own message (e.g. an eviction or NodePrepareResources failure).
    pub message: Option<String>,
    /// The last lines of the probe's log, read once it ended (already
    /// cleaned with [`clean_lines`]).
    pub log_tail: Option<String>,
}

/// What reading an agent pod's log found.
#[derive(Debug, Clone, PartialEq)]
pub struct LogObservation {
    pub pod: String,
    /// When the container (or pod) started: the window counts from here.
    pub started_at: Option<Timestamp>,
    pub read: LogRead,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LogRead {
    /// Not read yet.
    Unread,
    /// Read at `at` to the end of the log (or of the window); no line
    /// matched.
    Clean { at: Timestamp },
    /// Read at `at`, no line matched so far, but the read stopped at its
    /// size bound (or found the log rotated): the next read goes on at once
    /// (see [`super::log_reader`]).
    Behind { at: Timestamp },
    /// A line matched (see the logs gate's `scan`).
    Matched(LogMatch),
    /// The last read failed; earlier reads (if any) were clean up to `clean_at`.
    Unreadable {
        error: String,
        clean_at: Option<Timestamp>,
    },
}

/// One run of a prometheus gate's query.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub at: Timestamp,
    /// The `$STAGE_NODES` value the query ran with: a measurement over other
    /// nodes than the rollout holds now is not counted.
    pub stage_nodes: String,
    pub outcome: MeasurementOutcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MeasurementOutcome {
    /// The samples of the result: each sample's labels and value. Empty: no data.
    Samples(Vec<Sample>),
    /// The query failed or timed out (the message carries no credentials).
    Error(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Longest line a status keeps.
pub const MAX_LINE: usize = 200;

/// What looks like a credential, and what replaces it. One list for every
/// text that reaches status, Events or logs from a user or the cluster
/// (log lines, termination messages, scheduler and server errors); its
/// test is a corpus of planted secrets (`tests::planted_secrets`).
fn secret_patterns() -> &'static [(Regex, &'static str)] {
    static PATTERNS: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        [
            // Private keys, PEM: from the BEGIN line to the END line, or to
            // the end of the text when it was cut.
            (
                r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
                "-----BEGIN ${1}PRIVATE KEY----- *** -----END ${1}PRIVATE KEY-----",
            ),
            // Authorization headers, whatever the scheme (Bearer, Basic,
            // Token, Digest, AWS4-HMAC-SHA256 ...): the whole value.
            (
                r#"(?i)\b((?:proxy-)?authorization["']?\s*[=:]\s*)("[^"]*"|'[^']*'|[^\r\n]*)"#,
                AUTHORIZATION,
            ),
            // Cookies: the rest of the header.
            (r#"(?i)\b((?:set-)?cookie["']?\s*:\s*)[^\r\n]*"#, "$1***"),
            // Bearer/Basic credentials anywhere.
            (r"(?i)\b(bearer|basic)\s+([A-Za-z0-9._~+/=-]+)", BEARER),
            // key=value / key: value / "key": "value" where the key names a
            // secret; a quoted value is masked whole (spaces included).
            (
                r#"(?i)\b([a-z0-9_.-]*(?:token|password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?key|private[_-]?key|credentials?|license[_-]?key|signature|sig|accountkey|sharedaccesskey))(["']?\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s"',;&]+)"#,
                KEY_VALUE,
            ),
            // Anything before @ in a URL's authority: user:password@, token@.
            (r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@", "$1***@"),
            // Well-known token formats, wherever they stand.
            (r"\beyJ[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*){0,2}", "***"), // JWT, base64 JSON
            (r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,})", "***"), // GitHub
            (r"\bglpat-[A-Za-z0-9_-]{16,}", "***"),                                    // GitLab
            (r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b", "***"), // AWS access key id
            (r"\bAIza[0-9A-Za-z_-]{30,}", "***"),      // Google API key
            (r"\bnvapi-[A-Za-z0-9_-]{8,}", "***"),     // NVIDIA NGC
            (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", "***"), // Slack
            (r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}", "***"), // Stripe
            (r"\bsk-[A-Za-z0-9_-]{20,}", "***"),       // OpenAI-style API keys
        ]
        .into_iter()
        .map(|(p, r)| (Regex::new(p).expect("secret patterns compile"), r))
        .collect()
    })
}

/// The replacements of the `key=value` and bearer patterns, applied by
/// [`mask_unless_key`].
const KEY_VALUE: &str = "$1$2***";
const BEARER: &str = "$1 ***";
// The same as the cookie pattern's "$1***", written apart to tell them apart.
const AUTHORIZATION: &str = "${1}***";

/// Masks what looks like a credential (see [`secret_patterns`]): header and
/// `key=value` secrets, URL userinfo, well-known token formats, private
/// keys and PEM bodies.
pub fn mask_secrets(text: &str) -> String {
    let mut out = text.to_string();
    let patterns = secret_patterns();
    let key_value = &patterns
        .iter()
        .find(|(_, r)| *r == KEY_VALUE)
        .expect("a key=value pattern")
        .0;
    // What a masked value may have swallowed the start of: a key=value or
    // an Authorization or Cookie header (see `mask_unless_key`).
    let nested: Vec<&Regex> = patterns
        .iter()
        .filter(|(_, r)| [KEY_VALUE, AUTHORIZATION, "$1***"].contains(r))
        .map(|(re, _)| re)
        .collect();
    for (re, replacement) in patterns {
        if re.is_match(&out) {
            out = match *replacement {
                KEY_VALUE => mask_unless_key(re, &out, 3, key_value, &nested, |c| {
                    format!("{}{}***", &c[1], &c[2])
                }),
                BEARER => mask_unless_key(re, &out, 2, key_value, &nested, |c| {
                    format!("{} ***", &c[1])
                }),
                AUTHORIZATION => {
                    mask_unless_key(re, &out, 2, key_value, &nested, |c| format!("{}***", &c[1]))
                }
                _ => re.replace_all(&out, *replacement).into_owned(),
            };
        }
    }
    if out.lines().any(is_key_material) {
        out = out
            .lines()
            .map(|l| if is_key_material(l) { "***" } else { l })
            .collect::<Vec<_>>()
            .join("\n");
    }
    out
}

/// `re`'s replacement (`masked`), except where the value it masks (group
/// `value`) is itself the next secret's key: in `"password": LICENSE_KEY:
/// 1234-ABCD` (found by fuzzing, from `"password": ` at the end of a line
/// followed by a line `LICENSE_KEY: ...`, which `clean_line` joins), the
/// value of `password` is `LICENSE_KEY:`, and masking it hid the key whose
/// value followed, which stayed in clear; `Bearer passphrase='open sesame'`
/// did the same through the bearer pattern. A value where the `key=value`
/// pattern matches, reaching beyond it (a key, its separator and its own
/// value), is kept, and the scan goes on from there; a value that pattern
/// matches within (`password=token=abc`) is masked whole as before.
fn mask_unless_key(
    re: &Regex,
    text: &str,
    value: usize,
    key_value: &Regex,
    nested: &[&Regex],
    masked: impl Fn(&regex::Captures) -> String,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(c) = re.captures_at(text, at) {
        let (whole, v) = (c.get(0).expect("a match"), c.get(value).expect("a value"));
        let is_key = key_value
            .find_at(text, v.start())
            .is_some_and(|next| next.start() == v.start() && next.end() > v.end());
        if is_key {
            out.push_str(&text[at..v.start()]);
            at = v.start();
            continue;
        }
        // A key=value (or Authorization, Cookie) match that starts inside
        // the masked value and ends beyond it is masked through its end
        // too: a quoted value whose
        // quote was not closed (`"password": "x db password="secret"`,
        // also found by fuzzing) ends at the next secret's opening quote.
        // Each match found so is looked into the same way (it may have
        // swallowed the key of the next one). At most 64 of them: beyond,
        // the rest of the text is masked, so a line built of such keys
        // costs no more than that.
        let mut end = whole.end();
        let mut from = v.start() + 1;
        let mut looked = 0;
        while let Some(next) = nested
            .iter()
            .filter(|_| from <= text.len())
            .filter_map(|re| re.find_at(text, from))
            .min_by_key(|m| m.start())
        {
            if next.start() >= end {
                break;
            }
            looked += 1;
            if looked > 64 {
                end = text.len();
                break;
            }
            end = end.max(next.end());
            from = next.start() + 1;
        }
        out.push_str(&text[at..whole.start()]);
        out.push_str(&masked(&c));
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// A line that is nothing but a long run of mixed base64 (upper and lower
/// case and digits): a PEM body line, or a key printed on its own.
fn is_key_material(line: &str) -> bool {
    let l = line.trim().trim_end_matches('=');
    l.len() >= 40
        && l.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
        && l.bytes().any(|b| b.is_ascii_uppercase())
        && l.bytes().any(|b| b.is_ascii_lowercase())
        && l.bytes().any(|b| b.is_ascii_digit())
}

/// At most `max` characters, with `...` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max.saturating_sub(3)).collect();
    format!("{cut}...")
}

/// A fatal line found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMatch {
    /// The pattern as configured (built-in or the user's).
    pub pattern: String,
    /// `builtin:<Set>` or `spec.gates.logs.patterns[i]`.
    pub origin: String,
    /// The line, cleaned: truncated, secrets masked.
    pub line: String,
}

/// What a status may keep of a line: control characters out, secrets
/// masked (before cutting, so a cut never leaves half a secret), truncated.
pub fn clean_line(line: &str) -> String {
    let printable: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate(mask_secrets(printable.trim()).as_str(), MAX_LINE)
}

/// The last `n` non-empty lines of `text`, each cleaned, joined with ` | `.
pub fn clean_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..]
        .iter()
        .map(|l| clean_line(l))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Lines that carry a planted secret, and the secret: the corpus
/// [`mask_secrets`] answers for (its unit test, and the end-to-end test of
/// the logs gate). Every value is fake.
pub const PLANTED_SECRETS: &[(&str, &str)] = &[
    ("token=simtok-0123456789abcdef", "simtok-0123456789abcdef"),
    (
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl",
    ),
    (
        "Authorization: Token 9f8e7d6c5b4a39281706f5e4d3c2b1a0",
        "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
    ),
    (
        "Authorization: Basic YWRtaW46aHVudGVyMjAyNg==",
        "YWRtaW46aHVudGVyMjAyNg==",
    ),
    (
        "proxy-authorization: Digest username=\"u\", response=\"6629fae49393a05397450978507c4ef1\"",
        "6629fae49393a05397450978507c4ef1",
    ),
    (
        "PASSWORD=hunter2-correct-horse rest",
        "hunter2-correct-horse",
    ),
    (
        "db password=\"correct horse battery staple\" host=db",
        "correct horse battery staple",
    ),
    (
        "passphrase='open sesame 1234' for the key",
        "open sesame 1234",
    ),
    (
        "{\"api_key\": \"abc123def456ghi789\"}",
        "abc123def456ghi789",
    ),
    (
        "client_secret: Zm9vYmFyYmF6cXV4MTIz",
        "Zm9vYmFyYmF6cXV4MTIz",
    ),
    (
        "NGC_API_KEY=nvapi-Abc123Def456Ghi789",
        "nvapi-Abc123Def456Ghi789",
    ),
    (
        "using key nvapi-Qwe123Rty456Uio789 for nvcr.io",
        "nvapi-Qwe123Rty456Uio789",
    ),
    (
        "connecting to https://admin:s3cr3tPassw0rd@registry.example/v2",
        "s3cr3tPassw0rd",
    ),
    (
        "cloning https://ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8@github.com/org/repo",
        "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    ),
    (
        "GITHUB token ghp_Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2 loaded",
        "ghp_Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2",
    ),
    (
        "pat github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    ),
    (
        "gitlab glpat-xYz123AbC456dEf789gH",
        "glpat-xYz123AbC456dEf789gH",
    ),
    (
        "aws key AKIAIOSFODNN7EXAMPLE in use",
        "AKIAIOSFODNN7EXAMPLE",
    ),
    (
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        "GET https://bucket.s3.amazonaws.com/o?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260101&X-Amz-Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024",
        "fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024",
    ),
    (
        "GET https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=Zm9vYmFyYmF6cXV4cXV1eA%3D%3D&se=2026",
        "Zm9vYmFyYmF6cXV4cXV1eA",
    ),
    (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=bm90LWEtcmVhbC1rZXktYnV0LWxvb2tzLWxpa2Utb25l;EndpointSuffix=core.windows.net",
        "bm90LWEtcmVhbC1rZXktYnV0LWxvb2tzLWxpa2Utb25l",
    ),
    (
        "cookie: session=8c1f2e3d4b5a69788796a5b4c3d2e1f0; theme=dark",
        "8c1f2e3d4b5a69788796a5b4c3d2e1f0",
    ),
    (
        "Set-Cookie: sid=0f1e2d3c4b5a69788796a5b4c3d2e1f0; HttpOnly",
        "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    ),
    (
        "jwt eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJrOHMifQ.ZmFrZS1zaWduYXR1cmU",
        "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9",
    ),
    (
        "google key AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    ),
    (
        "slack xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp",
        "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp",
    ),
    (
        "stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    ),
    (
        "openai sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123",
        "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123",
    ),
    ("LICENSE_KEY: 1234-ABCD-5678-EFGH", "1234-ABCD-5678-EFGH"),
    (
        "key -----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7-----END PRIVATE KEY-----",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw",
    ),
    (
        "-----BEGIN EC PRIVATE KEY----- MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oCdlZd4FvpgRoAoGCCqGSM49",
        "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oCdlZd4FvpgRoAoGCCqGSM49",
    ),
    (
        "MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
        "MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// No run of 8 characters of `secret` survives in `masked`.
    fn leaks(secret: &str, masked: &str) -> Option<String> {
        let chars: Vec<char> = secret.chars().collect();
        chars
            .windows(8.min(chars.len()))
            .map(|w| w.iter().collect::<String>())
            .find(|w| masked.contains(w.as_str()))
    }

    #[test]
    fn planted_secrets() {
        for (line, secret) in PLANTED_SECRETS {
            let masked = clean_line(line);
            assert!(
                leaks(secret, &masked).is_none(),
                "{line:?} -> {masked:?} leaks {:?}",
                leaks(secret, &masked)
            );
            assert!(masked.contains("***"), "{masked}");
            // The same through a multi-line tail (a PEM block keeps its lines there).
            let tail = clean_lines(&format!("first line\n{line}\nlast line"), 5);
            assert!(leaks(secret, &tail).is_none(), "{tail}");
        }
        // A PEM block over several lines, as a termination message holds it.
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\nVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n-----END RSA PRIVATE KEY-----";
        for lines in [clean_line(pem), clean_lines(pem, 5)] {
            assert!(!lines.contains("MIIEpAIBAAKCAQEA"), "{lines}");
            assert!(!lines.contains("VTLw7onLRnrq0"), "{lines}");
        }
    }

    /// Found by fuzzing (fuzz/fuzz_targets/mask_secrets.rs): a key whose
    /// value is the next secret's key (here across a line break, which
    /// `clean_line` makes a space) left that secret in clear.
    #[test]
    fn a_secret_key_right_after_another_key_is_masked() {
        let input = "\0p@h/ \"pa\"pama@h/* \"password\": \nLICENSE_KEY: 1234-ABCD-5678-EFGH\n";
        for masked in [
            mask_secrets(input),
            clean_line(input),
            clean_lines(input, 5),
            clean_line("password: LICENSE_KEY: 1234-ABCD-5678-EFGH"),
            clean_line("token= password=hunter2-correct-horse"),
            clean_line("password: aws_secret_access_key = hunter2-correct-horse"),
            // Found by the same target: the bearer pattern did it too.
            mask_secrets(
                "token=/_n: Bearer\npassphrase='open sesame 1234' for the key\n\n6\0-\u{2}\0\0\0\0c th",
            ),
            clean_line("Bearer passphrase='1234-ABCD' for the key"),
            // And an unclosed quote before a secret's quoted value.
            mask_secrets(
                "\u{c}EEEEE\u{5}https://u:p@h/ \"password\": \"\u{1b}[0mEEEE\u{c}\u{12}\u{c}\ndb password=\"hunter2 correct horse\" host=db\n",
            ),
            clean_line("Authorization: \"x LICENSE_KEY=\"1234-ABCD\" y"),
            // A header swallowed by an unclosed quote.
            clean_line(
                "Authorization: \"p W rizo\nproxy-authorization: Digest username=\"u\", response=\"1234-ABCD\"",
            ),
            mask_secrets(
                "*\0\0gho_yJzdAuthorization: \"p \0\0B\0\0p\0\u{1a}tkken=abc Authorization: \"p W\0\0B\0rizo\nproxy-authorization: Digest username=\"u\", response=\"1234-ABCD\"\n\n\nokie:KE\0",
            ),
            // Through a match found inside a masked value, which swallowed
            // the next key in turn.
            mask_secrets(
                "\0iEE\0tkken=abc Authorization: Be\u{5}httD=*** reEEm\u{c}bsA\0\0bC4\0password\": \"\u{1b}\u{c}\ndb password=\"hunter2 correct horse\" host=db\n\no\n",
            ),
        ] {
            assert!(!masked.contains("1234-ABCD"), "{masked}");
            assert!(!masked.contains("hunter2"), "{masked}");
        }
        assert_eq!(
            clean_line("password: LICENSE_KEY: 1234-ABCD-5678-EFGH"),
            "password: LICENSE_KEY: ***"
        );
        // A value ending in '=' that is no key is masked as before.
        assert_eq!(clean_line("token=c2VjcmV0= next"), "token=*** next");
        assert_eq!(clean_line("password=mytoken="), "password=***");
        assert_eq!(clean_line("password=token=abc"), "password=***");
        assert!(!clean_line("Bearer passphrase='open sesame 1234'").contains("sesame"));
        assert_eq!(
            clean_line("Authorization: Bearer abc.def"),
            "Authorization: ***"
        );
        assert_eq!(clean_line("got bearer abc.def"), "got bearer ***");
        // Many keys in a row: bounded work, everything after masked.
        let keys = "password=\"".repeat(10_000);
        let masked = clean_line(&format!("x {keys}hunter2"));
        assert!(!masked.contains("hunter2"), "{masked}");
    }

    #[test]
    fn lines_without_secrets_are_left_alone() {
        for plain in [
            "Failed to initialize NVML: could not load NVML library",
            "E0102 server.go:364] Cannot register to kubelet service: rpc error: code = Unavailable",
            "0/4 nodes are available: 1 Insufficient example.com/gpu, 3 node(s) didn't match Pod's node affinity/selector.",
            "NodePrepareResources failed for ResourceClaim gpu: device gpu-0 not found in pool node-1 of driver gpu.example.com",
            "pulling image nvcr.io/nvidia/k8s-device-plugin:v0.17.0@sha256:0123456789abcdef0123456789abcdef",
            "Test PASSED",
        ] {
            assert_eq!(clean_line(plain), plain);
        }
    }

    #[test]
    fn lines_are_truncated_and_tails_joined() {
        let long = "x".repeat(500);
        assert_eq!(clean_line(&long).chars().count(), MAX_LINE);
        assert!(clean_line(&long).ends_with("..."));
        assert_eq!(clean_lines("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(clean_lines("one\ttab\u{7}", 5), "one tab");
    }
}
