//! The in-process verifier behind core's [`Verifier`] interface: each call runs on the
//! caller's thread.

use super::*;

impl<T: TargetModel> Verifier for LocalVerifier<T> {
    type Carry = TargetCarry;
    type Error = VerifierError;

    fn prefill(
        &self,
        request: PrefillRequest,
    ) -> impl std::future::Future<Output = Result<Prefilled<TargetCarry>, VerifierError>> + Send
    {
        std::future::ready(self.prefill_sync(request))
    }

    fn verify(
        &self,
        request: VerifyRequest,
    ) -> impl std::future::Future<Output = Result<Verified<TargetCarry>, VerifierError>> + Send
    {
        std::future::ready(self.verify_sync(request))
    }

    fn truncate(
        &self,
        seq: SeqId,
        committed_len: usize,
    ) -> impl std::future::Future<Output = Result<(), VerifierError>> + Send {
        std::future::ready(self.truncate_sync(seq, committed_len))
    }

    fn release(
        &self,
        seq: SeqId,
    ) -> impl std::future::Future<Output = Result<(), VerifierError>> + Send {
        let _ = self.release_sync(seq);
        std::future::ready(Ok(()))
    }

    fn release_detached(&self, seq: SeqId) {
        let _ = self.release_sync(seq);
    }
}
