//! Reading the drafts that follow a matched n-gram.

/// Up to `count` tokens from position `end` on of the context `history ++ [bonus]`.
///
/// The read is an overlapping copy: once it passes the end of the context it goes on over
/// the tokens it has just proposed. A match close to the end (the common case on periodic
/// text, since the most recent occurrence wins) thereby repeats the period instead of
/// stopping short of `count`. At most as many tokens as the context holds are proposed, so
/// an outsized `count` costs no more memory than the session already uses.
pub(crate) fn continuation(history: &[u32], bonus: u32, end: usize, count: usize) -> Vec<u32> {
    let context_len = history.len() + 1;
    let wanted = count.min(context_len);
    let mut drafts = Vec::with_capacity(wanted);
    for position in end..end.saturating_add(wanted) {
        let token = match position.checked_sub(history.len()) {
            None => history[position],
            Some(0) => bonus,
            Some(past_context) => match drafts.get(past_context - 1) {
                Some(&token) => token,
                None => break,
            },
        };
        drafts.push(token);
    }
    drafts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_history_then_bonus() {
        let history = [5, 6, 7, 8];
        assert_eq!(continuation(&history, 9, 1, 2), [6, 7]);
        assert_eq!(continuation(&history, 9, 1, 4), [6, 7, 8, 9]);
        assert_eq!(continuation(&history, 9, 4, 1), [9]);
        assert_eq!(continuation(&history, 9, 2, 0), [] as [u32; 0]);
    }

    #[test]
    fn copies_over_its_own_proposals_past_the_end() {
        // Context 1 2 3 1 2 | bonus 3; a match ending at 3 proposes the period 1 2 3 again.
        let history = [1, 2, 3, 1, 2];
        assert_eq!(continuation(&history, 3, 3, 5), [1, 2, 3, 1, 2]);
        // A match ending at the bonus repeats it: period 1.
        assert_eq!(continuation(&history, 3, 5, 3), [3, 3, 3]);
    }

    #[test]
    fn never_proposes_more_than_the_context_holds() {
        let history = [4, 4];
        assert_eq!(continuation(&history, 4, 1, usize::MAX), [4, 4, 4]);
        assert_eq!(continuation(&[], 7, 0, 10), [7]);
    }
}
