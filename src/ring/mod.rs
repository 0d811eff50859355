//! One io_uring instance: the [`Ring`] and what its parts share — its
//! construction ([`Ring::new`] from a [`RingConfig`]), the state behind its
//! lock ([`State`]), its counters, closing ([`Ring::close`],
//! [`Ring::orphan`], [`Ring::wait_drained`]), the teardown in `Drop`, and the
//! fixed-file updates ([`FixedFiles`]). The rest is split by role:
//!
//! | file | role | lock |
//! |---|---|---|
//! | `submit.rs` | SQ producer side; the one counted `io_uring_enter` path; breaking the ring | the state lock |
//! | `complete.rs` | CQ consumer side: reaping, completing ops, futures collecting or abandoning them | `reap_lock`, then the state lock per batch |
//! | `driver.rs` | the background [`Driver`] future; the blocking drive once it is gone | none of its own |
//! | `regions.rs` | memory registered as one fixed buffer with every ring of a context (the block cache's regions) | its number list's mutex |
//!
//! Locking: `state` (a `Mutex`) guards the op table, the free bounce
//! buffers, the backlog, `in_sq` and the SQ producer side. Ops push their
//! SQE under it and leave; `io_uring_enter` runs *without* it, so a long
//! enter never blocks them. The CQ is consumed only under `reap_lock`.
//! Lock order: `reap_lock` before `state`. No user code (wakers, parked
//! owned buffers) runs under either lock.
//!
//! Every `io_uring_enter` goes through [`Ring::enter`], which submits only
//! the SQEs counted under the lock, and none once the ring is broken.
//!
//! SAFETY (the state lock): `State` is the one record of what the kernel may
//! touch. From the moment an op's SQE is in the SQ until its CQE is reaped,
//! the kernel may write into the op's buffer (a pool buffer, a one-off
//! `AlignedBuf`, or the caller's owned buffer) and use its fixed-file index.
//! Under the state lock an op stays in `ops` — owning that buffer, and its
//! file entry so that the index is not reused — until its CQE has been
//! applied, and a pool buffer goes back on `free_bufs` only then. So the
//! pool is freed (in `Drop`) only once `live == 0`, every op back from the
//! kernel, and leaked otherwise.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use io_uring::{opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;

use crate::buf::Registered;
use crate::error::{shut_down_error, Closed};
use crate::files::{FileEntry, FixedFiles};
use crate::inline;
use crate::permit::{Permit, Slots, SlotsConfig};
use crate::sys;
use crate::util::lock;
use table::OpTable;

mod complete;
mod driver;
mod pool;
#[cfg(feature = "cache")]
mod regions;
mod sqe;
mod submit;
mod table;
#[cfg(test)]
mod tests;

use complete::AfterUnlock;
pub(crate) use complete::CopyTo;
pub(crate) use driver::Driver;
use pool::BufferPool;
#[cfg(feature = "cache")]
pub(crate) use regions::{RegionGuard, Regions};
pub(crate) use sqe::{Dst, RingOp, Src};
pub(crate) use submit::{Deferral, DEFAULT_SHALLOW_BATCH};
use submit::{EnterPlan, ENTER_GETEVENTS};

/// `user_data` of internal SQEs (cancel-all at shutdown); never a slab key.
const INTERNAL: u64 = u64::MAX;

/// The result given to an op whose SQE never reached the kernel because the
/// ring closed or broke first; turned into the ring's own error on poll.
const NOT_SUBMITTED: i32 = i32::MIN;

/// The kernel never transfers more than this in one read or write
/// (`MAX_RW_COUNT`).
pub(crate) const MAX_RW: usize = 0x7fff_f000;

/// How long the driver waits before retrying an enter that failed for a
/// passing reason (EAGAIN, ENOMEM, EBUSY), or before looking again for room
/// in a SQPOLL ring's full submission queue.
const RETRY_AFTER: Duration = Duration::from_micros(500);

/// Slots of a ring's registered-buffer table after the bounce pool's, for
/// regions registered later: a block cache's memory, 2 MiB a region.
const REGION_SLOTS: usize = 4096;

/// The kernel's largest registered-buffer table (`IORING_MAX_REG_BUFFERS`).
const MAX_REG_BUFFERS: usize = 1 << 14;

/// A number for a new context's rings (`RingConfig::owner`), unique in the
/// process; 0 is no context's.
pub(crate) fn next_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Ring settings, already resolved and bounded by the builder.
#[derive(Debug, Clone)]
pub(crate) struct RingConfig {
    pub(crate) entries: u32,
    pub(crate) in_flight: usize,
    /// The scheduler's settings for the ring's slots (`in_flight` of them).
    pub(crate) slots: SlotsConfig,
    pub(crate) sqpoll_idle: Option<Duration>,
    pub(crate) coop_taskrun: bool,
    pub(crate) pool_count: usize,
    pub(crate) pool_size: usize,
    pub(crate) file_capacity: u32,
    pub(crate) shutdown_timeout: Duration,
    /// Most SQEs per enter while the ring is shallow ([`DEFAULT_SHALLOW_BATCH`]
    /// unless `Builder::shallow_batch` says otherwise).
    pub(crate) shallow_batch: u32,
    /// The context's number, the same on all its rings: a
    /// [`Registered`] buffer names the context whose table holds it.
    pub(crate) owner: u64,
}

/// What an op keeps alive until it is removed from the table.
pub(crate) struct Keep {
    /// `None` for an op on no file (an open).
    _file: Option<Arc<FileEntry>>,
    _permit: Permit,
}

impl fmt::Debug for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keep")
    }
}

#[allow(
    clippy::struct_excessive_bools,
    reason = "independent flags of the ring's life, each set once"
)]
struct State {
    ops: OpTable<Keep>,
    free_bufs: Vec<u32>,
    /// SQEs that did not fit in the submission queue yet.
    backlog: VecDeque<squeue::Entry>,
    /// `user_data` of the SQEs in the submission queue that the kernel has
    /// not consumed yet, oldest first (it consumes in order).
    in_sq: VecDeque<u64>,
    /// Ops queued (backlog or SQ) or in the kernel, not yet completed.
    live: usize,
    closed: Option<Closed>,
    cancel_queued: bool,
    driver_gone: bool,
    /// `shutdown()` stopped waiting for the kernel (see `Ring::give_up`).
    gave_up: bool,
    /// Every handle of the context is gone: no future can wait on this
    /// ring any more.
    orphaned: bool,
    /// SQEs of ops the kernel has consumed (not the internal cancel).
    submitted: u64,
    /// CQEs of ops.
    completed: u64,
    /// Cancels queued for ops whose future was dropped.
    cancels: u64,
}

/// Counters of one ring (summed into `Stats`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RingCounters {
    pub(crate) submitted: u64,
    pub(crate) completed: u64,
    pub(crate) enters: u64,
    pub(crate) inline: u64,
    pub(crate) driver_polls: u64,
    pub(crate) cancels: u64,
}

pub(crate) struct Ring {
    state: Mutex<State>,
    reap_lock: Mutex<()>,
    uring: IoUring,
    sqpoll: bool,
    /// Freed in `Drop` only once the kernel is done with every op.
    pool: ManuallyDrop<BufferPool>,
    pool_registered: bool,
    /// Slots of the registered-buffer table after the pool's, for regions
    /// registered later ([`register_region`](Ring::register_region)); 0
    /// where the kernel refused the table.
    region_slots: u16,
    /// `RingConfig::owner`.
    owner: u64,
    /// Reads issued as `READ_FIXED` into registered regions.
    #[cfg(test)]
    pub(crate) region_reads: AtomicU64,
    pub(crate) permits: Slots,
    submit_pending: AtomicBool,
    /// The driver is in (or mid-yield of) a poll and will look at
    /// `submit_pending` before it sleeps: an op queuing an SQE need not wake it.
    pub(super) polling: AtomicBool,
    /// A batch ([`submit::Deferral`]) queued its reads: the next enter hands
    /// all of them over at once, shallow ring or not.
    pub(super) whole_batch: AtomicBool,
    /// The driver is asleep with nothing queued: the next op to queue an SQE
    /// claims this and submits it itself (see `Ring::submit`).
    pub(super) idle: AtomicBool,
    driver_waker: AtomicWaker,
    /// A duplicate of the ring's fd in the reactor, readable while the CQ
    /// holds entries: the idle driver sleeps on it.
    pub(super) cq_ready: AsyncFd<File>,
    /// One-shot timer of the driver: retry back-off, COOP tick, and the
    /// deadline of `shutdown()`.
    timer: AsyncFd<File>,
    drained: Notify,
    done: AtomicBool,
    enters: AtomicU64,
    driver_polls: AtomicU64,
    /// The inline path's record of this ring's reads (policy in `inline.rs`).
    pub(crate) inline: inline::History,
    coop_taskrun: bool,
    shutdown_timeout: Duration,
    /// Most SQEs per enter while the ring is shallow (`Builder::shallow_batch`).
    shallow_batch: u32,
    /// Futures whose CQE the driver reaped but has not woken yet: each one
    /// that completes (or is dropped) wakes the next, so a small round runs
    /// on one worker (see [`Ring::reap_relayed`], DESIGN "The driver").
    pub(super) relay: Mutex<VecDeque<Waker>>,
}

/// The ring and what it is doing now: ops queued and in the kernel, the
/// driver's flags, the slots. Fields behind a lock another thread holds
/// print as `<busy>` (a dump taken while the process seems stuck must not
/// wait on it).
impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Ring");
        d.field("fd", &self.uring.as_raw_fd());
        match self.state.try_lock() {
            Ok(st) => d
                .field("live", &st.live)
                .field("backlog", &st.backlog.len())
                .field("in_sq", &st.in_sq.len())
                .field("submitted", &st.submitted)
                .field("completed", &st.completed)
                .field("cancels", &st.cancels)
                .field("closed", &st.closed.is_some())
                .field("driver_gone", &st.driver_gone)
                .field("gave_up", &st.gave_up)
                .field("orphaned", &st.orphaned),
            Err(_) => d.field("state", &format_args!("<busy>")),
        };
        match self.relay.try_lock() {
            Ok(r) => d.field("relay", &r.len()),
            Err(_) => d.field("relay", &format_args!("<busy>")),
        };
        d.field("idle", &self.idle.load(Ordering::Relaxed))
            .field("polling", &self.polling.load(Ordering::Relaxed))
            .field(
                "submit_pending",
                &self.submit_pending.load(Ordering::Relaxed),
            )
            .field("enters", &self.enters.load(Ordering::Relaxed))
            .field("driver_polls", &self.driver_polls.load(Ordering::Relaxed))
            .field("permits", &self.permits)
            .field("pool", &*self.pool)
            .field("pool_registered", &self.pool_registered)
            .finish_non_exhaustive()
    }
}

/// `Instant::now() + timeout`, or a century away when that overflows:
/// `shutdown_timeout(Duration::MAX)` means "as long as it takes", not a panic.
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

/// Drops `x` (an op's buffers, possibly the caller's type), catching a
/// panic from its `Drop`: on a driver or in `Ring::drop` it would kill the
/// driver or abort the process.
pub(crate) fn drop_caught<T>(x: T) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(x))) {
        let msg = p
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(not a string)".into());
        eprintln!(
            "uring-positioned-io: a buffer's Drop panicked while the context released it \
             (ignored): {msg}"
        );
    }
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Enter errors that a later retry can fix: the kernel is short of memory
/// or of CQ room (overflow), or a signal came in.
fn transient(e: &io::Error) -> bool {
    matches!(
        errno(e),
        libc::EINTR | libc::EAGAIN | libc::ENOMEM | libc::EBUSY
    )
}

impl Ring {
    /// Sets up a ring with `fds` as its fixed files. Must run inside a tokio
    /// runtime with IO enabled (the ring fd is registered with its reactor).
    pub(crate) fn new(cfg: &RingConfig, fds: &[i32]) -> io::Result<Ring> {
        // Bounded by the builder: entries <= 32768, in_flight <= 65536.
        let cq_entries = (cfg.entries.saturating_mul(2))
            .max(u32::try_from(cfg.in_flight).unwrap_or(u32::MAX))
            .checked_next_power_of_two()
            .unwrap_or(u32::MAX);
        let mut builder = IoUring::builder();
        builder.setup_cqsize(cq_entries).dontfork();
        if let Some(idle) = cfg.sqpoll_idle {
            builder.setup_sqpoll(u32::try_from(idle.as_millis().max(1)).unwrap_or(u32::MAX));
        }
        if cfg.coop_taskrun {
            builder.setup_coop_taskrun().setup_taskrun_flag();
        }
        let uring = builder.build(cfg.entries)?;
        let submitter = uring.submitter();

        // Fixed files: a sparse table of `file_capacity` slots, then the files.
        submitter.register_files_sparse(cfg.file_capacity)?;
        if !fds.is_empty() {
            submitter.register_files_update(0, fds)?;
        }

        // io-wq's default bound (4 x CPUs) would queue every punted op
        // behind a few stuck on one slow file: allow one worker per op in
        // flight. Best effort (5.15+).
        let bounded = u32::try_from(cfg.in_flight).unwrap_or(u32::MAX);
        let _ = submitter.register_iowq_max_workers(&mut [bounded, 0]);

        // Registered buffers spare O_DIRECT the page pinning of every read;
        // without RLIMIT_MEMLOCK room plain reads and writes are used
        // instead. The table holds the bounce pool, then (feature `cache`)
        // empty slots for regions registered later (5.13+: without them,
        // the pool alone).
        let pool = BufferPool::new(cfg.pool_count, cfg.pool_size)?;
        let mut iovecs = pool.iovecs();
        let n = iovecs.len();
        // Only a block cache registers regions: without the feature, no slots.
        let regions = if cfg!(feature = "cache") {
            REGION_SLOTS.min(MAX_REG_BUFFERS.saturating_sub(n))
        } else {
            0
        };
        iovecs.resize(
            n + regions,
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
        );
        // SAFETY: the pool's iovecs point into `pool`, which stays
        // allocated until `Drop`, where it is freed only after the kernel
        // is done (or leaked); closing the ring fd unregisters them. The
        // rest are empty slots (no memory).
        let (pool_registered, region_slots) =
            if regions > 0 && unsafe { submitter.register_buffers(&iovecs) }.is_ok() {
                (n > 0, regions)
            } else {
                // SAFETY: as above, the pool's iovecs alone.
                let pool = n > 0
                    && n <= MAX_REG_BUFFERS
                    && unsafe { submitter.register_buffers(&iovecs[..n]) }.is_ok();
                (pool, 0)
            };
        let region_slots = u16::try_from(region_slots).unwrap_or(0);

        // The idle driver sleeps on a duplicate of the ring fd (no eventfd).
        let cq_ready = register(sys::dup_cloexec(uring.as_raw_fd())?)?;
        let timer = register(sys::timerfd()?)?;
        let free_bufs = (0..u32::try_from(pool.count()).unwrap_or(u32::MAX))
            .rev()
            .collect();

        Ok(Ring {
            state: Mutex::new(State {
                ops: OpTable::default(),
                free_bufs,
                backlog: VecDeque::new(),
                in_sq: VecDeque::new(),
                live: 0,
                closed: None,
                cancel_queued: false,
                driver_gone: false,
                gave_up: false,
                orphaned: false,
                submitted: 0,
                completed: 0,
                cancels: 0,
            }),
            reap_lock: Mutex::new(()),
            sqpoll: cfg.sqpoll_idle.is_some(),
            uring,
            pool: ManuallyDrop::new(pool),
            pool_registered,
            region_slots,
            owner: cfg.owner,
            #[cfg(test)]
            region_reads: AtomicU64::new(0),
            permits: Slots::new(cfg.slots),
            submit_pending: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            whole_batch: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            driver_waker: AtomicWaker::new(),
            cq_ready,
            timer,
            drained: Notify::new(),
            done: AtomicBool::new(false),
            enters: AtomicU64::new(0),
            driver_polls: AtomicU64::new(0),
            inline: inline::History::default(),
            coop_taskrun: cfg.coop_taskrun,
            shutdown_timeout: cfg.shutdown_timeout,
            shallow_batch: cfg.shallow_batch,
            relay: Mutex::new(VecDeque::new()),
        })
    }

    /// The ring's descriptor.
    #[cfg(all(test, feature = "cache"))]
    pub(crate) fn fd(&self) -> i32 {
        self.uring.as_raw_fd()
    }

    pub(crate) fn buffers_registered(&self) -> bool {
        self.pool_registered
    }

    /// Regions this ring's table has room for.
    #[cfg(feature = "cache")]
    pub(crate) fn region_slots(&self) -> u16 {
        self.region_slots
    }

    /// Registers `len` bytes at `ptr` as region `region` (below
    /// [`region_slots`](Ring::region_slots)) of this ring's table: reads
    /// into a buffer that says it lives there ([`Registered`]) become
    /// `READ_FIXED`, which spares the kernel pinning its pages per read.
    ///
    /// # Safety
    ///
    /// The range stays allocated and mapped to the same memory until
    /// [`unregister_region`](Ring::unregister_region) or the ring's drop
    /// (the kernel holds the pages it pinned now: a read into a range
    /// remapped meanwhile would land in the old pages).
    #[cfg(feature = "cache")]
    pub(crate) unsafe fn register_region(
        &self,
        region: u16,
        ptr: *mut u8,
        len: usize,
    ) -> io::Result<()> {
        let Some(slot) = self.table_slot(region) else {
            return Err(io::Error::other("no such region slot (a bug)"));
        };
        let iov = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: len,
        };
        // SAFETY: the caller keeps the range mapped while it is
        // registered; one slot, no tags.
        unsafe {
            self.uring
                .submitter()
                .register_buffers_update(u32::from(slot), &[iov], None)
        }
    }

    /// Empties region slot `region` (the kernel unpins its pages once no
    /// read in flight uses them).
    #[cfg(feature = "cache")]
    pub(crate) fn unregister_region(&self, region: u16) {
        if let Some(slot) = self.table_slot(region) {
            let empty = libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            };
            // SAFETY: an empty slot refers to no memory.
            let _ = unsafe {
                self.uring
                    .submitter()
                    .register_buffers_update(u32::from(slot), &[empty], None)
            };
        }
    }

    /// The table index of region `region`.
    fn table_slot(&self, region: u16) -> Option<u16> {
        (region < self.region_slots)
            .then(|| u16::try_from(self.pool.count() + usize::from(region)).ok())
            .flatten()
    }

    /// The table index for a read into `r`, if it is registered here.
    pub(super) fn fixed_index(&self, r: Registered) -> Option<u16> {
        if r.owner == self.owner {
            self.table_slot(r.region)
        } else {
            None
        }
    }

    pub(crate) fn counters(&self) -> RingCounters {
        let (submitted, completed, cancels) = {
            let mut st = lock(&self.state);
            self.account_consumed(&mut st);
            (st.submitted, st.completed, st.cancels)
        };
        RingCounters {
            submitted,
            completed,
            enters: self.enters.load(Ordering::Relaxed),
            inline: self.inline.hits(),
            driver_polls: self.driver_polls.load(Ordering::Relaxed),
            cancels,
        }
    }

    /// The error an op gets when this ring no longer takes ops.
    pub(crate) fn closed_error(&self) -> io::Error {
        lock(&self.state)
            .closed
            .as_ref()
            .map_or_else(shut_down_error, Closed::error)
    }

    /// Stops new ops, fails the ones never handed to the kernel, asks the
    /// kernel to cancel what it has, and lets the driver finish once every
    /// op is back (or `shutdown_timeout` passes, see `give_up`).
    pub(crate) fn close(&self) {
        let mut out = AfterUnlock::default();
        let mut st = lock(&self.state);
        if st.closed.is_none() {
            st.closed = Some(Closed::Shutdown);
        }
        self.fail_unsubmitted(&mut st, false, &mut out);
        let broken = matches!(st.closed, Some(Closed::Broken(_)));
        if st.live > 0 && !st.cancel_queued && !broken {
            st.cancel_queued = true;
            // Behind every SQE already in the SQ (taken in order): cancels those too.
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(INTERNAL);
            self.push_locked(&mut st, cancel);
        }
        drop(st);
        out.run();
        self.permits.close();
        self.notify_driver();
    }

    /// The last handle of the context is gone: close, and let the driver
    /// finish once every op is back or the shutdown timeout has passed
    /// (then the ring is torn down and what the kernel still holds leaked).
    pub(crate) fn orphan(&self) {
        lock(&self.state).orphaned = true;
        self.close();
    }

    /// Waits until the driver has finished (every op back from the kernel),
    /// or has given up waiting for the kernel.
    pub(crate) async fn wait_drained(&self) {
        loop {
            let notified = self.drained.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let st = lock(&self.state);
                if self.done.load(Ordering::Acquire) || st.driver_gone || st.gave_up {
                    return;
                }
            }
            notified.await;
        }
    }
}

/// Registers a descriptor the ring owns with the runtime's reactor.
fn register(fd: File) -> io::Result<AsyncFd<File>> {
    // SAFETY: the AsyncFd owns `fd`, so the descriptor stays open and
    // unchanged for the AsyncFd's whole life.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may still own buffers: fail what it never got, cancel
        // what it has, and wait (bounded) for every op; past the deadline
        // the pool is leaked, never freed under the kernel.
        let mut out = AfterUnlock::default();
        let (broken, deadline) = {
            let mut st = lock(&self.state);
            // A driver that gave up has already waited its timeout.
            let deadline = deadline_after(if st.gave_up {
                Duration::ZERO
            } else {
                self.shutdown_timeout
            });
            self.fail_unsubmitted(&mut st, false, &mut out);
            let broken = matches!(st.closed, Some(Closed::Broken(_)));
            if st.live > 0 && !broken {
                let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                    .build()
                    .user_data(INTERNAL);
                self.push_locked(&mut st, cancel);
            }
            (broken, deadline)
        };
        out.run();
        if broken {
            // The SQ is off limits; the synchronous cancel (6.0+) is not.
            let _ = self.uring.submitter().register_sync_cancel(
                Some(types::Timespec::new().nsec(100_000_000)),
                types::CancelBuilder::any(),
            );
        } else {
            // Submit until the cancel is in the kernel, without waiting for
            // completions: the ops ahead of it may only finish through it.
            while Instant::now() < deadline {
                let Some(plan) = self.plan_enter(false) else {
                    break;
                };
                match self.enter(plan, 0) {
                    Ok(_) => {}
                    Err(e) if transient(&e) => {
                        self.reap();
                        std::thread::sleep(RETRY_AFTER);
                    }
                    Err(_) => break,
                }
                let st = lock(&self.state);
                if st.backlog.is_empty() && (st.in_sq.is_empty() || self.sqpoll) {
                    break;
                }
            }
        }
        loop {
            self.reap();
            let live = lock(&self.state).live;
            let now = Instant::now();
            if live == 0 || now >= deadline {
                break;
            }
            if self.coop_taskrun && !broken {
                let _ = self.enter(
                    EnterPlan {
                        to_submit: 0,
                        flags: ENTER_GETEVENTS,
                        batch: u32::MAX,
                    },
                    0,
                );
            }
            sys::wait_readable(
                self.cq_ready.get_ref(),
                (deadline - now).min(Duration::from_millis(100)),
            );
        }
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if st.live == 0 {
            // SAFETY: the kernel has completed every op that referenced the
            // pool; the pool is not used after this point.
            unsafe { ManuallyDrop::drop(&mut self.pool) };
        } else {
            // Not drained: leak every buffer the kernel might still write
            // (the pool stays in its ManuallyDrop); files and permits are
            // released, the kernel holds its own file references.
            let released = st.ops.leak_buffers();
            drop_caught(released);
            eprintln!(
                "uring-positioned-io: {} ops still in the kernel after the shutdown timeout ({:?}); their buffers are leaked",
                st.live, self.shutdown_timeout
            );
        }
    }
}

/// Updates the fixed-file tables of every ring.
impl FixedFiles for Box<[Arc<Ring>]> {
    fn update(&self, index: u32, fd: i32) -> io::Result<()> {
        for ring in self {
            ring.uring.submitter().register_files_update(index, &[fd])?;
        }
        Ok(())
    }
}
