//! Every per-thread flag and slot of the crate, each a `thread_local` with
//! the thin functions its users call: the thread's number ([`thread_slot`]),
//! whether it runs drivers ([`on_driver_thread`]), the rings whose
//! submissions it defers ([`with_deferred`]), its stretch of inline
//! reads ([`with_stretch`]), the bounce buffers its blocking reads
//! brought back ([`with_kept_bounce`]) and the blocking jobs it is to
//! start ([`with_handoffs`]). A thread-local destructor may issue
//! ops: the locals that have destructors of their own are reached with
//! `try_with`, so such an op does without them rather than panic.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use crate::buf::AlignedBuf;
use crate::permit::{Job, Permit};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A small number identifying the calling thread, fixed on first use:
/// threads are numbered in the order they first issue an op, so a runtime's worker
/// threads spread over rings and file-table shards.
#[inline]
pub(crate) fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.with(|s| *s)
}

thread_local! {
    /// This thread has polled a driver: it is a worker of a runtime that
    /// hosts contexts, and lives as long as that runtime.
    static DRIVER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as one that runs drivers (a `Driver` polls).
pub(crate) fn mark_driver_thread() {
    DRIVER_THREAD.with(|d| d.set(true));
}

/// Whether this thread may submit for an idle driver (see `Ring::submit`):
/// only runtime workers that run drivers. io_uring cancels or cuts short
/// the requests of a thread that exits, so a short-lived thread (a
/// `block_on` on a fresh `std::thread`, a blocking-pool thread) leaves
/// submitting to the driver.
pub(crate) fn on_driver_thread() -> bool {
    DRIVER_THREAD.with(Cell::get)
}

thread_local! {
    /// Addresses of the rings whose submissions this thread defers (see
    /// `ring::Deferral`); compared, never dereferenced.
    static DEFERRED: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's list of deferring rings' addresses (see
/// `ring::Deferral`); `None` while the thread's locals are being destroyed
/// (an op issued from a thread-local destructor defers nothing).
pub(crate) fn with_deferred<R>(f: impl FnOnce(&RefCell<Vec<usize>>) -> R) -> Option<R> {
    DEFERRED.try_with(f).ok()
}

/// The stretch of inline reads running on a thread (see
/// `inline::turn_over`).
#[derive(Clone, Copy)]
pub(crate) struct Stretch {
    /// Whose: the task's, `None` outside a task.
    pub(crate) task: Option<tokio::task::Id>,
    /// Since when.
    pub(crate) start: crate::clock::Stamp,
    /// Bytes asked for since the clock was last read.
    pub(crate) unclocked: usize,
}

thread_local! {
    /// The stretch of inline reads running on this thread: whose (the
    /// task's, `None` outside a task) and since when (see `inline::turn_over`).
    static STRETCH: Cell<Option<Stretch>> = const { Cell::new(None) };
}

/// Runs `f` on this thread's stretch of inline reads (see
/// `inline::turn_over`).
pub(crate) fn with_stretch<R>(f: impl FnOnce(&Cell<Option<Stretch>>) -> R) -> R {
    STRETCH.with(f)
}

thread_local! {
    /// Bounce buffers of this thread's finished blocking reads, for its
    /// next ones (see `blocking::kept_bounce`).
    static KEPT_BOUNCE: RefCell<Vec<AlignedBuf>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the bounce buffers this thread keeps; `None` while the
/// thread's locals are being destroyed.
pub(crate) fn with_kept_bounce<R>(f: impl FnOnce(&RefCell<Vec<AlignedBuf>>) -> R) -> Option<R> {
    KEPT_BOUNCE.try_with(f).ok()
}

/// The blocking jobs this thread is to start (see `blocking::hand_off`).
#[derive(Default)]
pub(crate) struct Handoffs {
    /// The thread runs jobs in a loop (`blocking::run_jobs`): it takes the
    /// first itself when its job is over.
    pub(crate) runner: bool,
    /// A loop on this thread is spawning them.
    pub(crate) spawning: bool,
    pub(crate) jobs: VecDeque<(Job, Permit)>,
}

thread_local! {
    /// The blocking jobs this thread is to start (see `blocking::hand_off`).
    static HANDOFFS: RefCell<Handoffs> = RefCell::new(Handoffs::default());
}

/// Runs `f` on the blocking jobs this thread is to start; `None` while the
/// thread's locals are being destroyed.
pub(crate) fn with_handoffs<R>(f: impl FnOnce(&RefCell<Handoffs>) -> R) -> Option<R> {
    HANDOFFS.try_with(f).ok()
}
