//! The machine's thread wake-up latency: how long a thread parked on a futex
//! takes to run after another thread wakes it, with the waker on another CPU
//! and on the same CPU, after idle gaps of 200–400 µs (so the waiter's CPU
//! has gone idle, as it has between a lookup's submission and its
//! completion at light load).
//!
//! Every engine's latency contains one or more such hand-offs (a device
//! interrupt waking a thread, a runtime waking a worker, a pool handing a
//! request to a thread), so this figure is the unit in which this machine
//! charges for them. On the 2-vCPU Firecracker VMs this project is measured
//! on, guest halt-polling is off (`haltpoll.guest_halt_poll_ns=0`): an idle
//! vCPU halts and a wake-up that needs it costs a round trip through the
//! host: 20–40 µs at p50 here against 3–5 µs on the same CPU.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wake-ups per series of the machine's wake-latency probe (~0.3 ms each).
pub const SAMPLES: usize = 1500;

/// Percentiles of one wake-up series, in µs.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct WakePercentiles {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl WakePercentiles {
    /// From wake-up latencies in ns (sorted here); `None` when empty.
    pub fn from_ns(mut ns: Vec<u64>) -> Option<WakePercentiles> {
        if ns.is_empty() {
            return None;
        }
        ns.sort_unstable();
        let at = |q: f64| {
            let i = ((ns.len() as f64 * q) as usize).min(ns.len() - 1);
            ns[i] as f64 / 1e3
        };
        Some(WakePercentiles {
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            max_us: ns[ns.len() - 1] as f64 / 1e3,
        })
    }
}

/// The probe's result.
#[derive(Debug, Clone, Serialize)]
pub struct WakeLatency {
    /// Waker and waiter pinned to two different CPUs (`None` with one CPU).
    pub other_cpu: Option<WakePercentiles>,
    /// Both pinned to the same CPU.
    pub same_cpu: WakePercentiles,
    /// Wake-ups measured per series.
    pub samples: usize,
    /// `haltpoll.guest_halt_poll_ns`, where the guest has that module.
    pub guest_halt_poll_ns: Option<u64>,
}

impl WakeLatency {
    /// One line for the console and the reports.
    pub fn summary(&self) -> String {
        let f = |p: &WakePercentiles| {
            format!(
                "p50 {:.1} / p99 {:.1} / max {:.0} µs",
                p.p50_us, p.p99_us, p.max_us
            )
        };
        format!(
            "thread wake-up after an idle gap: other CPU {}; same CPU {}{}",
            self.other_cpu.as_ref().map_or("n/a (one CPU)".into(), f),
            f(&self.same_cpu),
            self.guest_halt_poll_ns
                .map_or(String::new(), |n| format!(" (guest halt-polling {n} ns)"))
        )
    }
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &raw mut set) };
    if r != 0 {
        return vec![0];
    }
    // SAFETY: CPU_ISSET reads the set within its size.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu` (best effort: an error leaves it free).
fn pin(cpu: usize) {
    // SAFETY: as above; CPU_SET writes within the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &raw const set);
    }
}

/// One series: `samples` wake-ups of a waiter pinned to `waiter_cpu` by a
/// waker pinned to `waker_cpu`. Both are fresh threads, so no thread of the
/// benchmark keeps their affinity.
fn series(waker_cpu: usize, waiter_cpu: usize, samples: usize) -> Vec<u64> {
    let base = Instant::now();
    // the waker's timestamp (ns since `base`) of wake-up `seq`; 0 = none yet
    let posted = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let waiter = {
        let (posted, seq, done) = (posted.clone(), seq.clone(), done.clone());
        std::thread::spawn(move || {
            pin(waiter_cpu);
            let mut out = Vec::with_capacity(samples);
            for i in 1..=samples as u64 {
                while seq.load(Ordering::Acquire) < i {
                    std::thread::park();
                }
                let now = base.elapsed().as_nanos() as u64;
                out.push(now.saturating_sub(posted.load(Ordering::Acquire)));
                done.store(i, Ordering::Release);
            }
            out
        })
    };
    let waker = std::thread::spawn({
        let waiter = waiter.thread().clone();
        move || {
            pin(waker_cpu);
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            for i in 1..=samples as u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                std::thread::sleep(Duration::from_micros(200 + x % 200));
                posted.store(base.elapsed().as_nanos() as u64, Ordering::Release);
                seq.store(i, Ordering::Release);
                waiter.unpark();
                // let the waiter run (on the same CPU it needs this one)
                while done.load(Ordering::Acquire) < i {
                    std::thread::yield_now();
                }
            }
        }
    });
    waker.join().expect("wake probe: waker panicked");
    waiter.join().expect("wake probe: waiter panicked")
}

/// Runs both series (about 2 × `samples` × 0.3 ms).
pub fn measure(samples: usize) -> WakeLatency {
    let cpus = allowed_cpus();
    let a = cpus.first().copied().unwrap_or(0);
    let other_cpu = cpus
        .get(1)
        .and_then(|&b| WakePercentiles::from_ns(series(a, b, samples)));
    let same_cpu =
        WakePercentiles::from_ns(series(a, a, samples)).expect("a series of at least one sample");
    let guest_halt_poll_ns =
        std::fs::read_to_string("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
            .ok()
            .and_then(|s| s.trim().parse().ok());
    WakeLatency {
        other_cpu,
        same_cpu,
        samples,
        guest_halt_poll_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_series() {
        let p = WakePercentiles::from_ns((1..=100).map(|i| i * 1000).collect()).unwrap();
        assert_eq!(p.p50_us, 51.0);
        assert_eq!(p.p90_us, 91.0);
        assert_eq!(p.p99_us, 100.0);
        assert_eq!(p.max_us, 100.0);
        assert_eq!(WakePercentiles::from_ns(Vec::new()), None);
    }

    #[test]
    fn the_probe_measures_every_wake_up() {
        let w = measure(50);
        assert_eq!(w.samples, 50);
        for p in w.other_cpu.iter().chain([&w.same_cpu]) {
            assert!(
                p.p50_us > 0.0 && p.p50_us <= p.p99_us && p.p99_us <= p.max_us,
                "{p:?}"
            );
            // a wake-up is not a second: the timestamps pair up
            assert!(p.max_us < 1e6, "{p:?}");
        }
        assert_eq!(w.other_cpu.is_some(), allowed_cpus().len() > 1);
        assert!(w.summary().contains("same CPU p50"), "{}", w.summary());
    }
}
