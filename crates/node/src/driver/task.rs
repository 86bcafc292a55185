//! How the node runs its driver: as a task of its own, going to the back of the run queue
//! once per wake-up, rather than as the runtime's `block_on` future, and which inputs one
//! wake-up takes (docs/performance.md, "Task hops and syscalls").

use std::time::Instant;

use super::{tasks, Driver, Input, INPUT_BATCH};

/// Run `driver` until it stops, as a task of its own rather than as the runtime's `block_on`
/// future: on the current-thread runtime every wake-up of that future (every batch a link task
/// hands over) made tokio poll the IO driver without blocking (an `epoll_wait` with timeout 0,
/// `park_yield`) before polling it, three quarters of a relay's `epoll_wait` calls
/// (docs/performance.md, session 22). A spawned task's wake-up is a run-queue push. A panic in
/// the driver is passed on.
pub async fn run_driver(driver: Driver) {
    if let Err(e) = tokio::spawn(driver.run()).await {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
        // Cancelled: the runtime is shutting down, as when the driver returns.
    }
}

/// Pending once, after putting its task at the back of the run queue: the tasks that were
/// already queued (link readers woken by the same IO poll, writers woken by the last flush)
/// run before the driver goes on. As the `block_on` future the driver was polled only once
/// the run queue was empty, so one turn took every batch those readers handed over; this
/// keeps most of that batching for the spawned driver, which would otherwise take the first
/// reader's batch alone at its first place in the queue. (Session 22 measured the plainly
/// spawned driver's loaded 50 KiB fetch ~25 % slower; session 24's alternating runs found no
/// difference for it or for this one: docs/performance.md.) Unlike `tokio::task::yield_now`,
/// whose wake-up is deferred until the IO driver has been polled (an `epoll_wait` per yield),
/// the wake-up here is an immediate run-queue push.
pub(super) struct BackOfQueue(pub(super) bool);

impl std::future::Future for BackOfQueue {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

impl Driver {
    /// One wake-up's inputs: `first` and what else is ready, up to [`INPUT_BATCH`] cells'
    /// worth, so that output is batched. When a link reader handed over a full batch
    /// ([`tasks::READ_BATCH`] cells) its read may hold more cells, which it hands over only
    /// once the driver has given the batch's credit back ([`tasks::LINK_INPUT_CREDIT`]): the
    /// driver steps to the back of the run queue once, so that the reader (woken by that
    /// credit) hands over the rest of its read, already in memory, into this wake-up. Without
    /// the step a read of more than `READ_BATCH` cells took two wake-ups and two flushes, and a
    /// client sent the SENDMEs of one read as two link writes; with it they leave as one. The
    /// rest joins the input queue behind what others queued, so a flooding connection still
    /// has at most its credit ahead of them. Returns how many inputs were handled, `None` on
    /// shutdown.
    pub(super) async fn take_inputs(&mut self, first: Input, now: Instant) -> Option<usize> {
        let mut handled = 0;
        let mut inputs = 0;
        let mut next = Some(first);
        // A full batch was handled (its reader may hold the rest of a read); stepped back once.
        let mut read_continues = false;
        let mut stepped = false;
        loop {
            let input = match next.take().map(Ok).unwrap_or_else(|| self.rx.try_recv()) {
                Ok(input) => input,
                Err(_) if read_continues && !stepped => {
                    stepped = true;
                    BackOfQueue(false).await;
                    continue;
                }
                Err(_) => break,
            };
            handled += input.weight();
            inputs += 1;
            read_continues |=
                matches!(input, Input::Cells { cells, .. } if cells >= tasks::READ_BATCH);
            if !self.handle_input(input, now) {
                return None;
            }
            if handled > INPUT_BATCH {
                break;
            }
        }
        Some(inputs)
    }
}
