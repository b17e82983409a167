//! mask_secrets, clean_line, clean_lines: never panic; a cleaned line is
//! bounded and printable; a planted secret (PLANTED_SECRETS) put on its own
//! line among the input's lines never survives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saferollout_core::gates::proof::{
    MAX_LINE, PLANTED_SECRETS, clean_line, clean_lines, mask_secrets,
};

/// A run of 8 characters of `secret` in `masked` that the text around the
/// planted line (`around`) does not hold itself: the fuzzer builds pieces
/// of the planted secrets into its input, and those are not the secret
/// (nor once cleaning made their control characters spaces).
fn leaks(secret: &str, masked: &str, around: &str) -> bool {
    let cleaned: String = around
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let chars: Vec<char> = secret.chars().collect();
    chars.windows(8.min(chars.len())).any(|w| {
        let w: String = w.iter().collect();
        masked.contains(w.as_str()) && !around.contains(w.as_str()) && !cleaned.contains(w.as_str())
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let _ = mask_secrets(text);
    let line = clean_line(text);
    assert!(line.chars().count() <= MAX_LINE);
    assert!(!line.chars().any(char::is_control), "{line:?}");
    let lines = clean_lines(text, 3);
    assert!(!lines.chars().any(char::is_control), "{lines:?}");

    // The input's lines around a planted secret's line, cut in two at a
    // line break.
    let (planted, secret) = PLANTED_SECRETS[usize::from(pick) % PLANTED_SECRETS.len()];
    let (before, after) = text.split_at(text.find('\n').unwrap_or(text.len()));
    let with_secret = format!("{before}\n{planted}\n{after}");
    for masked in [mask_secrets(&with_secret), clean_lines(&with_secret, 100)] {
        assert!(
            !leaks(secret, &masked, text),
            "{with_secret:?} -> {masked:?}"
        );
    }
});
