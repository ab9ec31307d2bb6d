//! Thin wrappers around a real verifier and drafter that time every call, so a benchmark can
//! split each round into draft, verify and the loop's own work.

use specd_core::sync::lock;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use specd_core::{
    DraftRequest, Drafter, OpenRequest, Opened, PrefillRequest, Prefilled, SeqId, SessionId,
    Verified, Verifier, VerifyRequest,
};

/// One verify round as the wrappers saw it.
#[derive(Debug, Clone, Copy)]
pub struct RoundTiming {
    /// The draft call of this round (zero in a round that did not draft).
    pub draft: Duration,
    pub verify: Duration,
    /// From the end of the previous verify (or of prefill and drafter open) to the end of
    /// this verify: draft + verify + whatever the round loop did in between.
    pub round: Duration,
    /// Tokens verified: the bonus plus this round's drafts.
    pub width: usize,
}

impl RoundTiming {
    /// Round time not spent in the drafter or the verifier: emitting, stop checks, carry
    /// handling, scheduling.
    pub fn overhead(&self) -> Duration {
        self.round.saturating_sub(self.draft + self.verify)
    }
}

#[derive(Default)]
struct State {
    rounds: Vec<RoundTiming>,
    pending_draft: Duration,
    mark: Option<Instant>,
}

/// Where both wrappers of one run write.
#[derive(Clone, Default)]
pub struct RoundClock(Arc<Mutex<State>>);

impl RoundClock {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.0)
    }

    fn mark(&self) {
        self.state().mark = Some(Instant::now());
    }

    /// Takes the rounds recorded so far.
    pub fn take(&self) -> Vec<RoundTiming> {
        let mut state = self.state();
        state.mark = None;
        state.pending_draft = Duration::ZERO;
        std::mem::take(&mut state.rounds)
    }
}

/// A [`Verifier`] that times each verify against the shared [`RoundClock`].
pub struct TimedVerifier<V> {
    pub inner: V,
    pub clock: RoundClock,
}

impl<V: Verifier> Verifier for TimedVerifier<V> {
    type Carry = V::Carry;
    type Error = V::Error;

    async fn prefill(&self, request: PrefillRequest) -> Result<Prefilled<V::Carry>, V::Error> {
        let out = self.inner.prefill(request).await;
        self.clock.mark();
        out
    }

    async fn verify(&self, request: VerifyRequest) -> Result<Verified<V::Carry>, V::Error> {
        let width = request.tokens.len();
        let start = Instant::now();
        let out = self.inner.verify(request).await;
        let end = Instant::now();
        let mut state = self.clock.state();
        let draft = std::mem::take(&mut state.pending_draft);
        let round = state.mark.map_or(end - start, |mark| end - mark);
        state.rounds.push(RoundTiming {
            draft,
            verify: end - start,
            round,
            width,
        });
        state.mark = Some(end);
        out
    }

    async fn truncate(&self, seq: SeqId, committed_len: usize) -> Result<(), V::Error> {
        self.inner.truncate(seq, committed_len).await
    }

    async fn release(&self, seq: SeqId) -> Result<(), V::Error> {
        self.inner.release(seq).await
    }

    fn release_detached(&self, seq: SeqId) {
        self.inner.release_detached(seq)
    }
}

/// A [`Drafter`] that times each draft call against the shared [`RoundClock`].
pub struct TimedDrafter<D> {
    pub inner: D,
    pub clock: RoundClock,
}

impl<D: Drafter> Drafter for TimedDrafter<D> {
    type Carry = D::Carry;
    type Error = D::Error;

    async fn open(&self, request: OpenRequest<D::Carry>) -> Result<Opened, D::Error> {
        let out = self.inner.open(request).await;
        // Opening belongs to the request's setup, not to its first round.
        self.clock.mark();
        out
    }

    async fn draft(&self, request: DraftRequest<D::Carry>) -> Result<Vec<u32>, D::Error> {
        let start = Instant::now();
        let out = self.inner.draft(request).await;
        self.clock.state().pending_draft += start.elapsed();
        out
    }

    async fn close(&self, session: SessionId) -> Result<(), D::Error> {
        self.inner.close(session).await
    }

    fn close_detached(&self, session: SessionId) {
        self.inner.close_detached(session)
    }
}
