//! Block-size cap under load: the verifier runs the rows of all active requests in one
//! batched forward, so a fixed per-forward token budget is split between them.

/// The block-size cap for each of `active` requests when one verifier forward should hold
/// at most `budget` tokens and no request verifies more than `max_block_size` per round.
///
/// `None` (no cap) while every request fits at its full size, or when `budget` is 0 (no
/// budget configured). Otherwise `budget / active`, never below 1: a plain round still makes
/// progress, so heavy load degrades speculation, never liveness.
pub fn load_block_cap(active: usize, budget: usize, max_block_size: usize) -> Option<usize> {
    if active == 0 || budget == 0 {
        return None;
    }
    if active.saturating_mul(max_block_size) <= budget {
        return None;
    }
    Some((budget / active).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_cap_while_everyone_fits() {
        assert_eq!(load_block_cap(0, 32, 8), None);
        assert_eq!(load_block_cap(1, 32, 8), None);
        assert_eq!(load_block_cap(4, 32, 8), None);
    }

    #[test]
    fn the_budget_is_shared_once_requests_outgrow_it() {
        assert_eq!(load_block_cap(5, 32, 8), Some(6));
        assert_eq!(load_block_cap(8, 32, 8), Some(4));
        assert_eq!(load_block_cap(16, 32, 8), Some(2));
        assert_eq!(load_block_cap(32, 32, 8), Some(1));
    }

    #[test]
    fn never_below_one_token_per_request() {
        assert_eq!(load_block_cap(33, 32, 8), Some(1));
        assert_eq!(load_block_cap(1000, 32, 8), Some(1));
        assert_eq!(load_block_cap(2, 1, 8), Some(1));
    }

    #[test]
    fn a_zero_budget_means_no_cap() {
        assert_eq!(load_block_cap(100, 0, 8), None);
    }

    #[test]
    fn the_cap_never_grows_with_load() {
        let mut last = usize::MAX;
        for active in 1..200 {
            let cap = load_block_cap(active, 32, 8).unwrap_or(usize::MAX);
            assert!(cap <= last, "active {active}");
            last = cap;
        }
    }
}
