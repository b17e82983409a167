//! Kubernetes quantities as whole counts: extended resources such as
//! `nvidia.com/gpu` are integers, but the API writes them in canonical
//! quantity form (`8`, `8k`, `2Ki`), e.g. Intel's `gpu.intel.com/millicores`
//! advertises 1000 per GPU and reads `8k` on an 8-GPU node.
//!
//! Parsing is `kube_quantity`'s; this module only turns a parsed quantity into
//! a whole count and refuses what is not one (a fraction, a negative value).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_quantity::ParsedQuantity;

/// The whole count a quantity stands for: `8` -> 8, `8k` -> 8000, `2Ki` ->
/// 2048, `1e3` -> 1000. `None` for a malformed quantity, a fraction (`500m`,
/// `1.5`), a negative value or one beyond `i64`.
pub fn quantity_count(q: &Quantity) -> Option<i64> {
    count_of(&q.0)
}

/// [`quantity_count`] of a string.
pub fn count_of(text: &str) -> Option<i64> {
    let text = text.trim();
    // Device counts are nearly always plain digits ("8"), read on every
    // node each pass by the allocatable gate: parsed directly, without the
    // general quantity grammar (about 3% of the operator's CPU at 1,000
    // nodes). Fifteen digits stay below the bound checked below.
    if (1..=15).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().ok();
    }
    let parsed = ParsedQuantity::try_from(text).ok()?;
    // f64 holds every integer up to 2^53 exactly: far beyond any device count.
    let value = parsed.to_bytes_f64()?;
    let whole = value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value < 9.0e15;
    whole.then_some(value as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_counts_in_every_notation() {
        for (text, want) in [
            ("8", 8),
            ("0", 0),
            ("8k", 8000),
            ("1k", 1000),
            ("2Ki", 2048),
            ("1M", 1_000_000),
            ("1Mi", 1_048_576),
            ("1e3", 1000),
            ("1.5k", 1500),
            (" 16 ", 16),
        ] {
            assert_eq!(count_of(text), Some(want), "{text}");
        }
    }

    #[test]
    fn fractions_negatives_and_garbage_are_not_counts() {
        for text in ["500m", "1.5", "-1", "abc", "", "8 GPUs", "1..2"] {
            assert_eq!(count_of(text), None, "{text:?}");
        }
    }

    /// The plain-digits shortcut answers as the quantity grammar does.
    #[test]
    fn plain_digits_read_as_the_grammar_reads_them() {
        let by_grammar = |t: &str| {
            let v = ParsedQuantity::try_from(t).ok()?.to_bytes_f64()?;
            (v.fract() == 0.0 && v < 9.0e15).then_some(v as i64)
        };
        for text in ["0", "8", "08", "0008", "4096", "123456789012345"] {
            assert_eq!(count_of(text), by_grammar(text), "{text}");
            assert!(count_of(text).is_some(), "{text}");
        }
        // Sixteen digits go through the grammar and its bound.
        assert_eq!(count_of("9000000000000001"), None);
        assert_eq!(count_of("1000000000000000"), Some(1_000_000_000_000_000));
    }

    #[test]
    fn from_a_quantity() {
        assert_eq!(quantity_count(&Quantity("8k".into())), Some(8000));
    }
}
