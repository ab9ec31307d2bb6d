//! Admission (the sequence limit and the K/V budget) and prefill of a new sequence.

use super::*;

impl<T: TargetModel> LocalVerifier<T> {
    /// Checks a prefill and reserves its worst case: the prompt, `max_new_tokens` (the whole
    /// context when unknown) and the rollback slack of one verify block. The reservation
    /// lasts until [`Self::release_sync`].
    pub(crate) fn admit(
        &self,
        request: &PrefillRequest,
        max_new_tokens: Option<usize>,
    ) -> Result<(), VerifierError> {
        if request.prompt_ids.is_empty() {
            return Err(VerifierError::invalid("prompt_ids", "must not be empty"));
        }
        self.check_tokens("prompt_ids", &request.prompt_ids)?;
        request
            .sampling
            .validate()
            .map_err(|e| VerifierError::invalid(e.field, e.reason))?;
        request
            .rules
            .validate(Some(self.target.vocab_size()))
            .map_err(|e| VerifierError::invalid(e.field, e.reason))?;
        if let Some(top) = request.top_logprobs.filter(|&top| top > MAX_TOP_LOGPROBS) {
            return Err(VerifierError::invalid(
                "top_logprobs",
                format!("at most {MAX_TOP_LOGPROBS}, got {top}"),
            ));
        }
        let limit = self.target.max_context();
        if request.prompt_ids.len() >= limit {
            return Err(VerifierError::out_of_range(
                "prompt_ids",
                format!(
                    "{} prompt tokens leave no room in the context limit of {limit}",
                    request.prompt_ids.len()
                ),
            ));
        }
        if self.sequences.contains_key(&request.seq) {
            return Err(VerifierError::DuplicateSequence(request.seq));
        }
        let tokens = match max_new_tokens {
            Some(new) => request
                .prompt_ids
                .len()
                .saturating_add(new)
                .saturating_add(MAX_ROLLBACK + 1)
                .min(limit),
            None => limit,
        };
        let wanted = Reservation {
            tokens,
            bytes: self.target.kv_bytes_bound(tokens),
        };
        self.make_room(wanted.tokens, wanted.bytes);
        self.admissions.reserve(request.seq, wanted)
    }

    /// Samples the first token of a prefilled cache and makes the sequence live. The
    /// sequence must have been admitted; one released meanwhile stays gone.
    pub(crate) fn finish_prefill(
        &self,
        request: PrefillRequest,
        cache: T::Cache,
        hidden: Tensor,
        cached_tokens: usize,
    ) -> Result<Prefilled<TargetCarry>, VerifierError> {
        let masks: Vec<TokenMask> = request.mask.iter().cloned().collect();
        let (prompt, output) = request.prompt_ids.split_at(
            request
                .prompt_ids
                .len()
                .saturating_sub(request.emitted_in_prompt),
        );
        let shaping = RowShaping {
            rules: &request.rules,
            prompt,
            output,
            masks: &masks,
            top_logprobs: request.top_logprobs,
            ..RowShaping::default()
        };
        let (first_token, first_logprob) =
            token_from_hidden(&*self.target, &hidden, &request.sampling, 0, shaping)?;
        let len = self.target.cache_len(&cache);
        self.keep_prefill_boundary(&request, &cache, len);
        let carry = if request.want_carry {
            Some(TargetCarry {
                hidden,
                shared_kv: self.target.shared_kv(&cache, 0, len).ok().flatten(),
                committed: request.prompt_ids.clone(),
                committed_len: len,
            })
        } else {
            None
        };
        // A drafter's mirror starts from this snapshot's window.
        let mirror_sliding_start = carry
            .as_ref()
            .and_then(|carry| carry.shared_kv.as_ref())
            .and_then(|kv| kv.sliding.as_ref())
            .map_or(0, |sliding| sliding.start);
        let entry = Sequence {
            cache,
            tokens: request.prompt_ids.clone(),
            prefilled: len,
            scope: request.cache_scope.clone(),
            sampling: request.sampling,
            rules: request.rules.clone(),
            top_logprobs: request.top_logprobs,
            prompt_len: request
                .prompt_ids
                .len()
                .saturating_sub(request.emitted_in_prompt),
            wants_carry: request.want_carry,
            rounds: RoundLog::new(mirror_sliding_start),
            last_used: Instant::now(),
        };
        // The vacant entry keeps a release of this id waiting until the sequence is in, so a
        // release either finds it or ends the admission before this checks it.
        match self.sequences.entry(request.seq) {
            Entry::Occupied(_) => return Err(VerifierError::DuplicateSequence(request.seq)),
            Entry::Vacant(_) if !self.admissions.holds(request.seq) => {
                return Err(VerifierError::UnknownSequence(request.seq))
            }
            Entry::Vacant(slot) => {
                slot.insert(Arc::new(Mutex::new(entry)));
            }
        }
        Ok(Prefilled {
            first_token,
            carry,
            cached_tokens,
            first_logprob,
        })
    }

    pub fn prefill_sync(
        &self,
        request: PrefillRequest,
    ) -> Result<Prefilled<TargetCarry>, VerifierError> {
        self.prefill_sync_with_budget(request, None)
    }

    /// A prefill that reserves K/V for `max_new_tokens` generated tokens (the whole context
    /// when `None`).
    pub fn prefill_sync_with_budget(
        &self,
        request: PrefillRequest,
        max_new_tokens: Option<usize>,
    ) -> Result<Prefilled<TargetCarry>, VerifierError> {
        self.admit(&request, max_new_tokens)?;
        let seq = request.seq;
        let run = || {
            let SeededCache { mut cache, cached } = self.seeded_cache(&request)?;
            let hidden = self.prefill_rest(&request, &mut cache, cached)?;
            self.finish_prefill(request, cache, hidden, cached)
        };
        let result = run();
        if result.is_err() {
            self.admissions.release(seq);
        }
        result
    }

    /// Prefills the prompt past the `done` tokens the cache holds, in the pieces a cold
    /// prefill runs from there (a reused prefix ends on a piece boundary where the target's
    /// rows depend on them); returns the last position's hidden.
    pub(crate) fn prefill_rest(
        &self,
        request: &PrefillRequest,
        cache: &mut T::Cache,
        mut done: usize,
    ) -> Result<Tensor, VerifierError> {
        let prompt = &request.prompt_ids;
        let chunk = self.target.prefill_chunk_len().max(1);
        loop {
            let end = (done + chunk).min(prompt.len());
            let last = end == prompt.len();
            if last {
                self.keep_prefill_boundary(request, cache, done);
            }
            let piece = prompt
                .get(done..end)
                .ok_or_else(|| VerifierError::invalid("prompt_ids", "must not be empty"))?;
            let hidden = self.target.prefill_piece(cache, piece, last)?;
            done = end;
            if last {
                return hidden.ok_or_else(|| {
                    VerifierError::invalid("prompt_ids", "the prefill returned no hidden state")
                });
            }
        }
    }
}
