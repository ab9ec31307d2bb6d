//! Calls that outlive the request that started them: a Prefill or Open answering after its
//! request went away, a sequence released or a session closed from a drop. They are counted,
//! so that a draining router lets them reach the verifier and drafters before it exits
//! instead of leaving sequences and sessions behind.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::watch;

fn pending() -> &'static watch::Sender<usize> {
    static PENDING: OnceLock<watch::Sender<usize>> = OnceLock::new();
    PENDING.get_or_init(|| watch::Sender::new(0))
}

/// Uncounts its call however it ends (finished, or dropped with its runtime).
struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        pending().send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn spawn_on(runtime: &tokio::runtime::Handle, call: impl Future<Output = ()> + Send + 'static) {
    pending().send_modify(|n| *n += 1);
    let counted = Counted;
    runtime.spawn(async move {
        let _counted = counted;
        call.await;
    });
}

/// Spawns `call` on the current runtime, counted until it ends.
pub(crate) fn spawn(call: impl Future<Output = ()> + Send + 'static) {
    spawn_on(&tokio::runtime::Handle::current(), call);
}

/// Like [`spawn`], but false (and `call` not run) outside a runtime, as from a drop on a
/// thread without one.
pub(crate) fn try_spawn(call: impl Future<Output = ()> + Send + 'static) -> bool {
    tokio::runtime::Handle::try_current()
        .map(|runtime| spawn_on(&runtime, call))
        .is_ok()
}

/// Resolves once no counted call runs, or after `limit` (a verifier or drafter that does
/// not answer must not hold a shutdown forever; its idle timeout frees what is left).
pub(crate) async fn settled(limit: Duration) {
    let mut pending = pending().subscribe();
    let _ = tokio::time::timeout(limit, pending.wait_for(|n| *n == 0)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settles_once_every_call_has_ended() {
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        spawn(async move {
            let _ = wait.await;
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(50), settled(Duration::from_secs(60)))
                .await
                .is_err()
        );
        let _ = release.send(());
        tokio::time::timeout(Duration::from_secs(5), settled(Duration::from_secs(60)))
            .await
            .unwrap();
    }
}
