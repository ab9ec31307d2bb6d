//! An output constraint holds in plain and speculative rounds alike: every emitted token is
//! one the constraint allowed at its position, speculative output equals plain output under
//! the same constraint, refused drafts never reach the verifier, and forced tokens are
//! verified as free drafts.

use specd_core::sampling::sample;
use specd_core::{
    BlockMasks, BlockSizeConfig, ConstraintError, RequestControl, RoundLoop, StopConditions,
    TokenConstraint, TokenMask,
};

use crate::support::executor::block_on;
use crate::support::pieces::Pieces;
use crate::support::scenario::{finished_event, request, samplings, tokens_of, PROMPT};
use crate::support::table_drafter::{Policy, TableDrafter};
use crate::support::table_target::{target_logits, VOCAB};
use crate::support::table_verifier::TableVerifier;

const MAX_TOKENS: usize = 36;

/// Tokens alternate between even and odd ids, except that 3 must be followed by 5, 7, 9
/// (a fixed string the format forces).
#[derive(Clone, Default)]
struct Alternating {
    emitted: Vec<u32>,
    /// The format is complete after this many tokens.
    complete_after: Option<usize>,
}

const FORCED_AFTER_3: [u32; 3] = [5, 7, 9];

fn allowed_after(history: &[u32]) -> Vec<u32> {
    let since_3 = history.iter().rev().position(|&t| t == 3);
    if let Some(back) = since_3 {
        if back < FORCED_AFTER_3.len() && history[history.len() - back..] == FORCED_AFTER_3[..back]
        {
            return vec![FORCED_AFTER_3[back]];
        }
    }
    let parity = history.len() % 2;
    (0..VOCAB).filter(|t| *t as usize % 2 == parity).collect()
}

impl Alternating {
    fn mask_after(history: &[u32]) -> TokenMask {
        TokenMask::allowing(VOCAB as usize, &allowed_after(history))
    }
}

impl TokenConstraint for Alternating {
    fn next_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        Ok(Self::mask_after(&self.emitted))
    }

    fn block_masks(&mut self, drafts: &[u32]) -> Result<BlockMasks, ConstraintError> {
        let mut history = self.emitted.clone();
        let mut masks = vec![Self::mask_after(&history)];
        for &draft in drafts {
            if !masks[masks.len() - 1].allows(draft) {
                break;
            }
            history.push(draft);
            masks.push(Self::mask_after(&history));
        }
        Ok(BlockMasks {
            kept: masks.len() - 1,
            masks,
        })
    }

    fn commit(&mut self, tokens: &[u32]) -> Result<(), ConstraintError> {
        for &token in tokens {
            if !allowed_after(&self.emitted).contains(&token) {
                return Err(ConstraintError(format!("token {token} refused")));
            }
            self.emitted.push(token);
        }
        Ok(())
    }

    fn forced(&mut self, max: usize) -> Vec<u32> {
        let mut history = self.emitted.clone();
        let mut forced = Vec::new();
        while forced.len() < max {
            match allowed_after(&history)[..] {
                [only] => {
                    forced.push(only);
                    history.push(only);
                }
                _ => break,
            }
        }
        forced
    }

    fn is_complete(&self) -> bool {
        self.complete_after.is_some_and(|n| self.emitted.len() >= n)
    }
}

/// Plain decoding under the constraint, written apart from the round loop.
fn reference(sampling: &specd_core::SamplingParams) -> Vec<u32> {
    let mut context = PROMPT.to_vec();
    let mut out = Vec::new();
    for index in 0..MAX_TOKENS {
        let mut logits = target_logits(&context);
        Alternating::mask_after(&out).apply(&mut logits).unwrap();
        let token = sample(&logits, sampling, index as u64).unwrap();
        out.push(token);
        context.push(token);
    }
    out
}

fn run_constrained(
    verifier: &TableVerifier,
    drafter: Option<&TableDrafter>,
    block_size: BlockSizeConfig,
    sampling: specd_core::SamplingParams,
    forced_drafts: usize,
) -> (Vec<u32>, specd_core::Finish) {
    run_format(
        verifier,
        drafter,
        block_size,
        sampling,
        forced_drafts,
        Alternating::default(),
    )
}

fn run_format(
    verifier: &TableVerifier,
    drafter: Option<&TableDrafter>,
    block_size: BlockSizeConfig,
    sampling: specd_core::SamplingParams,
    forced_drafts: usize,
    format: Alternating,
) -> (Vec<u32>, specd_core::Finish) {
    let mut request = request(block_size, sampling, StopConditions::max_tokens(MAX_TOKENS));
    request.forced_drafts = forced_drafts;
    let mut events = Vec::new();
    let outcome = block_on(RoundLoop::new(verifier, drafter, &Pieces).run_constrained(
        request,
        Some(Box::new(format)),
        &mut events,
        &RequestControl::new(),
    ));
    let finish = outcome.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(finished_event(&events), Some(&finish));
    (tokens_of(&events), finish)
}

#[test]
fn constrained_speculative_output_equals_constrained_plain_output() {
    for sampling in samplings() {
        let expected = reference(&sampling);
        for (i, &token) in expected.iter().enumerate() {
            assert!(allowed_after(&expected[..i]).contains(&token));
        }
        let plain = TableVerifier::default();
        let (tokens, _) = run_constrained(&plain, None, BlockSizeConfig::PLAIN, sampling, 0);
        assert_eq!(tokens, expected, "plain, {sampling:?}");
        for policy in [Policy::Oracle, Policy::Random, Policy::Adversarial] {
            for block in [2, 4, 8] {
                for forced in [0, 7] {
                    let case = format!("{sampling:?} {policy:?} block {block} forced {forced}");
                    let verifier = TableVerifier::default();
                    let drafter = TableDrafter::new(policy);
                    let (tokens, _) = run_constrained(
                        &verifier,
                        Some(&drafter),
                        BlockSizeConfig::fixed(block),
                        sampling,
                        forced,
                    );
                    assert_eq!(tokens, expected, "{case}");
                    // No draft the constraint refuses reached the verifier.
                    let log = verifier.log();
                    for verify in &log.verifies {
                        assert_eq!(verify.masks.len(), verify.tokens.len(), "{case}");
                        // The bonus is the last emitted token before the round.
                        let before = verify.output_index_base as usize;
                        let mut ahead = tokens[..before].to_vec();
                        for &draft in verify.drafts() {
                            assert!(allowed_after(&ahead).contains(&draft), "{case}");
                            ahead.push(draft);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn forced_tokens_are_verified_as_free_drafts() {
    // Greedy on the table target: find a case where 3 shows up, so 5, 7, 9 are forced.
    for sampling in samplings() {
        let expected = reference(&sampling);
        let Some(at) = expected.iter().position(|&t| t == 3) else {
            continue;
        };
        if at + FORCED_AFTER_3.len() >= MAX_TOKENS {
            continue;
        }
        let verifier = TableVerifier::default();
        let (tokens, finish) =
            run_constrained(&verifier, None, BlockSizeConfig::PLAIN, sampling, 7);
        assert_eq!(tokens, expected);
        assert!(
            finish.stats.forced_drafted >= FORCED_AFTER_3.len() as u64,
            "{finish:?}"
        );
        assert_eq!(finish.stats.forced_accepted, finish.stats.forced_drafted);
        // Without forced drafts, the same tokens take a round each.
        let verifier_off = TableVerifier::default();
        let (tokens_off, finish_off) =
            run_constrained(&verifier_off, None, BlockSizeConfig::PLAIN, sampling, 0);
        assert_eq!(tokens_off, expected);
        assert_eq!(finish_off.stats.forced_drafted, 0);
        assert!(finish.stats.rounds < finish_off.stats.rounds);
        return;
    }
    panic!("no sampling setup emitted a 3 early enough to force a string");
}

#[test]
fn generation_ends_at_the_token_that_completes_the_format() {
    const COMPLETE_AFTER: usize = 11;
    for sampling in samplings() {
        let expected = reference(&sampling)[..COMPLETE_AFTER].to_vec();
        let format = || Alternating {
            complete_after: Some(COMPLETE_AFTER),
            ..Alternating::default()
        };
        for (drafter, block) in [
            (None, 1),
            (Some(Policy::Oracle), 4),
            (Some(Policy::Random), 8),
        ] {
            let verifier = TableVerifier::default();
            let drafter = drafter.map(TableDrafter::new);
            let block = match block {
                1 => BlockSizeConfig::PLAIN,
                n => BlockSizeConfig::fixed(n),
            };
            let (tokens, finish) =
                run_format(&verifier, drafter.as_ref(), block, sampling, 7, format());
            assert_eq!(tokens, expected, "{sampling:?} {block:?}");
            assert_eq!(finish.reason, specd_core::FinishReason::Eos);
            assert_eq!(finish.tokens_emitted, COMPLETE_AFTER);
        }
    }
}
