//! What a cell's read loops and the probes running beside them share: the
//! stop flag with the cell's current window ([`Stop`], [`Phase`]) and the
//! latency histogram every figure is recorded in.

use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};

/// A latency histogram in nanoseconds (1 ns to 100 s, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Which window of a cell a read completes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The measured window: reads count for throughput and latency.
    Measure = 0,
    /// After the measured window, outside the syscall window: not counted.
    Between = 1,
    /// The syscall window: reads are counted against the syscalls.
    Syscalls = 2,
}

/// Stop flag, the current window, and the first failure of a cell.
#[derive(Default)]
pub struct Stop {
    flag: AtomicBool,
    phase: AtomicU8,
    error: Mutex<Option<String>>,
}

impl Stop {
    #[inline]
    pub fn stopped(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Measure,
            2 => Phase::Syscalls,
            _ => Phase::Between,
        }
    }

    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }

    pub fn stop(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    pub fn fail(&self, msg: String) {
        let mut e = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        e.get_or_insert(msg);
        self.stop();
    }

    pub fn error(&self) -> Option<String> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
