//! Token trees from a draft model ([`crate::tree_growth`]): each level's candidates run as
//! one tree block over the session's cache (one packed forward).
//!
//! The session's cache then holds the bonus and every node run, in the order they ran;
//! once the target commits a path, the nodes of it that ran are kept in place
//! ([`specd_models::CausalLm::keep_path`]) and the rest dropped.

use specd_core::DraftTree;
use specd_models::{CausalLm, OutputRows, SeqBlock, TopTwo};

use super::{internal, DraftModelEngine, DraftModelSession};
use crate::engine::{DraftStep, EngineError};
use crate::tree_growth::{grow, Branching, RunTree};

impl<M: CausalLm> DraftModelEngine<M> {
    /// A tree of at most `step.count` levels and `step.count + branching.nodes` drafts.
    pub(super) fn grow_tree(
        &self,
        session: &mut DraftModelSession<M::Cache>,
        step: DraftStep,
        branching: Branching,
    ) -> Result<DraftTree, EngineError> {
        let vocab = self.model.vocab_size();
        if step.bonus as usize >= vocab {
            return Err(EngineError::invalid(
                "draft.bonus",
                format!("token id {} is not below {vocab}", step.bonus),
            ));
        }
        session.forget_speculation();
        // Level 0: the committed tokens not yet fed, then the bonus (the tree's root).
        let mut feed = std::mem::take(&mut session.pending);
        feed.push(step.bonus);
        let first = self.ranked(&mut [SeqBlock::chain(&mut session.cache, &feed)])?;
        let calibration = std::mem::take(&mut session.calibration);
        let grown = grow(
            step.bonus,
            &first[0],
            step.count,
            branching,
            &calibration,
            |ran: &RunTree, from| {
                self.ranked(&mut [SeqBlock {
                    cache: &mut session.cache,
                    tokens: &ran.tokens[from..],
                    parents: &ran.parents,
                }])
            },
        );
        session.calibration = calibration;
        let grown = grown?;
        let tree = grown.tree.clone();
        session.run_tree = Some(grown);
        Ok(tree)
    }

    /// Each of the block's rows' greedy token and runner-up (one forward, every row).
    fn ranked(&self, rows: &mut [SeqBlock<'_, M::Cache>]) -> Result<Vec<TopTwo>, EngineError> {
        let hidden = self
            .model
            .forward(rows, OutputRows::All)
            .map_err(internal)?;
        let last = rows.len() == 1 && rows[0].parents.is_empty();
        let hidden = match (last, hidden.as_slice()) {
            // A chain block (level 0) proposes after its last token only.
            (true, [h]) => h.narrow(0, h.dim(0)? - 1, 1)?,
            (_, [h]) => h.clone(),
            _ => {
                return Err(EngineError::Internal(
                    "the draft model returned no rows".into(),
                ))
            }
        };
        let ranked = self
            .model
            .top_two_below(&hidden, self.draft_vocab)
            .map_err(internal)?;
        if ranked.len() != hidden.dim(0)? {
            return Err(EngineError::Internal(
                "the draft model ranked too few rows".into(),
            ));
        }
        Ok(ranked)
    }
}
