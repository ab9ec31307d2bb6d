//! The table sides taking time: each call sleeps on tokio's clock first, so with the clock
//! paused the round loop measures exactly the configured costs, deterministically.

use std::time::{Duration, Instant};

use specd_core::round_loop::Clock;
use specd_core::{
    DraftRequest, Drafter, OpenRequest, Opened, PrefillRequest, Prefilled, SeqId, SessionId,
    Verified, Verifier, VerifyRequest,
};

use super::table_drafter::{TableDrafter, TableDrafterError};
use super::table_verifier::{Carry, TableVerifier, TableVerifierError};

/// Tokio's clock, which a paused runtime advances only through its timers.
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// A verify costs `base + per_token × tokens`.
pub struct TimedVerifier<'a> {
    pub inner: &'a TableVerifier,
    pub base: Duration,
    pub per_token: Duration,
}

impl Verifier for TimedVerifier<'_> {
    type Carry = Carry;
    type Error = TableVerifierError;

    async fn prefill(
        &self,
        request: PrefillRequest,
    ) -> Result<Prefilled<Carry>, TableVerifierError> {
        self.inner.prefill(request).await
    }

    async fn verify(&self, request: VerifyRequest) -> Result<Verified<Carry>, TableVerifierError> {
        let tokens = u32::try_from(request.tokens.len()).unwrap();
        tokio::time::sleep(self.base + self.per_token * tokens).await;
        self.inner.verify(request).await
    }

    async fn truncate(&self, seq: SeqId, committed_len: usize) -> Result<(), TableVerifierError> {
        self.inner.truncate(seq, committed_len).await
    }

    async fn release(&self, seq: SeqId) -> Result<(), TableVerifierError> {
        self.inner.release(seq).await
    }

    fn release_detached(&self, seq: SeqId) {
        self.inner.release_detached(seq);
    }
}

/// A draft call costs `per_step × count`.
pub struct TimedDrafter<'a> {
    pub inner: &'a TableDrafter,
    pub per_step: Duration,
}

impl Drafter for TimedDrafter<'_> {
    type Carry = Carry;
    type Error = TableDrafterError;

    async fn open(&self, request: OpenRequest<Carry>) -> Result<Opened, TableDrafterError> {
        self.inner.open(request).await
    }

    async fn draft(&self, request: DraftRequest<Carry>) -> Result<Vec<u32>, TableDrafterError> {
        let steps = u32::try_from(request.count).unwrap();
        tokio::time::sleep(self.per_step * steps).await;
        self.inner.draft(request).await
    }

    async fn close(&self, session: SessionId) -> Result<(), TableDrafterError> {
        self.inner.close(session).await
    }

    fn close_detached(&self, session: SessionId) {
        self.inner.close_detached(session);
    }
}
