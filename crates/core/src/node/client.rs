//! The client's side of streams: opening a stream or a RESOLVE on a built origin circuit, and
//! the exit's CONNECTED and RESOLVED answers.

use std::time::Instant;

use chive_cell::{Begin, Connected, RelayCommand, Resolve, Resolved};

use crate::streamflow::{LegWindows, StreamFlow};
use crate::{CircKey, StreamHandle};

use super::circuit::Role;
use super::event::{CoreError, Event};
use super::stream::{Stream, StreamState};
use super::Core;

impl Core {
    /// Open a stream to `host:port` through a built origin circuit. Emits
    /// [`Event::StreamConnected`] or [`Event::StreamClosed`] later.
    pub fn open_stream(
        &mut self,
        circ: CircKey,
        host: &str,
        port: u16,
        now: Instant,
    ) -> Result<StreamHandle, CoreError> {
        let body = Begin {
            host: host.to_string(),
            port,
            flags: 0,
        }
        .encode()
        .map_err(|e| CoreError::BadTarget(e.to_string()))?;
        self.new_origin_stream(
            circ,
            RelayCommand::BEGIN,
            &body,
            StreamState::Connecting,
            now,
        )
    }

    /// Ask the exit of a built circuit to resolve `host`. Emits [`Event::Resolved`]
    /// or [`Event::StreamClosed`].
    pub fn resolve(
        &mut self,
        circ: CircKey,
        host: &str,
        now: Instant,
    ) -> Result<StreamHandle, CoreError> {
        let body = Resolve {
            host: host.to_string(),
        }
        .encode()
        .map_err(|e| CoreError::BadTarget(e.to_string()))?;
        self.new_origin_stream(
            circ,
            RelayCommand::RESOLVE,
            &body,
            StreamState::Resolving,
            now,
        )
    }

    fn new_origin_stream(
        &mut self,
        circ_key: CircKey,
        cmd: RelayCommand,
        body: &[u8],
        state: StreamState,
        now: Instant,
    ) -> Result<StreamHandle, CoreError> {
        let handle = StreamHandle(self.next_handle);
        let circ = self
            .circuits
            .get_mut(&circ_key)
            .ok_or(CoreError::NoSuchCircuit)?;
        let Role::Origin {
            edge, built: true, ..
        } = &mut circ.role
        else {
            return Err(CoreError::CircuitNotOpen);
        };
        let sid = (0..u16::MAX)
            .map(|i| edge.next_stream_id.wrapping_add(i))
            .find(|id| *id != 0 && !edge.streams.contains_key(id))
            .ok_or(CoreError::TooManyStreams)?;
        edge.next_stream_id = sid.wrapping_add(1);
        let flow = edge.stream_flow();
        let mut stream = Stream::new(handle, state, flow);
        // On a linked set's home under fixed windows: a stream window per leg, so that cells
        // queued behind one leg's congested entry do not hold a switch to the other.
        if matches!(stream.flow, StreamFlow::Window(_)) && self.path_set_of(circ_key).is_some() {
            stream.legs = Some(LegWindows::default());
        }
        let Some(edge) = self.circuits.get_mut(&circ_key).and_then(|c| c.edge_mut()) else {
            return Err(CoreError::CircuitNotOpen);
        };
        edge.streams.insert(sid, stream);
        self.next_handle += 1;
        self.streams.insert(handle, (circ_key, sid));
        // Through send_edge: a linked set sequences BEGIN like every multiplexed cell.
        self.send_edge(circ_key, cmd, sid, body, now);
        Ok(handle)
    }

    pub(super) fn client_connected(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let addr = Connected::decode(data).ok().and_then(|c| c.addr);
        let Some(stream) = self.stream_mut(key, sid) else {
            return;
        };
        if stream.state != StreamState::Connecting {
            return self.kill(key, "unexpected CONNECTED", now);
        }
        stream.state = StreamState::Open;
        let handle = stream.handle;
        self.events.push_back(Event::StreamConnected {
            stream: handle,
            addr,
        });
        self.grant_credit(key, sid);
    }

    pub(super) fn client_resolved(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let answers = match Resolved::decode(data) {
            Ok(r) => r.answers,
            Err(e) => return self.kill(key, &format!("malformed RESOLVED: {e}"), now),
        };
        let Some(stream) = self.stream_mut(key, sid) else {
            return;
        };
        if stream.state != StreamState::Resolving {
            return self.kill(key, "unexpected RESOLVED", now);
        }
        let handle = stream.handle;
        self.events.push_back(Event::Resolved {
            stream: handle,
            answers,
        });
        self.remove_stream(key, sid);
    }
}
