//! Two per-cell probes, of what an engine costs the rest of the process:
//!
//! - **timer lateness**: a task on the engine's own tokio runtime loops
//!   `tokio::time::sleep(1 ms)` during the measured window and records how
//!   late each wake-up is (elapsed − 1 ms). It answers "what happens to a
//!   1 ms timer on a runtime that is doing these reads?".
//! - **syscalls per read**: after the measured window the cell's work goes
//!   on for a short syscall window; at its start a `perf_event_open` counter
//!   on the `raw_syscalls:sys_enter` tracepoint is opened on every thread of
//!   the process (`/proc/self/task`, less the thread doing the counting),
//!   each with `inherit` set so threads they create meanwhile count too. The
//!   counters are read at the start and end of the window, and the reads the
//!   engine completed in between are counted apart: syscalls / those reads.
//!   The window is separate because an open per-task counter is not free —
//!   measured here (2 vCPU VM, kernel 6.18): ~0.15–0.2 µs more per syscall
//!   while it counts, ~1–2 µs more per thread-to-thread wake-up even while
//!   disabled, i.e. 10–20 % more CPU per read for hot syscall-per-read
//!   engines had it been open in the measured window.
//!   Reading a counter after its thread has exited still gives its count.

use crate::stop::{new_histogram, Phase, Stop};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::{Arc, OnceLock};
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

/// A `raw_syscalls:sys_enter` counter on one thread (pid = its tid; with
/// `inherit`, threads it creates from now on count too).
fn thread_counter(id: u64, tid: libc::pid_t) -> std::io::Result<perf_event::Counter> {
    let mut c = perf_event::Builder::new(perf_event::events::Tracepoint::with_id(id))
        .observe_pid(tid)
        .any_cpu()
        .inherit(true)
        // the tracepoint fires in kernel mode, on syscall entry: with
        // exclude_kernel (the builder's default) it counts nothing
        .exclude_kernel(false)
        .build()?;
    c.enable()?;
    Ok(c)
}

/// The thread ids of this process, from `/proc/self/task`.
fn thread_ids() -> Result<Vec<libc::pid_t>, String> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|e| format!("/proc/self/task: {e}"))?;
    Ok(dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// Counters on every thread of the process but the caller.
struct ProcessCounters {
    counters: Vec<perf_event::Counter>,
}

impl ProcessCounters {
    fn open() -> Result<ProcessCounters, String> {
        let id = sys_enter_id()?;
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let mut counters = Vec::new();
        for tid in thread_ids()? {
            if tid == me {
                continue;
            }
            match thread_counter(id, tid) {
                Ok(c) => counters.push(c),
                // the thread has exited since we listed it
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    return Err(format!(
                        "perf_event_open(raw_syscalls:sys_enter) on thread {tid}: {e}"
                    ))
                }
            }
        }
        Ok(ProcessCounters { counters })
    }

    fn sum(&mut self) -> Result<u64, String> {
        let mut n = 0;
        for c in &mut self.counters {
            n += c
                .read()
                .map_err(|e| format!("reading a syscall counter: {e}"))?;
        }
        Ok(n)
    }
}

/// Syscalls counted in a cell's syscall window.
#[derive(Debug, Clone, Copy)]
pub struct SyscallCounts {
    pub syscalls: u64,
    pub seconds: f64,
    /// Threads counted (each with its own counter).
    pub threads: usize,
}

/// [`SyscallCounts`] with the reads the engine completed in the window.
#[derive(Debug, Clone, Copy)]
pub struct SyscallWindow {
    pub counts: SyscallCounts,
    pub reads: u64,
}

/// The syscall window: opens the counters, switches the cell to
/// [`Phase::Syscalls`] for `window` (or until the cell is stopped), then to
/// [`Phase::Between`], and returns the syscalls counted in between. Called by
/// the cell's watchdog thread, which is not counted.
pub fn count_syscalls(stop: &Stop, window: Duration) -> Result<SyscallCounts, String> {
    let mut c = ProcessCounters::open()?;
    let before = c.sum()?;
    let t0 = Instant::now();
    stop.set_phase(Phase::Syscalls);
    while !stop.stopped() {
        let left = window.saturating_sub(t0.elapsed());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
    stop.set_phase(Phase::Between);
    let seconds = t0.elapsed().as_secs_f64();
    let after = c.sum()?;
    Ok(SyscallCounts {
        syscalls: after.saturating_sub(before),
        seconds,
        threads: c.counters.len(),
    })
}

/// Why syscalls could not be counted (the first reason given).
static UNAVAILABLE: OnceLock<String> = OnceLock::new();

/// Says once per process, in one line, why syscalls are not counted and
/// how to have them counted (the syscalls/read column then shows `-`; the
/// full reason goes to the report).
pub fn warn_once_unavailable(why: &str) {
    if UNAVAILABLE.set(why.to_string()).is_ok() {
        crate::report::say(&format!(
            "syscalls/read not counted, {}; {}",
            short_reason(why),
            how_to_enable(why)
        ));
    }
}

/// The gist of `why` (from [`ProcessCounters::open`]).
fn short_reason(why: &str) -> &'static str {
    if why.contains("tracepoint not found") {
        "no tracefs"
    } else if why.contains("perf_event_open") {
        "perf_event_open not permitted"
    } else {
        "the counters failed (report.md says why)"
    }
}

/// What a user can do about `why`.
fn how_to_enable(why: &str) -> &'static str {
    if why.contains("tracepoint not found") {
        "as root: mount -t tracefs nodev /sys/kernel/tracing"
    } else if why.contains("perf_event_open") {
        "run as root or lower kernel.perf_event_paranoid"
    } else {
        "--syscall-window 0 turns the probe off"
    }
}

/// How this run counted syscalls, for the report.
pub fn syscall_probe_description(requested: bool) -> String {
    match (requested, UNAVAILABLE.get()) {
        (false, _) => "not counted: --syscall-window 0".into(),
        (true, Some(why)) => format!("not counted: {why}; {}", how_to_enable(why)),
        (true, None) => "perf_event_open counters on the raw_syscalls:sys_enter tracepoint, \
             one per thread of the process, inherited by threads they create; fio not counted"
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

/// The timer probe: sleeps 1 ms in a loop until the measured window ends
/// and returns the lateness of every wake-up (ns). Spawn it on the runtime
/// under test when the measured window starts.
pub async fn timer_probe(stop: Arc<Stop>) -> Histogram<u64> {
    let mut h = new_histogram();
    while stop.phase() == Phase::Measure && !stop.stopped() {
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

    /// Counts the syscalls of another thread, one it creates after the
    /// counters were opened, and both after they exit. Skipped where the
    /// tracepoint is unavailable (no tracefs, no permission).
    #[test]
    fn counts_threads_and_their_children() {
        let burst = || {
            for _ in 0..1000 {
                // SAFETY: getppid has no preconditions.
                unsafe { libc::getppid() };
            }
        };
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            go_rx.recv().expect("go");
            burst();
            // a child created after the counters were opened
            std::thread::spawn(burst).join().expect("child");
            done_tx.send(()).expect("done");
            // stay alive until told to exit
            let _ = go_rx.recv();
        });
        let mut c = match ProcessCounters::open() {
            Ok(c) => c,
            Err(why) => {
                eprintln!("SKIPPED: counting syscalls needs tracefs and perf_event_open: {why}");
                drop(go_tx);
                let _ = t.join();
                return;
            }
        };
        let before = c.sum().expect("read");
        go_tx.send(()).expect("go");
        done_rx.recv().expect("done");
        let live = c.sum().expect("read");
        assert!(live - before >= 2000, "{}", live - before);
        drop(go_tx);
        t.join().expect("join");
        let after = c.sum().expect("read after exit");
        assert!(after >= live, "{after} < {live}");
    }
}
