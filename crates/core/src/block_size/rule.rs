//! The adaptive block-size rule for MTP-style drafters.

/// Rounds of history the rule looks at.
pub const HISTORY_WINDOW: usize = 32;
/// Rounds run at the configured depth before a larger block may be tried.
pub const WARMUP_ROUNDS: usize = 8;
/// Percentage of recent rounds that must accept the full configured depth for the larger
/// requested block to be used.
pub const FULL_DEPTH_HIT_PERCENT: usize = 65;

/// Verify width for the next round.
///
/// * `requested`: the block size asked for (a ceiling).
/// * `configured`: the drafter's trained depth (its checkpoint block size).
/// * `history`: accepted draft counts of past speculative rounds, oldest first; only the last
///   [`HISTORY_WINDOW`] entries count.
/// * `remaining`: tokens still allowed plus one (`max_tokens - emitted + 1`), so `bs - 1`
///   never exceeds the budget and only a final bonus token can be cut.
///
/// A requested size at or below the configured one is honoured (up to `remaining`). A larger
/// one is used only after [`WARMUP_ROUNDS`] rounds and while at least
/// [`FULL_DEPTH_HIT_PERCENT`]% of the recent rounds accepted the full configured depth;
/// otherwise the configured depth is used. A result of 1 or less means "verify only the
/// bonus" (a plain decoding step), never "stop".
pub fn next_block_size(
    requested: usize,
    configured: usize,
    history: &[usize],
    remaining: usize,
) -> usize {
    let block_total = requested.min(remaining);
    let conf = configured.min(block_total);
    if block_total <= conf || conf <= 1 {
        return block_total;
    }
    if history.len() < WARMUP_ROUNDS {
        return conf;
    }
    let recent = &history[history.len().saturating_sub(HISTORY_WINDOW)..];
    let full_depth = recent.iter().filter(|&&a| a + 1 >= conf).count();
    if full_depth * 100 >= FULL_DEPTH_HIT_PERCENT * recent.len() {
        block_total
    } else {
        conf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_table() {
        let rows: &[(usize, usize, &[usize], usize, usize)] = &[
            (4, 4, &[], 10, 4),
            (3, 4, &[], 10, 3),
            (8, 4, &[], 10, 4),
            (8, 4, &[3, 3, 3, 2, 3, 3, 3, 3], 10, 8),
            (8, 4, &[3, 0, 1, 2, 3, 0, 1, 2], 10, 4),
            (8, 4, &[], 3, 3),
            (6, 4, &[2, 2, 2, 2], 1, 1),
        ];
        for &(requested, configured, history, remaining, expected) in rows {
            assert_eq!(
                next_block_size(requested, configured, history, remaining),
                expected,
                "({requested}, {configured}, {history:?}, {remaining})"
            );
        }
    }

    #[test]
    fn only_the_last_window_counts() {
        // 32 full-depth rounds after many misses: the misses have left the window.
        let mut history = vec![0; 100];
        history.extend([3; HISTORY_WINDOW]);
        assert_eq!(next_block_size(8, 4, &history, 100), 8);
        // One more miss drops the rate to 31/32, still above 65%.
        history.push(0);
        assert_eq!(next_block_size(8, 4, &history, 100), 8);
    }

    #[test]
    fn hit_rate_threshold_is_inclusive() {
        // 13 of 20 = 65% exactly.
        let mut history = vec![3; 13];
        history.extend([1; 7]);
        assert_eq!(next_block_size(8, 4, &history, 100), 8);
        history.push(1);
        assert_eq!(next_block_size(8, 4, &history, 100), 4);
    }

    #[test]
    fn configured_depth_of_one_honours_request() {
        assert_eq!(next_block_size(5, 1, &[], 100), 5);
    }
}
