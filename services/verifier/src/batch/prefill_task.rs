//! A prompt being prefilled one bounded piece at a time, between verify forwards.

use specd_core::{PrefillRequest, Prefilled};
use tokio::sync::oneshot;
use tracing::debug;

use super::counters::Counters;
use super::jobs::PrefillJob;
use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::local::{LocalVerifier, SeededCache};
use crate::target::TargetModel;

type Reply = oneshot::Sender<Result<Prefilled<TargetCarry>, VerifierError>>;

pub(crate) struct PrefillTask<C> {
    request: PrefillRequest,
    cache: C,
    /// Prompt tokens already in the cache.
    done: usize,
    /// Prompt tokens the cache started with, from the prefix cache.
    cached: usize,
    reply: Reply,
}

impl<C> PrefillTask<C> {
    /// Starts an admitted prefill; answers and returns the reservation if no cache can be
    /// made.
    pub fn start<T: TargetModel<Cache = C>>(
        local: &LocalVerifier<T>,
        job: PrefillJob,
    ) -> Option<Self> {
        match local.seeded_cache(&job.request) {
            Ok(SeededCache { cache, cached }) => Some(Self {
                request: job.request,
                cache,
                done: cached,
                cached,
                reply: job.reply,
            }),
            Err(e) => {
                local.release_sync(job.request.seq);
                let _ = job.reply.send(Err(e));
                None
            }
        }
    }
}

impl<C: Send + 'static> PrefillTask<C> {
    /// Runs the next piece, the same pieces [`TargetModel::prefill`] runs, so the cache and
    /// the first token equal an uninterrupted prefill. On the last piece the sequence goes
    /// live and the caller is answered; `None` then, the task itself while pieces remain.
    pub fn step<T: TargetModel<Cache = C>>(
        mut self,
        local: &LocalVerifier<T>,
        counters: &Counters,
    ) -> Option<Self> {
        let seq = self.request.seq;
        if self.reply.is_closed() {
            debug!(%seq, "prefill caller went away; reservation returned");
            local.release_sync(seq);
            return None;
        }
        let prompt = &self.request.prompt_ids;
        let chunk = local.target().prefill_chunk_len().max(1);
        let end = (self.done + chunk).min(prompt.len());
        let last = end == prompt.len();
        if last {
            local.keep_prefill_boundary(&self.request, &self.cache, self.done);
        }
        let prompt = &self.request.prompt_ids;
        let piece = local
            .target()
            .prefill_piece(&mut self.cache, &prompt[self.done..end], last);
        counters.prefill_chunk_ran();
        self.done = end;
        let hidden = match piece {
            Ok(Some(hidden)) => hidden,
            Ok(None) if !last => return Some(self),
            Ok(None) => {
                let e =
                    VerifierError::invalid("prompt_ids", "the prefill returned no hidden state");
                return self.fail(local, e);
            }
            Err(e) => return self.fail(local, e),
        };
        let result = local.finish_prefill(self.request, self.cache, hidden, self.cached);
        let failed = result.is_err();
        if self.reply.send(result).is_err() || failed {
            // Nobody will use or release the sequence: free it now.
            local.release_sync(seq);
        }
        None
    }

    fn fail<T: TargetModel<Cache = C>>(
        self,
        local: &LocalVerifier<T>,
        error: VerifierError,
    ) -> Option<Self> {
        local.release_sync(self.request.seq);
        let _ = self.reply.send(Err(error));
        None
    }
}
