//! Shared by the core's benches.

use std::time::Duration;

use chive_core::SchedulerKind;
use criterion::Criterion;

/// How every core bench measures: 30 samples after 1 s of warm-up, 3 s of measurement each,
/// so that their numbers compare.
pub fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// The circuit schedulers every core bench compares, with their names in the bench ids.
pub const SCHEDULERS: [(&str, SchedulerKind); 3] = [
    ("rr", SchedulerKind::RoundRobin),
    ("ewma", SchedulerKind::Ewma { halflife: 30.0 }),
    ("ewma-direct", SchedulerKind::EwmaDirect { halflife: 30.0 }),
];
