//! A minimal executor: the table sides never wait, so polling to completion is enough.

use std::future::Future;
use std::task::{Context, Poll, Waker};

/// Polls `future` until it completes; panics if it keeps pending.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..10_000 {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
    panic!("future kept pending");
}

/// Polls `future` `times` times; true if it completed.
pub fn poll_times<F: Future + Unpin>(future: &mut F, times: usize) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    (0..times).any(|_| std::pin::Pin::new(&mut *future).poll(&mut cx).is_ready())
}
