//! Expiry of idle per-request work (a verifier's sequences, a drafter's sessions), whose
//! client may be gone without a word.

use std::fmt::Display;
use std::sync::Weak;
use std::time::Duration;

use tracing::info;

/// A table of per-request work: a draining server waits for it to end, and it expires when
/// idle.
pub trait IdleWork: Send + Sync + 'static {
    type Id: Display;
    /// What one unit of work is called, for the log.
    const NAME: &'static str;
    /// Work live now.
    fn live(&self) -> usize;
    /// Work untouched for `timeout` and not in use right now.
    fn idle(&self, timeout: Duration) -> Vec<Self::Id>;
    /// Ends `id`; whether it was still there.
    fn expire(&self, id: Self::Id) -> bool;
}

/// Ends work idle for `timeout`, checking a few times per timeout, until the table is
/// dropped with its service.
pub async fn expire_idle<W: IdleWork>(work: Weak<W>, timeout: Duration) {
    let period = (timeout / 4).max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(work) = work.upgrade() else {
            return;
        };
        for id in work.idle(timeout) {
            let shown = id.to_string();
            if work.expire(id) {
                info!(id = %shown, ?timeout, "idle {} expired", W::NAME);
            }
        }
    }
}
