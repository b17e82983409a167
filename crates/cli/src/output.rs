//! Output formats, writing to stdout, and time formatting.

use std::io::Write;

use clap::ValueEnum;
use jiff::Timestamp;
use serde::Serialize;

use crate::error::CliError;

/// `-o/--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum OutputFormat {
    /// Human-readable tables.
    #[default]
    Table,
    /// One JSON document (stable field names).
    Json,
    /// One YAML document (same fields as JSON).
    Yaml,
}

/// `value` as JSON or YAML text ending in a newline (`None` for `Table`,
/// which each command renders itself).
pub fn serialize<T: Serialize>(
    value: &T,
    format: OutputFormat,
) -> Result<Option<String>, CliError> {
    match format {
        OutputFormat::Table => Ok(None),
        OutputFormat::Json => serde_json::to_string_pretty(value)
            .map(|s| Some(s + "\n"))
            .map_err(|e| CliError::usage(format!("cannot serialise the output as JSON: {e}"))),
        OutputFormat::Yaml => serde_yaml::to_string(value)
            .map(Some)
            .map_err(|e| CliError::usage(format!("cannot serialise the output as YAML: {e}"))),
    }
}

/// Writes `text` to stdout. A closed pipe (`| head`) ends the process quietly
/// with status 0 instead of panicking like `print!` would.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// A duration as kubectl prints ages: `45s`, `3m20s`, `2h5m`, `3d4h`, `40d`.
pub fn short_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..600 if s % 60 != 0 => format!("{}m{}s", s / 60, s % 60),
        60..3600 => format!("{}m", s / 60),
        3600..28_800 if (s % 3600) / 60 != 0 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        3600..86_400 => format!("{}h", s / 3600),
        86_400..864_000 if (s % 86_400) / 3600 != 0 => {
            format!("{}d{}h", s / 86_400, (s % 86_400) / 3600)
        }
        _ => format!("{}d", s / 86_400),
    }
}

/// How long ago `t` was, e.g. `3m20s` (`-` when unknown).
pub fn age(t: Option<Timestamp>, now: Timestamp) -> String {
    match t {
        Some(t) => short_duration(now.duration_since(t).as_secs()),
        None => "-".to_string(),
    }
}

/// RFC 3339 in UTC, seconds precision, e.g. `2025-01-31T12:00:00Z`.
pub fn timestamp(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_look_like_kubectl() {
        assert_eq!(short_duration(-5), "0s");
        assert_eq!(short_duration(45), "45s");
        assert_eq!(short_duration(200), "3m20s");
        assert_eq!(short_duration(180), "3m");
        assert_eq!(short_duration(1500), "25m");
        assert_eq!(short_duration(7500), "2h5m");
        assert_eq!(short_duration(7200), "2h");
        assert_eq!(short_duration(40_000), "11h");
        assert_eq!(short_duration(3 * 86_400 + 4 * 3600), "3d4h");
        assert_eq!(short_duration(40 * 86_400), "40d");
    }

    #[test]
    fn ages_and_timestamps() {
        let now: Timestamp = "2025-01-31T12:00:00Z".parse().unwrap();
        let then: Timestamp = "2025-01-31T11:58:30.5Z".parse().unwrap();
        assert_eq!(age(Some(then), now), "1m29s");
        assert_eq!(age(None, now), "-");
        assert_eq!(timestamp(then), "2025-01-31T11:58:30Z");
    }

    #[test]
    fn json_and_yaml() {
        #[derive(Serialize)]
        struct S {
            a: u32,
        }
        assert_eq!(serialize(&S { a: 1 }, OutputFormat::Table).unwrap(), None);
        assert_eq!(
            serialize(&S { a: 1 }, OutputFormat::Json).unwrap().unwrap(),
            "{\n  \"a\": 1\n}\n"
        );
        assert_eq!(
            serialize(&S { a: 1 }, OutputFormat::Yaml).unwrap().unwrap(),
            "a: 1\n"
        );
    }
}
