//! The Prefill response stream, which owns its sequence until the client has read it all.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use specd_core::SeqId;
use specd_wire::verifier::PrefillResponse;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::Status;
use tracing::debug;

use super::sequences::ReleaseSequence;
use specd_core::sync::lock;

/// Shared by the producer task and the stream: which sequence the stream delivers, and
/// whether the client read it to the end.
pub(crate) struct SequenceHandover {
    releaser: Arc<dyn ReleaseSequence>,
    seq: Mutex<Option<SeqId>>,
    delivered: AtomicBool,
}

impl SequenceHandover {
    pub fn new(releaser: Arc<dyn ReleaseSequence>) -> Arc<Self> {
        Arc::new(Self {
            releaser,
            seq: Mutex::new(None),
            delivered: AtomicBool::new(false),
        })
    }

    /// The producer created `seq`; from now on an abandoned stream releases it.
    pub fn adopt(&self, seq: SeqId) {
        *lock(&self.seq) = Some(seq);
    }

    /// The stream cannot reach its client: free the sequence, if one was created.
    pub fn abandon(&self) {
        if let Some(seq) = lock(&self.seq).take() {
            if self.releaser.release_sequence(seq) {
                debug!(%seq, "prefill stream abandoned; sequence released");
            }
        }
    }
}

/// The server-streaming body of Prefill. Dropping it before its end (the client cancelled or
/// disconnected) releases the sequence, so nobody is left holding an id they never received.
pub struct PrefillStream {
    inner: ReceiverStream<Result<PrefillResponse, Status>>,
    handover: Arc<SequenceHandover>,
}

impl PrefillStream {
    pub(crate) fn new(
        receiver: mpsc::Receiver<Result<PrefillResponse, Status>>,
        handover: Arc<SequenceHandover>,
    ) -> Self {
        Self {
            inner: ReceiverStream::new(receiver),
            handover,
        }
    }
}

impl Stream for PrefillStream {
    type Item = Result<PrefillResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(None) = next {
            self.handover.delivered.store(true, Ordering::Release);
        }
        next
    }
}

impl Drop for PrefillStream {
    fn drop(&mut self) {
        if !self.handover.delivered.load(Ordering::Acquire) {
            self.handover.abandon();
        }
    }
}
