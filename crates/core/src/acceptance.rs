//! The acceptance walk: how many drafts the target agrees with, and which tokens that emits.

/// Result of verifying one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Length of the longest draft prefix that matches the target (0..=drafts). Not reduced by
    /// the budget: it decides what the target cache keeps (`accepted + 1` positions).
    pub accepted: usize,
    /// `d_1..d_accepted` followed by the target's own token at slot `accepted`, cut to the
    /// budget. The last one becomes the next bonus token.
    pub new_tokens: Vec<u32>,
}

/// Walks the drafts `d_1..d_n` against the target tokens `t_0..t_n`.
///
/// `target_at(j)` yields `t_j`, the target's choice after verify slot `j` (slot 0 holds the
/// bonus token, slot `j` holds `d_j`). It is called lazily, once per slot, for slots
/// `0..=accepted` only, so a verifier can project logits and sample up to the first rejection
/// and no further. Its first error stops the walk and is returned.
pub fn accept_drafts<E>(
    drafts: &[u32],
    budget: usize,
    mut target_at: impl FnMut(usize) -> Result<u32, E>,
) -> Result<Accepted, E> {
    let mut accepted = 0;
    let mut new_tokens = Vec::with_capacity(budget.min(drafts.len() + 1));
    loop {
        let target = target_at(accepted)?;
        if new_tokens.len() < budget {
            new_tokens.push(target);
        }
        if drafts.get(accepted) != Some(&target) {
            return Ok(Accepted {
                accepted,
                new_tokens,
            });
        }
        accepted += 1;
    }
}

/// [`accept_drafts`] over target tokens computed up front (`targets[j] = t_j`).
///
/// Fails with [`TooFewTargets`] when `targets` ends before the walk does.
pub fn accept_with_targets(
    drafts: &[u32],
    targets: &[u32],
    budget: usize,
) -> Result<Accepted, TooFewTargets> {
    accept_drafts(drafts, budget, |slot| {
        targets.get(slot).copied().ok_or(TooFewTargets {
            slot,
            targets: targets.len(),
        })
    })
}

/// The walk needed a target token past the end of the given targets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("target tokens: slot {slot} needed but only {targets} given")]
pub struct TooFewTargets {
    /// Verify slot that had no target token.
    pub slot: usize,
    /// How many target tokens were given.
    pub targets: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn walk(drafts: &[u32], targets: &[u32], budget: usize) -> (usize, Vec<u32>, usize) {
        let mut calls = 0;
        let result = accept_drafts::<Infallible>(drafts, budget, |slot| {
            calls += 1;
            Ok(targets[slot])
        })
        .unwrap();
        (result.accepted, result.new_tokens, calls)
    }

    #[test]
    fn reference_rejection_at_second_draft() {
        assert_eq!(
            walk(&[11, 12, 13], &[11, 99, 77, 55], 10),
            (1, vec![11, 99], 2)
        );
    }

    #[test]
    fn reference_full_acceptance_adds_the_extra_token() {
        assert_eq!(walk(&[11, 12], &[11, 12, 42], 10), (2, vec![11, 12, 42], 3));
    }

    #[test]
    fn first_draft_rejected() {
        assert_eq!(walk(&[5, 6], &[7, 8, 9], 10), (0, vec![7], 1));
    }

    #[test]
    fn no_drafts_is_a_plain_step() {
        assert_eq!(walk(&[], &[42], 10), (0, vec![42], 1));
    }

    #[test]
    fn budget_cuts_tokens_but_not_accepted() {
        assert_eq!(walk(&[11, 12], &[11, 12, 42], 2), (2, vec![11, 12], 3));
        assert_eq!(walk(&[11, 12, 13], &[11, 99, 77, 55], 1), (1, vec![11], 2));
        assert_eq!(walk(&[11, 12], &[11, 12, 42], 0), (2, vec![], 3));
    }

    #[test]
    fn closure_called_exactly_accepted_plus_one_times() {
        for accepted in 0..=4usize {
            let drafts = [1, 2, 3, 4];
            let mut targets: Vec<u32> = drafts[..accepted].to_vec();
            targets.push(100);
            let (a, tokens, calls) = walk(&drafts, &targets, 10);
            assert_eq!(a, accepted);
            assert_eq!(calls, accepted + 1);
            assert_eq!(tokens.len(), accepted + 1);
        }
    }

    #[test]
    fn errors_stop_the_walk() {
        let mut calls = 0;
        let result = accept_drafts(&[1, 2, 3], 10, |slot| {
            calls += 1;
            if slot == 1 {
                Err("projection failed")
            } else {
                Ok(slot as u32 + 1)
            }
        });
        assert_eq!(result, Err("projection failed"));
        assert_eq!(calls, 2);
    }

    #[test]
    fn precomputed_targets() {
        assert_eq!(
            accept_with_targets(&[11, 12, 13], &[11, 99, 77, 55], 10),
            Ok(Accepted {
                accepted: 1,
                new_tokens: vec![11, 99]
            })
        );
        assert_eq!(
            accept_with_targets(&[11, 12], &[11, 12], 10),
            Err(TooFewTargets {
                slot: 2,
                targets: 2
            })
        );
    }
}
