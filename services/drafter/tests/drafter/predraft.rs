//! Pre-drafting on a real draft model (a tiny random Qwen2 GGUF): whatever the target does
//! with a round, a session that pre-drafted while the round was verified proposes exactly the
//! drafts a session that did not would, and uses its pre-draft when the target's next token
//! is the one it guessed.

use candle_core::Device;
use specd_core::SamplingParams;
use specd_drafter::{
    DraftCarry, DraftEngine, DraftModelEngine, DraftStep, OpenSession, SessionSource,
};
use specd_models::qwen2::Qwen2Model;
use specd_models::{CausalLm, OutputRows, SeqBlock};

use crate::qwen2_support::{TempGguf, TinySpec};

fn engine(file: &TempGguf) -> DraftModelEngine {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    DraftModelEngine::new(model, "tiny".into(), 8)
}

/// The draft model's own greedy next token and runner-up after `tokens` (a fresh cache,
/// one block).
fn top_two_after(engine: &DraftModelEngine, tokens: &[u32]) -> (u32, u32) {
    let model = engine.model();
    let mut cache = CausalLm::new_cache(model, 0).unwrap();
    let mut rows = [SeqBlock::chain(&mut cache, tokens)];
    let last = model
        .forward(&mut rows, OutputRows::Last)
        .unwrap()
        .pop()
        .unwrap();
    let top = model.top_two_below(&last, engine.draft_vocab()).unwrap()[0];
    assert_eq!(
        top.best.0,
        model.argmax_below(&last, engine.draft_vocab()).unwrap()[0]
    );
    (top.best.0, top.runner_up.unwrap().0)
}

/// What the target does with a round in [`run_rounds`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    /// Every draft accepted, then the drafter's own next token (the pre-draft's guess).
    AllAcceptedAsGuessed,
    /// Every draft accepted, then another token.
    AllAcceptedOtherwise,
    /// Half the drafts accepted, then a token that is neither the draft nor the drafter's
    /// runner-up there.
    Rejected,
    /// Half the drafts accepted, then the drafter's runner-up there (a branch's guess).
    RejectedAsBranched,
    /// No draft accepted, then the token the all-accepted pre-draft guessed (where it
    /// differs from the first draft): a pre-draft made for another round must not be used.
    RejectedWithTheGuess,
}

const OUTCOMES: [Outcome; 5] = [
    Outcome::AllAcceptedAsGuessed,
    Outcome::RejectedAsBranched,
    Outcome::AllAcceptedOtherwise,
    Outcome::RejectedWithTheGuess,
    Outcome::Rejected,
];

#[derive(Debug, Default, PartialEq)]
struct Tally {
    hits: usize,
    branch_hits: usize,
}

/// Runs `rounds` rounds on a session that pre-drafts with `branches` rejection branches,
/// beside a session that never pre-drafts: both must propose the same drafts every round.
/// Returns the hits the pre-drafting session reported, after checking each against what
/// the round's outcome implies where that is certain.
fn run_rounds(branches: usize, rounds: usize) -> Tally {
    let file = TempGguf::tiny("predraft", &TinySpec::default());
    let (plain, pre) = (engine(&file), engine(&file));
    let context = vec![1u32, 2, 3, 4, 5];
    let open = || OpenSession {
        sampling: SamplingParams::default(),
        committed_len: context.len(),
        source: SessionSource::Context(context.clone()),
        cache_scope: Default::default(),
    };
    let (mut a, mut b) = (plain.open(open()).unwrap(), pre.open(open()).unwrap());
    let vocab = 256u32;
    // Every token so far: the context, then every emitted token (the last is the bonus).
    let mut history = context.clone();
    let mut bonus = 9u32;
    history.push(bonus);
    let mut tally = Tally::default();
    // The hit the last round's outcome implies: None where it is not certain.
    let mut expect: Option<(bool, bool)> = Some((false, false));
    for round in 0..rounds {
        let count = [3, 3, 2, 4, 1, 3][round % 6];
        let step = |branches| DraftStep {
            bonus,
            position: history.len() - 2,
            count,
            output_index_base: 0,
            branches,
        };
        let drafts = plain.draft(&mut a, step(0)).unwrap();
        assert_eq!(
            pre.draft(&mut b, step(branches)).unwrap(),
            drafts,
            "round {round}"
        );
        let hit = (pre.predraft_hit(&b), pre.predraft_branch_hit(&b));
        if let Some(expected) = expect {
            assert_eq!(hit, expected, "round {round}");
        }
        tally.hits += usize::from(hit.0);
        tally.branch_hits += usize::from(hit.1);
        // While the round is verified: the whole pre-draft, or only part of it.
        let next_count = [3, 3, 2, 4, 1, 3][(round + 1) % 6];
        let steps = if round % 4 == 3 { 1 } else { next_count + 1 };
        for _ in 0..steps {
            pre.predraft_step(&mut b, next_count).unwrap();
        }
        let mut with_drafts = history.clone();
        with_drafts.extend_from_slice(&drafts);
        let (guess, _) = top_two_after(&pre, &with_drafts);
        let at = count / 2;
        let mut before = history.clone();
        before.extend_from_slice(&drafts[..at]);
        let (_, runner_up) = top_two_after(&pre, &before);
        let outcome = OUTCOMES[round % OUTCOMES.len()];
        let (accepted, next) = match outcome {
            Outcome::AllAcceptedAsGuessed => (count, guess),
            Outcome::AllAcceptedOtherwise => (count, (guess + 1) % vocab),
            Outcome::Rejected => {
                let mut next = (drafts[at] + 1) % vocab;
                while next == runner_up || next == drafts[at] {
                    next = (next + 1) % vocab;
                }
                (at, next)
            }
            Outcome::RejectedAsBranched => (at, runner_up),
            Outcome::RejectedWithTheGuess if guess != drafts[0] => (0, guess),
            Outcome::RejectedWithTheGuess => (0, (drafts[0] + 1) % vocab),
        };
        // Branches are certain to exist for every rejection point when there are at least
        // as many as drafts.
        let every_point = branches >= count;
        expect = match outcome {
            Outcome::AllAcceptedAsGuessed => Some((true, false)),
            Outcome::AllAcceptedOtherwise | Outcome::Rejected => Some((false, false)),
            Outcome::RejectedAsBranched if every_point => Some((true, true)),
            Outcome::RejectedAsBranched if branches == 0 => Some((false, false)),
            Outcome::RejectedWithTheGuess if branches == 0 => Some((false, false)),
            _ => None,
        };
        let mut committed = vec![bonus];
        committed.extend_from_slice(&drafts[..accepted]);
        plain
            .apply(&mut a, DraftCarry::Tokens(committed.clone()))
            .unwrap();
        pre.apply(&mut b, DraftCarry::Tokens(committed)).unwrap();
        history.extend_from_slice(&drafts[..accepted]);
        history.push(next);
        bonus = next;
    }
    tally
}

#[test]
fn pre_drafted_sessions_propose_what_plain_sessions_do() {
    let tally = run_rounds(0, 30);
    assert!(tally.hits >= 5, "{tally:?}");
    assert_eq!(tally.branch_hits, 0);
}

#[test]
fn branched_pre_drafts_start_rounds_after_rejections_and_change_no_draft() {
    // Every rejection point branched: each rejection with the runner-up is a branch hit.
    let every = run_rounds(8, 30);
    assert!(every.branch_hits >= 5, "{every:?}");
    assert!(every.hits >= every.branch_hits + 5, "{every:?}");
    // One branch, at the likeliest point: the drafts are still the plain ones.
    let one = run_rounds(1, 30);
    assert!(one.hits >= 5, "{one:?}");
}

/// Sessions drafted together ([`DraftEngine::draft_many`]: one packed forward per draft
/// step) and pre-drafted together ([`DraftEngine::predraft_many`]) propose exactly the
/// drafts each proposes alone without pre-drafting, with different draft counts, one
/// session branching, and rounds accepted in full or in part.
#[test]
fn sessions_drafted_together_propose_what_each_proposes_alone() {
    let file = TempGguf::tiny("predraft-batched", &TinySpec::default());
    let (alone, together) = (engine(&file), engine(&file));
    let contexts = [
        vec![1u32, 2, 3, 4, 5],
        vec![7u32, 8, 9],
        vec![3u32, 1, 4, 1, 5, 9, 2, 6],
    ];
    let open = |context: &Vec<u32>| OpenSession {
        sampling: SamplingParams::default(),
        committed_len: context.len(),
        source: SessionSource::Context(context.clone()),
        cache_scope: Default::default(),
    };
    let mut solo: Vec<_> = contexts
        .iter()
        .map(|c| alone.open(open(c)).unwrap())
        .collect();
    let mut batched: Vec<_> = contexts
        .iter()
        .map(|c| together.open(open(c)).unwrap())
        .collect();
    let mut bonuses = [9u32, 11, 13];
    let mut histories: Vec<Vec<u32>> = contexts
        .iter()
        .zip(bonuses)
        .map(|(c, bonus)| [c.as_slice(), &[bonus]].concat())
        .collect();
    let count = |round: usize, i: usize| 1 + (round + i) % 4;
    let mut hits = 0;
    for round in 0..24 {
        let steps: Vec<DraftStep> = (0..3)
            .map(|i| DraftStep {
                bonus: bonuses[i],
                position: histories[i].len() - 2,
                count: count(round, i),
                output_index_base: 0,
                branches: i % 2,
            })
            .collect();
        let expected: Vec<Vec<u32>> = solo
            .iter_mut()
            .zip(&steps)
            .map(|(session, step)| {
                alone
                    .draft(
                        session,
                        DraftStep {
                            branches: 0,
                            ..*step
                        },
                    )
                    .unwrap()
            })
            .collect();
        let mut jobs: Vec<_> = batched.iter_mut().zip(steps.iter().copied()).collect();
        let drafted: Vec<Vec<u32>> = together
            .draft_many(&mut jobs)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(drafted, expected, "round {round}");
        hits += batched.iter().filter(|s| together.predraft_hit(s)).count();
        // While the round is verified: every session's pre-draft, together, to the end.
        for _ in 0..16 {
            let mut jobs: Vec<_> = batched
                .iter_mut()
                .enumerate()
                .map(|(i, session)| (session, count(round + 1, i)))
                .collect();
            let more = together.predraft_many(&mut jobs);
            if !more.iter().any(|r| matches!(r, Ok(true))) {
                assert!(more.iter().all(Result::is_ok), "{more:?}");
                break;
            }
        }
        for i in 0..3 {
            let drafts = &drafted[i];
            let mut with_drafts = histories[i].clone();
            with_drafts.extend_from_slice(drafts);
            let (guess, _) = top_two_after(&together, &with_drafts);
            // Every other round of each session is accepted in full with the pre-draft's
            // guess; the others keep half the drafts and then take another token.
            let (accepted, next) = if (round + i) % 2 == 0 {
                (drafts.len(), guess)
            } else {
                let at = drafts.len() / 2;
                (at, (drafts[at] + 1) % 256)
            };
            let mut committed = vec![bonuses[i]];
            committed.extend_from_slice(&drafts[..accepted]);
            alone
                .apply(&mut solo[i], DraftCarry::Tokens(committed.clone()))
                .unwrap();
            together
                .apply(&mut batched[i], DraftCarry::Tokens(committed))
                .unwrap();
            histories[i].extend_from_slice(&drafts[..accepted]);
            histories[i].push(next);
            bonuses[i] = next;
        }
    }
    // Half the rounds of every session after the first went as its pre-draft guessed.
    assert!(hits >= 30, "{hits} pre-draft hits");
}
