//! The `Link*` options relays and clients share (`LinkUnsentLimit`, `LinkKeepalive`,
//! `LinkIdleTimeout`, `LinkCongestionControl`, `LinkRecordLayer`): declared once for both config files
//! ([`with_link_options!`]), checked once ([`LinkOptions::validate`]), one error per option.

use anyhow::anyhow;

use crate::driver::Liveness;

/// `LinkUnsentLimit` when unset on link sockets whose buffers are not constrained and whose
/// node has no `BandwidthRate`: at 10 Mbit/s about 50 ms of data, so a SENDME queued behind
/// it waits that long instead of the ~1.8 s that autotuned buffers held on the paper-002
/// testbed; on loopback still far above what one wake-up of the writer needs
/// (docs/scheduling.md, "The unsent limit"). Also the most a rate's default may be.
pub const DEFAULT_UNSENT_LIMIT: u32 = 64 * 1024;

/// The least `LinkUnsentLimit` a rate's default may be (and the least the option accepts):
/// below about three segments the writer wakes for every segment sent.
pub const MIN_UNSENT_LIMIT: u32 = 4096;

/// How much of a `BandwidthRate` the default `LinkUnsentLimit` holds: 10 ms, the same share
/// the constrained buffers used to hold (docs/scheduling.md, "Socket buffers under a rate").
pub const RATE_UNSENT_DIVISOR: u64 = 100;

/// The link-socket and link-liveness options of a relay's or a client's config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkOptions {
    /// `LinkUnsentLimit`: TCP_NOTSENT_LOWAT on link sockets (0 = off, unset = see
    /// [`LinkOptions::unsent_limit`]).
    pub unsent_limit: Option<u32>,
    /// `LinkKeepalive`: seconds without a write after which a link sends PADDING (0 = off).
    pub keepalive: u64,
    /// `LinkIdleTimeout`: seconds without a read or write progress after which a link is
    /// closed as hung (0 = off).
    pub idle_timeout: u64,
    /// `LinkCongestionControl`: TCP_CONGESTION on link sockets (unset: the system's default).
    pub congestion_control: Option<String>,
    /// `LinkRecordLayer`: `"own"` (unset) or `"rustls"`, see [`LinkOptions::record_layer`].
    pub record_layer: Option<String>,
}

/// `with_link_options! { /// doc  #[derive(Deserialize…)] pub struct XConfig { … } }` declares
/// the config struct with the `Link*` options as its last fields (`link_unsent_limit`,
/// `link_keepalive`, `link_idle_timeout`, `link_congestion_control`) and `XConfig::link()`,
/// which gathers them into a [`LinkOptions`].
///
/// Why a macro and not `#[serde(flatten)]`: flattening buffers the whole file, and a value of
/// the wrong type is then reported at line 1 without its option's name (tested in
/// `client.rs`); fields declared in the struct itself keep TOML's error, which names the key.
macro_rules! with_link_options {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($fields:tt)* }) => {
        $(#[$meta])*
        $vis struct $name {
            $($fields)*
            #[serde(rename = "LinkUnsentLimit", default)]
            pub link_unsent_limit: Option<u32>,
            #[serde(
                rename = "LinkKeepalive",
                default = "crate::link_options::default_keepalive"
            )]
            pub link_keepalive: u64,
            #[serde(
                rename = "LinkIdleTimeout",
                default = "crate::link_options::default_idle_timeout"
            )]
            pub link_idle_timeout: u64,
            #[serde(rename = "LinkCongestionControl", default)]
            pub link_congestion_control: Option<String>,
            #[serde(rename = "LinkRecordLayer", default)]
            pub link_record_layer: Option<String>,
        }

        impl $name {
            /// The `Link*` options of this file.
            pub fn link(&self) -> $crate::link_options::LinkOptions {
                $crate::link_options::LinkOptions {
                    unsent_limit: self.link_unsent_limit,
                    keepalive: self.link_keepalive,
                    idle_timeout: self.link_idle_timeout,
                    congestion_control: self.link_congestion_control.clone(),
                    record_layer: self.link_record_layer.clone(),
                }
            }
        }
    };
}
pub(crate) use with_link_options;

impl Default for LinkOptions {
    fn default() -> LinkOptions {
        LinkOptions {
            unsent_limit: None,
            keepalive: default_keepalive(),
            idle_timeout: default_idle_timeout(),
            congestion_control: None,
            record_layer: None,
        }
    }
}

pub(crate) fn default_keepalive() -> u64 {
    crate::driver::DEFAULT_LINK_KEEPALIVE.as_secs()
}

pub(crate) fn default_idle_timeout() -> u64 {
    crate::driver::DEFAULT_LINK_IDLE_TIMEOUT.as_secs()
}

impl LinkOptions {
    /// Refuse bad values, naming the option: `LinkUnsentLimit` outside 0 (off) or
    /// 4096..16 MiB, a `LinkCongestionControl` this kernel does not offer, a keepalive not
    /// below the idle timeout.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(bytes) = self.unsent_limit {
            if bytes != 0 && !(MIN_UNSENT_LIMIT..=16 << 20).contains(&bytes) {
                anyhow::bail!(
                    "LinkUnsentLimit must be 0 (no limit) or between 4096 and 16777216 bytes"
                );
            }
        }
        if let Some(name) = &self.congestion_control {
            chive_net::check_congestion_control(name)
                .map_err(|e| anyhow!("LinkCongestionControl: {e}"))?;
        }
        self.liveness()?;
        self.record_layer()?;
        Ok(())
    }

    /// `LinkRecordLayer`: who seals and opens TLS records after the handshake: chive-net's
    /// own record layer (unset, `"own"`) or rustls (`"rustls"`).
    pub fn record_layer(&self) -> anyhow::Result<chive_net::RecordLayer> {
        match &self.record_layer {
            None => Ok(chive_net::RecordLayer::default()),
            Some(name) => name.parse().map_err(|e| anyhow!("LinkRecordLayer: {e}")),
        }
    }

    /// `LinkKeepalive` and `LinkIdleTimeout`, checked.
    pub fn liveness(&self) -> anyhow::Result<Liveness> {
        Liveness::from_options(self.keepalive, self.idle_timeout).map_err(anyhow::Error::msg)
    }

    /// TCP_NOTSENT_LOWAT for link sockets: 0 turns it off, a value is used as it is. Unset:
    /// none if the sockets' buffers are constrained (their whole send buffer is small then);
    /// else 10 ms of `rate` (bytes/s; 0 = no `BandwidthRate`) between [`MIN_UNSENT_LIMIT`]
    /// and [`DEFAULT_UNSENT_LIMIT`]; else [`DEFAULT_UNSENT_LIMIT`].
    pub fn unsent_limit(&self, constrained_buffers: bool, rate: u64) -> Option<u32> {
        match self.unsent_limit {
            Some(0) => None,
            Some(bytes) => Some(bytes),
            None if constrained_buffers => None,
            None if rate > 0 => Some(
                (rate / RATE_UNSENT_DIVISOR)
                    .clamp(MIN_UNSENT_LIMIT.into(), DEFAULT_UNSENT_LIMIT.into())
                    as u32,
            ),
            None => Some(DEFAULT_UNSENT_LIMIT),
        }
    }
}
