//! The one op engine: every op the crate offers (reads, vectored reads,
//! writes, syncs, `fallocate`, `statx`, `open`) is an [`Op`] driven by one
//! state machine, [`Core`], which its public future wraps.
//!
//! ```text
//! Start ──checks──► (inline: preadv2 RWF_NOWAIT, reads only) ──served──► Ready
//!   │                     │ miss / partial
//!   │                     ▼
//!   └──────────────► Acquire (in-flight slot + the file's share)
//!                         │
//!           ┌─────────────┴─────────────┐
//!           ▼                           ▼
//!   InFlight{ring, key} ──CQE──┐   Blocking (pool thread) ──┐
//!                              ▼                            ▼
//!                        op.advance: result ──► Ready, or the next piece ──► Start
//! ```
//!
//! An op says what its SQE is ([`Op::sqe`]), what its blocking-pool twin is
//! ([`Op::blocking_job`]), what a finished piece means ([`Op::advance`])
//! and what must outlive a dropped future ([`Op::park`]). The core owns
//! everything else: the file lookup and binding, the route (ring, blocking
//! pool, or inline), in-flight slots, the cooperative budget, errors
//! explained against the file, and cancellation: dropping the future in
//! `InFlight` hands the op to the ring (`Ring::abandon`), which keeps the
//! memory the kernel uses alive until the CQE; in every other state nothing
//! is in the kernel.
//!
//! A new op is a file in this directory: its `Op` impl and its future, a
//! [`RingOp`] variant if it needs a new SQE, and its public method in
//! `context/`.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use crate::blocking::{BlockingPool, GiveUpWatch, Lost, PoolHandle, PoolJob};
use crate::error::{self, shut_down_error};
use crate::files::FileEntry;
use crate::id::FileId;
use crate::inline;
use crate::latency::OpKind;
use crate::permit::{self, Acquired, JobAcquired, Permit, Priority};
use crate::ring::RingOp;
use crate::shared::{Ctx, Inner, RingRef};
use crate::thread::thread_slot;

pub(crate) mod open;
pub(crate) mod read;
pub(crate) mod readv;
pub(crate) mod statx;
pub(crate) mod sync;
pub(crate) mod write;

/// Which access to the file an op needs (to explain `EBADF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
    /// None in particular (syncs, `statx`, `open`).
    Any,
}

/// What one inline step ([`Op::inline`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inline {
    /// The op is over: its result (all of it read, or the end of the file).
    Served(usize),
    /// A whole piece was read and more follow: a point to yield at.
    Piece,
    /// Some bytes were read, fewer than the piece: try again.
    Partial,
    /// Not in the page cache; `first`: nothing was read inline before.
    Miss { first: bool },
    /// The file refuses `RWF_NOWAIT`: never try it again.
    Unsupported,
    /// Not for the inline path (too large, say): go to the ring.
    Ring,
}

/// One piece of an op is over: what [`Op::advance`] gets.
pub(crate) struct Piece<'f> {
    /// The kernel's (or the pool's) result, explained against the file.
    pub(crate) res: io::Result<usize>,
    /// The thread that submitted it exited while it was in the kernel (see
    /// `Record::tainted` in `ring/table.rs`).
    pub(crate) tainted: bool,
    /// It ran on a ring (not on the blocking pool).
    pub(crate) on_ring: bool,
    /// The file it went to.
    pub(crate) file: Option<&'f FileEntry>,
}

/// One kind of op, driven by [`Core`].
pub(crate) trait Op {
    /// What its blocking-pool twin returns.
    type Blocking: Send + 'static;
    /// Whether it works on a registered file (all but `open`).
    const ON_FILE: bool = true;
    /// Whether it may be served inline from the page cache (reads).
    const INLINE: bool = false;
    /// The histogram its latency counts in (`latency.rs`).
    const KIND: OpKind = OpKind::Other;
    /// Whether a blocking-pool piece may be left to finish on its own once
    /// `shutdown()` gives up on it: its task owns everything it touches
    /// and nothing must come back to the caller (not an owned buffer).
    const BLOCKING_DETACHABLE: bool;
    /// What the op is called in errors ("read", "write", "fsync", ...).
    fn name(&self) -> &'static str;
    /// Whether io-wq runs it one at a time with every other such op on a
    /// file whose inode hashes alike (io_uring's `hash_reg_file`: writes
    /// and `fallocate` on regular files, 64 buckets per ring). Such an op on
    /// a file whose storage may never answer goes to the blocking pool even
    /// when the file is on the rings (`FileRoute::RingAsync`): hung in
    /// io-wq, it would hold up the writes of unrelated files that io-wq
    /// hashed to its bucket.
    fn iowq_serialized(&self) -> bool {
        false
    }
    /// The access to its file the op needs.
    fn access(&self) -> Access {
        Access::Any
    }
    /// Checked on the first poll, with the file found: an error, or a
    /// result that needs no syscall at all (`Some`: nothing to read or write).
    fn check(&mut self, fid: FileId, file: Option<&FileEntry>) -> io::Result<Option<usize>>;
    /// The current piece's data transfer, `(offset, length, address of the
    /// caller's memory the kernel sees)`, to word an `EINVAL` on an
    /// `O_DIRECT` file; `None` for an op that moves no data.
    fn transfer(&self) -> Option<(u64, usize, Option<usize>)> {
        None
    }
    /// The whole transfer asked for, `(offset, length)`, for the op's span;
    /// `None` for an op that moves no data.
    #[cfg(feature = "tracing")]
    fn request(&self) -> Option<(u64, usize)> {
        None
    }
    /// One inline step (`preadv2(RWF_NOWAIT)` of the next piece on `fd`),
    /// for ops with [`INLINE`](Op::INLINE).
    fn inline(&mut self, _fd: RawFd) -> Inline {
        Inline::Ring
    }
    /// Caps the next piece at `max` bytes (`usize::MAX`: no cap), before
    /// [`sqe`](Op::sqe) or [`blocking_job`](Op::blocking_job) sizes it:
    /// the scheduler's limit on background pieces while latency ops are
    /// active (see `permit`). Ops that move data in pieces honour it.
    fn limit_piece(&mut self, _max: usize) {}
    /// The next piece, for a ring.
    fn sqe(&mut self) -> RingOp<'_>;
    /// Whether ring pieces go through a bounce buffer, whose bytes are
    /// then handed to [`copy_out`](Op::copy_out).
    fn bounced(&self) -> bool {
        false
    }
    /// Puts the bytes a bounce buffer received where they belong.
    fn copy_out(&mut self, _src: &[u8]) {}
    /// Whether the next blocking-pool piece of a latency op may be built
    /// before it has a slot and wait for one in the slots' queue, to be
    /// started by the thread whose release grants it (see
    /// `blocking::hand_off`): a read whose job holds at most a small bounce
    /// buffer while it waits.
    fn queues_job(&self) -> bool {
        false
    }
    /// The next piece, as a job of the blocking pool.
    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Option<Arc<FileEntry>>,
    ) -> io::Result<PoolJob<Self::Blocking>>;
    /// What a blocking piece returned, as a ring result.
    fn finish_blocking(&mut self, out: Self::Blocking) -> io::Result<usize>;
    /// What a ring's completion of a piece means, before it is explained.
    fn ring_result(&mut self, res: io::Result<usize>) -> io::Result<usize> {
        res
    }
    /// A piece is over: the op's result (`Some`), or `None` to issue the
    /// next piece.
    fn advance(&mut self, piece: Piece<'_>) -> Option<io::Result<usize>>;
    /// The op's result when it cannot go on with `e` (the context shut
    /// down, its ring closed) before its next piece reached the kernel.
    fn stopped(&mut self, e: io::Error) -> io::Result<usize> {
        Err(e)
    }
    /// The op's final result, from what `advance`, `stopped` or the core
    /// returned.
    fn finish(&mut self, res: io::Result<usize>) -> io::Result<usize> {
        res
    }
    /// What must stay alive with an op abandoned in the kernel.
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
    /// The bytes of its file the op may change, `(offset, len)` (writes,
    /// `fallocate`): block caches drop them when it ends (`cache/`).
    #[cfg(feature = "cache")]
    fn changes(&self) -> Option<(u64, u64)> {
        None
    }
}

enum State<'a, J> {
    Start,
    /// Waiting for an in-flight slot of a ring (`Some`) or of the blocking pool.
    Acquire {
        ring: Option<RingRef<'a>>,
        file: Option<Arc<FileEntry>>,
        permit: permit::Wait,
    },
    InFlight {
        ring: RingRef<'a>,
        key: usize,
    },
    /// On the blocking pool, or its job queued for a slot (`Some` wait,
    /// which takes it out of the queue if dropped first); a detachable op
    /// also watches for `shutdown()` giving up on it.
    Blocking(PoolHandle<J>, GiveUpWatch, Option<permit::Wait>),
    Done,
}

/// Where an op may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Inline first when the op, the context and the file allow; else the
    /// file's route.
    Any,
    /// Straight to a ring (a scan's read-ahead, see `scan/`).
    Ring,
    /// To the blocking pool even on a ring: an open, and a scan's
    /// read-ahead of a cached file for a consumer whose thread would copy
    /// the ring's reads itself (see `scan/`).
    Pool,
    /// The inline path served the whole op.
    Served,
}

/// Why a later piece of an op could not be issued (see [`Op::stopped`]).
struct Stop(io::Error);

/// The state machine every op runs on.
pub(crate) struct Core<'a, O: Op> {
    ctx: Ctx<'a>,
    fid: FileId,
    /// The file this op is bound to, once it has had to keep it beyond one
    /// poll (a `Pending` before submission, or an op in pieces): the entry
    /// registered under `fid` when the op was first polled, never a file
    /// registered later under the same id.
    bound: Option<Arc<FileEntry>>,
    checked: bool,
    route: Route,
    state: State<'a, O::Blocking>,
    /// When it was first polled (`latency::now`), if the context keeps
    /// latency histograms; 0 before.
    started: u64,
    /// Its span (feature `tracing`), made at its first poll and entered
    /// during every poll; boxed, and only when a subscriber wants it, so
    /// that an op without one grows by a word.
    #[cfg(feature = "tracing")]
    span: Option<Box<tracing::Span>>,
    pub(crate) op: O,
}

impl<'a, O: Op> Core<'a, O> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, op: O) -> Self {
        Core {
            ctx,
            fid,
            bound: None,
            checked: false,
            route: Route::Any,
            state: State::Start,
            started: 0,
            #[cfg(feature = "tracing")]
            span: None,
            op,
        }
    }

    /// Makes this op skip the inline path (see `Route::Ring`).
    pub(crate) fn ring_only(mut self) -> Self {
        self.route = Route::Ring;
        self
    }

    /// Makes this op go to the blocking pool (see `Route::Pool`).
    pub(crate) fn via_blocking_pool(mut self) -> Self {
        self.route = Route::Pool;
        self
    }

    /// Whether the inline path served the whole op.
    pub(crate) fn served_inline(&self) -> bool {
        self.route == Route::Served
    }

    pub(crate) fn ctx(&self) -> &Inner {
        &self.ctx
    }

    /// The file the op went to (once it started).
    pub(crate) fn file(&self) -> Option<&FileEntry> {
        self.bound.as_deref()
    }

    /// Binds an op that has not started to the file registered under its
    /// id now, as its first poll does, without starting it: for a batch
    /// that yields before its first read (`batch::Core::turn_over`). `Err`
    /// if no file is registered under the id: the op is left as it was, to
    /// be polled at once (its lookup then fails the same way).
    pub(crate) fn bind(&mut self) -> io::Result<()> {
        if O::ON_FILE && matches!(self.state, State::Start) && self.bound.is_none() {
            self.bound = Some(self.ctx.files.get(self.fid)?);
        }
        Ok(())
    }

    pub(crate) fn poll_op(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        #[cfg(feature = "tracing")]
        let span = self.span();
        #[cfg(feature = "tracing")]
        let _entered = span.enter();
        if self.started == 0 && self.ctx.latencies.is_some() {
            self.started = crate::latency::now();
        }
        // Every poll spends tokio's cooperative budget, so a task whose ops
        // complete at once (page-cache hits) still yields to its neighbours.
        let Poll::Ready(coop) = tokio::task::coop::poll_proceed(cx) else {
            // Out of budget before the first look at the file table: bind
            // the op to its file now, so that what it does does not depend
            // on when the runtime lets it run. No such file now: fail now;
            // waiting for budget would let a file registered meanwhile
            // under the same index be used instead.
            if let Err(e) = self.bind() {
                self.state = State::Done;
                return Poll::Ready(Err(e));
            }
            return Poll::Pending;
        };
        let res = match ready!(self.poll_pieces(cx)) {
            Ok(res) => res,
            Err(Stop(e)) => self.op.stopped(e),
        };
        #[cfg(feature = "cache")]
        self.changed();
        coop.made_progress();
        self.state = State::Done;
        let res = self.op.finish(res);
        self.finished(&res);
        Poll::Ready(res)
    }

    /// Counts the op's latency (if the context keeps histograms) and
    /// records its result in its span.
    fn finished(&self, res: &io::Result<usize>) {
        if let (t0 @ 1.., Some(rec)) = (self.started, &self.ctx.latencies) {
            let took = crate::latency::now().saturating_sub(t0);
            rec.record(thread_slot(), self.ctx.priority(), O::KIND, took);
        }
        #[cfg(feature = "tracing")]
        if let Some(span) = self.span.as_deref() {
            match res {
                Ok(n) => span.record("bytes", n),
                Err(e) => span.record("error", tracing::field::display(e)),
            };
            span.record("inline", self.served_inline());
        }
        #[cfg(not(feature = "tracing"))]
        let _ = res;
    }

    /// The op's span, made at its first poll: a `TRACE` span named `op`
    /// with the op's name, file, offset and length (ops that move data),
    /// priority, and at the end the bytes moved or the error and whether
    /// the page cache served it inline.
    #[cfg(feature = "tracing")]
    fn span(&mut self) -> tracing::Span {
        if let Some(span) = &self.span {
            return (**span).clone();
        }
        if self.checked {
            // Past its first poll with no span: it has none (a batch polls
            // its pending members often; asking again each time is not free).
            return tracing::Span::none();
        }

        let transfer = self.op.request();
        let span = tracing::trace_span!(
            "op",
            op = self.op.name(),
            fid = O::ON_FILE.then_some(self.fid.index()),
            offset = transfer.map(|t| t.0),
            len = transfer.map(|t| t.1),
            priority = ?self.ctx.priority(),
            bytes = tracing::field::Empty,
            error = tracing::field::Empty,
            inline = tracing::field::Empty,
        );
        if !span.is_disabled() {
            self.span = Some(Box::new(span.clone()));
        }
        span
    }

    /// Runs the op piece by piece: its result (`Ok`), or why a piece could
    /// not be issued (`Err`, for [`Op::stopped`]).
    fn poll_pieces(&mut self, cx: &mut Context<'_>) -> Poll<Result<io::Result<usize>, Stop>> {
        loop {
            match &mut self.state {
                State::Start => {
                    if let Some(res) = ready!(self.start_piece(cx)) {
                        return Poll::Ready(res);
                    }
                }
                State::Acquire { ring, file, permit } => {
                    let acquired = ready!(permit.poll_wait(cx));
                    let (ring, file) = (ring.take(), file.take());
                    let Ok(permit) = acquired else {
                        return Poll::Ready(Err(Stop(closed_error(ring.as_ref()))));
                    };
                    self.start(ring, file, permit).map_err(Stop)?;
                }
                State::InFlight { ring, key } => {
                    let key = *key;
                    let op = &mut self.op;
                    let bounced = op.bounced();
                    let mut copy = |src: &[u8]| op.copy_out(src);
                    let copy_to: Option<crate::ring::CopyTo<'_>> =
                        if bounced { Some(&mut copy) } else { None };
                    let done = ready!(ring.poll_complete(key, cx, copy_to));
                    self.state = State::Start;
                    let res = self.op.ring_result(done.res).map_err(|e| self.explain(e));
                    let piece = Piece {
                        res,
                        tainted: done.tainted,
                        on_ring: true,
                        file: self.bound.as_deref(),
                    };
                    if let Some(res) = self.op.advance(piece) {
                        return Poll::Ready(Ok(res));
                    }
                }
                State::Blocking(handle, gave_up, _queued) => {
                    let Poll::Ready(out) = Pin::new(handle).poll(cx) else {
                        if gave_up.gave_up(&self.ctx.blocking, cx) {
                            // The task keeps its own buffer (and its slot)
                            // until its syscall returns.
                            return Poll::Ready(Ok(Err(error::gave_up())));
                        }
                        return Poll::Pending;
                    };
                    self.state = State::Start;
                    let res = match out {
                        Ok(out) => self.op.finish_blocking(out),
                        // Dropped while it waited for a slot: the pool closed.
                        Err(Lost::NotRun) if self.ctx.blocking.is_closed() => {
                            return Poll::Ready(Err(Stop(shut_down_error())));
                        }
                        // Dropped unrun: the runtime of the blocking pool shut down.
                        Err(Lost::NotRun) => Err(error::runtime_gone_error()),
                        Err(Lost::Panicked) => Err(error::blocking_task_failed()),
                    };
                    let res = res.map_err(|e| self.explain(e));
                    let piece = Piece {
                        res,
                        tainted: false,
                        on_ring: false,
                        file: self.bound.as_deref(),
                    };
                    if let Some(res) = self.op.advance(piece) {
                        return Poll::Ready(Ok(res));
                    }
                }
                State::Done => panic!("op future polled after completion"),
            }
        }
    }

    /// The `Start` state: checks, then the inline path or a slot for the
    /// next piece. `Ready(None)`: the piece started (or waits for a slot).
    #[inline]
    fn start_piece(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<io::Result<usize>, Stop>>> {
        let ctx: &Inner = &self.ctx;
        if ctx.closed.load(Ordering::Acquire) {
            return Poll::Ready(Some(Err(Stop(shut_down_error()))));
        }
        let slot = thread_slot();
        // Borrowed from this thread's shard: no reference count is touched
        // unless the op has to outlive this poll. An op that already
        // returned `Pending` (or did a piece) is bound to the file it first
        // found.
        let mut files = None;
        let file = match &self.bound {
            Some(file) => Some(file),
            None if O::ON_FILE => match files.insert(ctx.files.shard(slot)).lookup(self.fid) {
                Ok(file) => Some(file),
                Err(e) => return Poll::Ready(Some(Ok(Err(e)))),
            },
            None => None,
        };
        if !self.checked {
            self.checked = true;
            match self.op.check(self.fid, file.map(|f| &**f)) {
                Ok(None) => {}
                Ok(Some(done)) => return Poll::Ready(Some(Ok(Ok(done)))),
                Err(e) => return Poll::Ready(Some(Ok(Err(e)))),
            }
        }
        let ring = if self.route != Route::Pool
            && file.is_none_or(|f| f.on_ring() && !(f.may_hang() && self.op.iowq_serialized()))
        {
            self.ctx.ring(slot)
        } else {
            None
        };
        if let (Some(ring), Some(file)) = (&ring, file) {
            if O::INLINE
                && self.route == Route::Any
                && ctx.inline_nowait
                && file.nowait_ok()
                && ring.inline.worth_trying()
            {
                // A batch's reads do not yield one by one (that would split
                // the batch's submission over polls): the batch checks once,
                // before its first read (`batch::Core::turn_over`).
                let yields = !ring.batching_here();
                if yields && inline::turn_over(ctx.inline_stretch) {
                    // Let other tasks (and the timer) run first.
                    if self.bound.is_none() {
                        self.bound = Some(file.clone());
                    }
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let fd = file.file.as_raw_fd();
                // A cached range can be served in several goes (a partial
                // hit, then the rest); an op that straddles the end of file
                // learns it here too, with no ring round trip.
                loop {
                    match self.op.inline(fd) {
                        Inline::Served(n) => {
                            ring.inline.hit();
                            self.route = Route::Served;
                            return Poll::Ready(Some(Ok(Ok(n))));
                        }
                        Inline::Piece => {
                            if yields && inline::turn_over(ctx.inline_stretch) {
                                // A whole piece, more to come: let the rest
                                // of the runtime run.
                                if self.bound.is_none() {
                                    self.bound = Some(file.clone());
                                }
                                cx.waker().wake_by_ref();
                                return Poll::Pending;
                            }
                        }
                        Inline::Partial => {}
                        Inline::Miss { first } => {
                            if first {
                                ring.inline.miss();
                            }
                            break;
                        }
                        Inline::Unsupported => {
                            file.nowait_ok.store(false, Ordering::Relaxed);
                            break;
                        }
                        Inline::Ring => break,
                    }
                }
            }
        }
        let file = file.cloned();
        drop(files);
        match self.acquire(ring, file) {
            Ok(()) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(Stop(e)))),
        }
    }

    /// Says what the kernel's bare errno meant for this op (the errno stays
    /// the error's source: [`crate::os_error`]): an op of a file
    /// unregistered before its SQE reached the kernel, a file not open for
    /// the access the op needs, an unaligned `O_DIRECT` transfer.
    fn explain(&self, e: io::Error) -> io::Error {
        if !O::ON_FILE {
            return e;
        }
        let errno = e.raw_os_error();
        if errno != Some(libc::EBADF) && errno != Some(libc::EINVAL) {
            return e;
        }
        // The file this op went to (every piece is bound to it), and
        // whether its id still names it.
        let now = self.ctx.files.get(self.fid).ok();
        let file = self.bound.clone().or_else(|| now.clone());
        let registered = match (&file, &now) {
            (Some(f), Some(n)) => Arc::ptr_eq(f, n),
            _ => false,
        };
        let name = self.op.name();
        match (errno, file) {
            (Some(libc::EBADF), _) if !registered => {
                error::unregistered_while_queued(self.fid, name)
            }
            (Some(libc::EBADF), Some(f)) => {
                let missing = match self.op.access() {
                    Access::Read if !f.readable() => "reading",
                    Access::Write if !f.writable() => "writing",
                    _ => return e,
                };
                error::explained(
                    io::ErrorKind::PermissionDenied,
                    e,
                    format!("{name} of {}: the file is not open for {missing}", self.fid),
                )
            }
            (Some(libc::EINVAL), Some(f)) if f.direct => match self.op.transfer() {
                Some(transfer) => error::direct_einval(e, self.fid, name, transfer, f.dio_align),
                None => e,
            },
            _ => e,
        }
    }

    /// Takes an in-flight slot of ring `ring` (or of the blocking pool),
    /// with the file's share of those slots, and starts the next piece, or
    /// waits for them. The one place an op takes a slot.
    fn acquire(
        &mut self,
        ring: Option<RingRef<'a>>,
        file: Option<Arc<FileEntry>>,
    ) -> io::Result<()> {
        let priority = self.ctx.priority();
        if ring.is_none() && priority == Priority::Latency && self.op.queues_job() {
            return self.queue_job(file);
        }
        let slots = match &ring {
            Some(r) => &r.permits,
            None => &self.ctx.blocking.permits,
        };
        match slots.acquire(priority, file.as_deref().map(FileEntry::key)) {
            Acquired::Now(permit) => self.start(ring, file, permit),
            Acquired::Wait(permit) => {
                self.state = State::Acquire { ring, file, permit };
                Ok(())
            }
            Acquired::Closed => Err(closed_error(ring.as_ref())),
        }
    }

    /// A latency op's next piece on the blocking pool, built before it has
    /// a slot: started at once if one is free, else queued with the slots,
    /// for the thread whose release grants it one to start.
    fn queue_job(&mut self, file: Option<Arc<FileEntry>>) -> io::Result<()> {
        if self.bound.is_none() {
            // Every later piece goes to the same file.
            self.bound.clone_from(&file);
        }
        let key = file.as_deref().map(FileEntry::key);
        // A latency op's pieces are never capped.
        self.op.limit_piece(usize::MAX);
        let PoolJob { job, handle } = self.pool_job(file)?;
        let pool = &self.ctx.blocking;
        let gave_up = pool.watch_give_up(O::BLOCKING_DETACHABLE);
        let bytes = self.piece_bytes();
        let queued = match pool.permits.acquire_job(key, bytes, job) {
            JobAcquired::Now(job, permit) => {
                pool.spawn(job, permit);
                None
            }
            JobAcquired::Queued(wait) => Some(wait),
            JobAcquired::Closed(job) => {
                drop(job);
                return Err(shut_down_error());
            }
        };
        self.state = State::Blocking(handle, gave_up, queued);
        Ok(())
    }

    /// Hands the next piece to ring `ring`, or to the blocking pool (`None`).
    fn start(
        &mut self,
        ring: Option<RingRef<'a>>,
        file: Option<Arc<FileEntry>>,
        permit: Permit,
    ) -> io::Result<()> {
        if self.bound.is_none() {
            // Every later piece goes to the same file.
            self.bound.clone_from(&file);
        }
        let priority = self.ctx.priority();
        self.op.limit_piece(permit.piece_limit());
        let Some(ring) = ring else {
            let PoolJob { job, handle } = self.pool_job(file)?;
            let pool = &self.ctx.blocking;
            let gave_up = pool.watch_give_up(O::BLOCKING_DETACHABLE);
            pool.spawn(job, permit);
            self.state = State::Blocking(handle, gave_up, None);
            pool.permits.count_bytes(priority, self.piece_bytes());
            return Ok(());
        };
        let key = ring.submit(file, permit, self.op.sqe())?;
        ring.permits.count_bytes(priority, self.piece_bytes());
        self.state = State::InFlight { ring, key };
        Ok(())
    }

    /// The op's next piece as a job of the blocking pool. A job that may
    /// change the file tells the context's block caches again when it is
    /// over (or dropped unrun): its future may be gone by then, and a
    /// cache read in between would have kept the old bytes. (A job whose
    /// future is still there tells them twice: the range is dropped again.)
    fn pool_job(&mut self, file: Option<Arc<FileEntry>>) -> io::Result<PoolJob<O::Blocking>> {
        #[cfg(feature = "cache")]
        let late = self.late_change();
        #[cfg_attr(not(feature = "cache"), allow(unused_mut))]
        let mut job = self.op.blocking_job(&self.ctx.blocking, file)?;
        #[cfg(feature = "cache")]
        if let Some(late) = late {
            let run = job.job;
            job.job = Box::new(move |permit| {
                run(permit);
                drop(late);
            });
        }
        Ok(job)
    }

    /// The bytes of the piece just started (0 for an op that moves none).
    fn piece_bytes(&self) -> u64 {
        self.op.transfer().map_or(0, |(_, len, _)| len as u64)
    }
}

/// The error of a closed ring or blocking pool (ops waiting for a slot
/// learn of it when the slots close).
fn closed_error(ring: Option<&RingRef<'_>>) -> io::Error {
    ring.map_or_else(shut_down_error, |r| r.closed_error())
}

impl<O: Op> Core<'_, O> {
    /// Tells the context's block caches which bytes this op may have
    /// changed: before its future resolves (whatever the result), and when
    /// it is dropped unfinished.
    #[cfg(feature = "cache")]
    fn changed(&self) {
        if let (Some(file), Some((offset, len))) = (&self.bound, self.op.changes()) {
            self.ctx.invalidation.changed(file, offset, len);
        }
    }

    /// The same notice, given when the returned value is dropped: kept with
    /// a piece that may outlive this future (`None` if the op changes
    /// nothing, or no cache listens).
    #[cfg(feature = "cache")]
    fn late_change(&self) -> Option<crate::changes::LateChange> {
        let (file, (offset, len)) = (self.bound.as_ref()?, self.op.changes()?);
        self.ctx.invalidation.later(file, offset, len)
    }
}

impl<O: Op> Drop for Core<'_, O> {
    fn drop(&mut self) {
        #[cfg(feature = "cache")]
        if !matches!(self.state, State::Done) {
            self.changed();
        }
        if let State::InFlight { ring, key } = &self.state {
            #[cfg_attr(not(feature = "cache"), allow(unused_mut))]
            let mut park = self.op.park();
            // A write the kernel still owns may land after this: the caches
            // hear of it again when its completion releases what is parked.
            #[cfg(feature = "cache")]
            if let Some(late) = self.late_change() {
                park = Some(Box::new((park, late)));
            }
            ring.abandon(*key, park);
        }
    }
}

impl<O: Op> fmt::Debug for Core<'_, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Start => "Start".to_owned(),
            State::Acquire { ring, .. } => {
                format!("Acquire {{ ring: {:?} }}", ring.as_ref().map(|r| r.index))
            }
            State::InFlight { ring, key } => {
                format!("InFlight {{ ring: {}, key: {key} }}", ring.index)
            }
            State::Blocking(..) => "Blocking".to_owned(),
            State::Done => "Done".to_owned(),
        };
        let mut d = f.debug_struct(self.op.name());
        if O::ON_FILE {
            d.field("fid", &self.fid);
        }
        if let Some((offset, len, _)) = self.op.transfer() {
            d.field("offset", &offset).field("len", &len);
        }
        d.field("state", &format_args!("{state}")).finish()
    }
}
