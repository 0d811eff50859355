//! One io_uring instance and the background future that drives it.
//!
//! Locking: `state` (a `Mutex`) guards the op table, the free bounce
//! buffers, the overflow backlog, the record of which SQEs the kernel has
//! not consumed yet, and the *producer* side of the submission queue.
//! Readers push their SQE under it and leave; the driver calls
//! `io_uring_enter` *without* it, so a long enter (buffered reads that hit the
//! page cache are copied inside the enter) never blocks readers. The
//! completion queue is consumed only under `reap_lock`, by the driver (or,
//! once the driver is gone, by whichever future drives the ring itself).
//!
//! No user code runs under either lock: wakers are cloned, woken and
//! dropped, and parked owned buffers dropped, only after unlocking.
//!
//! Every `io_uring_enter` goes through [`Ring::enter`], which submits only
//! the SQEs counted under the lock, and never any once the ring is broken
//! (see [`Ring::break_ring`]).

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::future::Future;
use std::io;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::buf::{AlignedBuf, BufferPool, BOUNCE_ALIGN};
use crate::files::{FileEntry, FixedFiles};
use crate::lock;
use crate::op::{Abandoned, OnCqe, Op, OpBuf, OpTable, Polled};
use crate::sys;

/// `user_data` of internal SQEs (cancel-all at shutdown); never a slab key.
const INTERNAL: u64 = u64::MAX;
/// The result given to an op whose SQE never reached the kernel because the
/// ring closed or broke first; turned into the ring's own error on poll.
const NOT_SUBMITTED: i32 = i32::MIN;
/// The kernel never transfers more than this in one read (`MAX_RW_COUNT`).
pub(crate) const MAX_READ: usize = 0x7fff_f000;
/// Inline page-cache misses in a row after which the fast path only probes.
const MISS_STREAK: u32 = 16;
/// While probing, one read in this many tries the page cache inline.
const PROBE_EVERY: u32 = 16;
/// Driver rounds per poll before it yields to other tasks.
const ROUNDS: usize = 32;
/// CQEs taken per lock of the op table.
const REAP_BATCH: usize = 256;
/// With COOP_TASKRUN the kernel does not interrupt a sleeping thread to run
/// completion work, so the driver re-enters at this period while reads are out.
const COOP_TICK: Duration = Duration::from_micros(200);
/// How long the driver waits before retrying an enter that failed for a
/// passing reason (EAGAIN, ENOMEM, EBUSY), or before looking again for room
/// in a SQPOLL ring's full submission queue.
const RETRY_AFTER: Duration = Duration::from_micros(500);

// io_uring_enter flags (include/uapi/linux/io_uring.h).
const ENTER_GETEVENTS: u32 = 1;
const ENTER_SQ_WAKEUP: u32 = 2;

/// Ring settings, already resolved and bounded by the builder.
#[derive(Debug, Clone)]
pub(crate) struct RingConfig {
    pub(crate) entries: u32,
    pub(crate) in_flight: usize,
    pub(crate) sqpoll_idle: Option<Duration>,
    pub(crate) coop_taskrun: bool,
    pub(crate) pool_count: usize,
    pub(crate) pool_size: usize,
    pub(crate) file_capacity: u32,
    pub(crate) shutdown_timeout: Duration,
}

/// What an op keeps alive until it is removed from the table.
pub(crate) struct Keep {
    _file: Arc<FileEntry>,
    _permit: OwnedSemaphorePermit,
}

impl fmt::Debug for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keep")
    }
}

/// Where a read's bytes go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dst {
    /// Into a bounce buffer owned by the op; copied out on completion.
    Bounce(usize),
    /// Straight into caller memory that outlives the op (an owned buffer,
    /// parked in the op if the future is dropped).
    Caller(*mut u8, usize),
}

/// Why a ring takes no more reads.
#[derive(Debug, Clone)]
pub(crate) enum Closed {
    /// `shutdown()` or the last handle dropped.
    Shutdown,
    /// The driver task was dropped: its (home) runtime shut down.
    RuntimeGone,
    /// `io_uring_enter` failed in a way retrying cannot fix.
    Broken(String),
}

impl Closed {
    pub(crate) fn error(&self) -> io::Error {
        match self {
            Closed::Shutdown => shut_down_error(),
            Closed::RuntimeGone => io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the UringContext is shut down: the tokio runtime it was created on (its home runtime) has shut down",
            ),
            Closed::Broken(why) => io::Error::other(format!(
                "the io_uring ring is broken (io_uring_enter failed: {why}); this read never reached the kernel"
            )),
        }
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
    /// SQEs the kernel has consumed (reads only).
    submitted: u64,
    /// CQEs of reads.
    completed: u64,
}

/// Counters of one ring (summed into `Stats`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RingCounters {
    pub(crate) submitted: u64,
    pub(crate) completed: u64,
    pub(crate) enters: u64,
    pub(crate) inline: u64,
    pub(crate) driver_polls: u64,
}

/// What a completed ring read tells its future.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) res: io::Result<usize>,
    /// See [`Op::tainted`].
    pub(crate) tainted: bool,
}

/// One `io_uring_enter`, planned under the state lock.
#[derive(Debug, Clone, Copy)]
struct EnterPlan {
    to_submit: u32,
    flags: u32,
}

pub(crate) struct Ring {
    state: Mutex<State>,
    reap_lock: Mutex<()>,
    uring: IoUring,
    sqpoll: bool,
    /// Freed in `Drop` only once the kernel is done with every op.
    pool: ManuallyDrop<BufferPool>,
    pool_registered: bool,
    pub(crate) permits: Arc<Semaphore>,
    submit_pending: AtomicBool,
    driver_waker: AtomicWaker,
    eventfd: AsyncFd<File>,
    /// One-shot timer of the driver: retry back-off, COOP tick, and the
    /// deadline of `shutdown()`.
    timer: AsyncFd<File>,
    drained: Notify,
    done: AtomicBool,
    enters: AtomicU64,
    driver_polls: AtomicU64,
    inline: AtomicU64,
    /// Page-cache misses of the inline path in a row (see `inline_worth_trying`).
    inline_misses: AtomicU32,
    coop_taskrun: bool,
    shutdown_timeout: Duration,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.uring.as_raw_fd())
            .field("pool", &*self.pool)
            .field("pool_registered", &self.pool_registered)
            .finish_non_exhaustive()
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

pub(crate) fn shut_down_error() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the UringContext is shut down")
}

/// A removed op and what its future parked with it.
type Released = (Op<Keep>, Option<Box<dyn Any + Send>>);

/// Wakers to wake and resources to release once the lock is gone.
#[derive(Default)]
struct Deferred {
    wakers: Vec<Waker>,
    released: Vec<Released>,
}

impl Deferred {
    /// Must be called without any of the ring's locks held.
    fn run(self) {
        self.wakers.into_iter().for_each(Waker::wake);
        drop(self.released);
    }
}

impl Ring {
    /// Sets up a ring with `fds` as its fixed files. Must run inside a tokio
    /// runtime with IO enabled (the eventfd is registered with its reactor).
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

        // Bounce buffers. Registering them lets O_DIRECT skip pinning pages
        // on every read; it needs RLIMIT_MEMLOCK room (or CAP_IPC_LOCK), so
        // failing to register is not an error: plain reads are used instead.
        let pool = BufferPool::new(cfg.pool_count, cfg.pool_size)?;
        let iovecs = pool.iovecs();
        let pool_registered = u16::try_from(pool.count()).is_ok()
            // SAFETY: the iovecs point into `pool`, which stays allocated
            // until `Drop`, where it is freed only after the kernel is done
            // (or leaked); closing the ring fd unregisters them.
            && unsafe { submitter.register_buffers(&iovecs) }.is_ok();

        let efd = sys::eventfd()?;
        submitter.register_eventfd(efd.as_raw_fd())?;
        let eventfd = register(efd)?;
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
            }),
            reap_lock: Mutex::new(()),
            sqpoll: cfg.sqpoll_idle.is_some(),
            uring,
            pool: ManuallyDrop::new(pool),
            pool_registered,
            permits: Arc::new(Semaphore::new(cfg.in_flight)),
            submit_pending: AtomicBool::new(false),
            driver_waker: AtomicWaker::new(),
            eventfd,
            timer,
            drained: Notify::new(),
            done: AtomicBool::new(false),
            enters: AtomicU64::new(0),
            driver_polls: AtomicU64::new(0),
            inline: AtomicU64::new(0),
            inline_misses: AtomicU32::new(0),
            coop_taskrun: cfg.coop_taskrun,
            shutdown_timeout: cfg.shutdown_timeout,
        })
    }

    pub(crate) fn buffers_registered(&self) -> bool {
        self.pool_registered
    }

    /// Whether a read should try the page cache inline first. After
    /// [`MISS_STREAK`] misses in a row (a cold working set), only every
    /// [`PROBE_EVERY`]th read tries, so cold reads do not pay a failing
    /// `preadv2` each; one hit turns the fast path fully back on.
    pub(crate) fn inline_worth_trying(&self) -> bool {
        self.inline_misses.load(Ordering::Relaxed) < MISS_STREAK
            || self.inline_misses.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == 0
    }

    pub(crate) fn inline_hit(&self) {
        self.inline.fetch_add(1, Ordering::Relaxed);
        if self.inline_misses.load(Ordering::Relaxed) != 0 {
            self.inline_misses.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn inline_miss(&self) {
        self.inline_misses.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn counters(&self) -> RingCounters {
        let (submitted, completed) = {
            let mut st = lock(&self.state);
            self.account_consumed(&mut st);
            (st.submitted, st.completed)
        };
        RingCounters {
            submitted,
            completed,
            enters: self.enters.load(Ordering::Relaxed),
            inline: self.inline.load(Ordering::Relaxed),
            driver_polls: self.driver_polls.load(Ordering::Relaxed),
        }
    }

    /// The error a read gets when this ring no longer takes reads.
    pub(crate) fn closed_error(&self) -> io::Error {
        lock(&self.state)
            .closed
            .as_ref()
            .map_or_else(shut_down_error, Closed::error)
    }

    /// Queues one read and returns its key. The SQE goes into the
    /// submission queue (or the backlog when that is full); the driver
    /// submits it with everything else queued at its next round.
    pub(crate) fn submit_read(
        &self,
        file: Arc<FileEntry>,
        permit: OwnedSemaphorePermit,
        offset: u64,
        dst: Dst,
    ) -> io::Result<usize> {
        // Allocate a large bounce buffer before taking the lock (the read
        // path bounds its size, see `read::BORROWED_CHUNK`).
        let mut heap = match dst {
            Dst::Bounce(len) if len > self.pool.buf_size() => {
                Some(AlignedBuf::try_new(len, BOUNCE_ALIGN)?)
            }
            _ => None,
        };
        let mut st = lock(&self.state);
        if let Some(closed) = &st.closed {
            return Err(closed.error());
        }
        let fixed = types::Fixed(file.index);
        let (buf, entry) = match dst {
            Dst::Caller(ptr, len) => (
                OpBuf::Caller,
                opcode::Read::new(fixed, ptr, read_len(len))
                    .offset(offset)
                    .build(),
            ),
            Dst::Bounce(len) => match (heap.take(), st.free_bufs.pop()) {
                (None, Some(i)) => {
                    let ptr = self.pool.ptr(i as usize);
                    let entry = match u16::try_from(i) {
                        Ok(index) if self.pool_registered => {
                            opcode::ReadFixed::new(fixed, ptr, read_len(len), index)
                                .offset(offset)
                                .build()
                        }
                        _ => opcode::Read::new(fixed, ptr, read_len(len))
                            .offset(offset)
                            .build(),
                    };
                    (OpBuf::Pool(i), entry)
                }
                (heap, free) => {
                    if let Some(i) = free {
                        st.free_bufs.push(i);
                    }
                    // Pool exhausted (more live ops than buffers) or a large read.
                    let mut b = if let Some(b) = heap {
                        b
                    } else {
                        drop(st);
                        let b = AlignedBuf::try_new(len, BOUNCE_ALIGN)?;
                        st = lock(&self.state);
                        if let Some(closed) = &st.closed {
                            return Err(closed.error());
                        }
                        b
                    };
                    let ptr = b.as_mut_ptr();
                    let entry = opcode::Read::new(fixed, ptr, read_len(len))
                        .offset(offset)
                        .build();
                    // Moving `b` into the op moves the header, not the heap
                    // block the SQE points to.
                    (OpBuf::Heap(b), entry)
                }
            },
        };
        let key = st.ops.insert(
            buf,
            Keep {
                _file: file,
                _permit: permit,
            },
        );
        let entry = entry.user_data(key as u64);
        self.push_locked(&mut st, entry);
        st.live += 1;
        drop(st);
        self.notify_driver();
        Ok(key)
    }

    /// Pushes an SQE, or parks it in the backlog when the queue is full.
    fn push_locked(&self, st: &mut State, entry: squeue::Entry) {
        if st.backlog.is_empty() {
            let user_data = entry.get_user_data();
            // SAFETY: the state lock is held, so this is the only
            // SubmissionQueue of this ring in existence; the entry's buffer
            // is owned by the op table until its CQE (see op.rs).
            let pushed = unsafe { self.uring.submission_shared().push(&entry) };
            if pushed.is_ok() {
                st.in_sq.push_back(user_data);
                return;
            }
        }
        st.backlog.push_back(entry);
    }

    /// Moves as much of the backlog as fits into the SQ (the state lock is
    /// held: `st` comes from it).
    fn flush_backlog(&self, st: &mut State) {
        if st.backlog.is_empty() {
            return;
        }
        // SAFETY: the state lock is held (we have `&mut State` from it), so
        // this is the only SubmissionQueue of this ring.
        let mut sq = unsafe { self.uring.submission_shared() };
        while let Some(e) = st.backlog.front() {
            // SAFETY: every SQE's buffer is owned by its op until its CQE
            // (as in `push_locked`).
            if unsafe { sq.push(e) }.is_err() {
                break;
            }
            st.in_sq.push_back(e.get_user_data());
            st.backlog.pop_front();
        }
    }

    /// Drops from `in_sq` the SQEs the kernel has consumed (it consumes in
    /// order, so they are the oldest), counting them as submitted.
    fn account_consumed(&self, st: &mut State) {
        if st.in_sq.is_empty() {
            return;
        }
        // SAFETY: the state lock is held (we have `&mut State` from it).
        let unconsumed = unsafe { self.uring.submission_shared() }.len();
        while st.in_sq.len() > unconsumed {
            if st.in_sq.pop_front() != Some(INTERNAL) {
                st.submitted += 1;
            }
        }
    }

    fn notify_driver(&self) {
        if !self.submit_pending.swap(true, Ordering::AcqRel) {
            self.driver_waker.wake();
        }
    }

    /// Polls op `key` from its future. On completion the op is removed, the
    /// bounce buffer (if any) copied into `copy_to`, and the result mapped.
    pub(crate) fn poll_complete(
        &self,
        key: usize,
        cx: &mut Context<'_>,
        copy_to: Option<&mut [u8]>,
    ) -> Poll<Completion> {
        let mut st = lock(&self.state);
        let polled = st.ops.poll(key, cx.waker());
        let replaced = match polled {
            Polled::Ready(res, op) => return Poll::Ready(self.finish(st, res, op, copy_to)),
            Polled::Pending => None,
            Polled::NeedsWaker => {
                // Cloning a waker is user code: not under the lock.
                drop(st);
                let waker = cx.waker().clone();
                st = lock(&self.state);
                match st.ops.set_waker(key, waker) {
                    Ok(old) => old,
                    Err((res, op, waker)) => {
                        let done = self.finish(st, res, op, copy_to);
                        drop(waker);
                        return Poll::Ready(done);
                    }
                }
            }
        };
        if st.gave_up && st.ops.is_bounce(key) {
            // shutdown() stopped waiting for the kernel: a borrowed read
            // resolves now, its bounce buffer stays with the ring (and is
            // released by the CQE, if one ever comes).
            let abandoned = st.ops.abandon(key, None);
            drop(st);
            drop((abandoned, replaced));
            return Poll::Ready(Completion {
                res: Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "shutdown() stopped waiting for this read: the kernel did not complete or cancel it within the shutdown timeout",
                )),
                tainted: false,
            });
        }
        let driver_gone = st.driver_gone;
        drop(st);
        drop(replaced);
        if driver_gone {
            // No driver will reap for us (its runtime shut down): drive the
            // ring from here, blocking, until this op completes.
            self.drive_blocking();
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// Removes a completed op: copies its bounce buffer out, recycles it,
    /// and releases the rest after unlocking.
    fn finish(
        &self,
        mut st: MutexGuard<'_, State>,
        res: i32,
        op: Op<Keep>,
        mut copy_to: Option<&mut [u8]>,
    ) -> Completion {
        let result = match res {
            NOT_SUBMITTED => Err(st
                .closed
                .as_ref()
                .map_or_else(shut_down_error, Closed::error)),
            res if res < 0 => Err(io::Error::from_raw_os_error(-res)),
            res => Ok(usize::try_from(res).unwrap_or(0)),
        };
        let Op {
            buf, keep, tainted, ..
        } = op;
        // The marking at driver drop can come too late: io_uring fails an
        // exiting worker's requests when the thread exits, which during the
        // home runtime's shutdown may be before its driver task is dropped.
        // So an op collected once the driver is gone is suspect too, and so
        // is EFAULT from any op: the crate only ever hands the kernel valid
        // buffers, so the kernel reports EFAULT only for such requests.
        let tainted = tainted || st.driver_gone || res == -libc::EFAULT;
        let mut heap = None;
        match buf {
            OpBuf::Pool(i) => {
                if let (Ok(n), Some(dst)) = (&result, copy_to.as_deref_mut()) {
                    let n = (*n).min(dst.len()).min(self.pool.buf_size());
                    // SAFETY: the CQE is in, so the kernel no longer writes
                    // buffer `i`; it is not on the free list (we hold the
                    // lock and have not pushed it yet) and holds >= n bytes.
                    let src = unsafe { std::slice::from_raw_parts(self.pool.ptr(i as usize), n) };
                    dst[..n].copy_from_slice(src);
                }
                st.free_bufs.push(i);
            }
            OpBuf::Heap(b) => heap = Some(b),
            OpBuf::Caller => {}
        }
        drop(st);
        if let (Some(b), Ok(n), Some(dst)) = (&heap, &result, copy_to) {
            let n = (*n).min(dst.len()).min(b.len());
            dst[..n].copy_from_slice(&b[..n]);
        }
        drop(keep);
        Completion {
            res: result,
            tainted,
        }
    }

    /// The future of op `key` is gone; `keep_alive` holds whatever else the
    /// kernel may write into (an owned buffer) until the CQE.
    pub(crate) fn abandon(&self, key: usize, keep_alive: Option<Box<dyn Any + Send>>) {
        let mut st = lock(&self.state);
        let abandoned = st.ops.abandon(key, keep_alive);
        if let Abandoned::Released(op, _) = &abandoned {
            if let OpBuf::Pool(i) = op.buf {
                st.free_bufs.push(i);
            }
        }
        drop(st);
        drop(abandoned);
    }

    /// Gives every op whose SQE is still in the backlog (and, with
    /// `sq_too`, in the SQ) the `NOT_SUBMITTED` result: they will never be
    /// submitted. Only sound for SQ entries if nothing ever enters with
    /// `to_submit > 0` on this ring again (a broken ring) and no SQPOLL
    /// thread can pick them up.
    fn fail_unsubmitted(&self, st: &mut State, sq_too: bool, out: &mut Deferred) {
        let mut keys: Vec<u64> = st.backlog.drain(..).map(|e| e.get_user_data()).collect();
        if sq_too && !self.sqpoll {
            self.account_consumed(st);
            keys.extend(st.in_sq.drain(..));
        }
        for key in keys {
            apply_one(st, key, NOT_SUBMITTED, false, out);
        }
    }

    /// Stops new reads, fails the ones never handed to the kernel, asks the
    /// kernel to cancel what it has, and lets the driver finish once every
    /// op is back (or `shutdown_timeout` passes, see `give_up`).
    pub(crate) fn close(&self) {
        let mut out = Deferred::default();
        let mut st = lock(&self.state);
        if st.closed.is_none() {
            st.closed = Some(Closed::Shutdown);
        }
        self.fail_unsubmitted(&mut st, false, &mut out);
        let broken = matches!(st.closed, Some(Closed::Broken(_)));
        if st.live > 0 && !st.cancel_queued && !broken {
            st.cancel_queued = true;
            // Queued after every SQE already in the SQ, so it also cancels
            // those: the kernel takes SQEs in order.
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

    /// Moves backlog into the SQ and plans an enter, if one is worth making
    /// (SQEs queued, CQ overflow to flush, task work to run, a sleeping
    /// SQPOLL thread to wake). A broken ring never submits again.
    fn plan_enter(&self, wait: bool) -> Option<EnterPlan> {
        let mut st = lock(&self.state);
        if matches!(st.closed, Some(Closed::Broken(_))) {
            return None;
        }
        self.account_consumed(&mut st);
        self.flush_backlog(&mut st);
        // SAFETY: the state lock is held.
        let sq = unsafe { self.uring.submission_shared() };
        let pending = u32::try_from(sq.len()).unwrap_or(u32::MAX);
        let mut flags = 0;
        if wait || sq.cq_overflow() || sq.taskrun() {
            flags |= ENTER_GETEVENTS;
        }
        if self.sqpoll {
            // Pairs with the kernel thread's barrier before it sets
            // NEED_WAKEUP (see io_uring's `SubmissionQueue::need_wakeup`).
            fence(Ordering::SeqCst);
            if pending > 0 && sq.need_wakeup() {
                flags |= ENTER_SQ_WAKEUP;
            }
            return (flags != 0).then_some(EnterPlan {
                to_submit: pending,
                flags,
            });
        }
        (pending > 0 || flags != 0).then_some(EnterPlan {
            to_submit: pending,
            flags,
        })
    }

    /// One `io_uring_enter`, without the state lock, submitting exactly the
    /// SQEs `plan` counted and waiting for `wait` completions.
    fn enter(&self, plan: EnterPlan, wait: u32) -> io::Result<usize> {
        loop {
            // SAFETY: the SQEs being submitted each point into memory owned
            // by their op until its CQE (see `push_locked`); no extra
            // argument is passed (null, size 0).
            let r = unsafe {
                self.uring.submitter().enter::<libc::sigset_t>(
                    plan.to_submit,
                    wait,
                    plan.flags | if wait > 0 { ENTER_GETEVENTS } else { 0 },
                    None,
                )
            };
            self.enters.fetch_add(1, Ordering::Relaxed);
            match r {
                Err(e) if errno(&e) == libc::EINTR => {}
                r => return r,
            }
        }
    }

    /// Takes every CQE off the queue, completes its op and wakes its future.
    /// Returns how many there were.
    fn reap(&self) -> usize {
        let _only_reaper = lock(&self.reap_lock);
        let mut total = 0;
        let mut space = [const { MaybeUninit::<cqueue::Entry>::uninit() }; REAP_BATCH];
        loop {
            // SAFETY: `reap_lock` is held: the only CompletionQueue of this ring.
            let cqes = unsafe { self.uring.completion_shared() }.fill(&mut space);
            if cqes.is_empty() {
                return total;
            }
            total += cqes.len();
            let mut out = Deferred::default();
            {
                let mut st = lock(&self.state);
                for cqe in &*cqes {
                    apply_one(&mut st, cqe.user_data(), cqe.result(), true, &mut out);
                }
            }
            out.run();
        }
    }

    /// Blocking drive, used when no driver task exists any more: submit
    /// what is queued (from this live thread), wait a little for a CQE, reap.
    fn drive_blocking(&self) {
        if let Some(plan) = self.plan_enter(false) {
            let _ = self.enter(plan, 0);
        }
        if self.reap() == 0 {
            if self.coop_taskrun {
                // Deferred completion work runs only in an enter.
                let _ = self.enter(
                    EnterPlan {
                        to_submit: 0,
                        flags: ENTER_GETEVENTS,
                    },
                    0,
                );
            }
            sys::wait_readable(self.eventfd.get_ref(), Duration::from_millis(50));
            let _ = sys::drain_counter(self.eventfd.get_ref());
            self.reap();
        }
    }

    /// io_uring_enter failed in a way retrying will not fix: stop taking
    /// reads, and fail every read that never reached the kernel (backlog,
    /// and the SQ too: from now on nothing enters with SQEs to submit, so
    /// the kernel can never see them). Reads already in the kernel complete
    /// as usual (their CQEs need no enter).
    fn break_ring(&self, e: &io::Error) {
        let mut out = Deferred::default();
        let mut st = lock(&self.state);
        if matches!(st.closed, Some(Closed::Broken(_))) {
            return;
        }
        st.closed = Some(Closed::Broken(e.to_string()));
        self.fail_unsubmitted(&mut st, true, &mut out);
        drop(st);
        out.run();
        self.permits.close();
    }

    /// `shutdown()`'s deadline passed with reads still in the kernel: let
    /// `shutdown()` return, and resolve the borrowed reads with an error
    /// (their buffers stay with the ring until their CQE). Owned reads keep
    /// waiting: their buffer cannot be handed back while the kernel may
    /// still write into it.
    fn give_up(&self) {
        let wakers = {
            let mut st = lock(&self.state);
            st.gave_up = true;
            st.ops.take_wakers()
        };
        self.drained.notify_waiters();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The body of the background poll future (see [`Driver`]).
    fn poll_drive(&self, cx: &mut Context<'_>, timer: &mut DriverTimer) -> Drive {
        self.driver_waker.register(cx.waker());
        self.driver_polls.fetch_add(1, Ordering::Relaxed);
        for _ in 0..ROUNDS {
            self.submit_pending.store(false, Ordering::SeqCst);
            let mut retry_later = false;
            if let Some(plan) = self.plan_enter(false) {
                match self.enter(plan, 0) {
                    Ok(_) => {}
                    // CQ overflow backlog, or no memory for requests right
                    // now: reaping makes room; retry after a pause.
                    Err(e) if transient(&e) => retry_later = true,
                    Err(e) => self.break_ring(&e),
                }
            }
            let reaped = self.reap();
            let (closed, live, backlog, unconsumed, gave_up, orphaned) = {
                let mut st = lock(&self.state);
                self.account_consumed(&mut st);
                (
                    st.closed.clone(),
                    st.live,
                    st.backlog.len(),
                    st.in_sq.len(),
                    st.gave_up,
                    st.orphaned,
                )
            };
            let broken = matches!(closed, Some(Closed::Broken(_)));
            // Done when every op is back, or when nobody can wait for the
            // rest: the context is gone and its shutdown timeout passed.
            if closed.is_some() && (live == 0 || (gave_up && orphaned)) {
                self.done.store(true, Ordering::Release);
                self.drained.notify_waiters();
                return Drive::Done;
            }
            if reaped > 0 {
                continue;
            }
            if self.submit_pending.load(Ordering::SeqCst) && !retry_later {
                // More SQEs are coming in: let them accumulate first.
                return Drive::Batch;
            }
            // Work left that the next enter can move: SQEs the kernel has
            // not taken (without SQPOLL it takes all it is given, so these
            // are newer) or a backlog.
            let stuck = !broken && (backlog > 0 || (unconsumed > 0 && !self.sqpoll));
            if stuck && !retry_later && !self.sqpoll {
                continue;
            }
            // Sleep until the kernel posts a CQE (eventfd), a reader queues
            // an SQE (driver_waker) or the timer fires. Never with SQEs
            // left unsubmitted and nothing to wake us: then the timer is armed.
            match self.eventfd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut guard)) => {
                    if let Err(e) = sys::drain_counter(self.eventfd.get_ref()) {
                        self.break_ring(&e);
                    }
                    guard.clear_ready();
                    continue;
                }
                Poll::Ready(Err(e)) => {
                    self.break_ring(&e);
                    continue;
                }
                Poll::Pending => {}
            }
            let due = if retry_later || (stuck && self.sqpoll) {
                Some(RETRY_AFTER)
            } else if self.coop_taskrun && live > 0 && !broken {
                Some(COOP_TICK)
            } else {
                None
            };
            let deadline = (matches!(closed, Some(Closed::Shutdown)) && !gave_up).then(|| {
                *timer
                    .close_deadline
                    .get_or_insert_with(|| Instant::now() + self.shutdown_timeout)
            });
            match timer.poll(self, cx, due, deadline) {
                TimerPoll::Fired => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        self.give_up();
                    }
                    if self.coop_taskrun && !broken {
                        // An enter with GETEVENTS runs the deferred completion work.
                        let _ = self.enter(
                            EnterPlan {
                                to_submit: 0,
                                flags: ENTER_GETEVENTS,
                            },
                            0,
                        );
                    }
                    continue;
                }
                TimerPoll::Failed(e) => {
                    // Without a timer the driver cannot sleep safely with
                    // work left: treat the ring as broken rather than spin.
                    if due.is_some() || deadline.is_some() {
                        self.break_ring(&e);
                        continue;
                    }
                }
                TimerPoll::Pending => {}
            }
            return Drive::Sleep;
        }
        // Busy: let the reading tasks on this worker run, then continue.
        Drive::Batch
    }

    /// The driver task is being dropped: its runtime is shutting down (or
    /// it finished). Reads in the kernel were submitted by threads that are
    /// exiting, which makes io_uring cancel or cut them short: mark them
    /// tainted so their futures check what they got. Reads never submitted
    /// fail; waiting futures are woken to drive the ring themselves.
    fn driver_dropped(&self, finished: bool) {
        let mut out = Deferred::default();
        {
            let mut st = lock(&self.state);
            st.driver_gone = true;
            if st.closed.is_none() {
                st.closed = Some(Closed::RuntimeGone);
            }
            self.fail_unsubmitted(&mut st, false, &mut out);
            if !finished {
                st.ops.taint_in_kernel();
            }
            out.wakers.extend(st.ops.take_wakers());
        }
        self.permits.close();
        self.drained.notify_waiters();
        out.run();
    }
}

/// Registers a descriptor the ring owns with the runtime's reactor.
fn register(fd: File) -> io::Result<AsyncFd<File>> {
    // SAFETY: the AsyncFd owns `fd`, so the descriptor stays open and
    // unchanged for the AsyncFd's whole life.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

/// Applies one completion (from a CQE, `kernel`, or a local failure).
fn apply_one(st: &mut State, key: u64, res: i32, kernel: bool, out: &mut Deferred) {
    if key == INTERNAL {
        return;
    }
    let Ok(slot) = usize::try_from(key) else {
        return;
    };
    match st.ops.on_cqe(slot, res) {
        OnCqe::Wake(w) => {
            st.live -= 1;
            st.completed += u64::from(kernel);
            out.wakers.extend(w);
        }
        OnCqe::Release(op, kept) => {
            st.live -= 1;
            st.completed += u64::from(kernel);
            if let OpBuf::Pool(i) = op.buf {
                st.free_bufs.push(i);
            }
            out.released.push((op, kept));
        }
        OnCqe::Unknown => {}
    }
}

/// The length field of a read SQE (callers cap reads at [`MAX_READ`]).
fn read_len(len: usize) -> u32 {
    u32::try_from(len.min(MAX_READ)).unwrap_or(u32::MAX)
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Nobody else can submit now (the driver, the last other owner, is
        // gone), but the kernel may still own buffers: fail what it never
        // got, cancel what it has, and wait — bounded — until every op is
        // back. Only then is the pool freed; past the deadline it is leaked.
        let mut out = Deferred::default();
        let (broken, deadline) = {
            let mut st = lock(&self.state);
            // A driver that gave up has already waited its timeout.
            let deadline = Instant::now()
                + if st.gave_up {
                    Duration::ZERO
                } else {
                    self.shutdown_timeout
                };
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
            // Submit until the cancel itself is in the kernel: it may sit
            // behind a full SQ of reads that only it can finish, so never
            // wait for completions while submitting.
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
                    },
                    0,
                );
            }
            sys::wait_readable(
                self.eventfd.get_ref(),
                (deadline - now).min(Duration::from_millis(100)),
            );
            let _ = sys::drain_counter(self.eventfd.get_ref());
        }
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if st.live == 0 {
            // SAFETY: the kernel has completed every op that referenced the
            // pool; the pool is not used after this point.
            unsafe { ManuallyDrop::drop(&mut self.pool) };
        } else {
            // The ring cannot be drained: leak every buffer the kernel might
            // still write into rather than free it under the kernel's feet
            // (the pool stays in its ManuallyDrop). Files and permits are
            // released: the kernel holds its own reference to each file.
            let released = st.ops.leak_buffers();
            drop(released);
            eprintln!(
                "uring-positioned-io: {} reads still in the kernel after the shutdown timeout ({:?}); their buffers are leaked",
                st.live, self.shutdown_timeout
            );
        }
    }
}

/// The driver's one-shot timer (a timerfd in the reactor, so the context
/// needs no time driver): armed for the earliest of a back-off / COOP tick
/// and `shutdown()`'s deadline.
#[derive(Debug, Default)]
pub(crate) struct DriverTimer {
    armed_until: Option<Instant>,
    close_deadline: Option<Instant>,
}

enum TimerPoll {
    Fired,
    Pending,
    Failed(io::Error),
}

impl DriverTimer {
    fn poll(
        &mut self,
        ring: &Ring,
        cx: &mut Context<'_>,
        due: Option<Duration>,
        deadline: Option<Instant>,
    ) -> TimerPoll {
        let now = Instant::now();
        let want = match (due.map(|d| now + d), deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(want) = want else {
            return TimerPoll::Pending;
        };
        if want <= now {
            return TimerPoll::Fired;
        }
        // Re-arm only for an earlier expiry (or if not armed).
        if self.armed_until.is_none_or(|t| want < t || t <= now) {
            if let Err(e) = sys::arm_timer(ring.timer.get_ref(), want - now) {
                return TimerPoll::Failed(e);
            }
            self.armed_until = Some(want);
        }
        match ring.timer.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => {
                let _ = sys::drain_counter(ring.timer.get_ref());
                guard.clear_ready();
                self.armed_until = None;
                TimerPoll::Fired
            }
            Poll::Ready(Err(e)) => TimerPoll::Failed(e),
            Poll::Pending => TimerPoll::Pending,
        }
    }
}

/// The background poll future of one ring, spawned on tokio by
/// `UringContext::new`. It submits every queued SQE with one
/// `io_uring_enter`, reaps every CQE, wakes the futures waiting for them, and
/// sleeps on the ring's eventfd when there is nothing to do.
pub(crate) struct Driver {
    ring: Arc<Ring>,
    timer: DriverTimer,
    /// Returned `Ready`: every op was back when it stopped.
    finished: bool,
    /// A pending `yield_now`: set when readers queued SQEs, so that the
    /// other tasks that are ready on this worker queue theirs too before the
    /// enter (tokio runs a freshly woken task next, which would otherwise
    /// make every batch one read long).
    batching: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Driver {
    pub(crate) fn new(ring: Arc<Ring>) -> Driver {
        Driver {
            ring,
            timer: DriverTimer::default(),
            finished: false,
            batching: None,
        }
    }

    fn start_batching(&mut self) {
        // `yield_now` defers our wake-up until this worker has run the tasks
        // that are ready now (or until its next maintenance tick, every 61
        // polls), so the wait is short and bounded.
        self.batching = Some(Box::pin(tokio::task::yield_now()));
    }
}

impl Future for Driver {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut yielded = false;
        loop {
            if let Some(y) = &mut this.batching {
                if y.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.batching = None;
                yielded = true;
            }
            // Woken by a reader's SQE: let the other ready readers queue
            // theirs before entering.
            if !yielded && this.ring.submit_pending.load(Ordering::Acquire) {
                this.start_batching();
                continue;
            }
            match this.ring.poll_drive(cx, &mut this.timer) {
                Drive::Done => {
                    this.finished = true;
                    return Poll::Ready(());
                }
                Drive::Sleep => return Poll::Pending,
                Drive::Batch => {
                    yielded = false;
                    this.start_batching();
                }
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Finished, or dropped with its runtime: futures still waiting must
        // not wait for a driver that will never come back.
        self.ring.driver_dropped(self.finished);
    }
}

/// What a driver poll ended with.
enum Drive {
    /// Closed and every op is back from the kernel.
    Done,
    /// Nothing to do: woken by the eventfd, a reader or the timer.
    Sleep,
    /// Reads are being queued: come back once the ready tasks have run.
    Batch,
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
