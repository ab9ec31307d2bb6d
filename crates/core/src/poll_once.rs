//! Unit-test helper for the crate's drafters, whose calls complete when first polled.

use std::future::Future;
use std::task::{Context, Poll, Waker};

/// The output of a future that completes on its first poll; panics if it would wait.
pub(crate) fn now<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a drafter under test waited"),
    }
}
