//! Guarantees that a request's verifier sequence and drafter session are freed.

use tracing::warn;

use crate::drafter::Drafter;
use crate::ids::{SeqId, SessionId};
use crate::verifier::Verifier;

/// Owns the duty to free a sequence and (once opened) a session.
///
/// The round loop awaits [`Cleanup::finish`] on every normal, failed or cancelled end. If the
/// request future is dropped instead (the caller gave up on it), `Drop` hands both ids to the
/// sides' non-blocking `*_detached` methods, so nothing leaks either way.
pub(crate) struct Cleanup<'a, V: Verifier, D: Drafter> {
    verifier: &'a V,
    seq: SeqId,
    sequence_live: bool,
    session: Option<(&'a D, SessionId)>,
}

impl<'a, V: Verifier, D: Drafter> Cleanup<'a, V, D> {
    /// Armed for `seq` from the start: a prefill cut short may still have created it.
    pub(crate) fn new(verifier: &'a V, seq: SeqId) -> Self {
        Self {
            verifier,
            seq,
            sequence_live: true,
            session: None,
        }
    }

    /// Arms the session before it is opened, for the same reason.
    pub(crate) fn session_opening(&mut self, drafter: &'a D, session: SessionId) {
        self.session = Some((drafter, session));
    }

    /// Closes the session without waiting (the drafter failed; do not stall on it).
    pub(crate) fn detach_session(&mut self) {
        if let Some((drafter, session)) = self.session.take() {
            drafter.close_detached(session);
        }
    }

    /// Closes the session and releases the sequence, logging failures: the output is
    /// complete by now, so a failed cleanup does not fail the request.
    pub(crate) async fn finish(&mut self) {
        if let Some((drafter, session)) = self.session {
            if let Err(error) = drafter.close(session).await {
                warn!(%session, %error, "closing the drafter session failed");
            }
            self.session = None;
        }
        if self.sequence_live {
            if let Err(error) = self.verifier.release(self.seq).await {
                warn!(seq = %self.seq, %error, "releasing the verifier sequence failed");
            }
            self.sequence_live = false;
        }
    }
}

impl<V: Verifier, D: Drafter> Drop for Cleanup<'_, V, D> {
    fn drop(&mut self) {
        self.detach_session();
        if self.sequence_live {
            self.verifier.release_detached(self.seq);
        }
    }
}
