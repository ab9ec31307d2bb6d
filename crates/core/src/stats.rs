//! Per-request speculative decoding statistics.

use crate::fallback::DrafterFallback;

/// Counters over the verify rounds of one request (plain rounds count with 0 drafts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify rounds run.
    pub rounds: u64,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// `drafted_at_position[i]`: rounds that drafted a token at draft position `i` (0-based).
    pub drafted_at_position: Vec<u64>,
    /// `accepted_at_position[i]`: rounds that accepted the draft at position `i`, that is
    /// rounds with `accepted > i`.
    pub accepted_at_position: Vec<u64>,
    /// Set when the drafter failed and the request went on without speculation.
    pub fallback: Option<DrafterFallback>,
    /// Plain rounds the cost-aware block size chose although drafting was allowed (plain
    /// decoding measured cheaper, or the one round that measures it).
    pub speculation_off_rounds: u64,
    /// Times the cost-aware block size switched speculation off or back on.
    pub speculation_switches: u64,
    /// Prompt tokens whose K/V the verifier took from its prefix cache.
    pub cached_prompt_tokens: u64,
    /// Drafts an output constraint forced (verified without asking the drafter).
    pub forced_drafted: u64,
    /// Of the forced drafts, those the target accepted.
    pub forced_accepted: u64,
    /// Rounds that verified a token tree rather than a chain.
    pub tree_rounds: u64,
    /// Drafts verified on a tree's branches beside its deepest path (counted in `drafted`
    /// too; the per-position counts follow depth).
    pub tree_branch_drafts: u64,
}

impl SpecStats {
    /// Records one verify round that checked `drafted` drafts and accepted `accepted` of them.
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        let accepted = accepted.min(drafted);
        self.rounds += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        if self.drafted_at_position.len() < drafted {
            self.drafted_at_position.resize(drafted, 0);
            self.accepted_at_position.resize(drafted, 0);
        }
        for count in &mut self.drafted_at_position[..drafted] {
            *count += 1;
        }
        for count in &mut self.accepted_at_position[..accepted] {
            *count += 1;
        }
    }

    /// Tokens produced per verify round: accepted drafts plus the target's own token.
    pub fn accepted_tokens_per_round(&self) -> Option<f64> {
        (self.rounds > 0).then(|| (self.accepted + self.rounds) as f64 / self.rounds as f64)
    }

    /// Accepted drafts per verify round.
    pub fn accepted_drafts_per_round(&self) -> Option<f64> {
        (self.rounds > 0).then(|| self.accepted as f64 / self.rounds as f64)
    }

    /// Fraction of drafted tokens that were accepted.
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// One-line summary, or `None` before the first round. With drafts:
    /// `"2.00 accepted tokens/round (1.00 accepted drafts/round, 60.0% of drafted, avg draft
    /// 1.67) over 3 rounds"`; without: `"1.00 accepted tokens over 4 rounds"`.
    pub fn format(&self) -> Option<String> {
        let tokens_per_round = self.accepted_tokens_per_round()?;
        let rounds = self.rounds;
        Some(match self.acceptance_rate() {
            Some(rate) => format!(
                "{tokens_per_round:.2} accepted tokens/round ({:.2} accepted drafts/round, \
                 {:.1}% of drafted, avg draft {:.2}) over {rounds} rounds",
                self.accepted as f64 / rounds as f64,
                100.0 * rate,
                self.drafted as f64 / rounds as f64,
            ),
            None => format!("{tokens_per_round:.2} accepted tokens over {rounds} rounds"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(accepted: &[usize], drafted: &[usize]) -> SpecStats {
        let mut s = SpecStats::default();
        for (&a, &d) in accepted.iter().zip(drafted) {
            s.record_round(d, a);
        }
        s
    }

    #[test]
    fn reference_format() {
        assert_eq!(
            stats(&[1, 0, 2], &[2, 1, 2]).format().unwrap(),
            "2.00 accepted tokens/round (1.00 accepted drafts/round, 60.0% of drafted, \
             avg draft 1.67) over 3 rounds"
        );
    }

    #[test]
    fn short_format_without_drafts() {
        assert_eq!(
            stats(&[0, 0, 0, 0], &[0, 0, 0, 0]).format().unwrap(),
            "1.00 accepted tokens over 4 rounds"
        );
        assert_eq!(SpecStats::default().format(), None);
    }

    #[test]
    fn counters_and_histograms() {
        let s = stats(&[1, 0, 2], &[2, 1, 2]);
        assert_eq!((s.rounds, s.drafted, s.accepted), (3, 5, 3));
        assert_eq!(s.drafted_at_position, vec![3, 2]);
        assert_eq!(s.accepted_at_position, vec![2, 1]);
        assert_eq!(s.accepted_tokens_per_round(), Some(2.0));
        assert_eq!(s.accepted_drafts_per_round(), Some(1.0));
        assert_eq!(s.acceptance_rate(), Some(0.6));
    }

    #[test]
    fn histogram_grows_with_longer_blocks() {
        let s = stats(&[1, 5], &[1, 7]);
        assert_eq!(s.drafted_at_position, vec![2, 1, 1, 1, 1, 1, 1]);
        assert_eq!(s.accepted_at_position, vec![2, 1, 1, 1, 1, 0, 0]);
    }
}
