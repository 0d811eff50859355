//! One io_uring instance and the background future that drives it.
//!
//! Locking: `state` (a `Mutex`) guards the op table, the free bounce
//! buffers, the overflow backlog and the *producer* side of the submission
//! queue. Readers push their SQE under it and leave; the driver calls
//! `io_uring_enter` *without* it, so a long enter (buffered reads that hit the
//! page cache are copied inside the enter) never blocks readers. The
//! completion queue is consumed only under `reap_lock`, by the driver (or,
//! once the driver is gone, by whichever future drives the ring itself).

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::task::AtomicWaker;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::buf::{AlignedBuf, BufferPool, BOUNCE_ALIGN};
use crate::files::{FileEntry, FixedFiles};
use crate::op::{OnCqe, OpBuf, OpTable};

/// `user_data` of internal SQEs (cancel-all at shutdown); never a slab key.
const INTERNAL: u64 = u64::MAX;
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

/// Ring settings, already resolved by the builder.
#[derive(Debug, Clone)]
pub(crate) struct RingConfig {
    pub(crate) entries: u32,
    pub(crate) in_flight: usize,
    pub(crate) sqpoll_idle: Option<Duration>,
    pub(crate) coop_taskrun: bool,
    pub(crate) pool_count: usize,
    pub(crate) pool_size: usize,
    pub(crate) file_capacity: u32,
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
#[derive(Debug)]
pub(crate) enum Dst {
    /// Into a bounce buffer owned by the op; copied out on completion.
    Bounce(usize),
    /// Straight into caller memory that outlives the op (an owned buffer,
    /// parked in the op if the future is dropped).
    Caller(*mut u8, usize),
}

#[derive(Debug, Clone)]
enum Closed {
    /// `shutdown()` or the last handle dropped.
    Shutdown,
    /// io_uring_enter failed in a way retrying cannot fix.
    Broken(String),
}

struct State {
    ops: OpTable<Keep>,
    free_bufs: Vec<u32>,
    /// SQEs that did not fit in the submission queue yet.
    backlog: VecDeque<squeue::Entry>,
    /// Ops the kernel has (or will have) but has not completed.
    kernel_owned: usize,
    closed: Option<Closed>,
    cancel_queued: bool,
    driver_gone: bool,
    submitted: u64,
    completed: u64,
}

/// Counters of one ring (summed into `Stats`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RingCounters {
    pub(crate) submitted: u64,
    pub(crate) completed: u64,
    pub(crate) enters: u64,
    pub(crate) inline: u64,
    pub(crate) in_flight: u64,
}

pub(crate) struct Ring {
    state: Mutex<State>,
    reap_lock: Mutex<()>,
    uring: IoUring,
    /// Freed in `Drop` only once the kernel is done with every op.
    pool: ManuallyDrop<BufferPool>,
    pool_registered: bool,
    pub(crate) permits: Arc<Semaphore>,
    submit_pending: AtomicBool,
    driver_waker: AtomicWaker,
    eventfd: AsyncFd<OwnedFd>,
    drained: Notify,
    done: AtomicBool,
    enters: AtomicU64,
    inline: AtomicU64,
    /// Page-cache misses of the inline path in a row (see `inline_worth_trying`).
    inline_misses: AtomicU32,
    coop_taskrun: bool,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the table half-updated in
    // a way that matters for soundness: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

pub(crate) fn shut_down_error() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the UringContext is shut down")
}

impl Ring {
    /// Sets up a ring with `fds` as its fixed files. Must run inside a tokio
    /// runtime with IO enabled (the eventfd is registered with its reactor).
    pub(crate) fn new(cfg: &RingConfig, fds: &[i32]) -> io::Result<Ring> {
        let cq_entries = (cfg.entries as usize * 2)
            .max(cfg.in_flight)
            .next_power_of_two() as u32;
        let mut builder = IoUring::builder();
        builder.setup_cqsize(cq_entries).dontfork();
        if let Some(idle) = cfg.sqpoll_idle {
            builder.setup_sqpoll(idle.as_millis().clamp(1, u32::MAX as u128) as u32);
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
        let pool = BufferPool::new(cfg.pool_count, cfg.pool_size);
        let iovecs = pool.iovecs();
        let pool_registered = pool.count() <= u16::MAX as usize
            // SAFETY: the iovecs point into `pool`, which stays allocated
            // until `Drop`, where it is freed only after the kernel is done
            // (or leaked); closing the ring fd unregisters them.
            && unsafe { submitter.register_buffers(&iovecs) }.is_ok();

        // SAFETY: eventfd has no memory arguments; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` is a fresh descriptor that nothing else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        submitter.register_eventfd(efd.as_raw_fd())?;
        // SAFETY: the AsyncFd owns `efd`, so the descriptor stays open and
        // unchanged for the AsyncFd's whole life.
        let eventfd = unsafe { AsyncFd::register_with_interest(efd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;

        Ok(Ring {
            state: Mutex::new(State {
                ops: OpTable::default(),
                free_bufs: (0..pool.count() as u32).rev().collect(),
                backlog: VecDeque::new(),
                kernel_owned: 0,
                closed: None,
                cancel_queued: false,
                driver_gone: false,
                submitted: 0,
                completed: 0,
            }),
            reap_lock: Mutex::new(()),
            uring,
            pool: ManuallyDrop::new(pool),
            pool_registered,
            permits: Arc::new(Semaphore::new(cfg.in_flight)),
            submit_pending: AtomicBool::new(false),
            driver_waker: AtomicWaker::new(),
            eventfd,
            drained: Notify::new(),
            done: AtomicBool::new(false),
            enters: AtomicU64::new(0),
            inline: AtomicU64::new(0),
            inline_misses: AtomicU32::new(0),
            coop_taskrun: cfg.coop_taskrun,
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
        let st = lock(&self.state);
        RingCounters {
            submitted: st.submitted,
            completed: st.completed,
            enters: self.enters.load(Ordering::Relaxed),
            inline: self.inline.load(Ordering::Relaxed),
            in_flight: st.kernel_owned as u64,
        }
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
        // Allocate a large bounce buffer before taking the lock.
        let mut heap = match dst {
            Dst::Bounce(len) if len > self.pool.buf_size() => {
                Some(AlignedBuf::new(len, BOUNCE_ALIGN))
            }
            _ => None,
        };
        let mut st = lock(&self.state);
        match &st.closed {
            None => {}
            Some(Closed::Shutdown) => return Err(shut_down_error()),
            Some(Closed::Broken(why)) => {
                return Err(io::Error::other(format!(
                    "the io_uring ring is broken: {why}"
                )))
            }
        }
        let fixed = types::Fixed(file.index);
        let (buf, entry) = match dst {
            Dst::Caller(ptr, len) => (
                OpBuf::Caller,
                opcode::Read::new(fixed, ptr, len as u32)
                    .offset(offset)
                    .build(),
            ),
            Dst::Bounce(len) => match (heap.take(), st.free_bufs.pop()) {
                (None, Some(i)) => {
                    let ptr = self.pool.ptr(i as usize);
                    let entry = if self.pool_registered {
                        opcode::ReadFixed::new(fixed, ptr, len as u32, i as u16)
                            .offset(offset)
                            .build()
                    } else {
                        opcode::Read::new(fixed, ptr, len as u32)
                            .offset(offset)
                            .build()
                    };
                    (OpBuf::Pool(i), entry)
                }
                (heap, free) => {
                    if let Some(i) = free {
                        st.free_bufs.push(i);
                    }
                    // Pool exhausted (more live ops than buffers) or a large read.
                    let mut b = heap.unwrap_or_else(|| AlignedBuf::new(len, BOUNCE_ALIGN));
                    let ptr = b.as_mut_ptr();
                    let entry = opcode::Read::new(fixed, ptr, len as u32)
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
        st.kernel_owned += 1;
        st.submitted += 1;
        drop(st);
        self.notify_driver();
        Ok(key)
    }

    /// Pushes an SQE, or parks it in the backlog when the queue is full.
    fn push_locked(&self, st: &mut State, entry: squeue::Entry) {
        if st.backlog.is_empty() {
            // SAFETY: the state lock is held, so this is the only
            // SubmissionQueue of this ring in existence; the entry's buffer
            // is owned by the op table until its CQE (see op.rs).
            let pushed = unsafe { self.uring.submission_shared().push(&entry) };
            if pushed.is_ok() {
                return;
            }
        }
        st.backlog.push_back(entry);
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
        mut copy_to: Option<&mut [u8]>,
    ) -> Poll<io::Result<usize>> {
        let mut st = lock(&self.state);
        let Some((res, op)) = st.ops.poll(key, cx.waker()) else {
            if st.driver_gone {
                drop(st);
                // No driver will reap for us (its runtime shut down): drive
                // the ring from here, blocking, until this op completes.
                self.drive_blocking();
                cx.waker().wake_by_ref();
            }
            return Poll::Pending;
        };
        let result = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as usize)
        };
        let mut heap = None;
        match op.buf {
            OpBuf::Pool(i) => {
                if let (Ok(n), Some(dst)) = (&result, copy_to.as_deref_mut()) {
                    let n = (*n).min(dst.len());
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
            let n = (*n).min(dst.len());
            dst[..n].copy_from_slice(&b[..n]);
        }
        drop(op.keep);
        Poll::Ready(result)
    }

    /// The future of op `key` is gone; `keep_alive` holds whatever else the
    /// kernel may write into (an owned buffer) until the CQE.
    pub(crate) fn abandon(&self, key: usize, keep_alive: Option<Box<dyn Any + Send>>) {
        let mut st = lock(&self.state);
        let released = st.ops.abandon(key, keep_alive);
        if let Some(op) = &released {
            if let OpBuf::Pool(i) = op.buf {
                st.free_bufs.push(i);
            }
        }
        drop(st);
        drop(released);
    }

    /// Stops new reads, asks the kernel to cancel what it has, and lets the
    /// driver finish once every op is back.
    pub(crate) fn close(&self) {
        let mut st = lock(&self.state);
        if st.closed.is_none() {
            st.closed = Some(Closed::Shutdown);
        }
        if st.kernel_owned > 0 && !st.cancel_queued {
            st.cancel_queued = true;
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(INTERNAL);
            self.push_locked(&mut st, cancel);
        }
        drop(st);
        self.permits.close();
        self.notify_driver();
    }

    /// Waits until the driver has finished (every op back from the kernel).
    pub(crate) async fn wait_drained(&self) {
        loop {
            let notified = self.drained.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.done.load(Ordering::Acquire) || lock(&self.state).driver_gone {
                return;
            }
            notified.await;
        }
    }

    /// Moves backlog into the SQ; says whether an enter is worth making.
    fn prepare_enter(&self) -> bool {
        let mut st = lock(&self.state);
        // SAFETY: the state lock is held.
        unsafe { flush_backlog(&self.uring, &mut st.backlog) }
    }

    /// One `io_uring_enter` submitting everything queued.
    fn enter(&self) -> io::Result<()> {
        loop {
            match self.uring.submitter().submit() {
                Ok(_) => {
                    self.enters.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if errno(&e) == libc::EINTR => continue,
                // CQ overflow backlog or no memory for requests right now:
                // reaping makes room; the next round retries.
                Err(e) if matches!(errno(&e), libc::EBUSY | libc::EAGAIN | libc::ENOMEM) => {
                    return Ok(())
                }
                Err(e) => return Err(e),
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
            let mut wakers: Vec<Waker> = Vec::with_capacity(cqes.len());
            let mut released = Vec::new();
            {
                let mut st = lock(&self.state);
                apply_cqes(&mut st, cqes, &mut wakers, &mut released);
            }
            wakers.into_iter().for_each(Waker::wake);
            drop(released);
        }
    }

    /// Blocking drive, used when no driver task exists any more.
    fn drive_blocking(&self) {
        let _ = self.prepare_enter();
        loop {
            match self.uring.submitter().submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if errno(&e) == libc::EINTR => continue,
                Err(_) => break,
            }
        }
        self.reap();
    }

    /// The body of the background poll future (see [`Driver`]).
    fn poll_drive(
        &self,
        cx: &mut Context<'_>,
        tick: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    ) -> Drive {
        self.driver_waker.register(cx.waker());
        for _ in 0..ROUNDS {
            self.submit_pending.store(false, Ordering::SeqCst);
            if self.prepare_enter() {
                if let Err(e) = self.enter() {
                    self.break_ring(e);
                }
            }
            let reaped = self.reap();
            let (closed, kernel_owned, backlog) = {
                let st = lock(&self.state);
                (st.closed.is_some(), st.kernel_owned, st.backlog.len())
            };
            if closed && kernel_owned == 0 {
                self.done.store(true, Ordering::Release);
                self.drained.notify_waiters();
                return Drive::Done;
            }
            if reaped > 0 || backlog > 0 {
                continue;
            }
            if self.submit_pending.load(Ordering::SeqCst) {
                // More SQEs are coming in: let them accumulate first.
                return Drive::Batch;
            }
            // Idle: sleep until the kernel posts a CQE (eventfd) or a reader
            // queues an SQE (driver_waker).
            match self.eventfd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut guard)) => {
                    let mut counter = [0u8; 8];
                    // SAFETY: reads 8 bytes into a local 8-byte array.
                    unsafe { libc::read(self.eventfd.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
                    guard.clear_ready();
                    continue;
                }
                Poll::Ready(Err(e)) => {
                    self.break_ring(e);
                    continue;
                }
                Poll::Pending => {}
            }
            if self.coop_taskrun && kernel_owned > 0 {
                let sleep = tick.get_or_insert_with(|| Box::pin(tokio::time::sleep(COOP_TICK)));
                if sleep.as_mut().poll(cx).is_ready() {
                    *tick = None;
                    // An enter with GETEVENTS runs the deferred completion work.
                    let _ = self.uring.submitter().submit_and_wait(0);
                    continue;
                }
            }
            return Drive::Sleep;
        }
        // Busy: let the reading tasks on this worker run, then continue.
        Drive::Batch
    }

    /// io_uring_enter failed in a way retrying will not fix: stop taking
    /// reads, and fail the ones that never reached the kernel.
    fn break_ring(&self, e: io::Error) {
        let mut st = lock(&self.state);
        if matches!(st.closed, Some(Closed::Broken(_))) {
            return;
        }
        st.closed = Some(Closed::Broken(e.to_string()));
        let never_submitted: Vec<u64> = st.backlog.drain(..).map(|e| e.get_user_data()).collect();
        let mut wakers = Vec::new();
        let mut released = Vec::new();
        for key in never_submitted.into_iter().filter(|&k| k != INTERNAL) {
            apply_one(&mut st, key, -libc::ECANCELED, &mut wakers, &mut released);
        }
        drop(st);
        self.permits.close();
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// Moves as much of the backlog as fits into the SQ, publishes it, and says
/// whether an enter is worth making (SQEs queued, CQ overflow to flush, or
/// task work to run).
///
/// # Safety
///
/// No other `SubmissionQueue` of `uring` may exist meanwhile: the caller
/// holds the ring's state lock, or has `&mut Ring`.
unsafe fn flush_backlog(uring: &IoUring, backlog: &mut VecDeque<squeue::Entry>) -> bool {
    // SAFETY: exclusivity is the caller's promise.
    let mut sq = unsafe { uring.submission_shared() };
    while let Some(e) = backlog.front() {
        // SAFETY: every SQE's buffer is owned by its op until its CQE (as in
        // `push_locked`).
        if unsafe { sq.push(e) }.is_err() {
            break;
        }
        backlog.pop_front();
    }
    sq.sync();
    !sq.is_empty() || sq.cq_overflow() || sq.taskrun()
}

fn apply_one(
    st: &mut State,
    key: u64,
    res: i32,
    wakers: &mut Vec<Waker>,
    released: &mut Vec<crate::op::Op<Keep>>,
) {
    if key == INTERNAL {
        return;
    }
    match st.ops.on_cqe(key as usize, res) {
        OnCqe::Wake(w) => {
            st.kernel_owned -= 1;
            st.completed += 1;
            wakers.extend(w);
        }
        OnCqe::Release(op) => {
            st.kernel_owned -= 1;
            st.completed += 1;
            if let OpBuf::Pool(i) = op.buf {
                st.free_bufs.push(i);
            }
            released.push(op);
        }
        OnCqe::Unknown => {}
    }
}

fn apply_cqes(
    st: &mut State,
    cqes: &[cqueue::Entry],
    wakers: &mut Vec<Waker>,
    released: &mut Vec<crate::op::Op<Keep>>,
) {
    for cqe in cqes {
        apply_one(st, cqe.user_data(), cqe.result(), wakers, released);
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Nobody else can touch the ring now (&mut self), but the kernel may
        // still own buffers: cancel, then reap until every op is back.
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if st.kernel_owned > 0 {
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(INTERNAL);
            st.backlog.push_front(cancel);
        }
        let mut space = [const { MaybeUninit::<cqueue::Entry>::uninit() }; REAP_BATCH];
        while st.kernel_owned > 0 {
            // SAFETY: `&mut self`: no other SubmissionQueue can exist.
            unsafe { flush_backlog(&self.uring, &mut st.backlog) };
            match self.uring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(errno(&e), libc::EINTR | libc::EBUSY | libc::EAGAIN) => {}
                Err(_) => break,
            }
            let mut wakers = Vec::new();
            let mut released = Vec::new();
            loop {
                // SAFETY: &mut self: the only CompletionQueue of this ring.
                let cqes = unsafe { self.uring.completion_shared() }.fill(&mut space);
                if cqes.is_empty() {
                    break;
                }
                apply_cqes(st, cqes, &mut wakers, &mut released);
            }
            wakers.into_iter().for_each(Waker::wake);
        }
        if st.kernel_owned == 0 {
            // SAFETY: the kernel has completed every op that referenced the
            // pool; the pool is not used after this point.
            unsafe { ManuallyDrop::drop(&mut self.pool) };
        } else {
            // The ring cannot be drained: leak every buffer the kernel might
            // still write into rather than free it under the kernel's feet.
            std::mem::forget(std::mem::take(&mut st.ops));
            eprintln!(
                "uring-positioned-io: {} reads still in the kernel at ring teardown; their buffers are leaked",
                st.kernel_owned
            );
        }
    }
}

/// The background poll future of one ring, spawned on tokio by
/// `UringContext::new`. It submits every queued SQE with one
/// `io_uring_enter`, reaps every CQE, wakes the futures waiting for them, and
/// sleeps on the ring's eventfd when there is nothing to do.
pub(crate) struct Driver {
    ring: Arc<Ring>,
    tick: Option<Pin<Box<tokio::time::Sleep>>>,
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
            tick: None,
            batching: None,
        }
    }
}

impl Driver {
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
            match this.ring.poll_drive(cx, &mut this.tick) {
                Drive::Done => return Poll::Ready(()),
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
        let wakers = {
            let mut st = lock(&self.ring.state);
            st.driver_gone = true;
            if st.closed.is_none() {
                st.closed = Some(Closed::Shutdown);
            }
            st.ops.take_wakers()
        };
        self.ring.permits.close();
        self.ring.drained.notify_waiters();
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// What a driver poll ended with.
enum Drive {
    /// Closed and every op is back from the kernel.
    Done,
    /// Nothing to do: woken by the eventfd or by a reader.
    Sleep,
    /// Reads are being queued: come back once the ready tasks have run.
    Batch,
}

/// Updates the fixed-file tables of every ring.
impl FixedFiles for Box<[Arc<Ring>]> {
    fn update(&self, index: u32, fd: i32) -> io::Result<()> {
        for ring in self.iter() {
            ring.uring.submitter().register_files_update(index, &[fd])?;
        }
        Ok(())
    }
}
