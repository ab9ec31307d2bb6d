//! Drafting several sessions' rounds together, for the drafter service's drafting thread and
//! the one-process server's alike.

use std::collections::VecDeque;

use specd_core::DraftTree;

use crate::engine::{DraftEngine, DraftStep, EngineError};
use crate::tree_growth::Branching;

/// One session's round in a batch.
pub struct BatchedRound<'a, S> {
    pub session: &'a mut S,
    pub step: DraftStep,
    /// How a tree may branch beside the chain (no nodes: a chain).
    pub branching: Branching,
}

/// Drafts `rounds`, answers in their order: the chains in one packed forward per draft step
/// ([`DraftEngine::draft_many`]), a tree (rare beside chains: a router asks for one only
/// where the target verifies trees) on its own.
pub fn draft_together<E: DraftEngine>(
    engine: &E,
    rounds: Vec<BatchedRound<'_, E::Session>>,
) -> Vec<Result<DraftTree, EngineError>> {
    let mut chains = Vec::new();
    let mut trees = Vec::new();
    for (index, round) in rounds.into_iter().enumerate() {
        match round.branching.nodes {
            0 => chains.push((index, round)),
            _ => trees.push((index, round)),
        }
    }
    let mut answers: Vec<Option<Result<DraftTree, EngineError>>> =
        (0..chains.len() + trees.len()).map(|_| None).collect();
    if !chains.is_empty() {
        let mut jobs: Vec<(&mut E::Session, DraftStep)> = chains
            .iter_mut()
            .map(|(_, round)| (&mut *round.session, round.step))
            .collect();
        let mut drafted = engine.draft_many(&mut jobs).into_iter();
        for (index, _) in &chains {
            answers[*index] = Some(
                drafted
                    .next()
                    .unwrap_or_else(|| {
                        Err(EngineError::Internal(
                            "the engine answered fewer drafts than asked".into(),
                        ))
                    })
                    .map(DraftTree::chain),
            );
        }
    }
    for (index, round) in trees {
        answers[index] = Some(engine.draft_tree(round.session, round.step, round.branching));
    }
    answers
        .into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| Err(EngineError::Internal("a round was not drafted".into())))
        })
        .collect()
}

/// The waiting jobs of distinct sessions, oldest first; a second job of a session (a retry)
/// waits for the next batch.
pub fn take_distinct<J>(
    waiting: &mut VecDeque<J>,
    same_session: impl Fn(&J, &J) -> bool,
) -> Vec<J> {
    let mut batch: Vec<J> = Vec::with_capacity(waiting.len());
    let mut later = VecDeque::new();
    while let Some(job) = waiting.pop_front() {
        if batch.iter().any(|taken| same_session(taken, &job)) {
            later.push_back(job);
        } else {
            batch.push(job);
        }
    }
    *waiting = later;
    batch
}
