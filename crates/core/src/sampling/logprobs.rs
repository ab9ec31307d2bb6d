//! Log probabilities of the chosen token and its best alternatives, read from the logits the
//! token was drawn from.

/// Most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// One emitted token's log probability and the best alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    /// Natural log of the token's probability.
    pub logprob: f32,
    /// The most likely tokens at the position, best first (ties to the lower id), with their
    /// log probabilities.
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits` (after the request's bias, penalties and constraint, before
/// temperature and truncation: the distribution the model with those rules gives) at
/// `token`, with the `top` best tokens. Computed in f64, so plain and speculative rows with
/// equal logits give equal numbers.
pub fn token_logprob(logits: &[f32], token: u32, top: u32) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let log_total = if max.is_finite() {
        let sum: f64 = logits
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - f64::from(max)).exp())
            .sum();
        f64::from(max) + sum.ln()
    } else {
        0.0
    };
    let logprob_of = |logit: f32| -> f32 {
        if logit.is_nan() || !max.is_finite() {
            f32::NEG_INFINITY
        } else {
            (f64::from(logit) - log_total) as f32
        }
    };
    let chosen = logits
        .get(token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    TokenLogprob {
        token,
        logprob: logprob_of(chosen),
        top: best(logits, top.min(MAX_TOP_LOGPROBS) as usize)
            .into_iter()
            .map(|id| (id, logprob_of(logits[id as usize])))
            .collect(),
    }
}

/// The ids of the `n` largest logits, best first, ties to the lower id; NaN never.
fn best(logits: &[f32], n: usize) -> Vec<u32> {
    let mut kept: Vec<u32> = Vec::with_capacity(n + 1);
    if n == 0 {
        return kept;
    }
    let better = |a: u32, b: u32| logits[a as usize] > logits[b as usize];
    for (id, logit) in logits.iter().enumerate() {
        if logit.is_nan() {
            continue;
        }
        let id = id as u32;
        if kept.len() == n && !better(id, kept[n - 1]) {
            continue;
        }
        // Later ids win no tie, so an equal logit goes after the ones kept.
        let at = kept.partition_point(|&k| !better(id, k));
        kept.insert(at, id);
        kept.truncate(n);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_best_first() {
        let logits = [0.5f32.ln(), 0.25f32.ln(), 0.25f32.ln(), f32::NEG_INFINITY];
        let lp = token_logprob(&logits, 2, 3);
        assert!((lp.logprob - 0.25f32.ln()).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [0, 1, 2]);
        assert!((lp.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(token_logprob(&logits, 3, 0).logprob, f32::NEG_INFINITY);
        assert!(token_logprob(&logits, 3, 0).top.is_empty());
    }

    #[test]
    fn top_is_capped_and_never_longer_than_the_vocabulary() {
        let logits: Vec<f32> = (0..30).map(|i| i as f32).collect();
        let lp = token_logprob(&logits, 0, 99);
        assert_eq!(lp.top.len(), MAX_TOP_LOGPROBS as usize);
        assert_eq!(lp.top[0].0, 29);
        assert_eq!(token_logprob(&[1.0, 1.0], 0, 5).top.len(), 2);
    }
}
