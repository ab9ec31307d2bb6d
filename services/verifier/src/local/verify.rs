//! One verify round of a live sequence: replay or check, the forward, acceptance and
//! rollback.

use super::*;

impl<T: TargetModel> LocalVerifier<T> {
    /// Replays a retried round or checks a new one before its forward.
    pub(crate) fn begin_verify(
        &self,
        seq: &Sequence<T::Cache>,
        request: &VerifyRequest,
    ) -> Result<VerifyStart, VerifierError> {
        if let Some(last) = &seq.rounds.last {
            if last.round == request.round {
                if last.tokens != request.tokens || last.parents != request.parents {
                    return Err(VerifierError::invalid(
                        "round",
                        "a retried round must send the same tokens",
                    ));
                }
                return Ok(VerifyStart::Replay(Box::new(last.clone())));
            }
        }
        let tokens = &request.tokens;
        if tokens.is_empty() {
            return Err(VerifierError::invalid(
                "tokens",
                "must hold at least the bonus token",
            ));
        }
        if tokens.len() > MAX_ROLLBACK + 1 {
            return Err(VerifierError::out_of_range(
                "tokens",
                format!(
                    "a block of {} tokens exceeds the maximum of {}",
                    tokens.len(),
                    MAX_ROLLBACK + 1
                ),
            ));
        }
        if request.budget == 0 {
            return Err(VerifierError::invalid("budget", "must be at least 1"));
        }
        if !request.masks.is_empty() && request.masks.len() != tokens.len() {
            return Err(VerifierError::invalid(
                "masks",
                format!(
                    "{} masks for a block of {} tokens (one per token, or none)",
                    request.masks.len(),
                    tokens.len()
                ),
            ));
        }
        self.check_tokens("tokens", tokens)?;
        if !request.parents.is_empty() {
            self.check_tree(seq, request)?;
        }
        let start_len = self.target.cache_len(&seq.cache);
        let limit = self.target.max_context();
        if start_len + tokens.len() > limit {
            return Err(VerifierError::out_of_range(
                "tokens",
                format!(
                    "the sequence would reach {} tokens, over the context limit of {limit}",
                    start_len + tokens.len()
                ),
            ));
        }
        Ok(VerifyStart::Run { start_len })
    }

    /// Checks a tree block: a tree this target can run, for a sequence whose rows are
    /// shaped without context (each row's penalties would need its own path's tokens).
    fn check_tree(
        &self,
        seq: &Sequence<T::Cache>,
        request: &VerifyRequest,
    ) -> Result<(), VerifierError> {
        if !self.target.supports_trees() {
            return Err(VerifierError::invalid(
                "parents",
                "this target verifies chains only (token trees run on the CPU engine's Qwen2 \
                 family)",
            ));
        }
        specd_core::tree::check_parents(&request.tokens[1..], &request.parents)
            .map_err(|reason| VerifierError::invalid("parents", reason))?;
        if !request.masks.is_empty() || !seq.rules.is_neutral() || seq.top_logprobs.is_some() {
            return Err(VerifierError::invalid(
                "parents",
                "a token tree cannot be verified with masks, logit rules or log probabilities",
            ));
        }
        Ok(())
    }

    /// Accepts and rolls back a forwarded block (`hidden`: every position's hidden,
    /// `targets`: the target's token at each), and records the answer for retries. On error
    /// the cache is left as before the round.
    pub(crate) fn finish_verify(
        &self,
        seq: &mut Sequence<T::Cache>,
        request: &VerifyRequest,
        hidden: &Tensor,
        choices: &RowChoices,
        start_len: usize,
    ) -> Result<RoundAnswer, VerifierError> {
        let outcome = accept_and_rollback(
            &*self.target,
            &mut seq.cache,
            &request.tokens,
            &request.parents,
            hidden,
            &choices.tokens,
            start_len,
            request.budget,
            request.want_carry,
        );
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(e);
            }
        };
        // The rows shipped with this round make a drafter's mirror end where this cache
        // ends; it then drops what this cache's window dropped.
        let mirror_sliding_start = if request.want_carry {
            match self.sliding_start(seq) {
                Ok(start) => start.unwrap_or(0),
                Err(e) => {
                    let _ = self.target.truncate(&mut seq.cache, start_len);
                    return Err(e);
                }
            }
        } else {
            seq.rounds.mirror_sliding_start
        };
        // The bonus and the accepted path's drafts, whatever the budget cut from new_tokens.
        let committed = outcome.carry.committed.clone();
        let logprobs = choices
            .logprobs
            .iter()
            .take(outcome.accepted.new_tokens.len())
            .cloned()
            .collect();
        let answer = RoundAnswer {
            round: request.round,
            tokens: request.tokens.clone(),
            parents: request.parents.clone(),
            verified: Verified {
                accepted: outcome.accepted.accepted,
                new_tokens: outcome.accepted.new_tokens,
                carry: request.want_carry.then_some(outcome.carry),
                forward: None,
                logprobs,
            },
            start_len,
            sliding_evicted: mirror_sliding_start.saturating_sub(seq.rounds.mirror_sliding_start),
        };
        // Written from where the round started, which also drops whatever an undone round
        // left past the cache.
        seq.tokens.truncate(start_len);
        seq.tokens.extend_from_slice(&committed);
        seq.rounds.applied += 1;
        seq.rounds.mirror_sliding_start = mirror_sliding_start;
        seq.rounds.last = Some(answer.clone());
        Ok(answer)
    }

    /// The first position the sequence's sliding shared K/V still holds, when the target
    /// exports one.
    fn sliding_start(&self, seq: &Sequence<T::Cache>) -> Result<Option<usize>, VerifierError> {
        let len = self.target.cache_len(&seq.cache);
        Ok(self
            .target
            .shared_kv(&seq.cache, 0, len)?
            .and_then(|kv| kv.sliding.map(|s| s.start)))
    }

    pub fn verify_sync(
        &self,
        request: VerifyRequest,
    ) -> Result<Verified<TargetCarry>, VerifierError> {
        let seq = self.sequence(request.seq)?;
        let mut seq = lock(&seq);
        seq.last_used = Instant::now();
        let start_len = match self.begin_verify(&seq, &request)? {
            VerifyStart::Replay(answer) => return Ok(answer.verified),
            VerifyStart::Run { start_len } => start_len,
        };
        let started = Instant::now();
        let forwarded = {
            let mut rows = [SeqBlock {
                cache: &mut seq.cache,
                tokens: &request.tokens,
                parents: &request.parents,
            }];
            self.target.forward_blocks(&mut rows)
        };
        let hidden = match forwarded.map(|mut rows| rows.pop()) {
            Ok(Some(hidden)) => hidden,
            Ok(None) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(VerifierError::invalid("tokens", "empty forward"));
            }
            Err(e) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(e);
            }
        };
        let targets = block_tokens(
            &*self.target,
            HeadRows {
                hidden: &hidden,
                sampling: &seq.sampling,
                output_index_base: request.output_index_base,
                depths: &tree_depths(&request.parents),
                shaping: seq.shaping(&request, start_len),
            },
        );
        let targets = match targets {
            Ok(targets) => targets,
            Err(e) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(e);
            }
        };
        let mut answer = self
            .finish_verify(&mut seq, &request, &hidden, &targets, start_len)?
            .verified;
        // Acceptance on the logits is part of what a verify of this width costs.
        answer.forward = Some(ForwardCost {
            tokens: request.tokens.len(),
            rows: 1,
            time: started.elapsed(),
        });
        Ok(answer)
    }
}

/// Each slot's depth in a tree block; empty for a chain.
pub(crate) fn tree_depths(parents: &[u32]) -> Vec<usize> {
    if parents.is_empty() {
        Vec::new()
    } else {
        specd_models::tree::depths(parents)
    }
}
