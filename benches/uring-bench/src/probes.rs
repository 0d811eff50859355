//! Two per-cell probes (issue #8):
//!
//! - **timer lateness**: a task on the engine's own tokio runtime loops
//!   `tokio::time::sleep(1 ms)` during the measured window and records how
//!   late each wake-up is (elapsed − 1 ms). It answers "what happens to a
//!   1 ms timer on a runtime that is doing these reads?".
//! - **syscalls per read**: a `perf_event_open` counter on the
//!   `raw_syscalls:sys_enter` tracepoint, opened on the thread that runs the
//!   cell before the engine creates its runtime or threads, with `inherit`
//!   set, so it counts that thread and every thread created after it (tokio
//!   workers, the blocking pool, reader threads; not threads that already
//!   existed). It is read at the start and at the end of the measured window.
//!   Reading an inherited counter returns the parent's count plus that of
//!   every child, live (the kernel reads each child's count) or exited
//!   (folded into the parent when the child exits), so the two reads bracket
//!   the window whether or not the engine's threads have been joined.

use crate::engines::{new_histogram, Stop};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Period of the timer probe.
pub const TIMER_PERIOD: Duration = Duration::from_millis(1);

/// Where tracefs puts the id of `raw_syscalls:sys_enter`.
const SYS_ENTER_ID: [&str; 2] = [
    "/sys/kernel/tracing/events/raw_syscalls/sys_enter/id",
    "/sys/kernel/debug/tracing/events/raw_syscalls/sys_enter/id",
];

/// Parses a tracefs `id` file ("443\n").
pub fn parse_tracepoint_id(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The id of the `raw_syscalls:sys_enter` tracepoint, or why there is none.
fn sys_enter_id() -> Result<u64, String> {
    let mut why = Vec::new();
    for p in SYS_ENTER_ID {
        match std::fs::read_to_string(p) {
            Ok(t) => {
                return parse_tracepoint_id(&t).ok_or_else(|| format!("{p}: unparseable id {t:?}"))
            }
            Err(e) => why.push(format!("{p}: {e}")),
        }
    }
    Err(format!(
        "raw_syscalls:sys_enter tracepoint not found (is tracefs mounted and readable?): {}",
        why.join("; ")
    ))
}

/// Counts the system calls of the calling thread and of every thread it (or
/// they) create from now on.
#[derive(Debug)]
pub struct SyscallCounter {
    counter: Mutex<perf_event::Counter>,
}

impl SyscallCounter {
    /// Opens and enables the counter; `Err` says why it is unavailable.
    pub fn open() -> Result<SyscallCounter, String> {
        let id = sys_enter_id()?;
        let mut counter = perf_event::Builder::new(perf_event::events::Tracepoint::with_id(id))
            // pid 0, any CPU: this thread, wherever it runs
            .observe_self()
            .any_cpu()
            // threads created after this call get a child counter
            .inherit(true)
            // the tracepoint fires in kernel mode, on syscall entry: with
            // exclude_kernel (the builder's default) it counts nothing
            .exclude_kernel(false)
            .build()
            .map_err(|e| format!("perf_event_open(raw_syscalls:sys_enter, inherit): {e}"))?;
        counter
            .enable()
            .map_err(|e| format!("enabling the syscall counter: {e}"))?;
        Ok(SyscallCounter {
            counter: Mutex::new(counter),
        })
    }

    /// Syscalls so far (this thread plus inherited children, live or exited).
    pub fn read(&self) -> Result<u64, String> {
        self.counter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .read()
            .map_err(|e| format!("reading the syscall counter: {e}"))
    }
}

/// Why syscalls could not be counted (the first reason given).
static UNAVAILABLE: OnceLock<String> = OnceLock::new();

/// Says once per process why syscalls are not counted.
pub fn warn_once_unavailable(why: &str) {
    if UNAVAILABLE.set(why.to_string()).is_ok() {
        println!("syscalls/read: n/a: {why}");
    }
}

/// How this run counted syscalls, for the report.
pub fn syscall_probe_description(requested: bool) -> String {
    match (requested, UNAVAILABLE.get()) {
        (false, _) => "n/a: not counted (--count-syscalls off)".into(),
        (true, Some(why)) => format!("n/a: {why}"),
        (true, None) => "perf_event_open counter on the raw_syscalls:sys_enter tracepoint, \
             inherited by every thread the cell creates; fio not counted"
            .into(),
    }
}

/// Timer lateness over a cell's window, milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimerLateness {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Wake-ups recorded.
    pub samples: u64,
}

impl TimerLateness {
    /// Summary of a histogram of lateness in nanoseconds (None when empty).
    pub fn from_histogram(h: &Histogram<u64>) -> Option<TimerLateness> {
        if h.is_empty() {
            return None;
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        Some(TimerLateness {
            p50_ms: ms(h.value_at_quantile(0.5)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
            samples: h.len(),
        })
    }
}

/// Records one wake-up that came `elapsed` after the sleep was started.
fn record_lateness(h: &mut Histogram<u64>, elapsed: Duration) {
    let late = elapsed.saturating_sub(TIMER_PERIOD).as_nanos() as u64;
    // the histogram's lowest value is 1 ns
    h.saturating_record(late.max(1));
}

/// The timer probe: sleeps 1 ms in a loop until `stop` is raised and
/// returns the lateness of every wake-up (ns). Spawn it on the runtime under
/// test when the measured window starts.
pub async fn timer_probe(stop: Arc<Stop>) -> Histogram<u64> {
    let mut h = new_histogram();
    while !stop.stopped() {
        let t0 = Instant::now();
        tokio::time::sleep(TIMER_PERIOD).await;
        record_lateness(&mut h, t0.elapsed());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tracefs_ids() {
        assert_eq!(parse_tracepoint_id("443\n"), Some(443));
        assert_eq!(parse_tracepoint_id(" 17 "), Some(17));
        assert_eq!(parse_tracepoint_id(""), None);
        assert_eq!(parse_tracepoint_id("x1"), None);
    }

    #[test]
    fn lateness_summary() {
        let mut h = new_histogram();
        assert_eq!(TimerLateness::from_histogram(&h), None);
        // 99 wake-ups 0.5 ms late, one 20 ms late, one early (counts as 0)
        for _ in 0..99 {
            record_lateness(&mut h, Duration::from_micros(1500));
        }
        record_lateness(&mut h, Duration::from_millis(21));
        record_lateness(&mut h, Duration::from_micros(900));
        let s = TimerLateness::from_histogram(&h).expect("samples");
        assert_eq!(s.samples, 101);
        assert!((s.p50_ms - 0.5).abs() < 0.001, "{s:?}");
        assert!((s.p99_ms - 0.5).abs() < 0.001, "{s:?}");
        assert!((s.max_ms - 20.0).abs() < 0.02, "{s:?}");
    }

    /// Counts syscalls of a thread created after the counter, while it is
    /// alive and after it exits. Skipped where the tracepoint is unavailable
    /// (no tracefs, no permission).
    #[test]
    fn counts_inherited_threads() {
        let c = match SyscallCounter::open() {
            Ok(c) => c,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        };
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            go_rx.recv().expect("go");
            for _ in 0..1000 {
                // SAFETY: getppid has no preconditions.
                unsafe { libc::getppid() };
            }
            done_tx.send(()).expect("done");
            // stay alive until told to exit
            let _ = go_rx.recv();
        });
        let before = c.read().expect("read");
        go_tx.send(()).expect("go");
        done_rx.recv().expect("done");
        let live = c.read().expect("read");
        assert!(live - before >= 1000, "live thread: {}", live - before);
        drop(go_tx);
        t.join().expect("join");
        let after = c.read().expect("read");
        assert!(after >= live, "{after} < {live}");
    }
}
