//! A prompt being prefilled one bounded piece at a time, between verify forwards or in them.

use candle_core::Tensor;
use specd_core::{PrefillRequest, Prefilled};
use specd_models::SeqBlock;
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

/// The prompt tokens a prefill task runs next.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    /// Where the piece ends in the prompt.
    end: usize,
    /// The prompt's last piece: the sequence goes live after it.
    last: bool,
}

impl<C: Send + 'static> PrefillTask<C> {
    /// Runs the next piece alone, the same pieces [`TargetModel::prefill`] runs, so the cache
    /// and the first token equal an uninterrupted prefill. On the last piece the sequence
    /// goes live and the caller is answered; `None` then, the task itself while pieces
    /// remain.
    pub fn step<T: TargetModel<Cache = C>>(
        self,
        local: &LocalVerifier<T>,
        counters: &Counters,
    ) -> Option<Self> {
        let (mut task, piece) = self.next_piece(local)?;
        let tokens = &task.request.prompt_ids[task.done..piece.end];
        let ran = local
            .target()
            .prefill_piece(&mut task.cache, tokens, piece.last);
        task.piece_ran(local, counters, piece, ran)
    }

    /// The piece to run next, or `None` (its reservation returned) if the caller went away.
    /// Before the last piece the prefix cache keeps the prompt's boundary.
    pub fn next_piece<T: TargetModel<Cache = C>>(
        self,
        local: &LocalVerifier<T>,
    ) -> Option<(Self, Piece)> {
        if self.reply.is_closed() {
            debug!(seq = %self.request.seq, "prefill caller went away; reservation returned");
            local.release_sync(self.request.seq);
            return None;
        }
        let end = self.done + self.next_len(local);
        let last = end == self.request.prompt_ids.len();
        if last {
            local.keep_prefill_boundary(&self.request, &self.cache, self.done);
        }
        Some((self, Piece { end, last }))
    }

    /// Prompt tokens the next piece runs: at most the target's prefill chunk.
    pub fn next_len<T: TargetModel<Cache = C>>(&self, local: &LocalVerifier<T>) -> usize {
        let remaining = self.request.prompt_ids.len().saturating_sub(self.done);
        remaining.min(local.target().prefill_chunk_len().max(1))
    }

    /// Prompt tokens in `piece`.
    pub fn piece_len(&self, piece: Piece) -> usize {
        piece.end - self.done
    }

    /// `piece` as a block of a forward that outputs every row.
    pub fn block(&mut self, piece: Piece) -> SeqBlock<'_, C> {
        SeqBlock::chain(
            &mut self.cache,
            &self.request.prompt_ids[self.done..piece.end],
        )
    }

    /// [`Self::piece_ran`] after `piece` ran as a block of a forward that output every
    /// row's hidden state, `hidden` `[piece rows, hidden]`.
    pub fn ran_in_forward<T: TargetModel<Cache = C>>(
        self,
        local: &LocalVerifier<T>,
        counters: &Counters,
        piece: Piece,
        hidden: Tensor,
    ) -> Option<Self> {
        let ran = if piece.last {
            hidden
                .narrow(0, self.piece_len(piece) - 1, 1)
                .map(Some)
                .map_err(|e| VerifierError::Forward(e.to_string()))
        } else {
            Ok(None)
        };
        self.piece_ran(local, counters, piece, ran)
    }

    /// After `piece` ran: `ran` is the hidden state of its last position on the last piece
    /// (`None` before). Answers the caller after the last piece; `None` then or on failure,
    /// the task itself while pieces remain.
    pub fn piece_ran<T: TargetModel<Cache = C>>(
        mut self,
        local: &LocalVerifier<T>,
        counters: &Counters,
        piece: Piece,
        ran: Result<Option<Tensor>, VerifierError>,
    ) -> Option<Self> {
        let seq = self.request.seq;
        counters.prefill_chunk_ran();
        self.done = piece.end;
        let hidden = match ran {
            Ok(Some(hidden)) => hidden,
            Ok(None) if !piece.last => return Some(self),
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

    pub fn fail<T: TargetModel<Cache = C>>(
        self,
        local: &LocalVerifier<T>,
        error: VerifierError,
    ) -> Option<Self> {
        local.release_sync(self.request.seq);
        let _ = self.reply.send(Err(error));
        None
    }
}
