//! A draft model that records the batches it drafts, and whose first batch takes a while, so
//! that draft calls arriving meanwhile queue for the next. Shared by the drafter service's
//! and the one-process server's batching tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use candle_core::Device;
use specd_drafter::{
    DraftCarry, DraftEngine, DraftModelEngine, DraftStep, EngineError, EngineInfo, OpenSession,
};

pub struct Recording {
    pub inner: DraftModelEngine,
    pub batches: AtomicUsize,
    /// The most sessions one `draft_many` drafted.
    pub largest: AtomicUsize,
}

impl Recording {
    pub fn new(inner: DraftModelEngine) -> Self {
        Self {
            inner,
            batches: AtomicUsize::new(0),
            largest: AtomicUsize::new(0),
        }
    }
}

impl DraftEngine for Recording {
    type Session = <DraftModelEngine as DraftEngine>::Session;

    fn info(&self) -> EngineInfo {
        self.inner.info()
    }

    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn open(&self, open: OpenSession) -> Result<Self::Session, EngineError> {
        self.inner.open(open)
    }

    fn committed_len(&self, session: &Self::Session) -> usize {
        self.inner.committed_len(session)
    }

    fn apply(&self, session: &mut Self::Session, carry: DraftCarry) -> Result<(), EngineError> {
        self.inner.apply(session, carry)
    }

    fn draft(&self, session: &mut Self::Session, step: DraftStep) -> Result<Vec<u32>, EngineError> {
        self.inner.draft(session, step)
    }

    fn draft_many(
        &self,
        jobs: &mut [(&mut Self::Session, DraftStep)],
    ) -> Vec<Result<Vec<u32>, EngineError>> {
        if self.batches.fetch_add(1, Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        self.largest.fetch_max(jobs.len(), Ordering::SeqCst);
        self.inner.draft_many(jobs)
    }
}
