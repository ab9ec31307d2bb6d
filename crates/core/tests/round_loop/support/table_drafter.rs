//! Drafters over the table target, from perfect to hostile, that check the loop's bookkeeping.

use specd_core::sync::lock;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use specd_core::sampling::mix64;
use specd_core::{DraftRequest, Drafter, OpenRequest, Opened, SamplingParams, SessionId};

use super::table_target::{target_token, VOCAB};
use super::table_verifier::Carry;

/// How drafts are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Exactly the target's tokens: every draft is accepted.
    Oracle,
    /// Hash-random tokens.
    Random,
    /// Never the target's token at the first position.
    Adversarial,
    /// The target's tokens for the first `round % (count + 1)` positions, then wrong ones, so
    /// every acceptance length occurs.
    PartlyRight,
    /// Oracle, but the draft call of this round fails.
    FailAt(u32),
    /// Opening the session fails.
    FailOpen,
    /// Oracle, but this round's answer has one token too many.
    TooManyAt(u32),
    /// Oracle, but this round's last draft is no token of the vocabulary.
    OutOfVocabularyAt(u32),
    /// Adversarial while the first draft's output index is in `from..to`, oracle otherwise:
    /// a drafter whose acceptance collapses and recovers mid-request.
    AdversarialBetween { from: u64, to: u64 },
}

#[derive(Debug, thiserror::Error)]
#[error("table drafter: {0}")]
pub struct TableDrafterError(pub String);

/// One draft call as seen by the drafter.
#[derive(Clone, Debug)]
pub struct DraftCall {
    pub round: u32,
    pub count: usize,
    pub committed_len: usize,
    pub carries: usize,
    pub output_index_base: u64,
}

struct Mirror {
    context: Vec<u32>,
    sampling: SamplingParams,
}

#[derive(Default)]
pub struct DrafterLog {
    sessions: HashMap<SessionId, Mirror>,
    pub opens: Vec<SessionId>,
    pub drafts: Vec<DraftCall>,
    pub closed: Vec<SessionId>,
    pub closed_detached: Vec<SessionId>,
    /// Bookkeeping errors of the loop that the drafter noticed.
    pub inconsistencies: Vec<String>,
}

pub struct TableDrafter {
    pub policy: Policy,
    /// Prompt tokens an open says it found in a cache of its own, and did not compute.
    held: usize,
    log: Mutex<DrafterLog>,
}

impl TableDrafter {
    pub fn new(policy: Policy) -> Self {
        Self::holding(policy, 0)
    }

    /// A drafter whose opens say they held the first `held` prompt tokens already.
    pub fn holding(policy: Policy, held: usize) -> Self {
        Self {
            policy,
            held,
            log: Mutex::default(),
        }
    }

    pub fn log(&self) -> MutexGuard<'_, DrafterLog> {
        lock(&self.log)
    }

    fn open_now(&self, request: OpenRequest<Carry>) -> Result<Opened, TableDrafterError> {
        let mut log = self.log();
        log.opens.push(request.session);
        if self.policy == Policy::FailOpen {
            return Err(TableDrafterError("injected open failure".into()));
        }
        if request.carry != request.prompt_ids {
            log.inconsistencies
                .push("prefill carry is not the prompt".into());
        }
        let computed = request.prompt_ids.len().saturating_sub(self.held);
        log.sessions.insert(
            request.session,
            Mirror {
                context: request.prompt_ids,
                sampling: request.sampling,
            },
        );
        Ok(Opened::computed(computed))
    }

    fn draft_now(&self, request: DraftRequest<Carry>) -> Result<Vec<u32>, TableDrafterError> {
        let mut log = self.log();
        log.drafts.push(DraftCall {
            round: request.round,
            count: request.count,
            committed_len: request.committed_len,
            carries: request.carries.len(),
            output_index_base: request.output_index_base,
        });
        if self.policy == Policy::FailAt(request.round) {
            return Err(TableDrafterError("injected draft failure".into()));
        }
        let carried: Vec<u32> = request.carries.concat();
        if carried != request.committed_tokens {
            let message = format!(
                "round {}: carries {carried:?} != committed tokens {:?}",
                request.round, request.committed_tokens
            );
            log.inconsistencies.push(message);
        }
        let mirror = log
            .sessions
            .get_mut(&request.session)
            .ok_or_else(|| TableDrafterError(format!("unknown {}", request.session)))?;
        mirror.context.extend_from_slice(&request.committed_tokens);
        let mirror_len = mirror.context.len();
        let oracle = oracle_drafts(mirror, &request);
        if mirror_len != request.committed_len {
            let message = format!(
                "round {}: mirror holds {mirror_len} tokens, committed_len is {}",
                request.round, request.committed_len
            );
            log.inconsistencies.push(message);
        }
        Ok(self.shape(oracle, &request))
    }

    fn shape(&self, oracle: Vec<u32>, request: &DraftRequest<Carry>) -> Vec<u32> {
        let wrong = |t: u32| (t + 1) % VOCAB;
        let random = |i: usize| {
            let h =
                mix64(u64::from(request.round) << 32 ^ (i as u64) << 8 ^ u64::from(request.bonus));
            (h % u64::from(VOCAB)) as u32
        };
        match self.policy {
            Policy::Oracle | Policy::FailAt(_) | Policy::FailOpen => oracle,
            Policy::TooManyAt(round) if round == request.round => {
                let mut drafts = oracle;
                drafts.push(1);
                drafts
            }
            Policy::TooManyAt(_) => oracle,
            Policy::OutOfVocabularyAt(round) if round == request.round => {
                let mut drafts = oracle;
                if let Some(last) = drafts.last_mut() {
                    *last = VOCAB + 5;
                }
                drafts
            }
            Policy::OutOfVocabularyAt(_) => oracle,
            Policy::Random => (0..request.count).map(random).collect(),
            Policy::Adversarial => oracle.into_iter().map(wrong).collect(),
            Policy::AdversarialBetween { from, to }
                if (from..to).contains(&request.output_index_base) =>
            {
                oracle.into_iter().map(wrong).collect()
            }
            Policy::AdversarialBetween { .. } => oracle,
            Policy::PartlyRight => {
                let keep = request.round as usize % (request.count + 1);
                (0..request.count)
                    .map(|i| match i.cmp(&keep) {
                        std::cmp::Ordering::Less => oracle[i],
                        std::cmp::Ordering::Equal => wrong(oracle[i]),
                        std::cmp::Ordering::Greater => random(i),
                    })
                    .collect()
            }
        }
    }
}

/// The target's own next `count` tokens after the mirror context and the bonus.
fn oracle_drafts(mirror: &Mirror, request: &DraftRequest<Carry>) -> Vec<u32> {
    let mut context = mirror.context.clone();
    context.push(request.bonus);
    (0..request.count)
        .map(|i| {
            let token = target_token(
                &context,
                &mirror.sampling,
                request.output_index_base + i as u64,
            );
            context.push(token);
            token
        })
        .collect()
}

impl Drafter for TableDrafter {
    type Carry = Carry;
    type Error = TableDrafterError;

    fn open(
        &self,
        request: OpenRequest<Carry>,
    ) -> impl Future<Output = Result<Opened, TableDrafterError>> + Send {
        std::future::ready(self.open_now(request))
    }

    fn draft(
        &self,
        request: DraftRequest<Carry>,
    ) -> impl Future<Output = Result<Vec<u32>, TableDrafterError>> + Send {
        std::future::ready(self.draft_now(request))
    }

    async fn close(&self, session: SessionId) -> Result<(), TableDrafterError> {
        let mut log = self.log();
        log.closed.push(session);
        log.sessions.remove(&session);
        Ok(())
    }

    fn close_detached(&self, session: SessionId) {
        let mut log = self.log();
        log.closed_detached.push(session);
        log.sessions.remove(&session);
    }
}
