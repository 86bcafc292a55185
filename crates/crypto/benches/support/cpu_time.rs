//! A criterion measurement of the benchmark thread's own CPU time, not wall-clock time.
//!
//! The benches feed the crypto floor of `lab/scripts/relay_cpu.py`, which compares them with the
//! relays' CPU time from /proc; on a shared host wall-clock time also counts the time the thread
//! waits for a core, which inflated the floor about 2× under load. The thread's CPU time comes from
//! `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, which brings the running task's accounting up to date
//! (nanoseconds; `/proc/thread-self/schedstat` is only updated at scheduler ticks, so short samples
//! read zero there).
//!
//! Shared by chive-net's `tls_record` bench (`#[path]`), so both halves of the floor measure alike;
//! in `benches/support/` so cargo does not take it for a bench target of its own.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::Throughput;

/// Nanoseconds this thread has spent on a CPU.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid, exclusive pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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
