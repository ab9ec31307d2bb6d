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

/// The draft model's own greedy next token after `tokens` (a fresh cache, one block).
fn next_after(engine: &DraftModelEngine, tokens: &[u32]) -> u32 {
    let model = engine.model();
    let mut cache = CausalLm::new_cache(model, 0).unwrap();
    let mut rows = [SeqBlock {
        cache: &mut cache,
        tokens,
    }];
    let last = model
        .forward(&mut rows, OutputRows::Last)
        .unwrap()
        .pop()
        .unwrap();
    model.argmax_below(&last, engine.draft_vocab()).unwrap()[0]
}

#[test]
fn pre_drafted_sessions_propose_what_plain_sessions_do() {
    let file = TempGguf::tiny("predraft", &TinySpec::default());
    let (plain, pre) = (engine(&file), engine(&file));
    let context = vec![1u32, 2, 3, 4, 5];
    let open = || OpenSession {
        sampling: SamplingParams::default(),
        committed_len: context.len(),
        source: SessionSource::Context(context.clone()),
    };
    let (mut a, mut b) = (plain.open(open()).unwrap(), pre.open(open()).unwrap());
    let vocab = 256u32;
    // Every token so far: the context, then every emitted token (the last is the bonus).
    let mut history = context.clone();
    let mut bonus = 9u32;
    history.push(bonus);
    let (mut hits, mut expected_hits) = (0, 0);
    let mut expect_hit = false;
    for round in 0..18usize {
        let count = [3, 3, 2, 4, 1, 3][round % 6];
        let step = DraftStep {
            bonus,
            position: history.len() - 2,
            count,
            output_index_base: 0,
        };
        let drafts = plain.draft(&mut a, step).unwrap();
        assert_eq!(pre.draft(&mut b, step).unwrap(), drafts, "round {round}");
        assert_eq!(pre.predraft_hit(&b), expect_hit, "round {round}");
        hits += usize::from(pre.predraft_hit(&b));
        // While the round is verified: the whole pre-draft, or only part of it.
        let next_count = [3, 3, 2, 4, 1, 3][(round + 1) % 6];
        let steps = if round % 4 == 3 { 1 } else { next_count + 1 };
        for _ in 0..steps {
            pre.predraft_step(&mut b, next_count).unwrap();
        }
        // The target: all accepted and its own next token (the drafter's guess), all
        // accepted and another token, or a rejection.
        let mut with_drafts = history.clone();
        with_drafts.extend_from_slice(&drafts);
        let guess = next_after(&pre, &with_drafts);
        let (accepted, next) = match round % 3 {
            0 => (count, guess),
            1 => (count, (guess + 1) % vocab),
            _ => (count / 2, (drafts[count / 2] + 1) % vocab),
        };
        expect_hit = round % 3 == 0;
        expected_hits += usize::from(expect_hit);
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
    assert_eq!(hits + usize::from(expect_hit), expected_hits);
    assert!(hits >= 5, "{hits} hits");
}
