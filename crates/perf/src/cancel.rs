//! Stopping a run: the cancellation token every loop watches, and the SIGTERM/SIGINT
//! stream that `run` turns into a cancel.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

/// A cancellation token: once cancelled, every transfer loop stops and a
/// transfer in flight is recorded as "interrupted". `run` cancels it on
/// SIGTERM/SIGINT; tests cancel it directly.
#[derive(Clone, Debug)]
pub struct Cancel {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Cancel {
    fn default() -> Self {
        Self::new()
    }
}

impl Cancel {
    /// A token that is not cancelled yet.
    pub fn new() -> Self {
        Cancel {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    /// Cancel; idempotent.
    pub fn cancel(&self) {
        self.tx.send_replace(true);
    }

    /// Whether `cancel` was called.
    pub fn is_cancelled(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once cancelled (at once if already).
    pub async fn cancelled(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so this only returns when cancelled.
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// A stream of the names of received SIGTERM/SIGINT signals.
#[cfg(unix)]
pub(crate) fn signals() -> std::io::Result<mpsc::Receiver<&'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                Some(()) = term.recv() => "SIGTERM",
                Some(()) = int.recv() => "SIGINT",
                else => return,
            };
            if tx.send(name).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// A stream of Ctrl-C events.
#[cfg(not(unix))]
pub(crate) fn signals() -> std::io::Result<mpsc::Receiver<&'static str>> {
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send("Ctrl-C").await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
