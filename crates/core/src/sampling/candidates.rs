//! Candidate sets for stochastic sampling: top-k and nucleus (top-p) filtering.
//!
//! Tokens are ranked by logit (descending; signed zeros equal), then id (ascending): a total
//! order, so a filtered set never depends on sort stability or on how a selection happened
//! to partition a slice.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A token still eligible for sampling.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub id: u32,
    pub logit: f32,
    /// Unnormalised probability `exp((logit - max) / T)`.
    pub weight: f64,
}

/// Temperature scaling relative to the largest logit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scale {
    pub max_logit: f64,
    pub inv_temperature: f64,
}

impl Scale {
    /// `(logit - max) / T`, in nats below the best token (so never positive).
    fn scaled(&self, logit: f32) -> f64 {
        (f64::from(logit) - self.max_logit) * self.inv_temperature
    }

    fn candidate(&self, id: u32, logit: f32) -> Candidate {
        Candidate {
            id,
            logit,
            weight: self.scaled(logit).exp(),
        }
    }
}

/// Rank of `a` against `b`: `Less` when `a` is the better token.
fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    // Callers never hold NaN logits, so the comparison is total.
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

fn is_eligible(logit: f32) -> bool {
    !logit.is_nan() && logit != f32::NEG_INFINITY
}

/// Every token that can be drawn (no NaN, no `-inf`), in ascending id order.
pub(crate) fn all_candidates(logits: &[f32], scale: Scale) -> Vec<Candidate> {
    logits
        .iter()
        .enumerate()
        .filter(|(_, &logit)| is_eligible(logit))
        .map(|(id, &logit)| scale.candidate(id as u32, logit))
        .collect()
}

/// The `k` best-ranked drawable tokens (`k > 0`), in ascending id order.
pub(crate) fn top_k_candidates(logits: &[f32], k: usize, scale: Scale) -> Vec<Candidate> {
    let unweighted = |(id, &logit): (usize, &f32)| Candidate {
        id: id as u32,
        logit,
        weight: 0.0,
    };
    let eligible = logits
        .iter()
        .enumerate()
        .filter(|(_, &logit)| is_eligible(logit))
        .map(unweighted);
    // A bounded heap looks at each logit once and rarely moves anything; a large k is better
    // served by one linear selection.
    let mut kept: Vec<Candidate> = if k <= logits.len() / 16 {
        let mut heap: BinaryHeap<WorstFirst> = BinaryHeap::with_capacity(k + 1);
        for c in eligible {
            if heap.len() < k {
                heap.push(WorstFirst(c));
            } else if heap
                .peek()
                .is_some_and(|worst| rank(&c, &worst.0) == Ordering::Less)
            {
                heap.pop();
                heap.push(WorstFirst(c));
            }
        }
        heap.into_iter().map(|w| w.0).collect()
    } else {
        let mut all: Vec<Candidate> = eligible.collect();
        if k < all.len() {
            all.select_nth_unstable_by(k, rank);
            all.truncate(k);
        }
        all
    };
    kept.sort_unstable_by_key(|c| c.id);
    for c in &mut kept {
        *c = scale.candidate(c.id, c.logit);
    }
    kept
}

/// Heap order that puts the worst-ranked token on top.
struct WorstFirst(Candidate);

impl PartialEq for WorstFirst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for WorstFirst {}

impl PartialOrd for WorstFirst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WorstFirst {
    fn cmp(&self, other: &Self) -> Ordering {
        rank(&self.0, &other.0)
    }
}

/// Sum of weights in ascending id order; callers keep sets in that order so the sum is
/// reproducible bit for bit.
pub(crate) fn total_weight(candidates: &[Candidate]) -> f64 {
    candidates.iter().map(|c| c.weight).sum()
}

/// Width of a nucleus bucket: a quarter of a nat of scaled logit.
const BUCKETS_PER_NAT: f64 = 4.0;
/// Buckets cover 64 nats below the best token; the last one takes everything further down.
const BUCKETS: usize = 256;

/// Keeps the smallest best-ranked prefix whose probability mass reaches `top_p`: a candidate
/// stays while the mass ranked strictly before it is below `top_p` times the total, so the
/// best one always stays. Input and output are in ascending id order.
///
/// The mass before a token is summed bucket by bucket: tokens fall into buckets of a quarter
/// nat of scaled logit (rank order never crosses back between buckets), each bucket's mass
/// is summed in ascending id order, and only the bucket where the mass reaches `top_p` is
/// sorted and walked in rank order. That keeps the cost linear in the vocabulary.
pub(crate) fn keep_nucleus(candidates: &mut Vec<Candidate>, top_p: f64, scale: Scale) {
    if top_p >= 1.0 || candidates.len() <= 1 {
        return;
    }
    let threshold = top_p * total_weight(candidates);
    let bucket_of = |c: &Candidate| {
        let depth = -scale.scaled(c.logit) * BUCKETS_PER_NAT;
        // `as` saturates, and depth is never negative; clamp the tail into the last bucket.
        (depth as usize).min(BUCKETS - 1)
    };
    let mut mass = [0.0f64; BUCKETS];
    for c in candidates.iter() {
        mass[bucket_of(c)] += c.weight;
    }
    let mut mass_before = 0.0;
    let Some(boundary) = (0..BUCKETS).find(|&b| {
        let reached = mass_before + mass[b] >= threshold;
        if !reached {
            mass_before += mass[b];
        }
        reached
    }) else {
        // Rounding kept the bucket sums below the threshold: everything stays.
        return;
    };
    let mut members: Vec<Candidate> = candidates
        .iter()
        .filter(|c| bucket_of(c) == boundary)
        .copied()
        .collect();
    members.sort_unstable_by(rank);
    let mut last_kept = members[0];
    for m in &members {
        if mass_before >= threshold {
            break;
        }
        last_kept = *m;
        mass_before += m.weight;
    }
    candidates.retain(|c| rank(c, &last_kept) != Ordering::Greater);
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: Scale = Scale {
        max_logit: 0.0,
        inv_temperature: 1.0,
    };

    fn logits_of(weights: &[f64]) -> Vec<f32> {
        weights.iter().map(|w| w.ln() as f32).collect()
    }

    fn ids(c: &[Candidate]) -> Vec<u32> {
        c.iter().map(|c| c.id).collect()
    }

    #[test]
    fn all_candidates_skip_undrawable_logits() {
        let c = all_candidates(&[0.0, f32::NAN, f32::NEG_INFINITY, -1.0], UNIT);
        assert_eq!(ids(&c), vec![0, 3]);
        assert_eq!(c[0].weight, 1.0);
    }

    #[test]
    fn top_k_keeps_best_in_id_order() {
        let logits = logits_of(&[0.1, 0.4, 0.05, 0.3, 0.15]);
        assert_eq!(ids(&top_k_candidates(&logits, 3, UNIT)), vec![1, 3, 4]);
    }

    #[test]
    fn top_k_breaks_ties_by_lower_id() {
        let logits = logits_of(&[0.2, 0.2, 0.2, 0.4]);
        assert_eq!(ids(&top_k_candidates(&logits, 2, UNIT)), vec![0, 3]);
    }

    #[test]
    fn top_k_heap_and_selection_agree() {
        let logits: Vec<f32> = (0..4000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 18) % 301) as f32 * 0.1)
            .collect();
        for k in [1, 7, 100, 250, 251, 1000, 3999, 4000, 5000] {
            let via_k = ids(&top_k_candidates(&logits, k, UNIT));
            let mut order: Vec<u32> = (0..4000).collect();
            order.sort_by(|&a, &b| {
                logits[b as usize]
                    .total_cmp(&logits[a as usize])
                    .then(a.cmp(&b))
            });
            let mut expected: Vec<u32> = order.into_iter().take(k).collect();
            expected.sort_unstable();
            assert_eq!(via_k, expected, "k = {k}");
        }
    }

    #[test]
    fn nucleus_stops_once_mass_reached() {
        let logits = logits_of(&[0.125, 0.5, 0.125, 0.25]);
        let mut c = all_candidates(&logits, UNIT);
        keep_nucleus(&mut c, 0.7, UNIT);
        assert_eq!(ids(&c), vec![1, 3]);
        let mut c = all_candidates(&logits, UNIT);
        keep_nucleus(&mut c, 0.5, UNIT);
        assert_eq!(ids(&c), vec![1]);
    }

    #[test]
    fn nucleus_over_equal_weights_keeps_lowest_ids() {
        let logits = vec![0.0f32; 1000];
        let mut c = all_candidates(&logits, UNIT);
        keep_nucleus(&mut c, 0.5, UNIT);
        assert_eq!(ids(&c), (0..500).collect::<Vec<_>>());
    }
}
