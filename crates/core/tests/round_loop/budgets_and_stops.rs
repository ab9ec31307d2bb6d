//! Token budgets, end-of-sequence ids and stop strings ending generation inside a round.

use specd_core::{BlockSizeConfig, FinishReason, StopConditions};

use crate::support::pieces::{decode, PIECES};
use crate::support::scenario::{
    finished_event, request, run, samplings, text_of, tokens_of, PROMPT, SEQ,
};
use crate::support::table_drafter::{Policy, TableDrafter};
use crate::support::table_target::reference_decode;
use crate::support::table_verifier::TableVerifier;

const LONG: usize = 64;

#[test]
fn max_tokens_inside_a_round_cuts_only_the_final_bonus() {
    let sampling = samplings()[0];
    let reference = reference_decode(&PROMPT, &sampling, 10, &[]);
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let stop = StopConditions::max_tokens(10);
    let (events, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), sampling, stop),
    );
    let finish = outcome.unwrap();
    assert_eq!(tokens_of(&events), reference);
    assert_eq!(finish.reason, FinishReason::Length);
    let log = verifier.log();
    // 1 prefill token, two rounds of 4, then remaining = 2 gives a block of 2 whose accepted
    // draft fills the budget and whose bonus is cut.
    let widths: Vec<(usize, usize)> = log
        .verifies
        .iter()
        .map(|v| (v.tokens.len(), v.budget))
        .collect();
    assert_eq!(widths, vec![(4, 9), (4, 5), (2, 1)]);
    // The cache held bonus + draft of the last block; it keeps all emitted tokens but the last.
    assert_eq!(log.truncates, vec![(SEQ, PROMPT.len() + 10 - 1)]);
}

#[test]
fn budgets_of_every_size_give_the_reference_prefix() {
    for sampling in samplings() {
        let reference = reference_decode(&PROMPT, &sampling, 20, &[]);
        for max_tokens in 1..=20 {
            for policy in [Policy::Oracle, Policy::PartlyRight] {
                let verifier = TableVerifier::default();
                let drafter = TableDrafter::new(policy);
                let stop = StopConditions::max_tokens(max_tokens);
                let (events, outcome) = run(
                    &verifier,
                    Some(&drafter),
                    request(BlockSizeConfig::fixed(6), sampling, stop),
                );
                let finish = outcome.unwrap();
                assert_eq!(
                    tokens_of(&events),
                    reference[..max_tokens],
                    "{max_tokens} {policy:?}"
                );
                assert_eq!(finish.reason, FinishReason::Length);
                let log = verifier.log();
                assert!(log.verifies.iter().all(|v| v.tokens.len() <= v.budget + 1));
                for &(_, len) in &log.truncates {
                    assert_eq!(len, PROMPT.len() + max_tokens - 1);
                }
            }
        }
    }
}

#[test]
fn one_token_budget_needs_no_round() {
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let stop = StopConditions::max_tokens(1);
    let (events, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), samplings()[0], stop),
    );
    let finish = outcome.unwrap();
    assert_eq!(tokens_of(&events).len(), 1);
    assert_eq!(finish.reason, FinishReason::Length);
    assert_eq!(finish.stats.rounds, 0);
    assert!(verifier.log().verifies.is_empty());
    assert!(drafter.log().drafts.is_empty());
}

/// First index `k >= from` whose token does not occur before it.
fn first_new_token_at_or_after(
    reference: &[u32],
    from: usize,
    accept: impl Fn(usize) -> bool,
) -> usize {
    (from..reference.len())
        .find(|&k| !reference[..k].contains(&reference[k]) && accept(k))
        .expect("the reference has a fresh token")
}

#[test]
fn eos_inside_a_round_ends_there_and_truncates() {
    let sampling = samplings()[0];
    let reference = reference_decode(&PROMPT, &sampling, LONG, &[]);
    // Oracle rounds of 4 cover output indices 1..=4, 5..=8, ...: pick an index that is not
    // the last of its round.
    let k = first_new_token_at_or_after(&reference, 2, |k| (k - 1) % 4 != 3);
    let eos = reference[k];
    let stop = StopConditions {
        eos_token_ids: vec![eos],
        ..StopConditions::max_tokens(LONG)
    };
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let (events, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), sampling, stop.clone()),
    );
    let finish = outcome.unwrap();
    assert_eq!(tokens_of(&events), reference[..=k]);
    assert_eq!(
        text_of(&events),
        decode(&reference[..k]),
        "eos adds no text"
    );
    assert_eq!(finish.reason, FinishReason::Eos);
    assert_eq!(finish.tokens_emitted, k + 1);
    assert_eq!(verifier.log().truncates, vec![(SEQ, PROMPT.len() + k)]);

    // The same with other drafters and block sizes, and with eos ignored.
    for policy in [Policy::Random, Policy::PartlyRight] {
        for block in [1, 3, 7] {
            let verifier = TableVerifier::default();
            let drafter = TableDrafter::new(policy);
            let (events, outcome) = run(
                &verifier,
                Some(&drafter),
                request(BlockSizeConfig::fixed(block), sampling, stop.clone()),
            );
            assert_eq!(tokens_of(&events), reference[..=k], "{policy:?} {block}");
            assert_eq!(outcome.unwrap().reason, FinishReason::Eos);
        }
    }
    let ignoring = StopConditions {
        ignore_eos: true,
        ..stop
    };
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let (events, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), sampling, ignoring),
    );
    assert_eq!(tokens_of(&events), reference);
    assert_eq!(outcome.unwrap().reason, FinishReason::Length);
}

fn ascii_piece(token: u32) -> Option<&'static str> {
    std::str::from_utf8(PIECES[token as usize])
        .ok()
        .filter(|p| !p.is_empty() && p.is_ascii() && *p != "<eos>")
}

#[test]
fn stop_string_spanning_two_tokens_inside_a_round() {
    let sampling = samplings()[1];
    let reference = reference_decode(&PROMPT, &sampling, LONG, &[]);
    // A stop string made of the last character of token k and the first of token k + 1,
    // chosen so that it first appears there and token k + 1 is not the last of its oracle
    // round of 4 (rounds cover indices 1..=4, 5..=8, ...).
    let (k, stop_string) = (1..reference.len() - 1)
        .find_map(|k| {
            let left = ascii_piece(reference[k])?;
            let right = ascii_piece(reference[k + 1])?;
            let stop = format!("{}{}", &left[left.len() - 1..], &right[..1]);
            let fresh = !decode(&reference[..=k]).contains(&stop);
            (fresh && (k + 1) % 4 != 0).then_some((k, stop))
        })
        .expect("the reference has a suitable token pair");
    let full_text = decode(&reference[..k + 2]);
    let cut = full_text.find(&stop_string).unwrap();
    let stop = StopConditions {
        stop_strings: vec![stop_string.clone()],
        ..StopConditions::max_tokens(LONG)
    };

    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let (events, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), sampling, stop.clone()),
    );
    let finish = outcome.unwrap();
    assert_eq!(
        tokens_of(&events),
        reference[..k + 2],
        "stop {stop_string:?}"
    );
    assert_eq!(text_of(&events), full_text[..cut]);
    assert_eq!(finish.reason, FinishReason::Stop);
    assert_eq!(
        finished_event(&events).map(|f| f.reason),
        Some(FinishReason::Stop)
    );
    assert_eq!(verifier.log().truncates, vec![(SEQ, PROMPT.len() + k + 1)]);

    for policy in [Policy::Random, Policy::Adversarial, Policy::PartlyRight] {
        for block in [1, 2, 5, 8] {
            let verifier = TableVerifier::default();
            let drafter = TableDrafter::new(policy);
            let (events, outcome) = run(
                &verifier,
                Some(&drafter),
                request(BlockSizeConfig::fixed(block), sampling, stop.clone()),
            );
            assert_eq!(tokens_of(&events), reference[..k + 2], "{policy:?} {block}");
            assert_eq!(text_of(&events), full_text[..cut], "{policy:?} {block}");
            assert_eq!(outcome.unwrap().reason, FinishReason::Stop);
            for &(_, len) in &verifier.log().truncates {
                assert_eq!(len, PROMPT.len() + k + 1);
            }
        }
    }
}

#[test]
fn text_deltas_reassemble_the_output_and_never_split_a_character() {
    for sampling in samplings() {
        let reference = reference_decode(&PROMPT, &sampling, LONG, &[]);
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::PartlyRight);
        let stop = StopConditions::max_tokens(LONG);
        let (events, _) = run(
            &verifier,
            Some(&drafter),
            request(BlockSizeConfig::fixed(3), sampling, stop),
        );
        let full = decode(&reference);
        assert_eq!(text_of(&events), full);
        if !full.contains('\u{FFFD}') {
            assert!(!text_of(&events).contains('\u{FFFD}'));
        }
    }
}
