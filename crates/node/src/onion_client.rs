//! `.onion` hostnames at the SOCKS port, and the IO around the client's onion roles (issue 19).
//!
//! A malformed address is answered at once with proposal 304's 0xF6, without touching the
//! network. A request for an address this client already has a joined rendezvous circuit
//! (or a connection attempt in flight) for, with the same SOCKS isolation, goes straight to
//! [`chive_client::onion::OnionConnector`]; so does one whose service's descriptor the
//! connector holds in its cache (valid until the descriptor expires, dropped when an
//! introduction through it fails). Otherwise the descriptor is fetched and verified
//! in a task of its own (none held → 0xF0, one that does not verify → 0xF1) and handed back to
//! the driver ([`ClientInput::OnionDescriptor`]), which starts the connection: rendezvous,
//! introduction, RENDEZVOUS2, then the stream's BEGIN on the joined circuit (0xF2 / 0xF3 /
//! 0xF7 on failure). The service side's IO (descriptor upload, local connections for
//! `HiddenServicePort`) is here too; its policy is [`chive_client::onion::OnionService`].

use std::net::SocketAddr;
use std::time::Instant;

use chive_client::onion::{ConnectKey, OnionOutcome, ServiceAction};
use chive_client::socks::{OnionSocksError, SocksCommand, SocksReply};
use chive_core::{CircKey, Core, LocalMap, StreamHandle};
use chive_crypto::OnionAddress;
use chive_dir::OnionDescriptor;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::client::{ClientInput, ClientState, SocksAnswer};
use crate::common::unix_now;
use crate::driver::{Input, StreamIo};
use crate::onion_dir::{fetch_onion_descriptor, publish_onion_descriptor, FetchError};

/// Is `host` an onion-service name (`….onion`, any case)?
pub fn is_onion_host(host: &str) -> bool {
    host.len() >= 6 && host[host.len() - 6..].eq_ignore_ascii_case(".onion")
}

/// The address in an `.onion` host name. Tor accepts subdomains (`www.<addr>.onion`): the
/// address is the last label before `.onion`.
pub fn parse_onion_host(host: &str) -> Result<OnionAddress, SocksReply> {
    let stem = &host[..host.len().saturating_sub(6)];
    let label = stem.rsplit('.').next().unwrap_or(stem);
    label
        .parse::<OnionAddress>()
        .map_err(|_| SocksReply::Onion(OnionSocksError::BadAddress))
}

/// What a descriptor fetch failure tells the SOCKS client.
pub fn fetch_error_reply(e: &FetchError) -> SocksReply {
    match e {
        FetchError::NotFound => SocksReply::Onion(OnionSocksError::DescriptorNotFound),
        FetchError::Invalid(_) => SocksReply::Onion(OnionSocksError::InvalidDescriptor),
        FetchError::Unreachable(_) => SocksReply::GeneralFailure,
    }
}

/// A request for an onion host, as the SOCKS layer gave it.
pub struct OnionRequest {
    /// The host name (kept for BEGIN, as Tor sends it).
    pub host: String,
    /// The virtual port.
    pub port: u16,
    /// CONNECT or RESOLVE.
    pub command: SocksCommand,
    /// SOCKS isolation key.
    pub isolation: Vec<u8>,
}

/// A connection's target once the address parsed: the connector's key, host and port.
pub struct OnionTarget {
    /// Address and isolation.
    pub key: ConnectKey,
    /// The host name as given.
    pub host: String,
    /// The virtual port.
    pub port: u16,
}

impl ClientState {
    /// A SOCKS request for an `.onion` host.
    pub(crate) fn onion_request(
        &mut self,
        core: &mut Core,
        req: OnionRequest,
        reply: oneshot::Sender<SocksAnswer>,
        now: Instant,
    ) {
        let address = match parse_onion_host(&req.host) {
            Ok(a) => a,
            Err(code) => {
                info!(host = %req.host.chars().take(80).collect::<String>(), "malformed onion address");
                let _ = reply.send(SocksAnswer::Failed(code));
                return;
            }
        };
        if req.command != SocksCommand::Connect {
            // Nothing to resolve: an onion service has no address to tell.
            let _ = reply.send(SocksAnswer::Failed(SocksReply::CommandNotSupported));
            return;
        }
        let key = ConnectKey {
            address,
            isolation: req.isolation,
        };
        if let Some(ticket) = self.onion.attach(core, &key, &req.host, req.port, now) {
            self.onion_waiting.insert(ticket, reply);
            return;
        }
        if let Some(desc) = self.onion.cached_descriptor(&address, unix_now()) {
            debug!(%address, revision = desc.revision, "onion descriptor from the cache");
            let ticket = self
                .onion
                .connect(core, key, desc, &req.host, req.port, now);
            self.onion_waiting.insert(ticket, reply);
            return;
        }
        let (Some(authority), Some(tx)) = (self.authority, self.tx.clone()) else {
            let _ = reply.send(SocksAnswer::Failed(SocksReply::GeneralFailure));
            return;
        };
        tokio::spawn(async move {
            let started = Instant::now();
            let result = fetch_onion_descriptor(authority, &address, unix_now())
                .await
                .map_err(|e| {
                    info!(%address, error = ?e, "onion descriptor fetch failed");
                    fetch_error_reply(&e)
                });
            if result.is_ok() {
                info!(%address, took_ms = started.elapsed().as_millis() as u64,
                      "onion descriptor fetched");
            }
            let input = ClientInput::OnionDescriptor {
                target: OnionTarget {
                    key,
                    host: req.host,
                    port: req.port,
                },
                result,
                reply,
            };
            let _ = tx.send(Input::Client(input)).await;
        });
    }

    /// The descriptor fetch for a request finished.
    pub(crate) fn onion_descriptor(
        &mut self,
        core: &mut Core,
        target: OnionTarget,
        result: Result<OnionDescriptor, SocksReply>,
        reply: oneshot::Sender<SocksAnswer>,
        now: Instant,
    ) {
        match result {
            Ok(desc) => {
                self.onion.store_descriptor(desc.clone(), unix_now());
                let OnionTarget { key, host, port } = target;
                let ticket = self.onion.connect(core, key, desc, &host, port, now);
                self.onion_waiting.insert(ticket, reply);
            }
            Err(code) => {
                match code {
                    SocksReply::Onion(OnionSocksError::InvalidDescriptor) => {
                        self.onion.descriptor_fetch_failed(true)
                    }
                    SocksReply::Onion(OnionSocksError::DescriptorNotFound) => {
                        self.onion.descriptor_fetch_failed(false)
                    }
                    _ => {}
                }
                let _ = reply.send(SocksAnswer::Failed(code));
            }
        }
    }

    /// Move finished onion requests into `opening` (or answer their failure).
    pub(crate) fn take_onion_outcomes(
        &mut self,
        streams: &mut LocalMap<StreamHandle, StreamIo>,
    ) -> bool {
        let mut any = false;
        while let Some((ticket, outcome)) = self.onion.poll_outcome() {
            any = true;
            let Some(reply) = self.onion_waiting.remove(&ticket) else {
                continue;
            };
            match outcome {
                OnionOutcome::Started(handle) => {
                    streams.insert(handle, StreamIo::parked());
                    self.opening.insert(handle, reply);
                }
                OnionOutcome::Failed(code) => {
                    let _ = reply.send(SocksAnswer::Failed(code));
                }
            }
        }
        any
    }

    /// Hand the service's actions to tasks (descriptor uploads).
    pub(crate) fn service_actions(&mut self) -> bool {
        let mut any = false;
        let Some(svc) = self.service.as_mut() else {
            return false;
        };
        while let Some(action) = svc.poll_action() {
            any = true;
            let ServiceAction::Publish {
                doc,
                revision,
                intro_points,
            } = action;
            let (Some(authority), Some(tx)) = (self.authority, self.tx.clone()) else {
                continue;
            };
            let address = svc.address();
            tokio::spawn(async move {
                let ok = match publish_onion_descriptor(authority, &address, &doc).await {
                    Ok(()) => {
                        info!(%address, revision, intro_points, "onion descriptor published");
                        true
                    }
                    Err(e) => {
                        warn!(%address, error = %format!("{e:#}"), "onion descriptor upload failed; retrying");
                        false
                    }
                };
                if !ok {
                    let _ = tx
                        .send(Input::Client(ClientInput::ServicePublishFailed))
                        .await;
                }
            });
        }
        any
    }

    /// Service side: the local target for a stream to `port` on `circ`, if any.
    pub fn service_target(&self, circ: CircKey, port: u16) -> Option<SocketAddr> {
        self.service.as_ref()?.stream_target(circ, port)
    }
}
