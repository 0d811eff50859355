//! The read futures: [`UringReadFuture`] (borrowed buffer),
//! [`UringReadOwnedFuture`] and [`UringReadExactOwnedFuture`] (owned
//! buffer), sharing one state machine. Each borrows its context, or — the
//! `'static` futures of the `*_static` methods — holds a handle to it
//! (`Ctx`).
//!
//! ```text
//! Start ──fid/len checks──► (page-cache fast path: preadv2 RWF_NOWAIT) ──hit──► Ready
//!   │                                      │ miss / partial
//!   ▼                                      ▼
//! Blocking (fallback)            Acquire (in-flight permit) ──► InFlight{ring, key} ──CQE──► Ready
//! ```
//!
//! Dropping the future in `InFlight` hands the op to the ring
//! (`Ring::abandon`), which keeps the memory the kernel writes into alive
//! until the CQE; in every other state nothing is in the kernel.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use tokio::task::JoinHandle;

use crate::buf::{AlignedBuf, IoBufMut};
use crate::error::{self, shut_down_error};
use crate::fallback::{Fallback, GiveUpWatch};
use crate::files::FileEntry;
use crate::id::FileId;
use crate::inline::{self, pread_nowait, Nowait};
use crate::permit::{self, Acquired, Permit};
use crate::ring::{CopyTo, Dst, MAX_READ};
use crate::shared::{Ctx, Inner, RingRef};
use crate::sys;
use crate::thread::thread_slot;

/// Largest piece of a borrowed read handed to the kernel at once: a
/// borrowed read goes through a bounce buffer the op owns, so a larger read
/// is split into pieces of this size, issued one after another (the caller
/// still sees one read). This bounds the memory a borrowed read allocates;
/// owned reads need no bounce buffer and are not split.
pub const BORROWED_CHUNK: usize = 1 << 20;

/// Where a read's bytes end up; the one difference between the futures.
pub(crate) trait Target {
    /// What a fallback (blocking pool) read returns.
    type Blocking: Send + 'static;
    /// Bytes the destination has room for.
    fn len(&self) -> usize;
    /// Whether a read into this destination may start (checked on the
    /// first poll, after the file id).
    fn check(&self, _fid: FileId) -> io::Result<()> {
        Ok(())
    }
    /// Largest piece handed to the kernel at once.
    fn max_piece(&self) -> usize;
    /// A synchronous page-cache read (`preadv2(RWF_NOWAIT)`) of the
    /// destination's bytes `range` at file offset `at`, straight into them.
    fn nowait(&mut self, fd: RawFd, range: Range<usize>, at: u64) -> Nowait;
    /// The destination of a ring read of `len` bytes starting at `done`.
    fn ring_dst(&mut self, done: usize, len: usize) -> Dst;
    /// Whether ring reads go through a bounce buffer (`Dst::Bounce`),
    /// whose bytes are then handed to [`copy_out`](Target::copy_out).
    fn bounced(&self) -> bool;
    /// Puts bytes a bounce buffer received at the destination's `done..`.
    fn copy_out(&mut self, _done: usize, _src: &[u8]) {}
    /// A fallback read of `len` bytes at `offset` into the destination's
    /// bytes `done..`.
    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Arc<FileEntry>,
        offset: u64,
        done: usize,
        len: usize,
        permit: Permit,
    ) -> io::Result<JoinHandle<Self::Blocking>>;
    /// Puts a fallback read's bytes at `done..` and says how many there were.
    fn finish_blocking(&mut self, out: Self::Blocking, done: usize) -> io::Result<usize>;
    /// What must stay alive with an abandoned in-flight op.
    fn park(&mut self) -> Option<Box<dyn Any + Send>>;
    /// Whether a blocking-pool read may be left to finish on its own: its
    /// task reads into a buffer of its own, not into the caller's.
    const BLOCKING_DETACHABLE: bool;
    /// The address the kernel writes the piece starting at `done` to, if
    /// it is the caller's memory (not a bounce buffer the crate aligned).
    fn addr(&self, _done: usize) -> Option<usize> {
        None
    }
}

enum State<'a, J> {
    Start,
    /// Waiting for an in-flight slot of a ring (`Some`) or of the fallback.
    Acquire {
        ring: Option<RingRef<'a>>,
        file: Arc<FileEntry>,
        permit: permit::Wait,
    },
    InFlight {
        ring: RingRef<'a>,
        key: usize,
    },
    /// On the blocking pool; a borrowed read also watches for `shutdown()`
    /// giving up on it.
    Blocking(JoinHandle<J>, GiveUpWatch),
    Done,
}

/// The number of bytes a read of `len` at `offset` may return, so that no
/// syscall ever sees `offset + len` beyond `i64::MAX` (the kernel rejects
/// that with EINVAL; no file extends that far, so nothing is lost): an
/// offset at `i64::MAX` reads `Ok(0)` like any offset past the end of file.
/// Offsets beyond `i64::MAX` cannot be expressed to the kernel at all.
pub(crate) fn clamp_len(fid: FileId, offset: u64, len: usize) -> io::Result<usize> {
    let max = i64::MAX.unsigned_abs();
    if offset > max {
        return Err(error::offset_beyond_max(fid, offset));
    }
    Ok(usize::try_from(max - offset).map_or(len, |room| len.min(room)))
}

/// A read and the page-cache fast path (`preadv2(RWF_NOWAIT)` on the
/// polling thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FastPath {
    /// Try it first (when the context and the file allow).
    Try,
    /// Go straight to a ring (a scan's read-ahead, see `scan.rs`).
    Skip,
    /// Go to the blocking pool, even on a ring (a scan's read-ahead of a
    /// cached file for a consumer whose thread would copy the ring's reads
    /// itself, see `scan.rs`).
    Pool,
    /// It served the whole read.
    Served,
}

pub(crate) struct ReadCore<'a, T: Target> {
    ctx: Ctx<'a>,
    fid: FileId,
    offset: u64,
    /// Bytes this read may return: the destination's length, clamped (see
    /// `clamp_len`); computed on the first poll.
    total: Option<usize>,
    /// Bytes already read (by the page-cache fast path, or earlier pieces).
    done: usize,
    /// Bytes asked of the piece in flight.
    piece: usize,
    /// The file this read is bound to, once it has had to keep it beyond
    /// one poll (a `Pending` before submission, or a read in pieces): the
    /// entry registered under `fid` when the read was first polled, never a
    /// file registered later under the same id.
    bound: Option<Arc<FileEntry>>,
    /// A ring read came back short before the end of the file and the rest
    /// is being read: a later failure is then an error, not a short count.
    resumed: bool,
    /// Fill the whole destination (`read_exact_owned`): every short piece
    /// is continued until the end of the file, and a failure after some
    /// bytes is an error, not a short count.
    exact: bool,
    /// Whether this read tries the page-cache fast path, and whether it
    /// served the whole read.
    fast_path: FastPath,
    state: State<'a, T::Blocking>,
    pub(crate) target: T,
}

impl<'a, T: Target> ReadCore<'a, T> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, offset: u64, target: T) -> Self {
        ReadCore {
            ctx,
            fid,
            offset,
            total: None,
            done: 0,
            piece: 0,
            bound: None,
            resumed: false,
            exact: false,
            fast_path: FastPath::Try,
            state: State::Start,
            target,
        }
    }

    /// Makes this read skip the page-cache fast path (see `FastPath::Skip`).
    pub(crate) fn ring_only(mut self) -> Self {
        self.fast_path = FastPath::Skip;
        self
    }

    /// Makes this read go to the blocking pool (see `FastPath::Pool`).
    pub(crate) fn via_blocking_pool(mut self) -> Self {
        self.fast_path = FastPath::Pool;
        self
    }

    /// Whether the page-cache fast path served the whole read.
    pub(crate) fn served_inline(&self) -> bool {
        self.fast_path == FastPath::Served
    }

    /// Bytes read so far (all of them, once the read is over).
    pub(crate) fn done(&self) -> usize {
        self.done
    }

    /// Makes this read fill its whole destination (see `exact`).
    pub(crate) fn exact(mut self) -> Self {
        self.exact = true;
        self
    }

    /// Binds a read that has not started to the file registered under its
    /// id now, as its first poll does, without reading: for a batch that
    /// yields before its first read (`batch::Core::turn_over`). `Err` if no
    /// file is registered under the id: the read is left as it was, to be
    /// polled at once (its lookup then fails the same way).
    pub(crate) fn bind(&mut self) -> io::Result<()> {
        if matches!(self.state, State::Start) && self.bound.is_none() {
            self.bound = Some(self.ctx.files.get(self.fid)?);
        }
        Ok(())
    }

    pub(crate) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        // Every poll spends tokio's cooperative budget, so a task whose reads
        // complete at once (page-cache hits) still yields to its neighbours.
        let Poll::Ready(coop) = tokio::task::coop::poll_proceed(cx) else {
            // Out of budget before the first look at the file table: bind
            // the read to its file now, so that what it reads does not depend
            // on when the runtime lets it run.
            if matches!(self.state, State::Start) && self.bound.is_none() {
                match self.ctx.files.get(self.fid) {
                    Ok(file) => self.bound = Some(file),
                    // No such file now: fail now. Waiting for budget would
                    // let a file registered meanwhile under the same index
                    // be read instead.
                    Err(e) => {
                        self.state = State::Done;
                        return Poll::Ready(Err(e));
                    }
                }
            }
            return Poll::Pending;
        };
        let res = loop {
            match ready!(self.poll_inner(cx)) {
                // An exact read retries what was interrupted, as
                // `read_exact` does (nothing is in flight after an error).
                Err(e) if self.exact && e.kind() == io::ErrorKind::Interrupted => {
                    self.state = State::Start;
                }
                res => break res,
            }
        };
        coop.made_progress();
        self.state = State::Done;
        // Bytes already read are never lost to a later failure: the caller
        // gets them, as read(2) would give them (see also `tainted`).
        Poll::Ready(match res {
            Err(_) if self.done > 0 && !self.resumed && !self.exact => Ok(self.done),
            res => res,
        })
    }

    #[allow(
        clippy::too_many_lines,
        reason = "the read's state machine, one arm per state, reads best in one place"
    )]
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        loop {
            match &mut self.state {
                State::Start => {
                    let ctx: &Inner = &self.ctx;
                    if ctx.closed.load(Ordering::Acquire) {
                        return Poll::Ready(Err(shut_down_error()));
                    }
                    let slot = thread_slot();
                    // Borrowed from this thread's shard: no reference count
                    // is touched unless the read has to outlive this poll.
                    // A read that already returned `Pending` (or read a
                    // piece) is bound to the file it first found.
                    let mut files = None;
                    let file = match &self.bound {
                        Some(file) => file,
                        None => files.insert(ctx.files.shard(slot)).lookup(self.fid)?,
                    };
                    let total = if let Some(t) = self.total {
                        t
                    } else {
                        self.target.check(self.fid)?;
                        *self
                            .total
                            .insert(clamp_len(self.fid, self.offset, self.target.len())?)
                    };
                    if self.done >= total {
                        return Poll::Ready(Ok(self.done));
                    }
                    let ring = if file.on_ring() && self.fast_path != FastPath::Pool {
                        self.ctx.ring(slot)
                    } else {
                        None
                    };
                    let Some(ring) = ring else {
                        let file = file.clone();
                        drop(files);
                        self.acquire(None, file)?;
                        continue;
                    };
                    if ctx.inline_nowait
                        && self.fast_path != FastPath::Skip
                        && file.nowait_ok()
                        && ring.inline.worth_trying()
                    {
                        // A batch's reads do not yield one by one (that
                        // would split the batch's submission over polls):
                        // the batch checks once, before its first read
                        // (`batch::Core::turn_over`).
                        if !ring.batching_here() && inline::turn_over(ctx.inline_stretch) {
                            // Let other tasks (and the timer) run first.
                            if self.bound.is_none() {
                                self.bound = Some(file.clone());
                            }
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                        let fd = file.file.as_raw_fd();
                        // A cached range can be served in several goes (a
                        // partial hit, then the rest); a read that straddles
                        // the end of file learns it here too, with no ring
                        // round trip.
                        loop {
                            let start = self.done;
                            let at = self.offset + start as u64;
                            // At most BORROWED_CHUNK per call, with the
                            // fairness check between pieces, so that a huge
                            // cached read does not hold the thread for its
                            // whole copy (see DESIGN, "The read path").
                            let end = total.min(start.saturating_add(BORROWED_CHUNK));
                            match self.target.nowait(fd, start..end, at) {
                                Nowait::Read(0) => {
                                    ring.inline.hit();
                                    self.fast_path = FastPath::Served;
                                    return Poll::Ready(Ok(self.done));
                                }
                                Nowait::Read(n) => {
                                    self.done += n;
                                    if self.done == total {
                                        ring.inline.hit();
                                        self.fast_path = FastPath::Served;
                                        return Poll::Ready(Ok(self.done));
                                    }
                                    if self.done == end
                                        && !ring.batching_here()
                                        && inline::turn_over(ctx.inline_stretch)
                                    {
                                        // A whole piece, more to come: let
                                        // the rest of the runtime run.
                                        if self.bound.is_none() {
                                            self.bound = Some(file.clone());
                                        }
                                        cx.waker().wake_by_ref();
                                        return Poll::Pending;
                                    }
                                }
                                Nowait::WouldBlock => {
                                    if self.done == 0 {
                                        ring.inline.miss();
                                    }
                                    break;
                                }
                                Nowait::Unsupported => {
                                    file.nowait_ok.store(false, Ordering::Relaxed);
                                    break;
                                }
                                Nowait::Ring => break,
                            }
                        }
                    }
                    let file = file.clone();
                    drop(files);
                    self.acquire(Some(ring), file)?;
                }
                State::Acquire { ring, file, permit } => {
                    let acquired = ready!(permit.as_mut().poll(cx));
                    let Ok(permit) = acquired else {
                        return Poll::Ready(Err(Self::closed_error(ring.as_ref())));
                    };
                    let (ring, file) = (ring.take(), file.clone());
                    self.start(ring, file, permit)?;
                }
                State::InFlight { ring, key } => {
                    let key = *key;
                    let (at, target) = (self.done, &mut self.target);
                    let bounced = target.bounced();
                    let mut copy = |src: &[u8]| target.copy_out(at, src);
                    let copy_to: Option<CopyTo<'_>> = if bounced { Some(&mut copy) } else { None };
                    let done = ready!(ring.poll_complete(key, cx, copy_to));
                    self.state = State::Done;
                    if done.tainted {
                        return Poll::Ready(self.check_tainted(done.res));
                    }
                    match done.res {
                        Ok(n) if n > 0 && n < self.piece && !self.at_eof(n) => {
                            // Cut short before the end of the file (a local
                            // file only does that when its reader's thread
                            // dies mid-read): read the rest, and if that is
                            // impossible, fail rather than return a short
                            // count from the middle of the file.
                            self.done += n;
                            self.resumed = true;
                            self.state = State::Start;
                        }
                        Ok(n) => {
                            if let Some(res) = self.piece_done(n) {
                                return Poll::Ready(res);
                            }
                        }
                        Err(e) => return Poll::Ready(Err(self.explain(e))),
                    }
                }
                State::Blocking(handle, gave_up) => {
                    let Poll::Ready(out) = Pin::new(handle).poll(cx) else {
                        if gave_up.gave_up(&self.ctx.blocking, cx) {
                            // The task keeps its own buffer (and its slot)
                            // until its syscall returns.
                            self.state = State::Done;
                            return Poll::Ready(Err(error::gave_up()));
                        }
                        return Poll::Pending;
                    };
                    self.state = State::Done;
                    let n = match out {
                        Ok(out) => match self.target.finish_blocking(out, self.done) {
                            Ok(n) => n,
                            Err(e) => return Poll::Ready(Err(self.explain(e))),
                        },
                        // Cancelled: the runtime of the blocking pool shut down.
                        Err(join) if join.is_cancelled() => {
                            return Poll::Ready(Err(error::runtime_gone_error()))
                        }
                        Err(join) => return Poll::Ready(Err(error::blocking_task_failed(&join))),
                    };
                    if let Some(res) = self.piece_done(n) {
                        return Poll::Ready(res);
                    }
                }
                State::Done => panic!("read future polled after completion"),
            }
        }
    }

    /// A piece returned `n` bytes: the read is over (`Some`), or the next
    /// piece starts (`None`, state back to `Start`).
    fn piece_done(&mut self, n: usize) -> Option<io::Result<usize>> {
        self.done += n;
        let total = self.total.unwrap_or(0);
        // A full piece is followed by the next; an exact read continues
        // after any piece that read something.
        if (n == self.piece || self.exact) && n > 0 && self.done < total {
            self.state = State::Start;
            None
        } else {
            Some(Ok(self.done))
        }
    }

    /// The op was in the kernel when the thread that submitted it exited
    /// (the context's home runtime shut down), and io_uring cancels or cuts
    /// short the requests of an exiting thread. A full read is fine; a short
    /// one is fine only if it stopped at the end of the file; anything else
    /// is an error that says so, never a short count mid-file.
    fn check_tainted(&mut self, res: io::Result<usize>) -> io::Result<usize> {
        // Not `Interrupted` (see `error::submitter_exited`).
        let gone = |what: String| error::submitter_exited(self.fid, self.offset, &what);
        let total = self.total.unwrap_or(0);
        let n = match res {
            Ok(n) => n,
            Err(e) => {
                self.done = 0;
                return Err(gone(format!("cancelled ({e})")));
            }
        };
        let read_to = self.done + n;
        let end = self.offset + read_to as u64;
        let file = self
            .bound
            .clone()
            .map_or_else(|| self.ctx.files.get(self.fid), Ok);
        let complete = read_to == total
            || file
                .and_then(|f| sys::file_size(&f.file, f.kind))
                .is_ok_and(|size| end >= size);
        if complete {
            self.done = read_to;
            Ok(read_to)
        } else {
            self.done = 0;
            Err(gone(format!("cut short ({read_to} of {total} bytes)")))
        }
    }

    /// Whether a ring read that returned `n` of `self.piece` bytes stopped
    /// at the end of the file (an `fstat`, paid only for short reads).
    fn at_eof(&self, n: usize) -> bool {
        let end = self.offset + (self.done + n) as u64;
        let file = self
            .bound
            .clone()
            .map_or_else(|| self.ctx.files.get(self.fid), Ok);
        // If the size cannot be read, take the kernel's word for it.
        file.and_then(|f| sys::file_size(&f.file, f.kind))
            .map_or(true, |size| end >= size)
    }

    /// The error of a closed ring or fallback (reads waiting for a permit
    /// learn of it when the semaphore closes).
    fn closed_error(ring: Option<&RingRef<'_>>) -> io::Error {
        match ring {
            Some(r) => r.closed_error(),
            None => shut_down_error(),
        }
    }

    /// Says what the kernel's bare errno meant for this read (the errno
    /// stays the error's source: [`crate::os_error`]): a ring read of a
    /// file unregistered before its SQE reached the kernel, a file not
    /// open for reading, an unaligned `O_DIRECT` read.
    fn explain(&self, e: io::Error) -> io::Error {
        // The file this read went to (every piece is bound to it), and
        // whether its id still names it.
        let now = self.ctx.files.get(self.fid).ok();
        let file = self.bound.clone().or_else(|| now.clone());
        let registered = match (&file, &now) {
            (Some(f), Some(n)) => Arc::ptr_eq(f, n),
            _ => false,
        };
        match (e.raw_os_error(), file) {
            (Some(libc::EBADF), _) if !registered => {
                error::unregistered_while_queued(self.fid, "read")
            }
            (Some(libc::EBADF), Some(f)) if !f.readable() => error::explained(
                io::ErrorKind::PermissionDenied,
                e,
                format!("read of {}: the file is not open for reading", self.fid),
            ),
            (Some(libc::EINVAL), Some(f)) if f.direct => {
                let at = self.offset + self.done as u64;
                let transfer = (at, self.piece, self.target.addr(self.done));
                error::direct_einval(e, self.fid, "read", transfer, f.dio_align)
            }
            _ => e,
        }
    }

    /// Takes an in-flight slot of ring `ring` (or of the blocking pool),
    /// with the file's share of those slots, and starts the read, or waits
    /// for them.
    fn acquire(&mut self, ring: Option<RingRef<'a>>, file: Arc<FileEntry>) -> io::Result<()> {
        let slots = match &ring {
            Some(r) => &r.permits,
            None => &self.ctx.blocking.permits,
        };
        match slots.acquire(Some(file.share())) {
            Acquired::Now(permit) => self.start(ring, file, permit),
            Acquired::Wait(permit) => {
                self.state = State::Acquire { ring, file, permit };
                Ok(())
            }
            Acquired::Closed => Err(Self::closed_error(ring.as_ref())),
        }
    }

    /// Hands the next piece of the read to ring `ring`, or to the blocking
    /// pool (`None`).
    fn start(
        &mut self,
        ring: Option<RingRef<'a>>,
        file: Arc<FileEntry>,
        permit: Permit,
    ) -> io::Result<()> {
        if self.bound.is_none() {
            // Any later piece (the next chunk, or the rest of a read cut
            // short) reads the same file.
            self.bound = Some(file.clone());
        }
        let remaining = self.total.unwrap_or(0) - self.done;
        self.piece = remaining.min(self.target.max_piece()).min(MAX_READ);
        let offset = self.offset + self.done as u64;
        let Some(ring) = ring else {
            let fb = &self.ctx.blocking;
            let h = self
                .target
                .spawn_blocking(fb, file, offset, self.done, self.piece, permit)?;
            let gave_up = fb.watch_give_up(T::BLOCKING_DETACHABLE);
            self.state = State::Blocking(h, gave_up);
            return Ok(());
        };
        let dst = self.target.ring_dst(self.done, self.piece);
        let key = ring.submit_read(file, permit, offset, dst)?;
        self.state = State::InFlight { ring, key };
        Ok(())
    }
}

impl<T: Target> Drop for ReadCore<'_, T> {
    fn drop(&mut self) {
        if let State::InFlight { ring, key } = &self.state {
            ring.abandon(*key, self.target.park());
        }
    }
}

impl<J> fmt::Debug for State<'_, J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            State::Start => f.write_str("Start"),
            State::Acquire { ring, .. } => {
                write!(
                    f,
                    "Acquire {{ ring: {:?} }}",
                    ring.as_ref().map(|r| r.index)
                )
            }
            State::InFlight { ring, key } => {
                write!(f, "InFlight {{ ring: {}, key: {key} }}", ring.index)
            }
            State::Blocking(..) => f.write_str("Blocking"),
            State::Done => f.write_str("Done"),
        }
    }
}

impl<T: Target> fmt::Debug for ReadCore<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Read")
            .field("fid", &self.fid)
            .field("offset", &self.offset)
            .field("len", &self.target.len())
            .field("state", &self.state)
            .finish()
    }
}

/// A borrowed destination: the kernel writes into a bounce buffer owned by
/// the op, copied here on completion.
pub(crate) struct Borrowed<'a>(pub(crate) &'a mut [u8]);

impl Target for Borrowed<'_> {
    const BLOCKING_DETACHABLE: bool = true;

    type Blocking = io::Result<(AlignedBuf, usize)>;
    fn len(&self) -> usize {
        self.0.len()
    }
    fn max_piece(&self) -> usize {
        BORROWED_CHUNK
    }
    fn nowait(&mut self, fd: RawFd, range: Range<usize>, at: u64) -> Nowait {
        let dst = &mut self.0[range];
        let len = dst.len();
        // SAFETY: the same memory, viewed as possibly uninitialised; what is
        // written through it (by the kernel) is initialised bytes only, so
        // the `&mut [u8]` stays valid.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast(), len) };
        pread_nowait(fd, dst, at)
    }
    fn ring_dst(&mut self, _done: usize, len: usize) -> Dst {
        Dst::Bounce(len)
    }
    fn bounced(&self) -> bool {
        true
    }
    fn copy_out(&mut self, done: usize, src: &[u8]) {
        let dst = &mut self.0[done..];
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
    }
    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Arc<FileEntry>,
        offset: u64,
        _done: usize,
        len: usize,
        permit: Permit,
    ) -> io::Result<JoinHandle<Self::Blocking>> {
        fb.read(file, offset, len, permit)
    }
    fn finish_blocking(&mut self, out: Self::Blocking, done: usize) -> io::Result<usize> {
        let (data, n) = out?;
        let n = n.min(data.len()).min(self.0.len() - done);
        self.0[done..done + n].copy_from_slice(&data[..n]);
        Ok(n)
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
}

/// An owned destination: the kernel writes straight into its spare
/// capacity, `bytes_init()..bytes_total()` as they were when the read was
/// made. On the fallback backend the buffer travels to the blocking pool
/// through `lent`, so it comes back even if the blocking task is cancelled
/// before it runs.
pub(crate) struct Owned<B> {
    buf: Option<B>,
    lent: Option<Arc<Mutex<Option<B>>>>,
    /// `bytes_init()` at the start: where the read writes.
    init: usize,
    /// The spare capacity: how many bytes the read may write.
    room: usize,
    /// `bytes_total()` at the start.
    total: usize,
}

impl<B: IoBufMut> Owned<B> {
    pub(crate) fn new(buf: B) -> Self {
        let total = buf.bytes_total();
        let init = buf.bytes_init().min(total);
        Owned {
            buf: Some(buf),
            lent: None,
            init,
            room: total - init,
            total,
        }
    }

    fn buf(&mut self) -> &mut B {
        self.buf.as_mut().expect("owned buffer is at home")
    }

    /// Hands the buffer back once the read is over, with the `filled` bytes
    /// the read wrote counted as initialised.
    pub(crate) fn take(&mut self, filled: usize) -> B {
        if let Some(lent) = self.lent.take() {
            self.buf = crate::util::lock(&lent).take();
        }
        let mut buf = self
            .buf
            .take()
            .expect("the owned buffer was lost by a panicking blocking read");
        if filled > 0 {
            // SAFETY: the read wrote `filled` bytes (counted only after a
            // successful syscall or CQE) right after the `init` bytes that
            // were initialised already, and filled <= room.
            unsafe { buf.set_init(self.init + filled.min(self.room)) };
        }
        buf
    }
}

impl<B: IoBufMut> Target for Owned<B> {
    const BLOCKING_DETACHABLE: bool = false;

    type Blocking = io::Result<usize>;
    fn len(&self) -> usize {
        self.room
    }
    fn check(&self, fid: FileId) -> io::Result<()> {
        if self.room == 0 && self.total > 0 {
            return Err(error::no_spare_capacity(fid, self.total));
        }
        Ok(())
    }
    fn max_piece(&self) -> usize {
        MAX_READ
    }
    fn nowait(&mut self, fd: RawFd, range: Range<usize>, at: u64) -> Nowait {
        let (init, room) = (self.init, self.room);
        let b = self.buf();
        // SAFETY: IoBufMut promises bytes_total() = init + room writable
        // bytes at the pointer while `b` lives, not necessarily
        // initialised (hence MaybeUninit); the slice does not outlive
        // this call.
        let dest: &mut [MaybeUninit<u8>] =
            unsafe { std::slice::from_raw_parts_mut(b.stable_mut_ptr().add(init).cast(), room) };
        pread_nowait(fd, &mut dest[range], at)
    }
    fn ring_dst(&mut self, done: usize, len: usize) -> Dst {
        let init = self.init;
        assert!(done + len <= self.room, "read piece out of bounds");
        let b = self.buf();
        // SAFETY: init + done + len <= bytes_total, so the pointer stays in
        // bounds.
        Dst::Caller(unsafe { b.stable_mut_ptr().add(init + done) }, len)
    }
    fn bounced(&self) -> bool {
        false
    }
    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Arc<FileEntry>,
        offset: u64,
        done: usize,
        len: usize,
        permit: Permit,
    ) -> io::Result<JoinHandle<Self::Blocking>> {
        let at = self.init + done;
        let lent = Arc::new(Mutex::new(self.buf.take()));
        self.lent = Some(lent.clone());
        fb.read_owned(file, offset, at..at + len, lent, permit)
    }
    fn finish_blocking(&mut self, res: Self::Blocking, _done: usize) -> io::Result<usize> {
        // Bring the buffer home now: a next piece needs it.
        if let Some(lent) = self.lent.take() {
            self.buf = crate::util::lock(&lent).take();
        }
        res
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        self.buf.take().map(|b| Box::new(b) as Box<dyn Any + Send>)
    }
    fn addr(&self, done: usize) -> Option<usize> {
        let b = self.buf.as_ref()?;
        Some(b.stable_ptr() as usize + self.init + done)
    }
}

impl<B: IoBufMut> ReadCore<'_, Owned<B>> {
    /// The buffer, once the read is over, grown by the bytes read.
    fn finish(&mut self) -> B {
        let done = self.done;
        self.target.take(done)
    }
}

/// The future returned by [`UringContext::read`](crate::UringContext::read).
///
/// Resolves to the number of bytes read (fewer than asked only at end of
/// file, or when the kernel returns a short read). Dropping it at any point
/// is sound: if the read is in the kernel, the bytes land in a buffer owned by
/// the context, never in the caller's slice.
#[must_use = "futures do nothing unless polled"]
pub struct UringReadFuture<'a> {
    pub(crate) core: ReadCore<'a, Borrowed<'a>>,
}

impl Future for UringReadFuture<'_> {
    type Output = io::Result<usize>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.get_mut().core.poll_read(cx)
    }
}

impl fmt::Debug for UringReadFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

/// The future returned by [`UringContext::read_owned`](crate::UringContext::read_owned)
/// (borrowing the context) and
/// [`read_owned_static`](crate::UringContext::read_owned_static)
/// (`'static`): the kernel writes straight into the buffer's spare
/// capacity, and the buffer comes back with the result, its initialised
/// length grown by the bytes read. Dropped while the read is in the kernel,
/// the buffer is kept by the context until the kernel is done, then freed.
#[must_use = "futures do nothing unless polled"]
pub struct UringReadOwnedFuture<'a, B: IoBufMut> {
    pub(crate) core: ReadCore<'a, Owned<B>>,
}

impl<'a, B: IoBufMut> UringReadOwnedFuture<'a, B> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, offset: u64, buf: B) -> Self {
        UringReadOwnedFuture {
            core: ReadCore::new(ctx, fid, offset, Owned::new(buf)),
        }
    }

    /// Makes this read skip the page-cache fast path and go to a ring even
    /// when its range is cached (a scan's read-ahead; see `scan.rs`).
    pub(crate) fn ring_only(self) -> Self {
        UringReadOwnedFuture {
            core: self.core.ring_only(),
        }
    }

    /// Makes this read a `pread` on the context's blocking pool, whatever
    /// the file's route (see `FastPath::Pool`).
    pub(crate) fn via_blocking_pool(self) -> Self {
        UringReadOwnedFuture {
            core: self.core.via_blocking_pool(),
        }
    }

    /// Whether this read, once complete, was served whole from the page
    /// cache on the polling thread.
    pub(crate) fn served_inline(&self) -> bool {
        self.core.served_inline()
    }
}

impl<B: IoBufMut> Future for UringReadOwnedFuture<'_, B> {
    type Output = (io::Result<usize>, B);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_read(cx));
        Poll::Ready((res, this.core.finish()))
    }
}

impl<B: IoBufMut> fmt::Debug for UringReadOwnedFuture<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

/// The future returned by
/// [`UringContext::read_exact_owned`](crate::UringContext::read_exact_owned)
/// (borrowing the context) and
/// [`read_exact_owned_static`](crate::UringContext::read_exact_owned_static)
/// (`'static`): fills the buffer's whole spare capacity, continuing short
/// reads, or fails with `UnexpectedEof` at the end of the file; the buffer
/// comes back either way, grown by every byte read. Dropping it is as sound
/// as dropping [`UringReadOwnedFuture`].
#[must_use = "futures do nothing unless polled"]
pub struct UringReadExactOwnedFuture<'a, B: IoBufMut> {
    core: ReadCore<'a, Owned<B>>,
}

impl<'a, B: IoBufMut> UringReadExactOwnedFuture<'a, B> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, offset: u64, buf: B) -> Self {
        UringReadExactOwnedFuture {
            core: ReadCore::new(ctx, fid, offset, Owned::new(buf)).exact(),
        }
    }
}

impl<B: IoBufMut> Future for UringReadExactOwnedFuture<'_, B> {
    type Output = (io::Result<()>, B);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_read(cx));
        let (fid, offset, room) = (this.core.fid, this.core.offset, this.core.target.room);
        let res = match res {
            Ok(n) if n == room => Ok(()),
            Ok(n) => Err(error::ends_before(fid, offset, n, room)),
            Err(e) => Err(e),
        };
        Poll::Ready((res, this.core.finish()))
    }
}

impl<B: IoBufMut> fmt::Debug for UringReadExactOwnedFuture<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

// The read futures' auto traits are part of the API, and holding their ring
// (a `RingRef`) or a context handle must not change them: they are `Send`
// and `Unpin` (spawned, polled through `&mut`), and today not `Sync` (each
// is polled by one task; making them `Sync` would be a deliberate API
// addition, not a side effect).
const _: fn() = || {
    fn send_unpin<T: Send + Unpin>() {}
    // Resolves only if exactly one impl applies, i.e. if `T` is not `Sync`.
    trait AmbiguousIfSync<A> {
        fn check() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}

    send_unpin::<UringReadFuture<'static>>();
    send_unpin::<UringReadOwnedFuture<'static, Vec<u8>>>();
    send_unpin::<UringReadOwnedFuture<'static, AlignedBuf>>();
    send_unpin::<UringReadExactOwnedFuture<'static, crate::buf::Slice<AlignedBuf>>>();
    send_unpin::<crate::Scan<'static>>();
    <UringReadFuture<'static> as AmbiguousIfSync<_>>::check();
    <UringReadOwnedFuture<'static, Vec<u8>> as AmbiguousIfSync<_>>::check();
    <UringReadExactOwnedFuture<'static, Vec<u8>> as AmbiguousIfSync<_>>::check();
    <crate::Scan<'static> as AmbiguousIfSync<_>>::check();
};
