//! Expiry of idle sessions, whose router may be gone without a word.

use std::sync::Weak;
use std::time::Duration;

use tracing::info;

use super::sessions::Sessions;

/// Closes sessions idle for `timeout`, checking a few times per timeout, until the table is
/// dropped with its service.
pub(crate) async fn expire_idle<S>(sessions: Weak<Sessions<S>>, timeout: Duration) {
    let period = (timeout / 4).max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        for id in sessions.idle(timeout) {
            if sessions.remove(id) {
                info!(session_id = %id, ?timeout, "idle session expired");
            }
        }
    }
}
