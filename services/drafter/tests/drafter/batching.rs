//! Batched drafting through the service: Draft calls of several sessions that wait at the
//! same moment are drafted in one batch (one packed forward per draft step of a real draft
//! model, a tiny random Qwen2 GGUF), and every session gets the drafts it gets alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use candle_core::Device;
use specd_core::SamplingParams;
use specd_drafter::{
    DraftEngine, DraftModelEngine, DraftStep, DrafterServerConfig, OpenSession, SessionSource,
};
use specd_models::qwen2::Qwen2Model;
use specd_wire::drafter::{draft_request, DraftRequest, OpenHeader, TokenCarry};

use crate::qwen2_support::{TempGguf, TinySpec};
use crate::recording::Recording;
use crate::support::*;

fn draft_model(file: &TempGguf) -> DraftModelEngine {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    DraftModelEngine::new(model, "tiny".into(), MAX_DRAFTS)
}

fn round_one(session_id: String, context_len: usize, bonus: u32, count: u32) -> DraftRequest {
    DraftRequest {
        session_id,
        round: 1,
        bonus,
        position: context_len as u32 - 1,
        count,
        output_index_base: 0,
        carry: Some(draft_request::Carry::Tokens(TokenCarry::default())),
        predraft: false,
        predraft_branches: 0,
        tree_nodes: 0,
        least_branch_chance: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drafts_waiting_together_are_batched_and_unchanged() {
    let file = TempGguf::tiny("drafter-batching", &TinySpec::default());
    let engine = Arc::new(Recording::new(draft_model(&file)));
    let server = TestDrafter::start_engine(engine.clone(), DrafterServerConfig::default()).await;
    let contexts: Vec<Vec<u32>> = vec![
        vec![1, 2, 3, 4, 5],
        vec![7, 8, 9],
        vec![3, 1, 4, 1, 5, 9, 2, 6],
        vec![200, 17],
        vec![5, 5, 5, 5],
    ];
    let mut sessions = Vec::new();
    for context in &contexts {
        let header = OpenHeader {
            sampling: sampling(),
            committed_len: context.len() as u32,
            context_ids: context.clone(),
            cache_scope: String::new(),
        };
        let mut client = server.client().await;
        let opened = client
            .open(tokio_stream::iter(open_messages(header, None)))
            .await
            .unwrap();
        sessions.push(opened.into_inner().session_id);
    }
    // Every session's first round at once, with different bonuses and counts.
    let mut calls = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let request = round_one(
            session.clone(),
            contexts[i].len(),
            10 + i as u32,
            1 + (i % 4) as u32,
        );
        let mut client = server.client().await;
        calls.push(tokio::spawn(async move {
            draft(&mut client, request).await.unwrap()
        }));
    }
    let mut drafted = Vec::new();
    for call in calls {
        drafted.push(call.await.unwrap());
    }
    assert!(
        engine.largest.load(Ordering::SeqCst) >= 2,
        "no two of {} calls were drafted together",
        sessions.len()
    );
    // The same sessions alone, one at a time, in this process.
    let alone = draft_model(&file);
    for (i, context) in contexts.iter().enumerate() {
        let mut session = alone
            .open(OpenSession {
                sampling: SamplingParams::default(),
                committed_len: context.len(),
                source: SessionSource::Context(context.clone()),
                cache_scope: Default::default(),
            })
            .unwrap();
        let step = DraftStep {
            bonus: 10 + i as u32,
            position: context.len() - 1,
            count: 1 + i % 4,
            output_index_base: 0,
            branches: 0,
        };
        assert_eq!(alone.draft(&mut session, step).unwrap(), drafted[i], "{i}");
    }
}
