//! A criterion measurement of the benchmark thread's own CPU time, not wall-clock time.
//!
//! The benches feed the crypto floor of `lab/scripts/relay_cpu.py`, which compares them with the
//! relays' CPU time from /proc; on a shared host wall-clock time also counts the time the thread
//! waits for a core, which inflated the floor 1.5–2× under load. The CPU time of the thread is
//! read from `/proc/thread-self/schedstat` (its first field: nanoseconds on a CPU), so no unsafe
//! code or extra dependency is needed; a read costs a few µs, against samples of ~30 ms.
//! Linux only; elsewhere it panics with a clear message.
//!
//! Shared by chive-net's `tls_record` bench (`#[path]`), so both halves of the floor measure alike;
//! in `benches/support/` so cargo does not take it for a bench target of its own.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::Throughput;

/// Nanoseconds this thread has spent on a CPU.
fn thread_cpu_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect(
        "/proc/thread-self/schedstat (Linux with schedstats) is needed for CPU-time benches",
    );
    text.split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("schedstat's first field is nanoseconds on CPU")
}

/// `Criterion::default().with_measurement(ThreadCpuTime)`.
pub struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuNs
    }
}

/// Values stay in CPU nanoseconds; throughputs in bytes (or elements) per CPU nanosecond (GB/s).
struct CpuNs;

impl ValueFormatter for CpuNs {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ns (CPU)"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let (n, unit) = match *t {
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => (n, "GB/s (CPU)"),
            Throughput::Elements(n) => (n, "Gelem/s (CPU)"),
        };
        for v in values {
            *v = n as f64 / *v;
        }
        unit
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}
