//! The exit's side of streams: BEGIN and RESOLVE from the client, and the driver's answers
//! (connected, failed, resolved).

use std::net::SocketAddr;
use std::time::Instant;

use chive_cell::{
    Begin, Connected, DestroyReason, EndReason, RelayCommand, Resolve, Resolved, ResolvedAnswer,
};
use tracing::debug;

use crate::dos::StreamDefense;
use crate::{CircKey, StreamHandle};

use super::circuit::Role;
use super::event::Event;
use super::stream::{Edge, Stream, StreamState};
use super::Core;

/// Where a BEGIN arrived: at an exit (its edge is made on first use) or at an onion service's
/// end of a rendezvous circuit (the origin circuit's edge).
#[derive(Clone, Copy)]
pub(super) enum BegunAt {
    Exit,
    Service,
}

/// Why [`Core::open_begun_stream`] opened no stream.
pub(super) enum NotOpened {
    /// The circuit has no edge for streams there.
    NoEdge,
    /// The stream id was in use: the circuit is closed.
    Killed,
}

impl Core {
    /// The stream a BEGIN asked for on circuit `key`: `sid` on the circuit's edge, Connecting,
    /// with a fresh handle. The caller asks the driver to connect it.
    pub(super) fn open_begun_stream(
        &mut self,
        key: CircKey,
        sid: u16,
        at: BegunAt,
        now: Instant,
    ) -> Result<StreamHandle, NotOpened> {
        let handle = StreamHandle(self.next_handle);
        let edge = match at {
            BegunAt::Exit => self.exit_edge(key),
            BegunAt::Service => self.circuits.get_mut(&key).and_then(|c| c.edge_mut()),
        };
        let Some(edge) = edge else {
            return Err(NotOpened::NoEdge);
        };
        if edge.streams.contains_key(&sid) {
            self.kill(key, "BEGIN for a stream id in use", now);
            return Err(NotOpened::Killed);
        }
        let flow = edge.stream_flow();
        edge.streams
            .insert(sid, Stream::new(handle, StreamState::Connecting, flow));
        self.next_handle += 1;
        self.streams.insert(handle, (key, sid));
        Ok(handle)
    }

    fn exit_edge(&mut self, key: CircKey) -> Option<&mut Edge> {
        let window = self.agreed_window(key);
        match &mut self.circuits.get_mut(&key)?.role {
            Role::Relay {
                edge,
                extending: false,
                pending_extend: None,
                crypto: _,
            } => Some(edge.get_or_insert_with(|| Edge::new(window))),
            _ => None,
        }
    }

    /// The stream-creation defence (`DoSStreamCreation*`, `crate::dos`) for a BEGIN or
    /// RESOLVE (`resolve`) on `key` at this exit: `true` if it was refused (END or RESOLVED
    /// error sent, or the circuit closed) and must go no further. As in Tor's
    /// `connection_exit_begin_conn` / `connection_exit_begin_resolve`, a BEGIN takes its token
    /// once it has been parsed (a malformed one is answered TORPROTOCOL and takes none), a
    /// RESOLVE before anything else.
    fn stream_creation_refused(
        &mut self,
        key: CircKey,
        sid: u16,
        resolve: bool,
        now: Instant,
    ) -> bool {
        let last_hop = self.circuits.get(&key).is_some_and(|c| c.next.is_none());
        if !self.cfg.dos.stream_creation.enabled || !self.cfg.exit || !last_hop {
            return false;
        }
        let Some(edge) = self.exit_edge(key) else {
            return false;
        };
        let mut bucket = edge.stream_bucket.take();
        let verdict = self.dos.on_stream(&mut bucket, now);
        if let Some(edge) = self.exit_edge(key) {
            edge.stream_bucket = bucket;
        }
        match verdict {
            None | Some(StreamDefense::None) => false,
            Some(StreamDefense::RefuseStream) if resolve => {
                // Tor: `dns_send_resolved_error_cell(conn, RESOLVED_TYPE_ERROR_TRANSIENT)`.
                let body = Resolved {
                    answers: vec![ResolvedAnswer::TransientError(0)],
                }
                .encode();
                match body {
                    Ok(body) => {
                        self.send_relay_backward(key, RelayCommand::RESOLVED, sid, &body, now)
                    }
                    Err(_) => self.send_end(key, sid, EndReason::MISC, now),
                }
                true
            }
            Some(StreamDefense::RefuseStream) => {
                // MISC, as Tor: RESOURCELIMIT would make the client give up on this exit.
                self.send_end(key, sid, EndReason::MISC, now);
                true
            }
            Some(StreamDefense::CloseCircuit) => {
                self.kill_with(
                    key,
                    DestroyReason::RESOURCELIMIT,
                    "DoS: streams opened faster than DoSStreamCreationRate",
                    now,
                );
                true
            }
        }
    }

    pub(super) fn on_begin(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        if sid == 0 {
            return self.kill(key, "BEGIN with stream id 0", now);
        }
        let begin = match Begin::decode(data) {
            Ok(b) => b,
            Err(e) => {
                debug!(?key, error = %e, "malformed BEGIN");
                return self.send_end(key, sid, EndReason::TORPROTOCOL, now);
            }
        };
        if !self.cfg.exit || self.circuits.get(&key).is_some_and(|c| c.next.is_some()) {
            return self.send_end(key, sid, EndReason::EXITPOLICY, now);
        }
        if self.stream_creation_refused(key, sid, false, now) {
            return;
        }
        let handle = match self.open_begun_stream(key, sid, BegunAt::Exit, now) {
            Ok(handle) => handle,
            Err(NotOpened::NoEdge) => return self.send_end(key, sid, EndReason::TORPROTOCOL, now),
            Err(NotOpened::Killed) => return,
        };
        self.events.push_back(Event::ExitConnect {
            stream: handle,
            host: begin.host,
            port: begin.port,
        });
    }

    pub(super) fn on_resolve(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        if sid != 0 && self.stream_creation_refused(key, sid, true, now) {
            return;
        }
        let host = match Resolve::decode(data) {
            Ok(r) => r.host,
            Err(_) => return self.send_end(key, sid, EndReason::TORPROTOCOL, now),
        };
        if !self.cfg.exit {
            return self.send_end(key, sid, EndReason::EXITPOLICY, now);
        }
        let handle = StreamHandle(self.next_handle);
        let Some(edge) = self.exit_edge(key) else {
            return self.send_end(key, sid, EndReason::TORPROTOCOL, now);
        };
        if sid == 0 || edge.streams.contains_key(&sid) {
            return self.kill(key, "RESOLVE with a bad stream id", now);
        }
        let flow = edge.stream_flow();
        edge.streams
            .insert(sid, Stream::new(handle, StreamState::Resolving, flow));
        self.next_handle += 1;
        self.streams.insert(handle, (key, sid));
        self.events.push_back(Event::ExitResolve {
            stream: handle,
            host,
        });
    }

    /// Exit: the TCP connection for `stream` is up.
    pub fn exit_connected(&mut self, stream: StreamHandle, addr: SocketAddr, now: Instant) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        if s.state != StreamState::Connecting {
            return;
        }
        s.state = StreamState::Open;
        if self.is_service_circuit(key) {
            let body = Self::service_connected_body();
            self.send_edge(key, RelayCommand::CONNECTED, sid, &body, now);
            self.grant_credit(key, sid);
            return;
        }
        let body = Connected {
            addr: Some(addr.ip()),
            ttl: 300,
        }
        .encode();
        self.send_relay_backward(key, RelayCommand::CONNECTED, sid, &body, now);
        self.grant_credit(key, sid);
    }

    /// Exit: the TCP connection for `stream` failed (or the policy refused it).
    pub fn exit_failed(&mut self, stream: StreamHandle, reason: EndReason, now: Instant) {
        let Some((key, sid)) = self.streams.remove(&stream) else {
            return;
        };
        if let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) {
            edge.streams.remove(&sid);
        }
        self.send_end(key, sid, reason, now);
    }

    /// Exit: answers for a RESOLVE.
    pub fn exit_resolved(
        &mut self,
        stream: StreamHandle,
        answers: Vec<ResolvedAnswer>,
        now: Instant,
    ) {
        let Some((key, sid)) = self.streams.remove(&stream) else {
            return;
        };
        if let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) {
            edge.streams.remove(&sid);
        }
        match (Resolved { answers }).encode() {
            Ok(body) => self.send_relay_backward(key, RelayCommand::RESOLVED, sid, &body, now),
            Err(_) => self.send_end(key, sid, EndReason::INTERNAL, now),
        }
    }
}
