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
    running: Mutex<HashMap<u64, Running>>,
    next_id: AtomicU64,
    active: watch::Sender<usize>,
    max_batch_tokens: usize,
    max_block_size: usize,
    governor: Arc<SpeculationGovernor>,
}

/// A running request as the load sees it.
struct Running {
    control: RequestControl,
    /// Still generating: counts toward the load (block caps, the governor). A request whose
    /// answer is complete only cleans up, and a client that sends its next request on
    /// reading the answer must find itself alone.
    generating: bool,
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
        running.insert(
            id,
            Running {
                control: control.clone(),
                generating: true,
            },
        );
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

    /// Requests still generating (not cleaning up after their answer).
    #[cfg(test)]
    pub(crate) fn generating(&self) -> usize {
        self.lock().values().filter(|r| r.generating).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Running>> {
        lock(&self.running)
    }

    /// Block caps and the governor follow the requests still generating; draining waits
    /// for every running one.
    fn rebalance(&self, running: &HashMap<u64, Running>) {
        let generating = running.values().filter(|r| r.generating).count();
        let cap = load_block_cap(generating, self.max_batch_tokens, self.max_block_size);
        for request in running.values() {
            request.control.set_block_cap(cap);
        }
        self.governor.set_active(generating);
        self.active.send_replace(running.len());
        debug!(active = running.len(), generating, ?cap, "load changed");
    }

    /// The request `id` has its whole answer: it stops counting toward the load.
    fn answered(&self, id: u64) {
        let mut running = self.lock();
        if let Some(request) = running.get_mut(&id).filter(|r| r.generating) {
            request.generating = false;
            self.rebalance(&running);
        }
    }
}

impl Admitted {
    /// The request's control, with the block-size cap of the current load.
    pub(crate) fn control(&self) -> &RequestControl {
        &self.control
    }

    /// What tells the load that this request's answer is complete.
    pub(crate) fn answer_done(&self) -> AnswerDone {
        AnswerDone {
            admission: self.admission.clone(),
            id: self.id,
        }
    }
}

/// Marks a request answered (its cleanup goes on, holding its place until it ends).
pub(crate) struct AnswerDone {
    admission: Arc<Admission>,
    id: u64,
}

impl AnswerDone {
    pub(crate) fn mark(self) {
        self.admission.answered(self.id);
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
    async fn an_answered_request_leaves_the_load_but_holds_its_place() {
        let admission = Arc::new(Admission::new(2, 8, 4, 1));
        let a = admission.admit().unwrap();
        let b = admission.admit().unwrap();
        let c_refused = admission.admit().err().unwrap();
        assert_eq!(c_refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(admission.generating(), 2);
        a.answer_done().mark();
        // Cleaning up, `a` still holds its place and keeps a drain waiting, but the next
        // request of its client is judged as if alone with `b`.
        assert_eq!(admission.active(), 2);
        assert_eq!(admission.generating(), 1);
        assert_eq!(b.control().block_cap(), None);
        a.answer_done().mark();
        assert_eq!(admission.generating(), 1);
        drop(a);
        assert_eq!((admission.active(), admission.generating()), (1, 1));
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
