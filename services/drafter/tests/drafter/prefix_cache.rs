//! A draft model's prefix cache: a session opened from a closed one's cache proposes exactly
//! the drafts of a session that prefilled its whole context, and only sessions of one scope
//! share.

use candle_core::Device;
use specd_core::{CacheScope, SamplingParams};
use specd_drafter::DrafterServerConfig;
use specd_drafter::{
    DraftCarry, DraftEngine, DraftModelEngine, DraftStep, OpenSession, SessionSource,
};
use specd_models::qwen2::Qwen2Model;
use specd_wire::drafter::{CloseRequest, OpenHeader};

use crate::qwen2_support::{TempGguf, TinySpec};
use crate::support::{open_messages, sampling, TestDrafter};

fn engine(file: &TempGguf, cache_bytes: usize) -> DraftModelEngine {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    DraftModelEngine::new(model, "tiny".into(), 8).with_prefix_cache(cache_bytes)
}

fn open(context: &[u32], scope: &str) -> OpenSession {
    OpenSession {
        sampling: SamplingParams::default(),
        committed_len: context.len(),
        source: SessionSource::Context(context.to_vec()),
        cache_scope: CacheScope(scope.into()),
    }
}

/// Drafts `rounds` rounds where the target accepts the first draft and then emits a token
/// of its own, the way a conversation's answer grows; returns every draft and the tokens
/// committed.
fn rounds(
    engine: &DraftModelEngine,
    session: &mut <DraftModelEngine as DraftEngine>::Session,
    context_len: usize,
    rounds: usize,
) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut all = Vec::new();
    let mut committed = Vec::new();
    let mut len = context_len;
    let mut bonus = 17u32;
    for round in 0..rounds {
        let drafts = engine
            .draft(
                session,
                DraftStep {
                    bonus,
                    position: len - 1,
                    count: 3,
                    output_index_base: round as u64,
                    branches: 0,
                },
            )
            .unwrap();
        let accepted = vec![bonus, drafts[0]];
        engine
            .apply(session, DraftCarry::Tokens(accepted.clone()))
            .unwrap();
        len += accepted.len();
        committed.extend(accepted);
        bonus = (drafts[0] * 7 + round as u32) % 256;
        all.push(drafts);
    }
    (all, committed)
}

#[test]
fn a_session_opened_from_a_cached_prefix_drafts_like_a_cold_one() {
    let file = TempGguf::tiny("drafter-prefix", &TinySpec::default());
    let (cold, warm) = (engine(&file, 0), engine(&file, 64 << 20));
    let mut context: Vec<u32> = (0..40).map(|i| (i * 11 + 3) % 256).collect();
    let mut held = 0;
    for turn in 0..3 {
        let mut a = cold.open(open(&context, "")).unwrap();
        let mut b = warm.open(open(&context, "")).unwrap();
        // What the open prefilled, for the router to price opens by.
        assert_eq!(cold.computed_at_open(&a), context.len(), "turn {turn}");
        assert_eq!(
            warm.computed_at_open(&b),
            context.len() - held,
            "turn {turn}"
        );
        let (drafts_a, committed) = rounds(&cold, &mut a, context.len(), 6);
        let (drafts_b, committed_b) = rounds(&warm, &mut b, context.len(), 6);
        assert_eq!(drafts_a, drafts_b, "turn {turn}");
        assert_eq!(committed, committed_b);
        cold.close(a);
        warm.close(b);
        held = context.len() + committed.len();
        context.extend(committed);
        context.extend([5, 6, 7]);
    }
    let view = warm.prefix_cache().unwrap();
    // Turns 2 and 3 opened from every token the turn before committed.
    assert_eq!(view.totals.lookups, 3);
    assert_eq!(view.totals.hit_tokens, (40 + 12) + (40 + 12 + 3 + 12));
    assert!(view.bytes > 0);
    assert!(cold.prefix_cache().is_none());
}

#[test]
fn scopes_keep_their_prefixes_apart() {
    let file = TempGguf::tiny("drafter-prefix-scope", &TinySpec::default());
    let warm = engine(&file, 64 << 20);
    let context: Vec<u32> = (0..30).map(|i| (i * 5 + 1) % 256).collect();
    let session = warm.open(open(&context, "a")).unwrap();
    warm.close(session);
    let mut longer = context.clone();
    longer.push(9);
    let other = warm.open(open(&longer, "b")).unwrap();
    warm.close(other);
    assert_eq!(warm.prefix_cache().unwrap().totals.hit_tokens, 0);
    let same = warm.open(open(&longer, "a")).unwrap();
    warm.close(same);
    assert_eq!(warm.prefix_cache().unwrap().totals.hit_tokens, 30);
}

#[tokio::test]
async fn an_open_answers_how_many_positions_it_prefilled() {
    let file = TempGguf::tiny("drafter-prefix-grpc", &TinySpec::default());
    let engine = std::sync::Arc::new(engine(&file, 64 << 20));
    let server = TestDrafter::start_engine(engine, DrafterServerConfig::default()).await;
    let mut client = server.client().await;
    let mut context: Vec<u32> = (0..40).map(|i| (i * 7 + 2) % 256).collect();
    let mut opens = Vec::new();
    for _ in 0..2 {
        let header = OpenHeader {
            sampling: sampling(),
            committed_len: context.len() as u32,
            context_ids: context.clone(),
            cache_scope: "chat".into(),
        };
        let opened = client
            .open(tokio_stream::iter(open_messages(header, None)))
            .await
            .unwrap()
            .into_inner();
        opens.push(opened.computed_positions);
        client
            .close(CloseRequest {
                session_id: opened.session_id,
            })
            .await
            .unwrap();
        context.extend([5, 6, 7]);
    }
    assert_eq!(
        opens,
        [Some(40), Some(3)],
        "the second open found the first's 40"
    );
}
