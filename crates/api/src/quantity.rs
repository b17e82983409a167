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
    let parsed = ParsedQuantity::try_from(text.trim()).ok()?;
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

    #[test]
    fn from_a_quantity() {
        assert_eq!(quantity_count(&Quantity("8k".into())), Some(8000));
    }
}
