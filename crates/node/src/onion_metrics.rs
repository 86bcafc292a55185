//! Onion-service counters in the node's metrics (issue 19): the relay's introduction- and
//! rendezvous-point roles (every node), the client's connector and descriptor cache, and the
//! onion service (`HiddenServiceDir`). [`crate::metrics::Metrics`] writes an `onion` record to
//! the `MetricsFile` in a second when a counter changed, an `onion_join` record per joined
//! connection (its set-up step by step, [`JoinTiming`]), and [`render`] adds the
//! `chive_onion_*` lines to the `MetricsPort` text. Names and meanings: docs/protocol.md, "Onion services".

use std::fmt::Write as _;

use chive_client::onion::{ConnectorCounters, JoinTiming, PoolCounters, ServiceCounters};
use chive_core::OnionRelayStats;

/// One node's onion counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OnionCounters {
    /// The relay roles (zero at a client unless it is a point, which it never is).
    pub relay: OnionRelayStats,
    /// The client's connections to services (clients only).
    pub client: Option<ConnectorCounters>,
    /// The service this client runs (HiddenServiceDir only).
    pub service: Option<ServiceCounters>,
    /// The client's predicted internal circuits (clients only).
    pub client_pool: Option<PoolStats>,
    /// The service's predicted rendezvous circuits (HiddenServiceDir only).
    pub service_pool: Option<PoolStats>,
}

/// One predicted-circuit pool ([`chive_client::onion::InternalPool`]): what it did and what
/// it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Launched / built / used / failed / expired since start.
    pub counters: PoolCounters,
    /// Built circuits waiting to be taken now.
    pub ready: usize,
}

/// The `chive_onion_<role>_pool_*` entries of one pool (`role`: "client" or "service").
fn pool_entries(
    role: &'static str,
    p: &PoolStats,
) -> [(&'static str, &'static str, &'static str, u64); 6] {
    let c = &p.counters;
    let client = role == "client";
    let pick = |a: &'static str, b: &'static str| if client { a } else { b };
    [
        (
            pick(
                "chive_onion_client_pool_launched_total",
                "chive_onion_service_pool_launched_total",
            ),
            "counter",
            "Predicted internal circuits launched (OnionPredictedCircuits).",
            c.launched,
        ),
        (
            pick(
                "chive_onion_client_pool_built_total",
                "chive_onion_service_pool_built_total",
            ),
            "counter",
            "Predicted internal circuits built.",
            c.built,
        ),
        (
            pick(
                "chive_onion_client_pool_used_total",
                "chive_onion_service_pool_used_total",
            ),
            "counter",
            "Predicted internal circuits taken for a point (extended to it, or ending at it).",
            c.used,
        ),
        (
            pick(
                "chive_onion_client_pool_failed_total",
                "chive_onion_service_pool_failed_total",
            ),
            "counter",
            "Predicted internal circuits closed before they were taken (build failed or lost).",
            c.failed,
        ),
        (
            pick(
                "chive_onion_client_pool_expired_total",
                "chive_onion_service_pool_expired_total",
            ),
            "counter",
            "Predicted internal circuits closed after an hour unused.",
            c.expired,
        ),
        (
            pick(
                "chive_onion_client_pool_ready",
                "chive_onion_service_pool_ready",
            ),
            "gauge",
            "Built predicted internal circuits waiting to be taken.",
            p.ready as u64,
        ),
    ]
}

/// `(name, kind, help, value)` of every metric `c` has, in a fixed order; the JSON record's
/// keys are the names without `chive_onion_` and `_total`.
pub fn entries(c: &OnionCounters) -> Vec<(&'static str, &'static str, &'static str, u64)> {
    let r = &c.relay;
    let mut v = vec![
        (
            "chive_onion_intro_circuits",
            "gauge",
            "Introduction circuits registered at this relay.",
            r.intro_circuits as u64,
        ),
        (
            "chive_onion_introduce1_relayed_total",
            "counter",
            "INTRODUCE1 passed on as INTRODUCE2 (introduction point).",
            r.introduced,
        ),
        (
            "chive_onion_introduce1_refused_total",
            "counter",
            "INTRODUCE1 refused: unparsable or for no registered key (introduction point).",
            r.intro_refused,
        ),
        (
            "chive_onion_rendezvous_waiting",
            "gauge",
            "Client circuits waiting here with a rendezvous cookie.",
            r.rend_waiting as u64,
        ),
        (
            "chive_onion_rendezvous_spliced_total",
            "counter",
            "Circuit pairs joined at this rendezvous point.",
            r.rend_joined,
        ),
    ];
    if let Some(k) = &c.client {
        v.extend([
            (
                "chive_onion_client_attempts_total",
                "counter",
                "Connection attempts started (each with a fresh cookie).",
                k.attempts,
            ),
            (
                "chive_onion_client_joined_total",
                "counter",
                "Attempts that joined a rendezvous circuit.",
                k.joined,
            ),
            (
                "chive_onion_client_intro_failed_total",
                "counter",
                "Attempts failed at the introduction (0xF2).",
                k.intro_failed,
            ),
            (
                "chive_onion_client_rendezvous_failed_total",
                "counter",
                "Attempts failed at the rendezvous (0xF3).",
                k.rendezvous_failed,
            ),
            (
                "chive_onion_client_timed_out_total",
                "counter",
                "Attempts past OnionAttemptTimeout (0xF7).",
                k.timed_out,
            ),
            (
                "chive_onion_client_requests_failed_total",
                "counter",
                "Onion requests that failed after their last attempt.",
                k.requests_failed,
            ),
            (
                "chive_onion_client_descriptors_fetched_total",
                "counter",
                "Descriptors fetched and verified.",
                k.descriptors_fetched,
            ),
            (
                "chive_onion_client_descriptors_refused_total",
                "counter",
                "Descriptors fetched that did not verify (0xF1).",
                k.descriptors_refused,
            ),
            (
                "chive_onion_client_descriptors_not_found_total",
                "counter",
                "Fetches answered without a descriptor (0xF0).",
                k.descriptors_not_found,
            ),
            (
                "chive_onion_client_descriptor_cache_hits_total",
                "counter",
                "Requests served from the descriptor cache.",
                k.descriptor_cache_hits,
            ),
            (
                "chive_onion_client_descriptors_dropped_total",
                "counter",
                "Cached descriptors dropped after an introduction failure.",
                k.descriptors_dropped,
            ),
            (
                "chive_onion_client_predicted_used_total",
                "counter",
                "Rendezvous and introduction circuits that were predicted circuits (ending at the point or extended to it).",
                k.predicted_used,
            ),
        ]);
    }
    if let Some(s) = &c.service {
        let i = &s.introduce;
        v.extend([
            (
                "chive_onion_service_introduce2_accepted_total",
                "counter",
                "INTRODUCE2 accepted (a rendezvous circuit is built).",
                i.accepted,
            ),
            (
                "chive_onion_service_introduce2_malformed_total",
                "counter",
                "INTRODUCE2 dropped: malformed or for another key.",
                i.malformed,
            ),
            (
                "chive_onion_service_introduce2_undecryptable_total",
                "counter",
                "INTRODUCE2 dropped: did not decrypt (bad MAC).",
                i.undecryptable,
            ),
            (
                "chive_onion_service_introduce2_replayed_total",
                "counter",
                "INTRODUCE2 dropped: replay detected.",
                i.replayed,
            ),
            (
                "chive_onion_service_introduce2_bad_rendezvous_point_total",
                "counter",
                "INTRODUCE2 dropped: no usable rendezvous point.",
                i.bad_rendezvous_point,
            ),
            (
                "chive_onion_service_rendezvous_dropped_total",
                "counter",
                "Accepted introductions dropped: too many rendezvous circuits building.",
                s.rendezvous_dropped,
            ),
            (
                "chive_onion_service_rendezvous_failed_total",
                "counter",
                "Rendezvous circuits that closed before they were built.",
                s.rendezvous_failed,
            ),
            (
                "chive_onion_service_rendezvous_joined_total",
                "counter",
                "RENDEZVOUS1 sent (a client joined).",
                s.rendezvous_joined,
            ),
            (
                "chive_onion_service_descriptors_published_total",
                "counter",
                "Descriptors handed out for upload.",
                s.descriptors_published,
            ),
            (
                "chive_onion_service_intro_circuits_lost_total",
                "counter",
                "Introduction circuits that closed.",
                s.intro_circuits_lost,
            ),
            (
                "chive_onion_service_predicted_used_total",
                "counter",
                "Rendezvous circuits that were predicted circuits extended by one hop.",
                s.predicted_used,
            ),
        ]);
    }
    if let Some(p) = &c.client_pool {
        v.extend(pool_entries("client", p));
    }
    if let Some(p) = &c.service_pool {
        v.extend(pool_entries("service", p));
    }
    v
}

/// The `onion` JSON-lines record at UNIX time `t`.
pub fn json_record(c: &OnionCounters, t: f64) -> String {
    let mut s = format!("{{\"type\":\"onion\",\"t\":{t:.6}");
    for (name, _, _, value) in entries(c) {
        let key = name.trim_start_matches("chive_onion_");
        let key = key.strip_suffix("_total").unwrap_or(key);
        let _ = write!(s, ",\"{key}\":{value}");
    }
    s.push('}');
    s
}

/// The `onion_join` JSON-lines record of one joined connection that joined at UNIX time `t`
/// (milliseconds from its attempt's start; null for a step that did not happen).
pub fn join_record(j: &JoinTiming, t: f64) -> String {
    let ms = |d: Option<std::time::Duration>| {
        d.map_or_else(
            || "null".to_string(),
            |d| format!("{:.3}", d.as_secs_f64() * 1e3),
        )
    };
    format!(
        "{{\"type\":\"onion_join\",\"t\":{t:.6},\"service\":\"{}\",\"attempt\":{},\"rend_built_ms\":{},\"rend_ready_ms\":{},\"intro_built_ms\":{},\"introduced_ms\":{},\"acked_ms\":{},\"joined_ms\":{:.3},\"rend_predicted\":{},\"intro_predicted\":{}}}",
        j.address,
        j.attempt,
        ms(j.rend_built),
        ms(j.rend_ready),
        ms(j.intro_built),
        ms(j.introduced),
        ms(j.acked),
        j.joined.as_secs_f64() * 1e3,
        j.rend_predicted,
        j.intro_predicted
    )
}

/// Prometheus text of `c`.
pub fn render(c: &OnionCounters, out: &mut String) {
    for (name, kind, help, value) in entries(c) {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn records_and_text_name_every_counter_of_the_roles_present() {
        let relay_only = OnionCounters {
            relay: OnionRelayStats {
                intro_refused: 3,
                ..Default::default()
            },
            ..Default::default()
        };
        let rec = json_record(&relay_only, 1.5);
        assert!(rec.contains("\"introduce1_refused\":3"), "{rec}");
        assert!(!rec.contains("client_"), "{rec}");
        let mut both = relay_only;
        let mut svc = ServiceCounters::default();
        svc.introduce.undecryptable = 2;
        svc.introduce.replayed = 1;
        both.service = Some(svc);
        both.client = Some(ConnectorCounters {
            descriptor_cache_hits: 4,
            ..Default::default()
        });
        let v: serde_json::Value = serde_json::from_str(&json_record(&both, 2.0)).unwrap();
        assert_eq!(v["service_introduce2_undecryptable"], 2);
        assert_eq!(v["service_introduce2_replayed"], 1);
        assert_eq!(v["client_descriptor_cache_hits"], 4);
        let mut text = String::new();
        render(&both, &mut text);
        assert!(text.contains("\nchive_onion_service_introduce2_undecryptable_total 2\n"));
        assert!(text.contains("# TYPE chive_onion_client_descriptor_cache_hits_total counter"));
        assert_eq!(text.matches("# TYPE").count(), entries(&both).len());
    }

    #[test]
    fn each_pool_has_its_counters_under_its_role() {
        let pool = |launched, used, failed, expired, ready| PoolStats {
            counters: PoolCounters {
                launched,
                built: launched - failed,
                used,
                failed,
                expired,
            },
            ready,
        };
        let none = OnionCounters {
            client: Some(ConnectorCounters::default()),
            ..Default::default()
        };
        assert!(!json_record(&none, 1.0).contains("pool"));
        let c = OnionCounters {
            client_pool: Some(pool(7, 3, 2, 1, 1)),
            service_pool: Some(pool(5, 4, 0, 0, 1)),
            ..none
        };
        let v: serde_json::Value = serde_json::from_str(&json_record(&c, 2.0)).unwrap();
        assert_eq!(
            [
                &v["client_pool_launched"],
                &v["client_pool_built"],
                &v["client_pool_used"],
                &v["client_pool_failed"],
                &v["client_pool_expired"],
                &v["client_pool_ready"],
            ],
            [7, 5, 3, 2, 1, 1].map(serde_json::Value::from).each_ref()
        );
        assert_eq!(v["service_pool_launched"], 5);
        assert_eq!(v["service_pool_used"], 4);
        let mut text = String::new();
        render(&c, &mut text);
        assert!(
            text.contains("\nchive_onion_client_pool_used_total 3\n"),
            "{text}"
        );
        assert!(
            text.contains("\nchive_onion_service_pool_launched_total 5\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE chive_onion_client_pool_ready gauge"),
            "{text}"
        );
        assert_eq!(text.matches("# TYPE").count(), entries(&c).len());
    }

    #[test]
    fn a_join_record_keeps_missing_steps_as_null() {
        let j = JoinTiming {
            address: chive_crypto::OnionAddress::from_key(
                chive_crypto::IdentityKeypair::from_secret_bytes(&[1; 32]).public(),
            ),
            attempt: 2,
            rend_built: Some(Duration::from_millis(100)),
            rend_ready: Some(Duration::from_millis(150)),
            intro_built: Some(Duration::from_millis(120)),
            introduced: Some(Duration::from_millis(150)),
            acked: None,
            joined: Duration::from_millis(700),
            rend_predicted: true,
            intro_predicted: false,
            at: std::time::Instant::now(),
        };
        let v: serde_json::Value = serde_json::from_str(&join_record(&j, 3.0)).unwrap();
        assert_eq!(v["type"], "onion_join");
        assert_eq!(v["attempt"], 2);
        assert!(v["acked_ms"].is_null());
        assert_eq!(v["joined_ms"], 700.0);
        assert_eq!(
            (
                v["rend_predicted"].as_bool(),
                v["intro_predicted"].as_bool()
            ),
            (Some(true), Some(false))
        );
        assert!(v["service"].as_str().unwrap().ends_with(".onion"));
    }
}
