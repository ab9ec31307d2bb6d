//! Which requests run: a bound on how many at once, the load cap on their block sizes, and
//! draining before shutdown.

use specd_core::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use specd_core::{load_block_cap, RequestControl, SpeculationGovernor};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tracing::debug;

/// The router's running requests.
pub(crate) struct Admission {
    permits: Arc<Semaphore>,
    capacity: usize,
    draining: AtomicBool,
    /// One lock, not a concurrent map: every admit and leave sets every running request's
    /// block cap from the count, and two of them interleaving would leave caps of a stale
    /// count behind.
    running: Mutex<HashMap<u64, RequestControl>>,
    next_id: AtomicU64,
    active: watch::Sender<usize>,
    max_batch_tokens: usize,
    max_block_size: usize,
    governor: Arc<SpeculationGovernor>,
}

/// A running request's place; leaving it (drop) lets another in.
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    id: u64,
    control: RequestControl,
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    /// `drafter_parallelism`: drafters that run draft steps in parallel (0: drafting shares
    /// nothing).
    pub(crate) fn new(
        capacity: usize,
        max_batch_tokens: usize,
        max_block_size: usize,
        drafter_parallelism: usize,
    ) -> Self {
        let capacity = capacity.max(1);
        Self {
            permits: Arc::new(Semaphore::new(capacity)),
            capacity,
            draining: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            active: watch::Sender::new(0),
            max_batch_tokens,
            max_block_size,
            governor: Arc::new(SpeculationGovernor::new(
                drafter_parallelism,
                max_block_size,
            )),
        }
    }

    /// The speculation governor every request of this router follows.
    pub(crate) fn governor(&self) -> &SpeculationGovernor {
        &self.governor
    }

    /// A place for one more request: UNAVAILABLE while draining, RESOURCE_EXHAUSTED at
    /// capacity. Every running request's block-size cap follows the new load.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Admitted, Status> {
        if self.draining.load(Ordering::Acquire) {
            return Err(Status::unavailable(
                "router: shutting down, not taking new requests",
            ));
        }
        let permit = self.permits.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "max_concurrent_requests: the router already runs its limit of {} requests",
                self.capacity
            ))
        })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let control = RequestControl::governed(self.governor.clone());
        let mut running = self.lock();
        running.insert(id, control.clone());
        self.rebalance(&running);
        Ok(Admitted {
            admission: self.clone(),
            id,
            control,
            _permit: permit,
        })
    }

    /// Stops admitting requests; those running go on.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub(crate) fn start_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Resolves once no request runs.
    pub(crate) async fn drained(&self) {
        let mut active = self.active.subscribe();
        // The sender lives in `self`, so the wait cannot fail.
        let _ = active.wait_for(|n| *n == 0).await;
    }

    /// Requests running now.
    #[cfg(test)]
    pub(crate) fn active(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, RequestControl>> {
        lock(&self.running)
    }

    fn rebalance(&self, running: &HashMap<u64, RequestControl>) {
        let cap = load_block_cap(running.len(), self.max_batch_tokens, self.max_block_size);
        for control in running.values() {
            control.set_block_cap(cap);
        }
        self.governor.set_active(running.len());
        self.active.send_replace(running.len());
        debug!(active = running.len(), ?cap, "load changed");
    }
}

impl Admitted {
    /// The request's control, with the block-size cap of the current load.
    pub(crate) fn control(&self) -> &RequestControl {
        &self.control
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut running = self.admission.lock();
        running.remove(&self.id);
        self.admission.rebalance(&running);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capacity_is_enforced_and_freed() {
        let admission = Arc::new(Admission::new(2, 0, 8, 1));
        let a = admission.admit().unwrap();
        let _b = admission.admit().unwrap();
        let refused = admission.admit().err().unwrap();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().starts_with("max_concurrent_requests"));
        drop(a);
        assert!(admission.admit().is_ok());
    }

    #[tokio::test]
    async fn the_block_cap_follows_the_load() {
        let admission = Arc::new(Admission::new(64, 8, 4, 1));
        let a = admission.admit().unwrap();
        let b = admission.admit().unwrap();
        assert_eq!(a.control().block_cap(), None);
        let c = admission.admit().unwrap();
        assert_eq!(a.control().block_cap(), Some(2));
        assert_eq!(c.control().block_cap(), Some(2));
        drop(c);
        assert_eq!(b.control().block_cap(), None);
    }

    #[tokio::test]
    async fn draining_refuses_new_requests_and_waits_for_running_ones() {
        let admission = Arc::new(Admission::new(4, 0, 8, 1));
        let running = admission.admit().unwrap();
        admission.start_drain();
        let refused = admission.admit().err().unwrap();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        let waiter = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.drained().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(running);
        waiter.await.unwrap();
        assert_eq!(admission.active(), 0);
    }
}
