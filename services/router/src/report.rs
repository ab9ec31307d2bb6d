//! What a finished request reports: finish reason, matched stop string and statistics.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use specd_core::{Detokenizer, Finish, FinishReason as CoreFinish, TokenDelta};
use specd_wire::generation::{FinishReason, GenerationStats};

use specd_text::TargetText;

use crate::predraft::PredraftCounts;

/// Everything a request emitted so far.
#[derive(Debug, Default)]
pub struct Transcript {
    pub tokens: Vec<u32>,
    pub text: String,
    pub first_token_at: Option<Instant>,
}

impl Transcript {
    pub fn record(&mut self, delta: &TokenDelta) {
        if self.first_token_at.is_none() && !delta.tokens.is_empty() {
            self.first_token_at = Some(Instant::now());
        }
        self.tokens.extend_from_slice(&delta.tokens);
        self.text.push_str(&delta.text);
    }
}

/// Per-request facts the final message needs besides the round loop's [`Finish`].
#[derive(Debug, Clone)]
pub struct RequestFacts {
    pub started: Instant,
    pub prompt_tokens: usize,
    pub seed: u64,
    pub context_capped: bool,
    pub stop: Vec<String>,
    /// Drafter sessions re-opened elsewhere, counted while the request runs.
    pub resyncs: Arc<AtomicU32>,
    /// Moves to another verifier replica.
    pub migrations: Arc<AtomicU32>,
    /// Pre-draft hits and misses.
    pub predraft: Arc<PredraftCounts>,
}

/// The last message's fields.
pub struct FinalReport {
    pub finish_reason: FinishReason,
    pub matched_stop: String,
    pub stats: GenerationStats,
}

impl RequestFacts {
    pub fn report(
        &self,
        finish: &Finish,
        transcript: &Transcript,
        text: &TargetText,
    ) -> FinalReport {
        let finish_reason = match finish.reason {
            CoreFinish::Length if self.context_capped => FinishReason::ContextLength,
            CoreFinish::Length => FinishReason::Length,
            CoreFinish::Eos => FinishReason::Eos,
            CoreFinish::Stop => FinishReason::Stop,
            CoreFinish::Cancelled => FinishReason::Unspecified,
        };
        let matched_stop = if finish.reason == CoreFinish::Stop {
            matched_stop(&self.stop, &transcript.tokens, text)
        } else {
            String::new()
        };
        let spec = &finish.stats;
        let drafting_rounds = spec.drafted_at_position.first().copied().unwrap_or(0);
        let ms = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1e3;
        let now = Instant::now();
        let stats = GenerationStats {
            prompt_tokens: saturate(self.prompt_tokens as u64),
            completion_tokens: saturate(finish.tokens_emitted as u64),
            rounds: saturate(spec.rounds),
            drafted: saturate(spec.drafted),
            accepted: saturate(spec.accepted),
            accepted_per_position: spec
                .accepted_at_position
                .iter()
                .map(|&n| saturate(n))
                .collect(),
            mean_accepted_tokens_per_round: spec.accepted_tokens_per_round().unwrap_or(0.0),
            plain_rounds: saturate(spec.rounds.saturating_sub(drafting_rounds)),
            drafter_resyncs: self.resyncs.load(Ordering::Relaxed),
            verifier_migrations: self.migrations.load(Ordering::Relaxed),
            predraft_hits: self.predraft.hits(),
            predraft_misses: self.predraft.misses(),
            predraft_branch_hits: self.predraft.branch_hits(),
            overlap_switches: self.predraft.switches(),
            cached_prompt_tokens: saturate(spec.cached_prompt_tokens),
            forced_drafted: saturate(spec.forced_drafted),
            forced_accepted: saturate(spec.forced_accepted),
            tree_rounds: saturate(spec.tree_rounds),
            tree_branch_drafts: saturate(spec.tree_branch_drafts),
            seed: self.seed,
            time_to_first_token_ms: transcript
                .first_token_at
                .map_or(0.0, |at| ms(self.started, at)),
            total_time_ms: ms(self.started, now),
        };
        FinalReport {
            finish_reason,
            matched_stop,
            stats,
        }
    }
}

/// The stop string that ended the completion: the one starting earliest in the decoded
/// completion, ties to the first listed (the stop checker's rule).
fn matched_stop(stop: &[String], tokens: &[u32], text: &TargetText) -> String {
    let Ok(completion) = text.decode(tokens) else {
        return String::new();
    };
    stop.iter()
        .enumerate()
        .filter_map(|(i, s)| completion.find(s.as_str()).map(|at| (at, i)))
        .min()
        .map(|(_, i)| stop[i].clone())
        .unwrap_or_default()
}

fn saturate(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
