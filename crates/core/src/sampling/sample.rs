//! The positioned sampler shared by plain decoding and speculative verification.

use super::argmax::argmax;
use super::candidates::{all_candidates, keep_nucleus, top_k_candidates, total_weight, Scale};
use super::keyed_uniform::keyed_uniform;
use super::params::{SamplingParamError, SamplingParams};

/// Why no token could be sampled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SamplingError {
    /// The parameters are out of range.
    #[error(transparent)]
    InvalidParams(#[from] SamplingParamError),
    /// The logits slice is empty.
    #[error("logits are empty")]
    EmptyLogits,
    /// Every logit is NaN.
    #[error("every logit is NaN")]
    NoCandidate,
}

/// Picks the token at output index `output_index` from `logits`.
///
/// The result depends only on `(logits, params, output_index)`: plain decoding and speculative
/// verification call this same function, so they emit the same tokens for the same logits.
///
/// Greedy (`temperature == 0`) is [`argmax`]. Otherwise, reproducibly:
/// 1. NaN and `-inf` logits are dropped; if the largest logit is `+inf` (or every logit is
///    `-inf`) the distribution is degenerate and the argmax is returned.
/// 2. top-k keeps the `top_k` largest logits (ties to the lower id).
/// 3. weights `exp((logit - max) / T)` are computed in f64.
/// 4. top-p keeps the best-ranked prefix whose mass reaches `top_p` (mass summed bucket by
///    bucket, see `candidates::keep_nucleus`).
/// 5. with `u` = [`keyed_uniform`]`(seed, output_index)`, the token is the first one, in
///    ascending id order, whose cumulative weight exceeds `u * total`, both sums taken in
///    ascending id order.
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    output_index: u64,
) -> Result<u32, SamplingError> {
    params.validate()?;
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    let best = argmax(logits).ok_or(SamplingError::NoCandidate)?;
    let max = logits[best as usize];
    if params.is_greedy() || !max.is_finite() {
        return Ok(best);
    }

    let scale = Scale {
        max_logit: f64::from(max),
        inv_temperature: 1.0 / f64::from(params.temperature),
    };
    let top_k = params.top_k as usize;
    let mut candidates = if top_k > 0 && top_k < logits.len() {
        top_k_candidates(logits, top_k, scale)
    } else {
        all_candidates(logits, scale)
    };
    keep_nucleus(&mut candidates, f64::from(params.top_p), scale);

    let target = keyed_uniform(params.seed, output_index) * total_weight(&candidates);
    let mut cumulative = 0.0;
    for c in &candidates {
        cumulative += c.weight;
        if cumulative > target {
            return Ok(c.id);
        }
    }
    // Unreachable in exact arithmetic (u < 1); keeps the last token with any weight.
    Ok(candidates
        .iter()
        .rev()
        .find(|c| c.weight > 0.0)
        .map_or(best, |c| c.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: u32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
        }
    }

    /// Logits of a fixed distribution over 6 tokens.
    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    const PROBS: [f64; 6] = [0.05, 0.30, 0.10, 0.40, 0.10, 0.05];

    #[test]
    fn greedy_is_argmax_with_lowest_id_ties() {
        let p = SamplingParams::GREEDY;
        assert_eq!(sample(&[0.0, 2.0, 1.0], &p, 0), Ok(1));
        assert_eq!(sample(&[3.0, 1.0, 3.0], &p, 5), Ok(0));
    }

    #[test]
    fn same_key_same_token() {
        let logits = logits_of(&PROBS);
        let p = params(1.0, 1.0, 0, 1234);
        for index in 0..200 {
            assert_eq!(sample(&logits, &p, index), sample(&logits, &p, index));
        }
    }

    #[test]
    fn seed_and_index_change_the_draw() {
        let logits = logits_of(&PROBS);
        let a: Vec<u32> = (0..64)
            .map(|i| sample(&logits, &params(1.0, 1.0, 0, 1), i).unwrap())
            .collect();
        let b: Vec<u32> = (0..64)
            .map(|i| sample(&logits, &params(1.0, 1.0, 0, 2), i).unwrap())
            .collect();
        assert_ne!(a, b, "another seed gives another sequence");
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() >= 4, "indices vary the draw: {a:?}");
    }

    #[test]
    fn top_k_one_equals_greedy() {
        let logits = logits_of(&PROBS);
        for index in 0..100 {
            assert_eq!(sample(&logits, &params(1.3, 1.0, 1, 9), index), Ok(3));
        }
        let tied = [1.0, 4.0, 4.0];
        assert_eq!(sample(&tied, &params(1.0, 1.0, 1, 9), 0), Ok(1));
    }

    #[test]
    fn tiny_top_p_equals_greedy() {
        let logits = logits_of(&PROBS);
        for index in 0..100 {
            assert_eq!(sample(&logits, &params(0.8, 1e-9, 0, 3), index), Ok(3));
        }
    }

    #[test]
    fn top_k_limits_the_support() {
        let logits = logits_of(&PROBS);
        for index in 0..500 {
            let t = sample(&logits, &params(1.0, 1.0, 2, 5), index).unwrap();
            assert!(t == 1 || t == 3, "token {t}");
        }
    }

    #[test]
    fn top_p_limits_the_support() {
        // Ranked: 3 (0.40), 1 (0.30), 2 (0.10) ... A 0.65 nucleus keeps {3, 1}.
        let logits = logits_of(&PROBS);
        let mut seen = [0u32; 6];
        for index in 0..2000 {
            seen[sample(&logits, &params(1.0, 0.65, 0, 5), index).unwrap() as usize] += 1;
        }
        assert_eq!(seen[0] + seen[2] + seen[4] + seen[5], 0, "{seen:?}");
        assert!(seen[1] > 0 && seen[3] > seen[1], "{seen:?}");
    }

    /// Pearson chi-square of counts against expected probabilities.
    fn chi_square(counts: &[u32], probs: &[f64]) -> f64 {
        let n: u32 = counts.iter().sum();
        counts
            .iter()
            .zip(probs)
            .map(|(&c, &p)| {
                let e = p * f64::from(n);
                (f64::from(c) - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn draws_follow_the_distribution() {
        let logits = logits_of(&PROBS);
        let p = params(1.0, 1.0, 0, 20240611);
        let mut counts = [0u32; 6];
        for index in 0..30_000 {
            counts[sample(&logits, &p, index).unwrap() as usize] += 1;
        }
        // 5 degrees of freedom: the 0.1% critical value is 20.5. The seed range is fixed, so
        // this either always passes or always fails; 30 is a loose bound.
        let chi = chi_square(&counts, &PROBS);
        assert!(chi < 30.0, "chi-square {chi}, counts {counts:?}");
    }

    #[test]
    fn temperature_reshapes_the_distribution() {
        // T = 2 turns probabilities p into p^(1/2), renormalised.
        let logits = logits_of(&PROBS);
        let p = params(2.0, 1.0, 0, 77);
        let sqrt: Vec<f64> = PROBS.iter().map(|p| p.sqrt()).collect();
        let z: f64 = sqrt.iter().sum();
        let expected: Vec<f64> = sqrt.iter().map(|s| s / z).collect();
        let mut counts = [0u32; 6];
        for index in 0..30_000 {
            counts[sample(&logits, &p, index).unwrap() as usize] += 1;
        }
        let chi = chi_square(&counts, &expected);
        assert!(chi < 30.0, "chi-square {chi}, counts {counts:?}");
    }

    #[test]
    fn nan_and_negative_infinity_are_never_drawn() {
        let logits = [f32::NAN, 0.0, f32::NEG_INFINITY, 0.0];
        for index in 0..300 {
            let t = sample(&logits, &params(1.0, 1.0, 0, 1), index).unwrap();
            assert!(t == 1 || t == 3);
        }
    }

    #[test]
    fn degenerate_logits() {
        let p = params(1.0, 1.0, 0, 1);
        assert_eq!(sample(&[], &p, 0), Err(SamplingError::EmptyLogits));
        assert_eq!(sample(&[f32::NAN], &p, 0), Err(SamplingError::NoCandidate));
        assert_eq!(sample(&[0.0, f32::INFINITY, 1.0], &p, 0), Ok(1));
        assert_eq!(sample(&[f32::NEG_INFINITY; 3], &p, 0), Ok(0));
    }

    #[test]
    fn invalid_params_are_reported_not_panicked() {
        let err = sample(&[0.0, 1.0], &params(-1.0, 1.0, 0, 0), 0).unwrap_err();
        assert!(matches!(err, SamplingError::InvalidParams(e) if e.field == "temperature"));
    }

    #[test]
    fn large_vocabulary_matches_a_full_sort_implementation() {
        // Cross-check the heap top-k and bucketed nucleus against a plain full sort.
        let vocab = 5000;
        let logits: Vec<f32> = (0..vocab)
            .map(|i| (i as f32 * 0.37).sin() * 4.0 + (i % 7) as f32 * 0.1)
            .collect();
        for (temperature, top_p, top_k) in [
            (0.9, 0.9, 0),
            (0.5, 0.3, 0),
            (1.7, 0.99, 0),
            (1.0, 0.8, 40),
            (1.0, 1.0, 300),
            (0.7, 0.95, 2000),
        ] {
            let p = params(temperature, top_p, top_k, 11);
            for index in 0..40 {
                let fast = sample(&logits, &p, index).unwrap();
                assert_eq!(
                    fast,
                    full_sort_reference(&logits, &p, index),
                    "{p:?} @ {index}"
                );
            }
        }
    }

    fn full_sort_reference(logits: &[f32], p: &SamplingParams, index: u64) -> u32 {
        let max = logits.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| ((l as f64 - max) / p.temperature as f64).exp())
            .collect();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            order.truncate(p.top_k as usize);
        }
        let mut by_id = order.clone();
        by_id.sort_unstable();
        let total: f64 = by_id.iter().map(|&i| w[i]).sum();
        let mut kept = Vec::new();
        let mut before = 0.0;
        for &i in &order {
            if before >= p.top_p as f64 * total {
                break;
            }
            kept.push(i);
            before += w[i];
        }
        kept.sort_unstable();
        let kept_total: f64 = kept.iter().map(|&i| w[i]).sum();
        let target = keyed_uniform(p.seed, index) * kept_total;
        let mut cum = 0.0;
        for &i in &kept {
            cum += w[i];
            if cum > target {
                return i as u32;
            }
        }
        unreachable!()
    }
}
