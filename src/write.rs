//! Everything but reads: positioned writes (borrowed and owned), `fsync`,
//! `fdatasync`, `sync_file_range`, `fallocate`, `statx` and `open`, on one
//! state machine ([`OpCore`]) that each op plugs a [`Job`] into.
//!
//! ```text
//! Start ──fid/offset checks──► Acquire (in-flight permit) ──► InFlight{ring, key} ──CQE──► job.advance ──► Ready
//!   │                                 │ fallback or FUSE file           ▲                     │ next piece
//!   │                                 ▼                                 │                     ▼
//!   │                               Blocking (pool thread) ─────────────┘                   Start
//! ```
//!
//! It reuses the read path's machinery as it is: the rings' op table,
//! in-flight permits, backlog, driver, completion (`Ring::poll_complete`)
//! and cancellation (`Ring::abandon`: dropping the future while the op is in
//! the kernel parks what the kernel may still touch in the op and sends an
//! `IORING_OP_ASYNC_CANCEL`), and on the fallback backend the blocking pool
//! with its permits and shutdown accounting (`Fallback::run`). There is no
//! page-cache fast path: a buffered write through the ring is copied into
//! the page cache inside the submitting `io_uring_enter` anyway.

use std::any::Any;
use std::ffi::CString;
use std::fmt;
use std::future::Future;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use tokio::task::JoinHandle;

use crate::buf::IoBuf;
use crate::context::UringContext;
use crate::error::{self, shut_down_error};
use crate::fallback::{Fallback, GiveUpWatch};
use crate::files::{Facts, FileEntry};
use crate::permit::{self, Acquired, Permit};
use crate::read::BORROWED_CHUNK;

use crate::id::FileId;
use crate::ring::{RingOp, MAX_READ};
use crate::shared::{Ctx, Inner, RingRef};
use crate::sys;
use crate::thread::thread_slot;

/// One kind of op, plugged into [`OpCore`].
pub(crate) trait Job {
    /// What its blocking-pool version returns.
    type Blocking: Send + 'static;
    /// What the op is called in errors ("write", "fsync", ...).
    fn name(&self) -> &'static str;
    /// Whether it works on a registered file (all but `open`).
    fn on_file(&self) -> bool {
        true
    }
    /// Whether it may run on a ring; `false` sends it to the blocking pool
    /// whatever its file's route.
    fn on_ring(&self) -> bool {
        true
    }
    /// The current piece's data transfer, `(offset, length, address of the
    /// caller's memory the kernel sees)`, to word an `EINVAL` on an
    /// `O_DIRECT` file; `None` for an op that moves no data.
    fn transfer(&self) -> Option<(u64, usize, Option<usize>)> {
        None
    }
    /// The op's result when it cannot go on with `e` (the context shut
    /// down, its ring closed) before its next piece reached the kernel.
    fn stopped(&mut self, e: io::Error) -> io::Result<usize> {
        Err(e)
    }
    /// Checked on the first poll, with the file found: an error, or a
    /// result that needs no syscall at all (`Some`, a write of nothing).
    fn check(&mut self, _fid: FileId, _file: Option<&FileEntry>) -> io::Result<Option<usize>> {
        Ok(None)
    }
    /// The next piece, for a ring.
    fn ring_op(&mut self) -> RingOp<'_>;
    /// The next piece, on the blocking pool.
    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Option<Arc<FileEntry>>,
        permit: Permit,
    ) -> io::Result<JoinHandle<Self::Blocking>>;
    /// What the blocking piece returned, as a ring result.
    fn finish_blocking(&mut self, out: Self::Blocking) -> io::Result<usize>;
    /// What must stay alive with an op abandoned in the kernel.
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
    /// Whether a blocking-pool piece may be left to finish on its own once
    /// `shutdown()` gives up on it: its task owns everything it touches
    /// and nothing must come back to the caller (not an owned buffer).
    const BLOCKING_DETACHABLE: bool = true;
    /// What a ring's completion of a piece means, before `advance`.
    fn ring_result(&mut self, res: io::Result<usize>) -> io::Result<usize> {
        res
    }
    /// A piece is over with `res` (`tainted`: see `Op::tainted`): the
    /// op's result (`Some`), or `None` to issue the next piece.
    fn advance(&mut self, res: io::Result<usize>, tainted: bool) -> Option<io::Result<usize>>;
}

enum State<'a, J> {
    Start,
    Acquire {
        ring: Option<RingRef<'a>>,
        permit: permit::Wait,
    },
    InFlight {
        ring: RingRef<'a>,
        key: usize,
    },
    /// On the blocking pool; a detachable job also watches for
    /// `shutdown()` giving up on it.
    Blocking(JoinHandle<J>, GiveUpWatch),
    Done,
}

/// The state machine every non-read op runs on.
pub(crate) struct OpCore<'a, J: Job> {
    ctx: Ctx<'a>,
    fid: FileId,
    /// The file, found on the first poll; every piece goes to it.
    file: Option<Arc<FileEntry>>,
    started: bool,
    state: State<'a, J::Blocking>,
    pub(crate) job: J,
}

impl<'a, J: Job> OpCore<'a, J> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, job: J) -> Self {
        OpCore {
            ctx,
            fid,
            file: None,
            started: false,
            state: State::Start,
            job,
        }
    }

    pub(crate) fn poll_op(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        // As reads: every poll spends tokio's cooperative budget.
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        let res = ready!(self.poll_inner(cx));
        coop.made_progress();
        self.state = State::Done;
        Poll::Ready(res)
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        match self.poll_pieces(cx) {
            // A later piece that could not be issued: what the earlier
            // ones did is the job's to report (a short write).
            Poll::Ready(Err(Stop(e))) => Poll::Ready(self.job.stopped(e)),
            Poll::Ready(Ok(res)) => Poll::Ready(res),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Runs the op piece by piece: its result (`Ok`), or why a piece could
    /// not be issued (`Err`, for [`Job::stopped`]).
    fn poll_pieces(&mut self, cx: &mut Context<'_>) -> Poll<Result<io::Result<usize>, Stop>> {
        loop {
            match &mut self.state {
                State::Start => {
                    if self.ctx.closed.load(Ordering::Acquire) {
                        return Poll::Ready(Err(Stop(shut_down_error())));
                    }
                    if !self.started {
                        self.started = true;
                        if self.job.on_file() {
                            match self.ctx.files.get(self.fid) {
                                Ok(file) => self.file = Some(file),
                                Err(e) => return Poll::Ready(Ok(Err(e))),
                            }
                        }
                        match self.job.check(self.fid, self.file.as_deref()) {
                            Ok(None) => {}
                            Ok(Some(done)) => return Poll::Ready(Ok(Ok(done))),
                            Err(e) => return Poll::Ready(Ok(Err(e))),
                        }
                    }
                    // FUSE files (and every file of the fallback backend)
                    // go to the blocking pool, as their reads do; so does
                    // an open, which may meet any file system on its path.
                    let ring =
                        if self.job.on_ring() && self.file.as_ref().is_none_or(|f| f.on_ring()) {
                            self.ctx.ring(thread_slot())
                        } else {
                            None
                        };
                    self.acquire(ring).map_err(Stop)?;
                }
                State::Acquire { ring, permit } => {
                    let acquired = ready!(permit.as_mut().poll(cx));
                    let ring = ring.take();
                    let Ok(permit) = acquired else {
                        return Poll::Ready(Err(Stop(closed_error(ring.as_ref()))));
                    };
                    self.start(ring, permit).map_err(Stop)?;
                }
                State::InFlight { ring, key } => {
                    let done = ready!(ring.poll_complete(*key, cx, None));
                    self.state = State::Start;
                    let res = self.job.ring_result(done.res).map_err(|e| self.explain(e));
                    if let Some(res) = self.job.advance(res, done.tainted) {
                        return Poll::Ready(Ok(res));
                    }
                }
                State::Blocking(handle, gave_up) => {
                    let Poll::Ready(out) = Pin::new(handle).poll(cx) else {
                        if gave_up.gave_up(&self.ctx.blocking, cx) {
                            // The task keeps its own buffer (and its slot)
                            // until its syscall returns.
                            self.state = State::Done;
                            return Poll::Ready(Ok(Err(error::gave_up())));
                        }
                        return Poll::Pending;
                    };
                    self.state = State::Start;
                    let res = match out {
                        Ok(out) => self.job.finish_blocking(out),
                        Err(join) if join.is_cancelled() => Err(error::runtime_gone_error()),
                        Err(join) => Err(error::blocking_task_failed(&join)),
                    };
                    let res = res.map_err(|e| self.explain(e));
                    if let Some(res) = self.job.advance(res, false) {
                        return Poll::Ready(Ok(res));
                    }
                }
                State::Done => panic!("future polled after completion"),
            }
        }
    }

    /// Says what the kernel's bare errno meant for this op (the errno stays
    /// the error's source: [`crate::os_error`]).
    fn explain(&self, e: io::Error) -> io::Error {
        let Some(file) = &self.file else { return e };
        match e.raw_os_error() {
            Some(libc::EBADF) if self.ctx.files.get(self.fid).is_err() => {
                error::unregistered_while_queued(self.fid, self.job.name())
            }
            Some(libc::EBADF) if self.job.transfer().is_some() && !file.writable() => {
                error::explained(
                    io::ErrorKind::PermissionDenied,
                    e,
                    format!(
                        "{} of {}: the file is not open for writing",
                        self.job.name(),
                        self.fid
                    ),
                )
            }
            Some(libc::EINVAL) if file.direct => match self.job.transfer() {
                Some(transfer) => {
                    error::direct_einval(e, self.fid, self.job.name(), transfer, file.dio_align)
                }
                None => e,
            },
            _ => e,
        }
    }

    /// Takes an in-flight slot of `ring` (or of the blocking pool) and
    /// starts the next piece, or waits for a slot. The one place a non-read
    /// op takes a permit.
    /// An op on a file also takes a unit of the file's share of the slots
    /// (`Builder::max_in_flight_per_file`), as reads do; an open takes only
    /// a slot.
    fn acquire(&mut self, ring: Option<RingRef<'a>>) -> io::Result<()> {
        let slots = match &ring {
            Some(r) => &r.permits,
            None => &self.ctx.blocking.permits,
        };
        match slots.acquire(self.file.as_deref().map(FileEntry::share)) {
            Acquired::Now(permit) => self.start(ring, permit),
            Acquired::Wait(permit) => {
                self.state = State::Acquire { ring, permit };
                Ok(())
            }
            Acquired::Closed => Err(closed_error(ring.as_ref())),
        }
    }

    fn start(&mut self, ring: Option<RingRef<'a>>, permit: Permit) -> io::Result<()> {
        let Some(ring) = ring else {
            let h = self
                .job
                .spawn_blocking(&self.ctx.blocking, self.file.clone(), permit)?;
            let gave_up = self.ctx.blocking.watch_give_up(J::BLOCKING_DETACHABLE);
            self.state = State::Blocking(h, gave_up);
            return Ok(());
        };
        let key = ring.submit_op(self.file.clone(), permit, &self.job.ring_op())?;
        self.state = State::InFlight { ring, key };
        Ok(())
    }
}

/// An offset or length as `off64_t` (callers check it fits).
fn off(v: u64) -> libc::off64_t {
    libc::off64_t::try_from(v).unwrap_or(libc::off64_t::MAX)
}

fn closed_error(ring: Option<&RingRef<'_>>) -> io::Error {
    ring.map_or_else(shut_down_error, |r| r.closed_error())
}

/// Why a later piece of an op could not be issued (see [`Job::stopped`]).
struct Stop(io::Error);

impl<J: Job> Drop for OpCore<'_, J> {
    fn drop(&mut self) {
        if let State::InFlight { ring, key } = &self.state {
            ring.abandon(*key, self.job.park());
        }
    }
}

impl<J: Job> fmt::Debug for OpCore<'_, J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Start => "Start".to_owned(),
            State::Acquire { .. } => "Acquire".to_owned(),
            State::InFlight { ring, key } => {
                format!("InFlight {{ ring: {}, key: {key} }}", ring.index)
            }
            State::Blocking(..) => "Blocking".to_owned(),
            State::Done => "Done".to_owned(),
        };
        f.debug_struct("Op")
            .field("fid", &self.fid)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------- writes

/// Where a write's bytes come from.
pub(crate) trait Source {
    /// Bytes to write.
    fn len(&self) -> usize;
    /// Largest piece handed to the kernel at once.
    fn max_piece(&self) -> usize;
    /// The ring op writing bytes `done..done + len` at `offset`.
    fn ring_op(&mut self, offset: u64, done: usize, len: usize) -> RingOp<'_>;
    /// The same on the blocking pool.
    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Arc<FileEntry>,
        permit: Permit,
        offset: u64,
        done: usize,
        len: usize,
    ) -> io::Result<JoinHandle<io::Result<usize>>>;
    /// A blocking piece is over: bring a lent buffer home.
    fn home(&mut self) {}
    /// See `Job::BLOCKING_DETACHABLE`.
    const BLOCKING_DETACHABLE: bool;
    fn park(&mut self) -> Option<Box<dyn Any + Send>>;
    /// The address the kernel reads the piece starting at `done` from, if
    /// it is the caller's memory (not a bounce buffer the crate aligned).
    fn addr(&self, _done: usize) -> Option<usize> {
        None
    }
}

/// A positioned write of a [`Source`] at `offset`.
pub(crate) struct Write<S> {
    pub(crate) src: S,
    offset: u64,
    done: usize,
    piece: usize,
    /// `write_all`: continue every short piece; a failure is an error.
    exact: bool,
}

impl<S: Source> Write<S> {
    pub(crate) fn new(src: S, offset: u64, exact: bool) -> Self {
        Write {
            src,
            offset,
            done: 0,
            piece: 0,
            exact,
        }
    }

    fn next_piece(&mut self) -> (u64, usize) {
        self.piece = (self.src.len() - self.done)
            .min(self.src.max_piece())
            .min(MAX_READ);
        (self.offset + self.done as u64, self.piece)
    }
}

impl<S: Source> Job for Write<S> {
    const BLOCKING_DETACHABLE: bool = S::BLOCKING_DETACHABLE;

    type Blocking = io::Result<usize>;

    fn name(&self) -> &'static str {
        "write"
    }

    fn check(&mut self, fid: FileId, file: Option<&FileEntry>) -> io::Result<Option<usize>> {
        let len = self.src.len();
        let max = i64::MAX.unsigned_abs();
        if self.offset > max || max - self.offset < len as u64 {
            return Err(error::write_beyond_max(fid, self.offset, len));
        }
        if file.is_some_and(|f| f.append) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "write to {fid}: its descriptor is opened with O_APPEND, so the kernel \
                     would put the bytes at the end of the file whatever the offset; register \
                     a descriptor opened without append (reads of it work as they are)"
                ),
            ));
        }
        Ok((len == 0).then_some(0))
    }

    fn transfer(&self) -> Option<(u64, usize, Option<usize>)> {
        Some((
            self.offset + self.done as u64,
            self.piece,
            self.src.addr(self.done),
        ))
    }

    /// A `write` that wrote some pieces reports them, as write(2) does when
    /// a later part fails; a `write_all` fails, saying how far it got.
    fn stopped(&mut self, e: io::Error) -> io::Result<usize> {
        match (self.done, self.exact) {
            (0, _) => Err(e),
            (done, false) => Ok(done),
            (done, true) => Err(io::Error::new(
                e.kind(),
                format!(
                    "{e} ({done} of {} bytes were written, from offset {})",
                    self.src.len(),
                    self.offset
                ),
            )),
        }
    }

    fn ring_op(&mut self) -> RingOp<'_> {
        let (offset, len) = self.next_piece();
        self.src.ring_op(offset, self.done, len)
    }

    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Option<Arc<FileEntry>>,
        permit: Permit,
    ) -> io::Result<JoinHandle<io::Result<usize>>> {
        let (offset, len) = self.next_piece();
        let file = file.ok_or_else(|| io::Error::other("write without a file (a bug)"))?;
        self.src
            .spawn_blocking(fb, file, permit, offset, self.done, len)
    }

    fn finish_blocking(&mut self, out: io::Result<usize>) -> io::Result<usize> {
        self.src.home();
        out
    }

    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        self.src.park()
    }

    /// `EAGAIN` from a ring write is a write that wrote nothing. When a
    /// regular file takes fewer bytes than asked, io_uring retries the rest
    /// itself; if a retry takes nothing, the request completes with the
    /// bytes written before it, or with `-EAGAIN` when there were none
    /// (`io_write`'s partial-write path, then io-wq giving up on `-EAGAIN`
    /// for a file it cannot poll). Seen with a FUSE server that answers a
    /// write with 0 bytes (`tests/storage.rs`,
    /// `fuse_writes_that_fail_lie_or_hang`); `pwrite` returns 0 there, so
    /// mapping it to 0 makes the two backends agree: `write` returns
    /// `Ok(0)`, `write_all` fails with `WriteZero`, and neither invites the
    /// caller to retry a write that cannot progress, as `WouldBlock` would.
    fn ring_result(&mut self, res: io::Result<usize>) -> io::Result<usize> {
        match res {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(0),
            res => res,
        }
    }

    fn advance(&mut self, res: io::Result<usize>, tainted: bool) -> Option<io::Result<usize>> {
        let n = match res {
            Ok(n) => n.min(self.piece),
            // An exact write retries what was interrupted, as `write_all`.
            Err(e) if self.exact && e.kind() == io::ErrorKind::Interrupted => return None,
            // Bytes already written are reported, as write(2) would (a
            // `write_all` fails, saying how many).
            Err(e) => return Some(self.stopped(e)),
        };
        if tainted && n < self.piece {
            return Some(Err(io::Error::other(format!(
                "the thread that submitted this write exited while it was in the kernel (the \
                 context's home runtime shut down), and io_uring cut it short ({n} of {} \
                 bytes at offset {}): what was written is unknown",
                self.piece,
                self.offset + self.done as u64
            ))));
        }
        self.done += n;
        if self.done >= self.src.len() {
            return Some(Ok(self.done));
        }
        if n == 0 {
            return Some(if self.exact {
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!(
                        "the kernel wrote 0 bytes at offset {} ({} of {} written)",
                        self.offset + self.done as u64,
                        self.done,
                        self.src.len()
                    ),
                ))
            } else {
                Ok(self.done)
            });
        }
        // A full piece is followed by the next; a short one ends a `write`
        // (reported short, as pwrite(2)) and is continued by `write_all`.
        if n == self.piece || self.exact {
            None
        } else {
            Some(Ok(self.done))
        }
    }
}

/// Borrowed bytes: each piece is copied into a bounce buffer the op owns
/// (at most [`BORROWED_CHUNK`]), so the borrow ends with the future.
pub(crate) struct BorrowedSrc<'b>(pub(crate) &'b [u8]);

impl Source for BorrowedSrc<'_> {
    const BLOCKING_DETACHABLE: bool = true;

    fn len(&self) -> usize {
        self.0.len()
    }
    fn max_piece(&self) -> usize {
        BORROWED_CHUNK
    }
    fn ring_op(&mut self, offset: u64, done: usize, len: usize) -> RingOp<'_> {
        RingOp::WriteCopy {
            offset,
            data: &self.0[done..done + len],
        }
    }
    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Arc<FileEntry>,
        permit: Permit,
        offset: u64,
        done: usize,
        len: usize,
    ) -> io::Result<JoinHandle<io::Result<usize>>> {
        // Page-aligned, so that O_DIRECT files work as on the ring.
        let mut copy = crate::buf::AlignedBuf::try_new(len, crate::buf::BOUNCE_ALIGN)?;
        copy.copy_from_slice(&self.0[done..done + len]);
        fb.run(permit, move || file.file.write_at(&copy, offset))
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
}

/// An owned buffer, written from its initialised bytes; on the fallback
/// backend lent to the blocking task through `lent`, so it comes back even
/// if that task is cancelled before it runs.
pub(crate) struct OwnedSrc<B> {
    buf: Option<B>,
    lent: Option<Arc<Mutex<Option<B>>>>,
    len: usize,
}

impl<B: IoBuf> OwnedSrc<B> {
    pub(crate) fn new(buf: B) -> Self {
        OwnedSrc {
            len: buf.data_len(),
            buf: Some(buf),
            lent: None,
        }
    }

    pub(crate) fn take(&mut self) -> B {
        self.home();
        self.buf
            .take()
            .expect("the owned buffer was lost by a panicking blocking write")
    }
}

impl<B: IoBuf> Source for OwnedSrc<B> {
    const BLOCKING_DETACHABLE: bool = false;

    fn len(&self) -> usize {
        self.len
    }
    fn max_piece(&self) -> usize {
        MAX_READ
    }
    fn ring_op(&mut self, offset: u64, done: usize, len: usize) -> RingOp<'_> {
        assert!(done + len <= self.len, "write piece out of bounds");
        let b = self.buf.as_ref().expect("owned buffer is at home");
        // SAFETY: done + len <= data_len(): in bounds of the buffer.
        let ptr = unsafe { b.data_ptr().add(done) };
        RingOp::WriteCaller { offset, ptr, len }
    }
    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Arc<FileEntry>,
        permit: Permit,
        offset: u64,
        done: usize,
        len: usize,
    ) -> io::Result<JoinHandle<io::Result<usize>>> {
        let lent = Arc::new(Mutex::new(self.buf.take()));
        self.lent = Some(lent.clone());
        fb.run(permit, move || {
            let guard = crate::util::lock(&lent);
            let buf = guard
                .as_ref()
                .expect("owned buffer lent to the blocking write");
            // SAFETY: IoBuf promises data_len() initialised bytes at
            // data_ptr while `buf` lives; the lock keeps it in place.
            let all = unsafe { std::slice::from_raw_parts(buf.data_ptr(), buf.data_len()) };
            let src = all.get(done..done + len).ok_or_else(|| {
                io::Error::other("owned write out of the buffer's bounds (a bug in the crate)")
            })?;
            file.file.write_at(src, offset)
        })
    }
    fn home(&mut self) {
        if let Some(lent) = self.lent.take() {
            self.buf = crate::util::lock(&lent).take();
        }
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        self.buf.take().map(|b| Box::new(b) as Box<dyn Any + Send>)
    }
    fn addr(&self, done: usize) -> Option<usize> {
        self.buf.as_ref().map(|b| b.data_ptr() as usize + done)
    }
}

// ----------------------------------------------------------------- syncs

/// An op with no memory: `fsync`, `fdatasync`, `sync_file_range`,
/// `fallocate`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sync {
    Fsync { datasync: bool },
    Range { offset: u64, len: u32, flags: u32 },
    Fallocate { mode: i32, offset: u64, len: u64 },
}

impl Job for Sync {
    type Blocking = io::Result<usize>;

    fn name(&self) -> &'static str {
        match self {
            Sync::Fsync { datasync: false } => "fsync",
            Sync::Fsync { datasync: true } => "fdatasync",
            Sync::Range { .. } => "sync_file_range",
            Sync::Fallocate { .. } => "fallocate",
        }
    }

    fn check(&mut self, fid: FileId, _file: Option<&FileEntry>) -> io::Result<Option<usize>> {
        let max = i64::MAX.unsigned_abs();
        match *self {
            Sync::Range { offset, len, .. } if offset > max || max - offset < u64::from(len) => {
                Err(error::write_beyond_max(fid, offset, len as usize))
            }
            Sync::Fallocate { offset, len, .. } if offset > max || max - offset < len => Err(
                error::write_beyond_max(fid, offset, usize::try_from(len).unwrap_or(usize::MAX)),
            ),
            _ => Ok(None),
        }
    }

    fn ring_op(&mut self) -> RingOp<'_> {
        match *self {
            Sync::Fsync { datasync } => RingOp::Fsync { datasync },
            Sync::Range { offset, len, flags } => RingOp::SyncRange { offset, len, flags },
            Sync::Fallocate { mode, offset, len } => RingOp::Fallocate { mode, offset, len },
        }
    }

    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Option<Arc<FileEntry>>,
        permit: Permit,
    ) -> io::Result<JoinHandle<io::Result<usize>>> {
        let file = file.ok_or_else(|| io::Error::other("sync without a file (a bug)"))?;
        let op = *self;
        fb.run(permit, move || {
            let file = &file.file;
            match op {
                Sync::Fsync { datasync } => sys::fsync(file, datasync),
                // Offsets and lengths were checked to stay within i64::MAX
                // (`check`): `off` never saturates.
                Sync::Range { offset, len, flags } => {
                    sys::sync_file_range(file, off(offset), libc::off64_t::from(len), flags)
                }
                Sync::Fallocate { mode, offset, len } => {
                    sys::fallocate(file, mode, off(offset), off(len))
                }
            }
            .map(|()| 0)
        })
    }

    fn finish_blocking(&mut self, out: io::Result<usize>) -> io::Result<usize> {
        out
    }

    fn advance(&mut self, res: io::Result<usize>, tainted: bool) -> Option<io::Result<usize>> {
        Some(match res {
            Err(e) if tainted => Err(io::Error::other(format!(
                "the thread that submitted this op exited while it was in the kernel \
                 (the context's home runtime shut down), and io_uring cancelled it ({e})"
            ))),
            res => res.map(|_| 0),
        })
    }
}

// ----------------------------------------------------------------- statx

/// What [`UringContext::statx`](crate::UringContext::statx) says about a
/// file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileStat {
    /// Size in bytes (of a block device too).
    pub size: u64,
    /// Storage allocated, in 512-byte units (`st_blocks`).
    pub blocks: u64,
    /// The preferred I/O size (`st_blksize`).
    pub block_size: u32,
    /// For `O_DIRECT`: the alignment a buffer's address needs, if the
    /// kernel (6.1+) and file system say (`STATX_DIOALIGN`); `Some(0)`
    /// means the file does not support `O_DIRECT`.
    pub dio_mem_align: Option<u32>,
    /// For `O_DIRECT`: the alignment offsets and lengths need, if known.
    pub dio_offset_align: Option<u32>,
}

const STATX_MASK: u32 = libc::STATX_BASIC_STATS | libc::STATX_DIOALIGN;

pub(crate) struct Statx {
    /// The kernel writes here (boxed: stable while the future moves;
    /// parked in the op if the future is dropped).
    buf: Option<Box<libc::statx>>,
}

impl Statx {
    pub(crate) fn new() -> Self {
        Statx {
            // SAFETY: statx is plain data; all zeroes is a valid value.
            buf: Some(Box::new(unsafe { std::mem::zeroed() })),
        }
    }

    fn stat(&self, file: Option<&FileEntry>) -> io::Result<FileStat> {
        let st = self
            .buf
            .as_deref()
            .ok_or_else(|| io::Error::other("statx buffer lost"))?;
        let mut size = st.stx_size;
        if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFBLK {
            if let Some(f) = file {
                size = crate::sys::file_size(&f.file, f.kind)?;
            }
        }
        let dio = st.stx_mask & libc::STATX_DIOALIGN != 0;
        Ok(FileStat {
            size,
            blocks: st.stx_blocks,
            block_size: st.stx_blksize,
            dio_mem_align: dio.then_some(st.stx_dio_mem_align),
            dio_offset_align: dio.then_some(st.stx_dio_offset_align),
        })
    }
}

impl Job for Statx {
    type Blocking = io::Result<Box<libc::statx>>;

    fn name(&self) -> &'static str {
        "statx"
    }

    fn ring_op(&mut self) -> RingOp<'_> {
        let buf = self.buf.as_deref_mut().expect("statx buffer at home");
        RingOp::Statx {
            buf: std::ptr::from_mut(buf),
            mask: STATX_MASK,
        }
    }

    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        file: Option<Arc<FileEntry>>,
        permit: Permit,
    ) -> io::Result<JoinHandle<Self::Blocking>> {
        let file = file.ok_or_else(|| io::Error::other("statx without a file (a bug)"))?;
        fb.run(permit, move || sys::statx(&file.file, STATX_MASK))
    }

    fn finish_blocking(&mut self, out: Self::Blocking) -> io::Result<usize> {
        self.buf = Some(out?);
        Ok(0)
    }

    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        self.buf.take().map(|b| b as Box<dyn Any + Send>)
    }

    fn advance(&mut self, res: io::Result<usize>, _tainted: bool) -> Option<io::Result<usize>> {
        Some(res)
    }
}

// ------------------------------------------------------------------ open

/// How [`UringContext::open`](crate::UringContext::open) opens a file:
/// like [`std::fs::OpenOptions`], plus `O_DIRECT`; without append mode,
/// which positioned writes cannot use (on Linux, `pwrite` on an
/// `O_APPEND` file appends whatever the offset).
///
/// ```
/// use uring_positioned_io::OpenOptions;
/// let wal = OpenOptions::new().read(true).write(true).create(true).clone();
/// let data = OpenOptions::new().read(true).write(true).direct(true).clone();
/// # let _ = (wal, data);
/// ```
#[derive(Debug, Clone)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent open flags, as std's"
)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    create: bool,
    create_new: bool,
    truncate: bool,
    direct: bool,
    mode: u32,
    custom_flags: i32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// Nothing set: set `read` and/or `write`.
    #[must_use]
    pub fn new() -> Self {
        OpenOptions {
            read: false,
            write: false,
            create: false,
            create_new: false,
            truncate: false,
            direct: false,
            mode: 0o666,
            custom_flags: 0,
        }
    }
    /// Open for reading.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Create the file if it does not exist (needs `write`).
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Create the file, failing if it exists (needs `write`).
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Truncate the file to length 0 (needs `write`).
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    /// `O_DIRECT`: bypass the page cache. Offsets, lengths and buffer
    /// addresses must then be aligned (see [`FileStat::dio_offset_align`]).
    pub fn direct(&mut self, on: bool) -> &mut Self {
        self.direct = on;
        self
    }
    /// Permission bits of a created file (before the umask); 0o666 unless set.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
    /// More `open(2)` flags (such as `O_NOATIME`, `O_DSYNC`); the access
    /// mode bits are ignored. Refused: `O_APPEND` (a positioned write
    /// would land at the end of the file), `O_PATH` (no I/O), `O_NONBLOCK`
    /// (the context never blocks a runtime worker anyway, and on a regular
    /// file it would turn io_uring reads into `EAGAIN`), and `O_CREAT`,
    /// `O_EXCL` or `O_TRUNC` without [`write`](Self::write), as
    /// [`create`](Self::create) and [`truncate`](Self::truncate).
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }

    /// The `open(2)` flags, or why these options are invalid. Always
    /// `O_CLOEXEC`, and `O_NONBLOCK` (so that opening a FIFO never blocks;
    /// cleared once the file is open).
    fn flags(&self) -> io::Result<i32> {
        let invalid = |why: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, why.to_owned()));
        let access = match (self.read, self.write) {
            (true, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
            (false, false) => return invalid("OpenOptions: set read and/or write"),
        };
        if (self.create || self.create_new || self.truncate) && !self.write {
            return invalid("OpenOptions: create, create_new and truncate need write");
        }
        let custom = self.custom_flags & !libc::O_ACCMODE;
        if custom & (libc::O_APPEND | libc::O_PATH) != 0 {
            return invalid(
                "OpenOptions: O_APPEND (pwrite on it appends whatever the offset) and O_PATH are refused",
            );
        }
        if custom & libc::O_NONBLOCK != 0 {
            return invalid(
                "OpenOptions: O_NONBLOCK is refused: the context never blocks a runtime worker, \
                 and on a regular file it turns io_uring reads into EAGAIN",
            );
        }
        if custom & (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) != 0 && !self.write {
            return invalid("OpenOptions: O_CREAT, O_EXCL and O_TRUNC in custom_flags need write");
        }
        let mut flags = access | custom | libc::O_CLOEXEC | libc::O_NONBLOCK;
        if self.create_new {
            flags |= libc::O_CREAT | libc::O_EXCL;
        } else if self.create {
            flags |= libc::O_CREAT;
        }
        if self.truncate {
            flags |= libc::O_TRUNC;
        }
        if self.direct {
            flags |= libc::O_DIRECT;
        }
        Ok(flags)
    }
}

pub(crate) struct Open {
    path: CString,
    flags: i32,
    mode: u32,
    /// The file and its facts, once opened.
    pub(crate) opened: Option<(std::fs::File, Facts)>,
}

impl Open {
    pub(crate) fn new(path: &Path, options: &OpenOptions) -> io::Result<Self> {
        let path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
        Ok(Open {
            path,
            flags: options.flags()?,
            mode: options.mode,
            opened: None,
        })
    }
}

/// `open(2)` of `path`, on a blocking-pool thread. `ENXIO` is what a
/// non-blocking open of a FIFO without a reader, of a socket or of a device
/// with no driver gives: said as the refusal of a file that is not a
/// regular file or a block device, naming what it is.
///
/// What registering the file needs to know of it (`Facts`: `fstat`,
/// `fstatfs`, `statx`, each of which may wait for the file system) is read
/// here too, off the runtime's workers.
fn open_blocking(path: &CString, flags: i32, mode: u32) -> io::Result<(std::fs::File, Facts)> {
    let e = match sys::open(path, flags, mode) {
        Ok(file) => {
            // Opened with O_NONBLOCK so that a FIFO could not block the open;
            // a regular file needs it cleared (io_uring would return EAGAIN).
            sys::clear_nonblock(&file)?;
            let name = format!(
                "{:?} (opened with UringContext::open)",
                path.to_string_lossy()
            );
            let facts = Facts::of(&file, &name)?;
            return Ok((file, facts));
        }
        Err(e) => e,
    };
    if e.raw_os_error() != Some(libc::ENXIO) {
        return Err(e);
    }
    let shown = std::path::Path::new(std::ffi::OsStr::from_bytes(path.as_bytes())).display();
    let what = match std::fs::metadata(std::ffi::OsStr::from_bytes(path.as_bytes())) {
        Ok(m) if m.file_type().is_fifo() => "a pipe or FIFO",
        Ok(m) if m.file_type().is_socket() => "a socket",
        Ok(m) if m.file_type().is_char_device() => "a character device",
        Ok(m) if m.file_type().is_block_device() => "a block device with no driver",
        _ => return Err(e),
    };
    Err(error::explained(
        io::ErrorKind::InvalidInput,
        e,
        format!(
            "open {shown}: it is {what}; only regular files and block devices support \
             positioned I/O"
        ),
    ))
}

impl Job for Open {
    type Blocking = io::Result<(std::fs::File, Facts)>;

    fn name(&self) -> &'static str {
        "open"
    }

    fn on_file(&self) -> bool {
        false
    }

    /// An open resolves a path, and any directory on it may be a FUSE or
    /// network mount whose server never answers; on a ring the kernel
    /// runs the open of a cached path inside `io_uring_enter`, on the
    /// runtime worker that submits it. On the blocking pool a hung server
    /// holds one pool thread and one of the pool's slots, and `shutdown()`
    /// can give up on it.
    fn on_ring(&self) -> bool {
        false
    }

    fn ring_op(&mut self) -> RingOp<'_> {
        unreachable!("an open runs on the blocking pool (Job::on_ring)")
    }

    fn spawn_blocking(
        &mut self,
        fb: &Fallback,
        _file: Option<Arc<FileEntry>>,
        permit: Permit,
    ) -> io::Result<JoinHandle<Self::Blocking>> {
        let path = self.path.clone();
        let (flags, mode) = (self.flags, self.mode);
        // The descriptor is owned as soon as it exists: a dropped future's
        // task closes it.
        fb.run(permit, move || open_blocking(&path, flags, mode))
    }

    fn finish_blocking(&mut self, out: Self::Blocking) -> io::Result<usize> {
        self.opened = Some(out?);
        Ok(0)
    }

    fn advance(&mut self, res: io::Result<usize>, _tainted: bool) -> Option<io::Result<usize>> {
        Some(res)
    }
}

/// Registers a file `open` opened (with the facts its pool task read).
pub(crate) fn register_opened(
    inner: &Inner,
    file: std::fs::File,
    facts: Facts,
) -> io::Result<FileId> {
    if inner.closed.load(Ordering::Acquire) {
        return Err(shut_down_error());
    }
    inner.files.insert(file, facts, inner.fixed())
}

// --------------------------------------------------------------- futures

macro_rules! debug_via_core {
    ($($t:ident $(<$b:ident>)?),*) => {$(
        impl<$($b: IoBuf)?> fmt::Debug for $t<'_ $(, $b)?> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.core.fmt(f)
            }
        }
    )*};
}

/// The future of [`UringContext::write`](crate::UringContext::write):
/// resolves to the number of bytes written. Dropping it is sound at any
/// point (the kernel reads a copy the context owns); see the crate's
/// [durability notes](crate::design) for what a dropped write means.
#[must_use = "futures do nothing unless polled"]
pub struct UringWriteFuture<'a> {
    pub(crate) core: OpCore<'a, Write<BorrowedSrc<'a>>>,
}

impl Future for UringWriteFuture<'_> {
    type Output = io::Result<usize>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().core.poll_op(cx)
    }
}

/// The future of [`UringContext::write_all`](crate::UringContext::write_all).
#[must_use = "futures do nothing unless polled"]
pub struct UringWriteAllFuture<'a> {
    pub(crate) core: OpCore<'a, Write<BorrowedSrc<'a>>>,
}

impl Future for UringWriteAllFuture<'_> {
    type Output = io::Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().core.poll_op(cx).map_ok(drop)
    }
}

/// The future of [`UringContext::write_owned`](crate::UringContext::write_owned):
/// the buffer comes back with the number of bytes written. Dropped while
/// the write is in the kernel, the buffer is kept by the context until the
/// kernel is done with it.
#[must_use = "futures do nothing unless polled"]
pub struct UringWriteOwnedFuture<'a, B: IoBuf> {
    pub(crate) core: OpCore<'a, Write<OwnedSrc<B>>>,
}

impl<B: IoBuf> Future for UringWriteOwnedFuture<'_, B> {
    type Output = (io::Result<usize>, B);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_op(cx));
        Poll::Ready((res, this.core.job.src.take()))
    }
}

/// The future of
/// [`UringContext::write_all_owned`](crate::UringContext::write_all_owned)
/// (borrowing the context) and
/// [`write_all_owned_static`](crate::UringContext::write_all_owned_static)
/// (`'static`).
#[must_use = "futures do nothing unless polled"]
pub struct UringWriteAllOwnedFuture<'a, B: IoBuf> {
    pub(crate) core: OpCore<'a, Write<OwnedSrc<B>>>,
}

impl<B: IoBuf> Future for UringWriteAllOwnedFuture<'_, B> {
    type Output = (io::Result<()>, B);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_op(cx));
        Poll::Ready((res.map(drop), this.core.job.src.take()))
    }
}

/// The future of [`fsync`](crate::UringContext::fsync),
/// [`fdatasync`](crate::UringContext::fdatasync),
/// [`sync_file_range`](crate::UringContext::sync_file_range) and
/// [`fallocate`](crate::UringContext::fallocate).
#[must_use = "futures do nothing unless polled"]
pub struct UringSyncFuture<'a> {
    pub(crate) core: OpCore<'a, Sync>,
}

impl Future for UringSyncFuture<'_> {
    type Output = io::Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().core.poll_op(cx).map_ok(drop)
    }
}

/// The future of [`UringContext::statx`](crate::UringContext::statx).
#[must_use = "futures do nothing unless polled"]
pub struct UringStatxFuture<'a> {
    pub(crate) core: OpCore<'a, Statx>,
}

impl Future for UringStatxFuture<'_> {
    type Output = io::Result<FileStat>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        ready!(this.core.poll_op(cx))?;
        Poll::Ready(this.core.job.stat(this.core.file.as_deref()))
    }
}

/// The future of [`UringContext::open`](crate::UringContext::open):
/// resolves to the checked id of the newly registered file. Dropped before
/// it resolves, the file may or may not have been opened (and created);
/// if it was, it is closed again and never registered.
#[must_use = "futures do nothing unless polled"]
pub struct UringOpenFuture<'a> {
    pub(crate) core: Result<OpCore<'a, Open>, Option<io::Error>>,
}

impl Future for UringOpenFuture<'_> {
    type Output = io::Result<FileId>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let core = match &mut self.get_mut().core {
            Ok(core) => core,
            Err(e) => {
                let e = e.take().expect("future polled after completion");
                return Poll::Ready(Err(e));
            }
        };
        ready!(core.poll_op(cx))?;
        let (file, facts) = core
            .job
            .opened
            .take()
            .ok_or_else(|| io::Error::other("open returned no descriptor (a bug)"))?;
        Poll::Ready(register_opened(&core.ctx, file, facts))
    }
}

impl fmt::Debug for UringOpenFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.core {
            Ok(core) => core.fmt(f),
            Err(_) => f.write_str("Open(invalid)"),
        }
    }
}

debug_via_core!(
    UringWriteFuture,
    UringWriteAllFuture,
    UringWriteOwnedFuture<B>,
    UringWriteAllOwnedFuture<B>,
    UringSyncFuture,
    UringStatxFuture
);

// As the read futures: `Send` and `Unpin`.
const _: fn() = || {
    fn send_unpin<T: Send + Unpin>() {}
    send_unpin::<UringWriteFuture<'static>>();
    send_unpin::<UringWriteAllFuture<'static>>();
    send_unpin::<UringWriteOwnedFuture<'static, Vec<u8>>>();
    send_unpin::<UringWriteAllOwnedFuture<'static, crate::buf::AlignedBuf>>();
    send_unpin::<UringSyncFuture<'static>>();
    send_unpin::<UringStatxFuture<'static>>();
    send_unpin::<UringOpenFuture<'static>>();
};

/// Writes, durability, file metadata and opening files. See the
/// [design document](crate::design) ("Writes and durability") for the
/// ordering rules in full; in short:
///
/// - A **completed** write (its future resolved `Ok(n)`) has put its `n`
///   bytes in the file as far as every later read sees them — through this
///   context or any other descriptor — but not necessarily on storage: a
///   crash may lose it until an [`fsync`](Self::fsync) or
///   [`fdatasync`](Self::fdatasync) that **starts after the write
///   completed** completes `Ok`.
/// - Writes in flight at the same time have **no order** among themselves
///   (nor with a sync started meanwhile): to make write A durable before
///   write B is issued, await A, await an `fdatasync`, then issue B.
/// - A write future **dropped** before it resolved may or may not have
///   happened, in whole or in part: treat its range as unknown until
///   rewritten. The same holds for one that failed (`write_all`), and for
///   one whose sync failed: after a failed `fsync`/`fdatasync`, the
///   kernel may have dropped the dirty pages, so rewrite what it covered.
impl UringContext {
    /// Writes `buf` to file `fid` at `offset`; returns the bytes written.
    ///
    /// The bytes are copied into a buffer the context owns before the
    /// kernel sees them (at most [`BORROWED_CHUNK`](crate::BORROWED_CHUNK)
    /// at a time: a larger write goes to the kernel in pieces of that size,
    /// one after another), so dropping the future at any point is sound.
    /// A short write from the kernel (rare on local files: a full disk, a
    /// signal) is returned as it is, like `pwrite(2)`; bytes written before
    /// a later piece fails are returned as a short count.
    /// [`write_all`](Self::write_all) continues short writes instead.
    ///
    /// Errors: `InvalidInput` for an unknown `fid`, or when `offset +
    /// buf.len()` would exceed `i64::MAX`; `PermissionDenied` for a file
    /// not opened for writing; `InvalidInput` naming the alignment rule for
    /// a misaligned write to an `O_DIRECT` file; the kernel's error
    /// otherwise. An empty `buf` returns `Ok(0)` without a syscall.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// assert_eq!(ctx.write(0, 4, b"world").await?, 5);
    /// ctx.write_all(0, 0, b"hey ").await?;
    /// ctx.fdatasync(0).await?; // durable from here on
    /// let mut buf = [0u8; 9];
    /// assert_eq!(ctx.read(0, 0, &mut buf).await?, 9);
    /// assert_eq!(&buf, b"hey world");
    /// assert_eq!(ctx.file_size(0).await?, 9);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn write<'a>(
        &'a self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &'a [u8],
    ) -> UringWriteFuture<'a> {
        UringWriteFuture {
            core: OpCore::new(
                Ctx::Borrowed(&self.inner),
                fid.into(),
                Write::new(BorrowedSrc(buf), offset, false),
            ),
        }
    }

    /// Writes all of `buf` to file `fid` at `offset`, continuing short
    /// writes (and retrying `Interrupted`); `WriteZero` if the kernel
    /// writes nothing. As [`write`](Self::write) otherwise. On an error, an
    /// unknown prefix of `buf` may have been written.
    pub fn write_all<'a>(
        &'a self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &'a [u8],
    ) -> UringWriteAllFuture<'a> {
        UringWriteAllFuture {
            core: OpCore::new(
                Ctx::Borrowed(&self.inner),
                fid.into(),
                Write::new(BorrowedSrc(buf), offset, true),
            ),
        }
    }

    /// Writes the initialised bytes of the owned buffer `buf` (see
    /// [`IoBuf`](crate::IoBuf)) to file `fid` at `offset`, zero-copy; the
    /// buffer comes back with the number of bytes written. Use an
    /// [`AlignedBuf`](crate::AlignedBuf) for `O_DIRECT` files — for large
    /// sequential writes one from
    /// [`AlignedBuf::new_huge`](crate::AlignedBuf::new_huge), whose
    /// physically contiguous memory reaches the device in fewer, larger
    /// segments (the crate's `docs/DESIGN.md`, "Writes and durability").
    /// Short writes and errors as [`write`](Self::write); a write is not
    /// split (up to the kernel's limit of 2 GiB − 4 KiB per call).
    ///
    /// ```
    /// # use uring_positioned_io::{AlignedBuf, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// let mut block = AlignedBuf::new(4096, 4096);
    /// block.fill(7);
    /// let (n, block) = ctx.write_owned(0, 8192, block).await;
    /// assert_eq!((n?, block.len()), (4096, 4096)); // the buffer is back
    /// assert_eq!(ctx.statx(0).await?.size, 12288);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn write_owned<B: IoBuf>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringWriteOwnedFuture<'_, B> {
        UringWriteOwnedFuture {
            core: OpCore::new(
                Ctx::Borrowed(&self.inner),
                fid.into(),
                Write::new(OwnedSrc::new(buf), offset, false),
            ),
        }
    }

    /// Writes all the initialised bytes of `buf` at `offset`, continuing
    /// short writes, as [`write_all`](Self::write_all); zero-copy, the
    /// buffer comes back, as [`write_owned`](Self::write_owned).
    pub fn write_all_owned<B: IoBuf>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringWriteAllOwnedFuture<'_, B> {
        UringWriteAllOwnedFuture {
            core: OpCore::new(
                Ctx::Borrowed(&self.inner),
                fid.into(),
                Write::new(OwnedSrc::new(buf), offset, true),
            ),
        }
    }

    /// [`write_all_owned`](Self::write_all_owned) with a `'static` future
    /// (it holds a handle to the context), for `tokio::spawn`.
    pub fn write_all_owned_static<B: IoBuf>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringWriteAllOwnedFuture<'static, B> {
        UringWriteAllOwnedFuture {
            core: OpCore::new(
                Ctx::Shared(self.inner.clone()),
                fid.into(),
                Write::new(OwnedSrc::new(buf), offset, true),
            ),
        }
    }

    fn sync_op(&self, fid: FileId, op: Sync) -> UringSyncFuture<'_> {
        UringSyncFuture {
            core: OpCore::new(Ctx::Borrowed(&self.inner), fid, op),
        }
    }

    /// `fsync(2)` of file `fid` (`IORING_OP_FSYNC`): once it completes
    /// `Ok`, every write to the file that had **completed before it
    /// started** is on stable storage, with the file's metadata. Writes
    /// still in flight when it starts are not covered.
    pub fn fsync(&self, fid: impl Into<FileId>) -> UringSyncFuture<'_> {
        self.sync_op(fid.into(), Sync::Fsync { datasync: false })
    }

    /// `fdatasync(2)` of file `fid`: as [`fsync`](Self::fsync), but
    /// metadata only as far as reading the data back needs it (the size of
    /// a grown file is included; timestamps are not). The usual commit of
    /// a write-ahead log.
    pub fn fdatasync(&self, fid: impl Into<FileId>) -> UringSyncFuture<'_> {
        self.sync_op(fid.into(), Sync::Fsync { datasync: true })
    }

    /// `sync_file_range(2)` of `len` bytes at `offset` (`len` 0: to the end
    /// of the file) with `flags` (`libc::SYNC_FILE_RANGE_*`). It starts or
    /// waits for writeback of data only — no metadata, no device cache
    /// flush — so it **does not make writes durable**; use it to pace
    /// writeback, and [`fdatasync`](Self::fdatasync) to commit.
    pub fn sync_file_range(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        len: u32,
        flags: u32,
    ) -> UringSyncFuture<'_> {
        self.sync_op(fid.into(), Sync::Range { offset, len, flags })
    }

    /// `fallocate(2)` of `len` bytes at `offset` with `mode` (0 allocates
    /// and extends the file; `libc::FALLOC_FL_*` for the others). Errors
    /// as the kernel's (`EOPNOTSUPP` where the file system has no such
    /// mode), `InvalidInput` for a range beyond `i64::MAX`.
    pub fn fallocate(
        &self,
        fid: impl Into<FileId>,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> UringSyncFuture<'_> {
        self.sync_op(fid.into(), Sync::Fallocate { mode, offset, len })
    }

    /// `statx(2)` of file `fid` (`IORING_OP_STATX`): its size, allocation
    /// and `O_DIRECT` alignment needs.
    pub fn statx(&self, fid: impl Into<FileId>) -> UringStatxFuture<'_> {
        UringStatxFuture {
            core: OpCore::new(Ctx::Borrowed(&self.inner), fid.into(), Statx::new()),
        }
    }

    /// The size of file `fid` in bytes, through [`statx`](Self::statx).
    ///
    /// # Errors
    ///
    /// As [`statx`](Self::statx).
    pub async fn file_size(&self, fid: impl Into<FileId>) -> io::Result<u64> {
        Ok(self.statx(fid).await?.size)
    }

    /// Opens `path` with `options` (`open(2)` on the blocking pool, so that
    /// a file system that never answers holds a pool thread, not a runtime
    /// worker) and registers it, as
    /// [`register_file`](Self::register_file) would: resolves to its
    /// checked id. Only regular files and block devices are accepted (a
    /// FIFO never blocks the open: it is opened non-blocking, then
    /// refused).
    ///
    /// ```
    /// # use uring_positioned_io::{OpenOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let ctx = UringContext::new(vec![])?;
    /// let opts = OpenOptions::new().read(true).write(true).create(true).clone();
    /// let fid = ctx.open(dir.path().join("log"), &opts).await?;
    /// ctx.write_all(fid, 0, b"record").await?;
    /// assert_eq!(ctx.file_size(fid).await?, 6);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn open(&self, path: impl AsRef<Path>, options: &OpenOptions) -> UringOpenFuture<'_> {
        UringOpenFuture {
            core: Open::new(path.as_ref(), options)
                .map(|job| OpCore::new(Ctx::Borrowed(&self.inner), FileId::from(0), job))
                .map_err(Some),
        }
    }
}
