//! Summary statistics of a sample of durations (pure).

use serde::{Deserialize, Serialize};

/// Percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// The `q`-quantile (0..=1) of sorted values by the nearest-rank method: the
/// smallest value with at least `q` of the sample at or below it, so p99 of 30
/// trials is the largest one (never an interpolation between trials).
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(Summary {
        count: v.len(),
        p50: nearest_rank(&v, 0.50),
        p90: nearest_rank(&v, 0.90),
        p99: nearest_rank(&v, 0.99),
        max: v[v.len() - 1],
        mean: v.iter().sum::<f64>() / v.len() as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=30).map(f64::from).collect();
        let s = summarize(&v).unwrap();
        assert_eq!(s.count, 30);
        assert_eq!(s.p50, 15.0);
        assert_eq!(s.p90, 27.0);
        assert_eq!(s.p99, 30.0, "p99 of 30 trials is the worst one");
        assert_eq!(s.max, 30.0);
        assert_eq!(s.mean, 15.5);
        let one = summarize(&[7.0]).unwrap();
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert!(summarize(&[]).is_none());
        let unsorted = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((unsorted.p50, unsorted.max), (2.0, 3.0));
    }
}
