//! Lazy timers for a link's IO tasks: the idle timeout of each read and write
//! (`LinkIdleTimeout`) and the writer's keepalive (`LinkKeepalive`).
//!
//! A `tokio::time::timeout` per read or write (and per wait for the next batch) put an entry
//! into the runtime's timer wheel and took it out again for every batch of cells: at a busy
//! relay thousands of times a second, for a timer that almost never fires. Here each task
//! keeps one `Sleep`, armed at the earliest moment the current wait could expire and moved
//! forward only when it fires early: a read or write costs a clock read, and the wheel is
//! touched about once per timeout period. The deadlines are exactly those of a timer per
//! operation (an operation started at `t` fails at `t + idle`, a writer idle since `t` sends
//! its keepalive at `t + keepalive`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Far enough ahead to stand for "never" (a `Sleep` needs some deadline).
const NEVER: Duration = Duration::from_secs(86_400 * 365);

/// One task's lazily re-armed timer.
pub(super) struct LazyTimer {
    sleep: Pin<Box<Sleep>>,
}

impl LazyTimer {
    /// A timer armed at `first` (no later than any deadline it will be asked to wait for).
    pub(super) fn new(first: Option<Duration>) -> Self {
        LazyTimer {
            sleep: Box::pin(tokio::time::sleep_until(
                Instant::now() + first.unwrap_or(NEVER),
            )),
        }
    }

    /// Wait until `due`. The armed deadline must be at or before `due`: every caller's
    /// deadlines only move forward (each is "now + a fixed period").
    pub(super) async fn until(&mut self, due: Instant) {
        loop {
            self.sleep.as_mut().await;
            if Instant::now() >= due {
                return;
            }
            self.sleep.as_mut().reset(due);
        }
    }
}

/// Run `io`, failing it if it makes no progress for `idle` (`None`: never): the lazy form of
/// `tokio::time::timeout(idle, io)` on `timer`, which must be one task's only user.
pub(super) async fn bounded<T, E: std::fmt::Display>(
    timer: &mut LazyTimer,
    idle: Option<Duration>,
    what: &str,
    io: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    let Some(t) = idle else {
        return io.await.map_err(|e| e.to_string());
    };
    let due = Instant::now() + t;
    tokio::select! {
        biased;
        r = io => r.map_err(|e| e.to_string()),
        () = timer.until(due) => Err(format!(
            "peer presumed hung: no {what} for {} s (LinkIdleTimeout)",
            t.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn fails_a_stalled_operation_at_its_own_deadline_not_the_first_one() {
        let idle = Some(200 * MS);
        let mut timer = LazyTimer::new(idle);
        // Operations that finish within the period pass, however long they take together.
        for i in 0..5 {
            let r = bounded(&mut timer, idle, "x", async move {
                tokio::time::sleep(80 * MS).await;
                Ok::<_, String>(i)
            })
            .await;
            assert_eq!(r, Ok(i));
        }
        // One that never finishes fails a full period after it started, not at the timer's
        // first deadline (200 ms after creation, long past).
        let began = Instant::now();
        let r = bounded(
            &mut timer,
            idle,
            "cell from it",
            std::future::pending::<Result<u8, String>>(),
        )
        .await;
        let took = Instant::now() - began;
        assert!(took >= 200 * MS, "failed after {took:?}");
        assert!(took < 5000 * MS, "failed only after {took:?}");
        assert!(r.unwrap_err().contains("no cell from it for 0 s"));
    }

    #[tokio::test]
    async fn until_waits_for_a_later_deadline_than_armed() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(Some(20 * MS));
        timer.until(start + 150 * MS).await;
        assert!(Instant::now() - start >= 150 * MS);
        // A due time already reached returns at once (the timer fired long ago).
        let again = Instant::now();
        timer.until(start).await;
        assert!(Instant::now() - again < 1000 * MS);
    }

    #[tokio::test]
    async fn no_idle_timeout_never_fails() {
        let mut timer = LazyTimer::new(None);
        let r = bounded(&mut timer, None, "x", async {
            tokio::time::sleep(50 * MS).await;
            Ok::<_, String>(3)
        })
        .await;
        assert_eq!(r, Ok(3));
    }
}
