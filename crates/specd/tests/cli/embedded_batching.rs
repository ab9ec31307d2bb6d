//! The one-process server's drafter: the rounds of concurrent requests that wait at the same
//! moment are drafted together (one packed forward per draft step of a real draft model, a
//! tiny random Qwen2 GGUF), and each request gets the drafts it gets alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use specd::embedded_drafter::{EmbeddedDrafter, InProcessCarry};
use specd_core::{DraftRequest, Drafter, OpenRequest, SamplingParams, SessionId};
use specd_drafter::{DraftCarry, DraftModelEngine, EngineError, SessionSource};
use specd_models::qwen2::Qwen2Model;
use specd_verifier::TargetCarry;

use crate::qwen2_support::{TempGguf, TinySpec};
use crate::recording::Recording;

impl InProcessCarry for Recording {
    fn open_from(
        &self,
        request: &OpenRequest<TargetCarry>,
    ) -> Result<(SessionSource, Vec<DraftCarry>), EngineError> {
        self.inner.open_from(request)
    }

    fn carries_of(
        &self,
        request: &DraftRequest<TargetCarry>,
    ) -> Result<Vec<DraftCarry>, EngineError> {
        self.inner.carries_of(request)
    }
}

fn draft_model(file: &TempGguf) -> DraftModelEngine {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    DraftModelEngine::new(model, "tiny".into(), 8)
}

fn open(session: u64, context: &[u32]) -> OpenRequest<TargetCarry> {
    OpenRequest {
        session: SessionId(session),
        prompt_ids: context.to_vec(),
        sampling: SamplingParams::default(),
        carry: TargetCarry {
            hidden: Tensor::zeros((1, 1), candle_core::DType::F32, &Device::Cpu).unwrap(),
            shared_kv: None,
            committed: Vec::new(),
            committed_len: context.len(),
        },
        cache_scope: Default::default(),
    }
}

/// Round `round` of session `i`: the first after open, then one that commits the previous
/// round's bonus and first draft.
fn round(i: usize, context_len: usize, round: u32, committed: &[u32]) -> DraftRequest<TargetCarry> {
    DraftRequest {
        session: SessionId(i as u64),
        round,
        bonus: 10 + i as u32 + round,
        carries: Vec::new(),
        committed_tokens: committed.to_vec(),
        committed_len: context_len + committed.len(),
        output_index_base: u64::from(round),
        count: 1 + i % 4,
        tree_nodes: 0,
        least_branch_chance: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_rounds_are_drafted_together_and_unchanged() {
    let file = TempGguf::tiny("embedded-batching", &TinySpec::default());
    let served = Arc::new(
        EmbeddedDrafter::new(Recording::new(draft_model(&file)))
            .serving()
            .unwrap(),
    );
    let alone = EmbeddedDrafter::new(draft_model(&file));
    let contexts: Vec<Vec<u32>> = vec![
        vec![1, 2, 3, 4, 5],
        vec![7, 8, 9],
        vec![3, 1, 4, 1, 5, 9, 2, 6],
        vec![200, 17],
        vec![5, 5, 5, 5],
    ];
    for (i, context) in contexts.iter().enumerate() {
        served.open(open(i as u64, context)).await.unwrap();
        alone.open(open(i as u64, context)).await.unwrap();
    }
    let mut committed: Vec<Vec<u32>> = vec![Vec::new(); contexts.len()];
    for number in 1..=2 {
        let calls: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(i, context)| {
                let (served, request) = (
                    served.clone(),
                    round(i, context.len(), number, &committed[i]),
                );
                tokio::spawn(async move { served.draft(request).await.unwrap() })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            let drafted = call.await.unwrap();
            let request = round(i, contexts[i].len(), number, &committed[i]);
            let bonus = request.bonus;
            assert_eq!(
                alone.draft(request).await.unwrap(),
                drafted,
                "session {i}, round {number}"
            );
            committed[i].extend([bonus, drafted[0]]);
        }
    }
    let engine = served.engine();
    assert!(
        engine.largest.load(Ordering::SeqCst) >= 2,
        "no two of {} rounds were drafted together ({} batches)",
        2 * contexts.len(),
        engine.batches.load(Ordering::SeqCst)
    );
}
