//! The driver's own writes of link batches ([`ConnHandles::send_batch`]) over a real link pair
//! on the own record layer: written directly only while the writer holds nothing, never when
//! paced, and a partly written batch finished by the writer with nothing overtaking it.

use std::sync::Arc;

use chive_cell::{AnyCell, Cell, CellCommand, VarCell, PAYLOAD_LEN};
use chive_core::chansched::BatchClass;
use chive_core::ChannelId;
use chive_crypto::IdentityKeypair;
use chive_net::{
    FeatureSet, LinkConfig, LinkLimits, LinkListener, LinkReader, LinkWriter, RecordLayer,
};
use tokio::sync::mpsc;

use super::{spawn_conn, BatchSent, Input, Liveness};

fn cfg(identity: Option<Arc<IdentityKeypair>>) -> LinkConfig {
    LinkConfig {
        identity,
        features: FeatureSet::EMPTY,
        // Small, fixed socket buffers: a batch of a megabyte cannot go in whole.
        socket_buffer: Some(64 * 1024),
        unsent_limit: None,
        unsent_rtt_rate: None,
        congestion_control: None,
        record_layer: RecordLayer::Own,
    }
}

fn numbered_cell(i: u32) -> Cell {
    let mut payload = [0u8; PAYLOAD_LEN];
    for (j, b) in payload.iter_mut().enumerate() {
        *b = (i as usize).wrapping_mul(31).wrapping_add(j * 7) as u8;
    }
    Cell {
        circ_id: i,
        command: CellCommand::RELAY,
        payload,
    }
}

/// Cells `from..to` as the send path frames them for the own record layer.
fn framed(from: u32, to: u32) -> Vec<u8> {
    let cells: Vec<Cell> = (from..to).map(numbered_cell).collect();
    let mut out = Vec::new();
    for record in cells.chunks(chive_net::CELLS_PER_RECORD) {
        out.resize(out.len() + chive_net::RECORD_HEAD, 0);
        record.iter().for_each(|c| c.encode_into(&mut out));
        out.resize(out.len() + chive_net::RECORD_TAIL, 0);
    }
    out
}

async fn written(rx: &mut mpsc::Receiver<Input>) -> usize {
    loop {
        match rx.recv().await.expect("the writer reports") {
            Input::Written { cells, .. } => return cells,
            Input::Paid { .. } => continue,
            _ => panic!("expected Written"),
        }
    }
}

/// Our ends of an own-records link over loopback, and the peer's.
async fn own_link_pair() -> (LinkReader, LinkWriter, LinkReader, LinkWriter) {
    let id = Arc::new(IdentityKeypair::generate(&mut rand::thread_rng()));
    let public = id.public();
    let listener = LinkListener::bind("127.0.0.1:0".parse().unwrap(), Arc::new(cfg(Some(id))))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let accept = tokio::spawn(async move { listener.accept().await.unwrap().handshake().await });
    let ours = chive_net::connect(addr, Some(public), &cfg(None))
        .await
        .unwrap();
    let theirs = accept.await.unwrap().unwrap();
    let (reader, writer) = ours.split(LinkLimits::default());
    let (peer, peer_w) = theirs.split(LinkLimits::default());
    (reader, writer, peer, peer_w)
}

#[tokio::test]
async fn the_driver_writes_a_link_batch_itself_only_when_the_writer_holds_nothing() {
    let (reader, writer, mut peer, _peer_w) = own_link_pair().await;
    let (tx, mut rx) = mpsc::channel(64);
    let quiet_off = Liveness {
        keepalive: None,
        idle_timeout: None,
    };
    let h = spawn_conn(ChannelId(1), reader, writer, quiet_off, tx);
    let big = 2000;
    // What the peer must read, in order: numbered cells, and one HANDOFF after the first 40.
    let total = 40 + 10 + 20 + big + 5 + 7;
    let check = tokio::spawn(async move {
        let mut i = 0;
        let mut vars = 0;
        while i < total {
            match peer.read_cell().await.unwrap() {
                Some(AnyCell::Fixed(c)) => {
                    assert_eq!(c.circ_id, i, "cell out of order");
                    assert_eq!(c.payload, numbered_cell(i).payload);
                    i += 1;
                }
                Some(AnyCell::Var(v)) => {
                    assert_eq!((i, v.command), (40, CellCommand::HANDOFF));
                    vars += 1;
                }
                None => panic!("EOF at cell {i}"),
            }
        }
        vars
    });
    let send = |from: u32, to: u32, paced: bool, may_direct: bool| {
        h.send_batch(
            framed(from, to),
            (to - from) as usize,
            BatchClass::Bulk,
            std::time::Instant::now(),
            true,
            paced,
            may_direct,
        )
    };
    // The writer holds nothing: written here, and no Written comes for it.
    assert_eq!(send(0, 40, false, true), BatchSent::Written);
    // Behind a HANDOFF the writer holds: the writer writes it, after the HANDOFF.
    h.send_var(VarCell {
        circ_id: 0,
        command: CellCommand::HANDOFF,
        payload: vec![1, 2, 3],
    });
    assert_eq!(send(40, 50, false, true), BatchSent::Queued);
    assert_eq!(written(&mut rx).await, 10);
    // A paced batch always goes through the writer (it pays first).
    assert_eq!(send(50, 70, true, true), BatchSent::Queued);
    assert_eq!(written(&mut rx).await, 20);
    // More than the socket takes: sealed and begun here, finished by the writer; the next
    // batch waits behind it, and so does one the caller may not write directly.
    let at = 70;
    assert_eq!(send(at, at + big, false, true), BatchSent::Queued);
    assert_eq!(send(at + big, at + big + 5, false, true), BatchSent::Queued);
    assert_eq!(written(&mut rx).await, big as usize);
    assert_eq!(written(&mut rx).await, 5);
    let end = at + big + 5;
    assert_eq!(send(end, end + 7, false, false), BatchSent::Queued);
    assert_eq!(written(&mut rx).await, 7);
    assert_eq!(check.await.unwrap(), 1);
    assert!(rx.try_recv().is_err(), "one report per queued batch only");
}

/// A link the driver keeps writing to directly sends no keepalive PADDING (its writer task
/// sees no messages, but the link is not idle); once the writes stop, the PADDING comes.
#[tokio::test]
async fn direct_writes_count_as_the_links_writes_for_its_keepalive() {
    let (reader, writer, mut peer, _peer_w) = own_link_pair().await;
    let (tx, _rx) = mpsc::channel(64);
    let keepalive = std::time::Duration::from_millis(500);
    let liveness = Liveness {
        keepalive: Some(keepalive),
        idle_timeout: None,
    };
    let h = spawn_conn(ChannelId(1), reader, writer, liveness, tx);
    // The peer's view: how many cells came before the first PADDING, and when it came.
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut cells = 0u32;
        while let Ok(Some(cell)) = peer.read_cell().await {
            if let AnyCell::Fixed(c) = cell {
                if c.command == CellCommand::PADDING {
                    let _ = seen_tx.send((cells, std::time::Instant::now()));
                } else {
                    cells += 1;
                }
            }
        }
    });
    // Three keepalive periods of direct writes, one every 100 ms.
    let batches = 15;
    for i in 0..batches {
        let sent = h.send_batch(
            framed(i, i + 1),
            1,
            BatchClass::Bulk,
            std::time::Instant::now(),
            true,
            false,
            true,
        );
        assert_eq!(sent, BatchSent::Written);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let stopped = std::time::Instant::now();
    let (cells_before, at) =
        tokio::time::timeout(std::time::Duration::from_secs(10), seen_rx.recv())
            .await
            .expect("a keepalive once the writes stop")
            .expect("the peer reads");
    assert_eq!(
        cells_before, batches,
        "no PADDING while the driver was writing"
    );
    assert!(
        at.duration_since(stopped) + std::time::Duration::from_millis(100) >= keepalive / 2,
        "the PADDING came a period after the last write"
    );
}
