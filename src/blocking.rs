//! The blocking pool: ops as blocking syscalls (`pread`, `pwrite`, `fsync`,
//! ...) on tokio's blocking threads. It runs every op of the fallback
//! backend, and the ops of files routed away from the rings.
//!
//! Soundness is by ownership: each blocking task owns its buffer (its own
//! for borrowed ops, the caller's for owned ones), so a dropped future
//! merely detaches a task that finishes on its own.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::buf::{AlignedBuf, IoBufMut, BOUNCE_ALIGN};
use crate::error::shut_down_error;
use crate::files::FileEntry;
use crate::permit::{Permit, Slots, SlotsConfig};

#[derive(Debug)]
pub(crate) struct BlockingPool {
    /// Ops on the blocking pool at once (`Builder::max_in_flight`).
    pub(crate) permits: Slots,
    /// The runtime the context was built on: its blocking threads run the
    /// ops wherever the future is polled from.
    runtime: Handle,
    closed: AtomicBool,
    /// Ops submitted and completed (see [`Tally`]).
    counts: Arc<Tally>,
    idle: Arc<Notify>,
    /// `shutdown()` stopped waiting for the ops still running
    /// (`wait_idle` timed out): borrowed ops waiting for them fail.
    gave_up: AtomicBool,
    /// Notified (to every waiter) when `gave_up` is set.
    gave_up_notify: Arc<Notify>,
}

/// The largest bounce buffer a thread keeps for its next blocking read
/// (a database block; larger reads amortise their allocation).
const KEPT_MAX_LEN: usize = 16 << 10;
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
/// thread, so each thread mostly takes back what it gave.
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
    submitted: AtomicU64,
    completed: AtomicU64,
}

/// Counts a blocking op as completed however its task ends; the op that
/// leaves the pool idle wakes `wait_idle`.
struct Done {
    counts: Arc<Tally>,
    idle: Arc<Notify>,
}

impl Drop for Done {
    fn drop(&mut self) {
        let completed = self.counts.completed.fetch_add(1, Ordering::SeqCst) + 1;
        if completed == self.counts.submitted.load(Ordering::SeqCst) {
            self.idle.notify_waiters();
        }
    }
}

impl BlockingPool {
    pub(crate) fn new(slots: SlotsConfig, runtime: Handle) -> BlockingPool {
        BlockingPool {
            runtime,
            permits: Slots::new(slots),
            closed: AtomicBool::new(false),
            counts: Arc::default(),
            idle: Arc::new(Notify::new()),
            gave_up: AtomicBool::new(false),
            gave_up_notify: Arc::new(Notify::new()),
        }
    }

    fn start(&self) -> io::Result<Done> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down_error());
        }
        self.counts.submitted.fetch_add(1, Ordering::SeqCst);
        Ok(Done {
            counts: self.counts.clone(),
            idle: self.idle.clone(),
        })
    }

    /// A read into a page-aligned buffer owned by the blocking task (aligned
    /// so that `O_DIRECT` files work as on the ring).
    pub(crate) fn read(
        &self,
        file: Arc<FileEntry>,
        offset: u64,
        len: usize,
        permit: Permit,
    ) -> io::Result<JoinHandle<io::Result<(AlignedBuf, usize)>>> {
        // Bounded by the caller (`read::BORROWED_CHUNK`); fails cleanly all the same.
        let mut buf = bounce_buffer(len)?;
        let done = self.start()?;
        Ok(self.runtime.spawn_blocking(move || {
            let _ioprio = crate::sys::IoprioGuard::set(permit.priority().ioprio());
            let _done = (done, permit);
            // SAFETY: `buf` has at least `len` bytes of storage (see
            // `bounce_buffer`), owned by this task alone for the call;
            // `MaybeUninit` because they need not be initialised.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(buf.stable_mut_ptr().cast::<MaybeUninit<u8>>(), len)
            };
            let n = crate::sys::pread(&file.file, dst, offset)?;
            // SAFETY: `pread` initialised the first `n` bytes.
            unsafe { buf.set_init(n) };
            Ok((buf, n))
        }))
    }

    /// A read into bytes `range` of the caller's owned buffer's storage
    /// (possibly uninitialised), lent to the task through `lent`.
    pub(crate) fn read_owned<B: IoBufMut>(
        &self,
        file: Arc<FileEntry>,
        offset: u64,
        range: Range<usize>,
        lent: Arc<Mutex<Option<B>>>,
        permit: Permit,
    ) -> io::Result<JoinHandle<io::Result<usize>>> {
        let done = self.start()?;
        Ok(self.runtime.spawn_blocking(move || {
            let _ioprio = crate::sys::IoprioGuard::set(permit.priority().ioprio());
            let _done = (done, permit);
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
        }))
    }

    /// Runs `job` (a read, write, sync, open...) on the blocking pool,
    /// counted, holding `permit` until it is over. `job` owns whatever it
    /// touches, so a dropped future merely detaches it.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        permit: Permit,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<JoinHandle<T>> {
        let done = self.start()?;
        Ok(self.runtime.spawn_blocking(move || {
            let _ioprio = crate::sys::IoprioGuard::set(permit.priority().ioprio());
            let _done = (done, permit);
            job()
        }))
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
        self.closed.store(true, Ordering::Release);
        self.permits.close();
    }

    /// Waits until every started op has finished, or `timeout` has passed
    /// (an op on storage that never answers keeps its thread and buffer).
    /// The timeout runs on a blocking thread: no time driver is needed.
    pub(crate) async fn wait_idle(&self, timeout: Duration) {
        let idle = async {
            loop {
                let notified = self.idle.notified();
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
