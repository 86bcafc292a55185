//! The driver's policy plumbing, without sockets. The core's clock is passed in (`now`); only the
//! run loop's test reads tokio's real clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_core::chansched::ChannelSchedulerKind;
use chive_core::{Core, CoreConfig, SchedulerKind};
use chive_net::{FeatureSet, LinkConfig, LinkLimits, TokenBucket};

use super::{Driver, DriverConfig, Input, Tunables};

fn driver(write_bucket: Option<Arc<TokenBucket>>, tunables: Tunables) -> Driver {
    let core = Core::new(CoreConfig::default(), [3; 32]);
    Driver::new(
        core,
        DriverConfig {
            link: Arc::new(LinkConfig {
                identity: None,
                features: FeatureSet::EMPTY,
                socket_buffer: None,
                unsent_limit: None,
                unsent_rtt_rate: None,
                congestion_control: None,
                record_layer: Default::default(),
            }),
            limits: LinkLimits {
                read_bucket: None,
                write_bucket,
            },
            outbuf_cells: 32,
            exit_policy: None,
            tunables,
            liveness: super::Liveness::default(),
        },
    )
}

#[tokio::test]
async fn a_bad_reload_keeps_the_old_policy() {
    let now = Instant::now();
    let mut d = driver(None, Tunables::default());
    assert!(d.apply_policy(now));
    let ewma = d.core.scheduler();
    assert!(matches!(ewma, SchedulerKind::Ewma { .. }), "{ewma:?}");
    let outbuf = d.cfg.outbuf_cells;
    assert_eq!(outbuf, chive_dir::OUTBUF_CELLS.default as usize);
    // A reload naming a scheduler that does not exist changes nothing (and is logged).
    let bad = Tunables {
        scheduler: Some("fifo".into()),
        outbuf_cells: Some(7),
        ..Tunables::default()
    };
    assert!(d.handle_input(Input::Reconfigure(bad), now));
    assert_eq!(d.core.scheduler(), ewma);
    assert_eq!(d.cfg.outbuf_cells, outbuf);
    assert_eq!(d.cfg.tunables.scheduler, None);
    // A good one applies.
    let rr = Tunables {
        scheduler: Some("rr".into()),
        outbuf_cells: Some(7),
        ..Tunables::default()
    };
    d.handle_input(Input::Reconfigure(rr), now);
    assert_eq!(d.core.scheduler(), SchedulerKind::RoundRobin);
    assert_eq!(d.cfg.outbuf_cells, 7);
    assert_eq!(d.send.config().outbuf_cells, 7);
}

#[tokio::test]
async fn the_channel_scheduler_follows_the_write_bucket() {
    let now = Instant::now();
    let bucket = Arc::new(TokenBucket::new(1_000_000, 1_000_000));
    bucket.set_reserve(100_000);
    let shared = Tunables {
        cross_channel: true,
        ..Tunables::default()
    };
    let mut d = driver(Some(bucket.clone()), shared.clone());
    let cfg = d.send.config().clone();
    assert_eq!(cfg.kind, ChannelSchedulerKind::SharedRate);
    assert!(cfg.paced);
    assert_eq!(cfg.quiet_reserve, 100_000);
    // SIGHUP lifts the rate limit: the relay's writers no longer share a rate.
    bucket.set_rate(0, 0);
    d.handle_input(Input::Reconfigure(shared.clone()), now);
    assert_eq!(d.send.config().kind, ChannelSchedulerKind::Direct);
    assert_eq!(d.send.policy_name(), "direct");
    // Nor pay per batch: an unlimited bucket grants everything (no `Input::Paid`).
    assert!(!d.send.config().paced);
    // Limited again by a later SIGHUP: paced again.
    bucket.set_rate(1_000_000, 1_000_000);
    d.handle_input(Input::Reconfigure(shared), now);
    assert!(d.send.config().paced);
    assert_eq!(d.send.config().kind, ChannelSchedulerKind::SharedRate);
    // A relay without `BandwidthRate` carries an unlimited bucket from the start.
    let d = driver(
        Some(Arc::new(TokenBucket::unlimited())),
        Tunables::default(),
    );
    assert!(!d.send.config().paced);
    // Without CrossChannelPriority a rate limit is not shared either.
    let mut d = driver(
        Some(Arc::new(TokenBucket::new(1_000_000, 1_000_000))),
        Tunables::default(),
    );
    d.apply_policy(now);
    assert_eq!(d.send.config().kind, ChannelSchedulerKind::Direct);
}

#[tokio::test]
async fn the_loop_ticks_and_stops_on_shutdown() {
    let d = driver(None, Tunables::default());
    let tx = d.sender();
    let run = tokio::spawn(d.run());
    // Two of the 500 ms ticks (client, split and metrics work) and about ten switch ticks.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    tx.send(Input::Dump).await.unwrap();
    tx.send(Input::Shutdown).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), run)
        .await
        .expect("driver stopped")
        .unwrap();
}

/// The spawned driver keeps the `block_on` future's turn: a task queued after the driver's
/// wake-up still runs before the driver goes on, so one turn takes what every reader woken by
/// the same IO poll handed over. Without the step the driver runs first.
#[tokio::test]
async fn the_driver_goes_on_after_the_tasks_already_queued() {
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (wake, woken) = tokio::sync::oneshot::channel::<()>();
    let driver = {
        let order = order.clone();
        tokio::spawn(async move {
            let _ = woken.await;
            super::task::BackOfQueue(false).await;
            order.lock().unwrap().push("driver");
        })
    };
    // Let the driver park on its input first, as it does between hand-overs.
    tokio::task::yield_now().await;
    // A reader hands over (the driver is queued), then another reader is woken.
    wake.send(()).unwrap();
    let reader = {
        let order = order.clone();
        tokio::spawn(async move { order.lock().unwrap().push("reader") })
    };
    driver.await.unwrap();
    reader.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["reader", "driver"]);
}

/// A reader's read of more than `READ_BATCH` cells reaches the driver as two inputs, the
/// second only once the driver has handled the first and given its credit back. After a full
/// batch the driver steps back once, so the rest joins the same wake-up (one flush: a client's
/// SENDMEs for the whole read in one link write); after a smaller batch it does not.
#[tokio::test]
async fn the_rest_of_a_read_joins_the_wake_up_of_its_first_batch() {
    use super::tasks::{LINK_INPUT_CREDIT, READ_BATCH};
    use tokio::sync::Semaphore;
    async fn wake_up_inputs(first_cells: usize) -> usize {
        let mut d = driver(None, Tunables::default());
        let tx = d.sender();
        let credit = Arc::new(Semaphore::new(LINK_INPUT_CREDIT));
        let budget = Arc::new(Semaphore::new(4 * LINK_INPUT_CREDIT));
        // A reader as `spawn_conn` runs it: each batch takes its cells' credit first.
        let reader = tokio::spawn(async move {
            for cells in [first_cells, LINK_INPUT_CREDIT] {
                let credit = credit
                    .clone()
                    .acquire_many_owned(cells as u32)
                    .await
                    .unwrap();
                let permit = budget
                    .clone()
                    .acquire_many_owned(cells as u32)
                    .await
                    .unwrap();
                let bytes = chive_net::CellBatch::copied(Vec::new());
                let chan = chive_core::ChannelId(7);
                let input = Input::Cells {
                    chan,
                    bytes,
                    cells,
                    permit,
                    credit,
                };
                tx.send(input).await.unwrap();
            }
        });
        let first = d.rx.recv().await.unwrap();
        let inputs = d.take_inputs(first, Instant::now()).await.unwrap();
        reader.abort();
        inputs
    }
    assert_eq!(wake_up_inputs(READ_BATCH).await, 2);
    assert_eq!(wake_up_inputs(READ_BATCH - 1).await, 1);
}
