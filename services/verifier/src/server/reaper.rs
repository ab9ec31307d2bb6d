//! Expiry of idle sequences, whose router may be gone without a word.

use std::sync::Weak;
use std::time::Duration;

use tracing::info;

use super::sequences::Sequences;
use crate::target::TargetModel;

/// Releases sequences idle for `timeout`, checking a few times per timeout, until the
/// sequences are dropped with their service.
pub(crate) async fn expire_idle<T: TargetModel>(sequences: Weak<Sequences<T>>, timeout: Duration) {
    let period = (timeout / 4).max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(sequences) = sequences.upgrade() else {
            return;
        };
        for seq in sequences.idle(timeout) {
            if sequences.release(seq) {
                info!(%seq, ?timeout, "idle sequence expired");
            }
        }
    }
}
