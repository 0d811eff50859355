//! The blocking pool: ops as blocking syscalls (`pread`, `pwrite`, `fsync`,
//! ...) on tokio's blocking threads. It runs every op of the fallback
//! backend, and the ops of files routed away from the rings.
//!
//! Each op's piece is a [`Job`]: a closure that owns what it touches (a
//! bounce buffer of its own for borrowed ops, the caller's buffer for owned
//! ones) and sends its result through a channel. Soundness is by that
//! ownership: a dropped future merely detaches a job that finishes on its
//! own. A job runs with an in-flight slot: spawned at once when one is
//! free, or, for a latency read, queued with the slots and started by the
//! thread whose release grants it one ([`hand_off`]).

use std::fmt;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{oneshot, Notify};

use crate::buf::{AlignedBuf, IoBufMut, BOUNCE_ALIGN};
use crate::error::shut_down_error;
use crate::files::FileEntry;
use crate::permit::{Job, Permit, Slots, SlotsConfig};
use crate::thread::Handoffs;

pub(crate) struct BlockingPool {
    /// Ops on the blocking pool at once (`Builder::max_in_flight`).
    pub(crate) permits: Slots,
    /// The runtime the context was built on: its blocking threads run the
    /// ops wherever the future is polled from.
    runtime: Handle,
    /// Jobs started and completed, and whether the pool is closed (see
    /// [`Tally`]).
    counts: Arc<Tally>,
    /// `shutdown()` stopped waiting for the ops still running
    /// (`wait_idle` timed out): borrowed ops waiting for them fail.
    gave_up: AtomicBool,
    /// Notified (to every waiter) when `gave_up` is set.
    gave_up_notify: Arc<Notify>,
}

/// What the pool is doing now: jobs started and ended, and its slots.
impl fmt::Debug for BlockingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingPool")
            .field("started", &self.counts.submitted.load(Ordering::Relaxed))
            .field("ended", &self.counts.completed.load(Ordering::Relaxed))
            .field("closed", &self.counts.closed.load(Ordering::Relaxed))
            .field("gave_up", &self.gave_up.load(Ordering::Relaxed))
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// The largest bounce buffer a thread keeps for its next blocking read
/// (a database block; larger reads amortise their allocation).
pub(crate) const KEPT_MAX_LEN: usize = 16 << 10;
/// Bounce buffers a thread keeps: with [`KEPT_MAX_LEN`], at most 64 KiB.
const KEPT_PER_THREAD: usize = 4;

/// The size a bounce buffer for `len` bytes is allocated and kept at.
fn bounce_class(len: usize) -> usize {
    if len <= KEPT_MAX_LEN {
        len.next_power_of_two().max(BOUNCE_ALIGN)
    } else {
        len
    }
}

/// An empty page-aligned buffer of at least `len` bytes: one this thread
/// kept, or a new one (not zeroed: a read initialises what it returns). A
/// borrowed read is issued and its bytes copied out on the caller's
/// thread, so each thread mostly takes back what it gave, and the buffers
/// come from that thread's malloc arena.
fn bounce_buffer(len: usize) -> io::Result<AlignedBuf> {
    let class = bounce_class(len);
    if class <= KEPT_MAX_LEN {
        let kept = crate::thread::with_kept_bounce(|k| {
            let mut k = k.try_borrow_mut().ok()?;
            let i = k.iter().position(|b| b.capacity() == class)?;
            Some(k.swap_remove(i))
        })
        .flatten();
        if let Some(mut buf) = kept {
            buf.clear();
            return Ok(buf);
        }
    }
    AlignedBuf::try_with_capacity(class, BOUNCE_ALIGN)
}

/// Gives a bounce buffer whose bytes were copied out back to this thread,
/// for its next blocking read (dropped if the thread keeps enough).
pub(crate) fn recycle_bounce(buf: AlignedBuf) {
    if buf.capacity() > KEPT_MAX_LEN || buf.align() != BOUNCE_ALIGN {
        return;
    }
    crate::thread::with_kept_bounce(move |k| {
        if let Ok(mut k) = k.try_borrow_mut() {
            if k.len() < KEPT_PER_THREAD {
                k.push(buf);
            }
        }
    });
}

/// A job and where its result arrives.
pub(crate) struct PoolJob<T> {
    pub(crate) job: Job,
    pub(crate) handle: PoolHandle<T>,
}

/// Why a job's result never came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// Dropped before it ran: the slots closed, or the runtime shut down.
    NotRun,
    /// It panicked.
    Panicked,
}

/// The result of a job: a future, ready once the job ran or was dropped.
pub(crate) struct PoolHandle<T>(oneshot::Receiver<Result<T, Lost>>);

impl<T> Future for PoolHandle<T> {
    type Output = Result<T, Lost>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T, Lost>> {
        // A sender dropped without a word cannot happen (`Reply` speaks on
        // drop); say `NotRun` all the same.
        Poll::Ready(ready!(Pin::new(&mut self.0).poll(cx)).unwrap_or(Err(Lost::NotRun)))
    }
}

/// A job's end of its [`PoolHandle`]: a job dropped unrun, or unwinding,
/// says so when dropped.
struct Reply<T> {
    tx: Option<oneshot::Sender<Result<T, Lost>>>,
    lost: Lost,
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Err(self.lost));
        }
    }
}

/// Starts `job`, granted `permit` by a release of a slot on this thread:
/// a blocking thread that released it runs it next itself (so a pool kept
/// busy hands its work from thread to thread, with no task or thread to
/// wake); any other thread spawns it on `runtime`'s blocking threads.
pub(crate) fn hand_off(job: Job, permit: Permit, runtime: Option<&Handle>) {
    let mut item = Some((job, permit));
    let taken = crate::thread::with_handoffs(|h| {
        // Never borrowed while a job or a slot is dropped: always free.
        let Ok(mut h) = h.try_borrow_mut() else {
            return false;
        };
        h.jobs.extend(item.take());
        h.runner || std::mem::replace(&mut h.spawning, true)
    });
    if let Some((job, permit)) = item {
        // The thread's locals are being destroyed (a thread-local
        // destructor issued an op): spawn it from here.
        spawn_on(runtime, job, permit);
        return;
    }
    if taken == Some(true) {
        return;
    }
    let _spawning = Unset(|h| h.spawning = false);
    // Spawning may drop a job unrun (the runtime shut down), whose slot's
    // release hands off the next: this loop, not recursion, starts it.
    while let Some((job, permit)) = pop_handoff() {
        spawn_on(runtime, job, permit);
    }
}

/// Clears a flag of this thread's [`Handoffs`] when dropped, also while
/// unwinding (tokio may panic when the OS refuses it a thread), so that
/// later hand-offs on this thread start their jobs.
struct Unset(fn(&mut Handoffs));

impl Drop for Unset {
    fn drop(&mut self) {
        crate::thread::with_handoffs(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                (self.0)(&mut h);
            }
        });
    }
}

fn pop_handoff() -> Option<(Job, Permit)> {
    crate::thread::with_handoffs(|h| h.borrow_mut().jobs.pop_front()).flatten()
}

/// Runs `job` with `permit` on a new blocking task of `runtime` (dropped,
/// unrun, without one).
fn spawn_on(runtime: Option<&Handle>, job: Job, permit: Permit) {
    if let Some(rt) = runtime {
        let rt2 = rt.clone();
        drop(rt.spawn_blocking(move || run_jobs(&rt2, job, permit)));
    }
}

/// A blocking task's loop: runs `job`, then the jobs its own slot
/// releases handed to this thread (the first; the rest on new tasks).
fn run_jobs(runtime: &Handle, job: Job, permit: Permit) {
    crate::thread::with_handoffs(|h| h.borrow_mut().runner = true);
    let _runner = Unset(|h| h.runner = false);
    let mut next = Some((job, permit));
    while let Some((job, permit)) = next.take() {
        // A panicking job has told its op (`Reply`) and released its slot
        // while unwinding; the loop goes on with what that release handed
        // here.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(move || job(permit)));
        next = pop_handoff();
        while let Some((job, permit)) = pop_handoff() {
            spawn_on(Some(runtime), job, permit);
        }
    }
}

/// What a future waiting for blocking work watches to learn that
/// `shutdown()` gave up on it: only work that may be left to finish on its
/// own (its task owns everything it touches) watches; the rest waits.
pub(crate) struct GiveUpWatch(Option<Pin<Box<OwnedNotified>>>);

impl GiveUpWatch {
    /// Whether `shutdown()` gave up on blocking work (registers `cx` to be
    /// woken when it does).
    pub(crate) fn gave_up(&mut self, pool: &BlockingPool, cx: &mut Context<'_>) -> bool {
        match &mut self.0 {
            Some(n) => n.as_mut().poll(cx).is_ready() || pool.gave_up.load(Ordering::Acquire),
            None => false,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counts {
    pub(crate) submitted: u64,
    pub(crate) completed: u64,
}

/// The pool's counters, without a lock: hundreds of pool threads finish
/// ops at once (`BlockingPool::counters` takes a consistent snapshot).
#[derive(Debug, Default)]
struct Tally {
    /// Jobs that started (with a slot) and ended.
    submitted: AtomicU64,
    completed: AtomicU64,
    /// The pool was closed: no job starts from now on.
    closed: AtomicBool,
    idle: Notify,
}

impl Tally {
    /// Counts a job as started, unless the pool was closed: counted first
    /// and checked after, so that `wait_idle`, which closes first and
    /// counts after, either waits for the job or the job sees it closed.
    fn start(self: &Arc<Self>) -> Option<Done> {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        let done = Done(self.clone());
        (!self.closed.load(Ordering::SeqCst)).then_some(done)
    }
}

/// Counts a blocking job as completed however it ends; the job that
/// leaves the pool idle wakes `wait_idle`.
struct Done(Arc<Tally>);

impl Drop for Done {
    fn drop(&mut self) {
        let t = &self.0;
        let completed = t.completed.fetch_add(1, Ordering::SeqCst) + 1;
        if completed == t.submitted.load(Ordering::SeqCst) {
            t.idle.notify_waiters();
        }
    }
}

impl BlockingPool {
    pub(crate) fn new(slots: SlotsConfig, runtime: Handle) -> BlockingPool {
        BlockingPool {
            permits: Slots::on(slots, Some(runtime.clone()), Some(hand_off)),
            runtime,
            counts: Arc::default(),
            gave_up: AtomicBool::new(false),
            gave_up_notify: Arc::new(Notify::new()),
        }
    }

    /// A read into a page-aligned buffer owned by the blocking task (aligned
    /// so that `O_DIRECT` files work as on the ring), taken now on the
    /// polling thread.
    pub(crate) fn read(
        &self,
        file: Arc<FileEntry>,
        offset: u64,
        len: usize,
    ) -> io::Result<PoolJob<io::Result<(AlignedBuf, usize)>>> {
        // Bounded by the caller (`read::BORROWED_CHUNK`); fails cleanly all the same.
        let mut buf = bounce_buffer(len)?;
        self.job(move || {
            // SAFETY: `buf` has at least `len` bytes of storage (see
            // `bounce_buffer`), owned by this job alone for the call;
            // `MaybeUninit` because they need not be initialised.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(buf.stable_mut_ptr().cast::<MaybeUninit<u8>>(), len)
            };
            let n = crate::sys::pread(&file.file, dst, offset)?;
            // SAFETY: `pread` initialised the first `n` bytes.
            unsafe { buf.set_init(n) };
            Ok((buf, n))
        })
    }

    /// A read into bytes `range` of the caller's owned buffer's storage
    /// (possibly uninitialised), lent to the job through `lent`.
    pub(crate) fn read_owned<B: IoBufMut>(
        &self,
        file: Arc<FileEntry>,
        offset: u64,
        range: Range<usize>,
        lent: Arc<Mutex<Option<B>>>,
    ) -> io::Result<PoolJob<io::Result<usize>>> {
        self.job(move || {
            let mut guard = crate::util::lock(&lent);
            let buf = guard
                .as_mut()
                .expect("owned buffer lent to the blocking read");
            let len = buf.bytes_total();
            // SAFETY: IoBufMut promises `len` writable bytes at this pointer
            // while `buf` lives (not necessarily initialised, hence
            // `MaybeUninit`); the lock keeps it in place for the call.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(buf.stable_mut_ptr().cast::<MaybeUninit<u8>>(), len)
            };
            let dst = dst.get_mut(range).ok_or_else(|| {
                io::Error::other("owned read out of the buffer's bounds (a bug in the crate)")
            })?;
            crate::sys::pread(&file.file, dst, offset)
        })
    }

    /// `work` (a read, write, sync, open...) as a job of the blocking pool,
    /// counted from now, holding its slot until it is over. `work` owns
    /// whatever it touches, so a dropped future merely detaches it.
    pub(crate) fn job<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<PoolJob<T>> {
        if self.is_closed() {
            return Err(shut_down_error());
        }
        let tally = self.counts.clone();
        let (tx, rx) = oneshot::channel();
        let mut reply = Reply {
            tx: Some(tx),
            lost: Lost::NotRun,
        };
        let job: Job = Box::new(move |permit: Permit| {
            // Granted after `shutdown()` closed the pool: never run.
            let Some(done) = tally.start() else {
                return;
            };
            let _ioprio = crate::sys::IoprioGuard::set(permit.priority().ioprio());
            reply.lost = Lost::Panicked;
            let out = work();
            // Over before its result is seen (the counters say so), and
            // its slot's release may hand this thread its next job.
            drop((done, permit));
            if let Some(tx) = reply.tx.take() {
                let _ = tx.send(Ok(out));
            }
        });
        Ok(PoolJob {
            job,
            handle: PoolHandle(rx),
        })
    }

    /// Runs `job` with `permit`, granted at once, on a new blocking task.
    pub(crate) fn spawn(&self, job: Job, permit: Permit) {
        spawn_on(Some(&self.runtime), job, permit);
    }

    /// Whether the pool was closed (`shutdown()`, the context dropped).
    pub(crate) fn is_closed(&self) -> bool {
        self.counts.closed.load(Ordering::SeqCst)
    }

    /// A watch for `shutdown()` giving up, for work that may be left to
    /// finish on its own (`detachable`); created before the work starts, so
    /// no give-up is missed.
    pub(crate) fn watch_give_up(&self, detachable: bool) -> GiveUpWatch {
        GiveUpWatch(detachable.then(|| Box::pin(self.gave_up_notify.clone().notified_owned())))
    }

    /// A snapshot of the counters: `submitted` did not move while
    /// `completed` was read, so `submitted - completed` is what was in
    /// flight at that moment (after a few tries under constant submission,
    /// a snapshot that at least never has more completed than submitted).
    pub(crate) fn counters(&self) -> Counts {
        let t = &self.counts;
        for _ in 0..64 {
            let submitted = t.submitted.load(Ordering::SeqCst);
            let completed = t.completed.load(Ordering::SeqCst);
            if t.submitted.load(Ordering::SeqCst) == submitted {
                return Counts {
                    submitted,
                    completed,
                };
            }
        }
        let completed = t.completed.load(Ordering::SeqCst);
        Counts {
            submitted: t.submitted.load(Ordering::SeqCst),
            completed,
        }
    }

    pub(crate) fn close(&self) {
        self.counts.closed.store(true, Ordering::SeqCst);
        self.permits.close();
    }

    /// Waits until every started op has finished, or `timeout` has passed
    /// (an op on storage that never answers keeps its thread and buffer).
    /// The timeout runs on a blocking thread: no time driver is needed.
    pub(crate) async fn wait_idle(&self, timeout: Duration) {
        let idle = async {
            loop {
                let notified = self.counts.idle.notified();
                let mut notified = std::pin::pin!(notified);
                notified.as_mut().enable();
                let c = self.counters();
                if c.submitted == c.completed {
                    return;
                }
                notified.await;
            }
        };
        if self.counters().submitted == self.counters().completed {
            return;
        }
        // A channel, so the timer thread ends with the ops (the sender is
        // dropped below), not after the whole timeout.
        let (stop_timer, timer_stopped) = std::sync::mpsc::channel::<()>();
        let timer = self.runtime.spawn_blocking(move || {
            let _ = timer_stopped.recv_timeout(timeout);
        });
        let idle = std::pin::pin!(idle);
        let timed_out = matches!(
            futures::future::select(idle, timer).await,
            futures::future::Either::Right(_)
        );
        drop(stop_timer);
        if timed_out {
            // Borrowed ops fail now; each task keeps its buffer until its
            // syscall returns.
            self.gave_up.store(true, Ordering::Release);
            self.gave_up_notify.notify_waiters();
        }
    }
}
