//! The one-process server's drafter as its batch scheduler sees it: every round it drafts
//! is counted while it drafts, so rows waiting for a verify forward wait for those rounds too
//! (see [`DraftingRounds`]).

use std::future::Future;

use specd_core::{DraftRequest, DraftTree, Drafter, OpenRequest, Opened, SessionId};
use specd_verifier::batch::DraftingRounds;

pub struct AnnouncedDrafter<D> {
    inner: D,
    drafting: DraftingRounds,
}

impl<D> AnnouncedDrafter<D> {
    pub fn new(inner: D, drafting: DraftingRounds) -> Self {
        Self { inner, drafting }
    }

    /// `draft`, counted as a drafting round from now until it is done.
    fn counted<F: Future + Send>(&self, draft: F) -> impl Future<Output = F::Output> + Send {
        let round = self.drafting.start();
        async move {
            let drafted = draft.await;
            drop(round);
            drafted
        }
    }
}

impl<D: Drafter> Drafter for AnnouncedDrafter<D> {
    type Carry = D::Carry;
    type Error = D::Error;

    fn open(
        &self,
        request: OpenRequest<D::Carry>,
    ) -> impl Future<Output = Result<Opened, D::Error>> + Send {
        self.inner.open(request)
    }

    fn draft(
        &self,
        request: DraftRequest<D::Carry>,
    ) -> impl Future<Output = Result<Vec<u32>, D::Error>> + Send {
        self.counted(self.inner.draft(request))
    }

    fn draft_tree(
        &self,
        request: DraftRequest<D::Carry>,
    ) -> impl Future<Output = Result<DraftTree, D::Error>> + Send {
        self.counted(self.inner.draft_tree(request))
    }

    fn close(&self, session: SessionId) -> impl Future<Output = Result<(), D::Error>> + Send {
        self.inner.close(session)
    }

    fn close_detached(&self, session: SessionId) {
        self.inner.close_detached(session);
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}
