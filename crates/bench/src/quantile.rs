//! Quantiles of timed samples, one definition for every benchmark table.

use std::time::Duration;

/// The `q`-quantile of `samples` by nearest rank: the smallest sample with at least a
/// fraction `q` of all samples at or below it; `None` without samples.
pub(super) fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// The median (the 0.5-quantile); zero without samples.
pub(super) fn median(samples: &[Duration]) -> Duration {
    quantile(samples, 0.5).unwrap_or_default()
}

/// The median of `values` by nearest rank (the lower middle of an even count); zero
/// without values.
pub(super) fn median_of(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

/// `d` in milliseconds.
pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(median_of(&[]), 0.0);
        assert_eq!(median_of(&[0.3, 0.1, 0.2]), 0.2);
        assert_eq!(median_of(&[0.4, 0.1, 0.3, 0.2]), 0.2);
        assert_eq!(median(&ms(&[5, 1, 3])), Duration::from_millis(3));
        assert_eq!(median(&ms(&[4, 1, 3, 2])), Duration::from_millis(2));
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(
            quantile(&ms(&hundred), 0.99),
            Some(Duration::from_millis(99))
        );
        assert_eq!(
            quantile(&ms(&hundred), 1.0),
            Some(Duration::from_millis(100))
        );
    }
}
