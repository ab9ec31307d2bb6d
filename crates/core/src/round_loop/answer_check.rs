//! Checks a verifier's answer against what the round asked for.

/// Checks that `accepted` and `new_tokens` are what an acceptance walk of `drafts` with
/// `budget` can produce: `accepted <= drafts`, `new_tokens` are the accepted drafts then one
/// target token, cut to the budget.
pub(crate) fn check_verify_answer(
    drafts: &[u32],
    budget: usize,
    accepted: usize,
    new_tokens: &[u32],
) -> Result<(), String> {
    if accepted > drafts.len() {
        return Err(format!(
            "accepted {accepted} of only {} drafts",
            drafts.len()
        ));
    }
    let expected_len = (accepted + 1).min(budget);
    if new_tokens.len() != expected_len {
        return Err(format!(
            "{} new tokens, expected {expected_len} (accepted {accepted}, budget {budget})",
            new_tokens.len()
        ));
    }
    let echoed = accepted.min(new_tokens.len());
    if new_tokens[..echoed] != drafts[..echoed] {
        return Err("new tokens do not start with the accepted drafts".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_consistent_answers() {
        assert!(check_verify_answer(&[1, 2, 3], 10, 1, &[1, 9]).is_ok());
        assert!(check_verify_answer(&[1, 2], 10, 2, &[1, 2, 7]).is_ok());
        assert!(check_verify_answer(&[1, 2], 2, 2, &[1, 2]).is_ok());
        assert!(check_verify_answer(&[], 1, 0, &[5]).is_ok());
    }

    #[test]
    fn rejects_inconsistent_answers() {
        assert!(check_verify_answer(&[1], 10, 2, &[1, 2, 3]).is_err());
        assert!(check_verify_answer(&[1, 2], 10, 1, &[1, 2, 3]).is_err());
        assert!(check_verify_answer(&[1, 2], 10, 1, &[1]).is_err());
        assert!(check_verify_answer(&[1, 2], 10, 1, &[3, 4]).is_err());
        assert!(check_verify_answer(&[1, 2], 1, 1, &[1, 2]).is_err());
    }
}
