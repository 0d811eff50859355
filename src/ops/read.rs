//! Reads: the [`Read`] op over a destination ([`Dest`]): a borrowed slice
//! ([`UringReadFuture`]) or an owned buffer ([`UringReadOwnedFuture`],
//! [`UringReadExactOwnedFuture`]); vectored destinations are in `readv.rs`.
//! A read is the one op the inline path serves (`preadv2(RWF_NOWAIT)` on
//! the polling thread); otherwise it runs on the engine like every op (see
//! the module above).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use super::{Access, Core, Inline, Op, Piece};
use crate::blocking::BlockingPool;
use crate::blocking::PoolJob;
use crate::buf::{AlignedBuf, IoBufMut};
use crate::error;
use crate::files::FileEntry;
use crate::id::FileId;
use crate::latency::OpKind;
use crate::ring::{Dst, RingOp, MAX_RW};
use crate::shared::Ctx;
use crate::sys::{self, pread_nowait, Nowait};

/// Largest piece of a borrowed read handed to the kernel at once: a
/// borrowed read goes through a bounce buffer the op owns, so a larger read
/// is split into pieces of this size, issued one after another (the caller
/// still sees one read). This bounds the memory a borrowed read allocates;
/// owned reads need no bounce buffer and are not split.
pub const BORROWED_CHUNK: usize = 1 << 20;

/// Where a read's bytes end up; the one difference between the read futures.
pub(crate) trait Dest {
    /// What a blocking-pool read returns.
    type Blocking: Send + 'static;
    /// See [`Op::BLOCKING_DETACHABLE`]: whether the blocking task reads
    /// into a buffer of its own, not into the caller's.
    const BLOCKING_DETACHABLE: bool;
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
    /// whose bytes are then handed to [`copy_out`](Dest::copy_out).
    fn bounced(&self) -> bool;
    /// Puts bytes a bounce buffer received at the destination's `done..`.
    fn copy_out(&mut self, _done: usize, _src: &[u8]) {}
    /// A blocking-pool read of `len` bytes at `offset` into the
    /// destination's bytes `done..`.
    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Arc<FileEntry>,
        offset: u64,
        done: usize,
        len: usize,
    ) -> io::Result<PoolJob<Self::Blocking>>;
    /// Puts a blocking-pool read's bytes at `done..` and says how many
    /// there were.
    fn finish_blocking(&mut self, out: Self::Blocking, done: usize) -> io::Result<usize>;
    /// What must stay alive with an abandoned in-flight read.
    fn park(&mut self) -> Option<Box<dyn Any + Send>>;
    /// The address the kernel writes the piece starting at `done` to, if
    /// it is the caller's memory (not a bounce buffer the crate aligned).
    fn addr(&self, _done: usize) -> Option<usize> {
        None
    }
}

/// The number of bytes a read of `len` at `offset` may return, so that no
/// syscall sees `offset + len` beyond `i64::MAX` (EINVAL; no file reaches
/// it): at `i64::MAX` a read is `Ok(0)`, beyond it an error.
pub(crate) fn clamp_len(fid: FileId, offset: u64, len: usize) -> io::Result<usize> {
    let max = i64::MAX.unsigned_abs();
    if offset > max {
        return Err(error::offset_beyond_max(fid, offset));
    }
    Ok(usize::try_from(max - offset).map_or(len, |room| len.min(room)))
}

/// A positioned read into a [`Dest`].
pub(crate) struct Read<D> {
    fid: FileId,
    offset: u64,
    /// Bytes this read may return: the destination's length, clamped (see
    /// `clamp_len`); computed on the first poll.
    total: usize,
    /// Bytes already read (inline, or by earlier pieces).
    done: usize,
    /// Bytes asked of the piece in flight.
    piece: usize,
    /// The cap on the next piece ([`Op::limit_piece`]); a `u32` (pieces
    /// are at most `MAX_RW`), which fits beside the flags.
    limit: u32,
    /// A ring read came back short before the end of the file and the rest
    /// is being read: a later failure is then an error, not a short count.
    resumed: bool,
    /// Fill the whole destination (`read_exact_owned`): every short piece
    /// is continued until the end of the file, and a failure after some
    /// bytes is an error, not a short count.
    exact: bool,
    pub(crate) dest: D,
}

impl<D: Dest> Read<D> {
    pub(crate) fn new(fid: FileId, offset: u64, dest: D) -> Self {
        Read {
            fid,
            offset,
            total: 0,
            done: 0,
            piece: 0,
            limit: u32::MAX,
            resumed: false,
            exact: false,
            dest,
        }
    }

    /// Makes this read fill its whole destination (see `exact`).
    pub(crate) fn exact(mut self) -> Self {
        self.exact = true;
        self
    }

    /// Bytes read so far (all of them, once the read is over).
    pub(crate) fn done(&self) -> usize {
        self.done
    }

    /// The offset and length of the next piece.
    fn next_piece(&mut self) -> (u64, usize) {
        self.piece = (self.total - self.done)
            .min(self.dest.max_piece())
            .min(self.limit as usize)
            .min(MAX_RW);
        (self.offset + self.done as u64, self.piece)
    }

    /// A piece returned `n` bytes: the read is over (`Some`), or the next
    /// piece starts (`None`).
    fn piece_done(&mut self, n: usize) -> Option<io::Result<usize>> {
        self.done += n;
        // A full piece is followed by the next; an exact read continues
        // after any piece that read something.
        if (n == self.piece || self.exact) && n > 0 && self.done < self.total {
            None
        } else {
            Some(Ok(self.done))
        }
    }

    /// The piece was in the kernel when its submitting thread exited (io_uring
    /// may have cut it short): a full read, or one short at the end of the
    /// file, stands; anything else is an error, never a short count mid-file.
    fn check_tainted(
        &mut self,
        res: io::Result<usize>,
        file: Option<&FileEntry>,
    ) -> io::Result<usize> {
        // Not `Interrupted` (see `error::submitter_exited`).
        let (fid, offset) = (self.fid, self.offset);
        let n = match res {
            Ok(n) => n,
            Err(e) => {
                self.done = 0;
                return Err(error::submitter_exited(fid, offset, "cancelled", Some(e)));
            }
        };
        let read_to = self.done + n;
        let end = self.offset + read_to as u64;
        let complete = read_to == self.total
            || file.is_some_and(|f| sys::file_size(&f.file, f.kind).is_ok_and(|size| end >= size));
        if complete {
            self.done = read_to;
            Ok(read_to)
        } else {
            self.done = 0;
            Err(error::submitter_exited(
                fid,
                offset,
                &format!("cut short ({read_to} of {} bytes)", self.total),
                None,
            ))
        }
    }

    /// Whether a ring read that returned `n` of `self.piece` bytes stopped
    /// at the end of the file (an `fstat`, paid only for short reads).
    fn at_eof(&self, n: usize, file: Option<&FileEntry>) -> bool {
        let end = self.offset + (self.done + n) as u64;
        // If the size cannot be read, take the kernel's word for it.
        file.is_none_or(|f| sys::file_size(&f.file, f.kind).map_or(true, |size| end >= size))
    }
}

impl<D: Dest> Op for Read<D> {
    type Blocking = D::Blocking;
    const INLINE: bool = true;
    const KIND: OpKind = OpKind::Read;
    const BLOCKING_DETACHABLE: bool = D::BLOCKING_DETACHABLE;

    fn name(&self) -> &'static str {
        "read"
    }

    fn access(&self) -> Access {
        Access::Read
    }

    fn check(&mut self, fid: FileId, _file: Option<&FileEntry>) -> io::Result<Option<usize>> {
        self.dest.check(fid)?;
        self.total = clamp_len(fid, self.offset, self.dest.len())?;
        Ok((self.total == 0).then_some(0))
    }

    fn transfer(&self) -> Option<(u64, usize, Option<usize>)> {
        let at = self.offset + self.done as u64;
        Some((at, self.piece, self.dest.addr(self.done)))
    }

    #[cfg(feature = "tracing")]
    fn request(&self) -> Option<(u64, usize)> {
        Some((self.offset, self.dest.len()))
    }

    #[inline]
    fn inline(&mut self, fd: RawFd) -> Inline {
        let start = self.done;
        let at = self.offset + start as u64;
        // At most BORROWED_CHUNK per call, with the fairness check between
        // pieces, so that a huge cached read does not hold the thread for
        // its whole copy (see DESIGN, "The read path").
        let end = self.total.min(start.saturating_add(BORROWED_CHUNK));
        match self.dest.nowait(fd, start..end, at) {
            Nowait::Read(0) => Inline::Served(self.done),
            Nowait::Read(n) => {
                self.done += n;
                if self.done == self.total {
                    Inline::Served(self.done)
                } else if self.done == end {
                    Inline::Piece
                } else {
                    Inline::Partial
                }
            }
            Nowait::WouldBlock => Inline::Miss {
                first: self.done == 0,
            },
            Nowait::Unsupported => Inline::Unsupported,
            Nowait::Ring => Inline::Ring,
        }
    }

    fn limit_piece(&mut self, max: usize) {
        self.limit = u32::try_from(max).unwrap_or(u32::MAX);
    }

    fn sqe(&mut self) -> RingOp<'_> {
        let (offset, len) = self.next_piece();
        RingOp::Read {
            offset,
            dst: self.dest.ring_dst(self.done, len),
        }
    }

    fn bounced(&self) -> bool {
        self.dest.bounced()
    }

    fn copy_out(&mut self, src: &[u8]) {
        self.dest.copy_out(self.done, src);
    }

    /// A destination read through a bounce buffer of the job's own
    /// (`BLOCKING_DETACHABLE`) queues only pieces small enough that the
    /// buffer it holds while it waits stays small (those a thread keeps);
    /// the caller's own buffers cost nothing to hold.
    fn queues_job(&self) -> bool {
        let piece = (self.total - self.done)
            .min(self.dest.max_piece())
            .min(MAX_RW);
        !D::BLOCKING_DETACHABLE || piece <= crate::blocking::KEPT_MAX_LEN
    }

    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Option<Arc<FileEntry>>,
    ) -> io::Result<PoolJob<Self::Blocking>> {
        let (offset, len) = self.next_piece();
        let file = file.ok_or_else(|| io::Error::other("read without a file (a bug)"))?;
        self.dest.blocking_job(pool, file, offset, self.done, len)
    }

    fn finish_blocking(&mut self, out: Self::Blocking) -> io::Result<usize> {
        self.dest.finish_blocking(out, self.done)
    }

    fn advance(&mut self, piece: Piece<'_>) -> Option<io::Result<usize>> {
        if piece.tainted {
            return Some(self.check_tainted(piece.res, piece.file));
        }
        match piece.res {
            Ok(n) if piece.on_ring && n > 0 && n < self.piece && !self.at_eof(n, piece.file) => {
                // Cut short mid-file (its submitter's thread died): read the
                // rest, or fail rather than return a short count.
                self.done += n;
                self.resumed = true;
                None
            }
            Ok(n) => self.piece_done(n),
            // An exact read retries what was interrupted, as `read_exact`
            // does (nothing is in flight after an error).
            Err(e) if self.exact && e.kind() == io::ErrorKind::Interrupted => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Bytes already read are never lost to a later failure: the caller
    /// gets them, as read(2) would give them (see also `check_tainted`).
    fn finish(&mut self, res: io::Result<usize>) -> io::Result<usize> {
        match res {
            Err(_) if self.done > 0 && !self.resumed && !self.exact => Ok(self.done),
            res => res,
        }
    }

    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        self.dest.park()
    }
}

/// A read's engine: the core with a [`Read`] op.
pub(crate) type ReadCore<'a, D> = Core<'a, Read<D>>;

/// A borrowed destination: the kernel writes into a bounce buffer owned by
/// the op, copied here on completion.
pub(crate) struct Borrowed<'a>(pub(crate) &'a mut [u8]);

impl Dest for Borrowed<'_> {
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
    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Arc<FileEntry>,
        offset: u64,
        _done: usize,
        len: usize,
    ) -> io::Result<PoolJob<Self::Blocking>> {
        pool.read(file, offset, len)
    }
    fn finish_blocking(&mut self, out: Self::Blocking, done: usize) -> io::Result<usize> {
        let (data, n) = out?;
        let n = n.min(data.len()).min(self.0.len() - done);
        self.0[done..done + n].copy_from_slice(&data[..n]);
        crate::blocking::recycle_bounce(data);
        Ok(n)
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
}

/// An owned destination: the kernel writes straight into its storage,
/// from its start, at most `bytes_total()` bytes as it was when the read
/// was made. On the blocking pool the buffer travels to its task through
/// `lent`, so it comes back even if that task is cancelled before it runs.
pub(crate) struct Owned<B> {
    buf: Option<B>,
    lent: Option<Arc<Mutex<Option<B>>>>,
    /// `bytes_total()` at the start: how many bytes the read may write.
    total: usize,
    /// The op's name, for the error of a buffer of 0 bytes.
    op: &'static str,
}

impl<B: IoBufMut> Owned<B> {
    /// The destination of the owned read `op` (its name in errors).
    pub(crate) fn new(buf: B, op: &'static str) -> Self {
        Owned {
            total: buf.bytes_total(),
            buf: Some(buf),
            lent: None,
            op,
        }
    }

    fn buf(&mut self) -> &mut B {
        self.buf.as_mut().expect("owned buffer is at home")
    }

    /// Hands the buffer back once the read is over, with the `filled` bytes
    /// the read wrote at its start counted as initialised.
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
            // successful syscall or CQE) at the start of the storage, so
            // they are initialised, and filled <= total = bytes_total().
            unsafe { buf.set_init(filled.min(self.total)) };
        }
        buf
    }
}

impl<B: IoBufMut> Dest for Owned<B> {
    const BLOCKING_DETACHABLE: bool = false;

    type Blocking = io::Result<usize>;
    fn len(&self) -> usize {
        self.total
    }
    fn check(&self, fid: FileId) -> io::Result<()> {
        if self.total == 0 {
            return Err(error::nothing_to_read_into(self.op, fid));
        }
        Ok(())
    }
    fn max_piece(&self) -> usize {
        MAX_RW
    }
    fn nowait(&mut self, fd: RawFd, range: Range<usize>, at: u64) -> Nowait {
        let total = self.total;
        let b = self.buf();
        // SAFETY: IoBufMut promises bytes_total() = total writable bytes
        // at the pointer while `b` lives, not necessarily initialised
        // (hence MaybeUninit); the slice does not outlive this call.
        let dest: &mut [MaybeUninit<u8>] =
            unsafe { std::slice::from_raw_parts_mut(b.stable_mut_ptr().cast(), total) };
        pread_nowait(fd, &mut dest[range], at)
    }
    fn ring_dst(&mut self, done: usize, len: usize) -> Dst {
        assert!(done + len <= self.total, "read piece out of bounds");
        let b = self.buf();
        // SAFETY: done + len <= bytes_total, so the pointer stays in
        // bounds.
        Dst::Caller(unsafe { b.stable_mut_ptr().add(done) }, len, b.registered())
    }
    fn bounced(&self) -> bool {
        false
    }
    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Arc<FileEntry>,
        offset: u64,
        done: usize,
        len: usize,
    ) -> io::Result<PoolJob<Self::Blocking>> {
        let at = done;
        let lent = Arc::new(Mutex::new(self.buf.take()));
        self.lent = Some(lent.clone());
        pool.read_owned(file, offset, at..at + len, lent)
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
        Some(b.stable_ptr() as usize + done)
    }
}

impl<B: IoBufMut> ReadCore<'_, Owned<B>> {
    /// The buffer, once the read is over, its initialised length raised to
    /// the bytes read if shorter.
    fn take_buf(&mut self) -> B {
        let done = self.op.done;
        self.op.dest.take(done)
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

impl<'a> UringReadFuture<'a> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, offset: u64, buf: &'a mut [u8]) -> Self {
        UringReadFuture {
            core: Core::new(ctx, fid, Read::new(fid, offset, Borrowed(buf))),
        }
    }
}

impl Future for UringReadFuture<'_> {
    type Output = io::Result<usize>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.get_mut().core.poll_op(cx)
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
/// (`'static`): the kernel writes straight into the buffer from its start,
/// at most `bytes_total()` bytes, and the buffer comes back with the
/// result, its initialised length raised to the bytes read if shorter
/// (never lowered). Dropped while the read is in the kernel,
/// the buffer is kept by the context until the kernel is done, then freed.
#[must_use = "futures do nothing unless polled"]
pub struct UringReadOwnedFuture<'a, B: IoBufMut> {
    pub(crate) core: ReadCore<'a, Owned<B>>,
}

impl<'a, B: IoBufMut> UringReadOwnedFuture<'a, B> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, offset: u64, buf: B) -> Self {
        UringReadOwnedFuture {
            core: Core::new(
                ctx,
                fid,
                Read::new(fid, offset, Owned::new(buf, "read_owned")),
            ),
        }
    }

    /// Names the op in the error for a buffer of 0 bytes (a batch's reads).
    pub(crate) fn named(mut self, op: &'static str) -> Self {
        self.core.op.dest.op = op;
        self
    }

    /// Makes this read skip the inline path and go to a ring even when its
    /// range is cached (a scan's read-ahead; see `scan/`).
    pub(crate) fn ring_only(self) -> Self {
        UringReadOwnedFuture {
            core: self.core.ring_only(),
        }
    }

    /// Makes this read a `pread` on the context's blocking pool, whatever
    /// the file's route (a scan's read-ahead; see `scan/`).
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
        let res = ready!(this.core.poll_op(cx));
        Poll::Ready((res, this.core.take_buf()))
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
/// (`'static`): fills the buffer with exactly `bytes_total()` bytes from
/// its start, continuing short reads, or fails with `UnexpectedEof` at the
/// end of the file; the buffer comes back either way, its initialised
/// length raised to cover every byte read. Dropping it is as sound
/// as dropping [`UringReadOwnedFuture`].
#[must_use = "futures do nothing unless polled"]
pub struct UringReadExactOwnedFuture<'a, B: IoBufMut> {
    core: ReadCore<'a, Owned<B>>,
}

impl<'a, B: IoBufMut> UringReadExactOwnedFuture<'a, B> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, offset: u64, buf: B) -> Self {
        UringReadExactOwnedFuture {
            core: Core::new(
                ctx,
                fid,
                Read::new(fid, offset, Owned::new(buf, "read_exact_owned")).exact(),
            ),
        }
    }
}

impl<B: IoBufMut> Future for UringReadExactOwnedFuture<'_, B> {
    type Output = (io::Result<()>, B);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_op(cx));
        let read = &this.core.op;
        let (fid, offset, total) = (read.fid, read.offset, read.dest.total);
        let res = match res {
            Ok(n) if n == total => Ok(()),
            Ok(n) => Err(error::ends_before(fid, offset, n, total)),
            Err(e) => Err(e),
        };
        Poll::Ready((res, this.core.take_buf()))
    }
}

impl<B: IoBufMut> fmt::Debug for UringReadExactOwnedFuture<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

// The read futures' auto traits are part of the API: `Send` and `Unpin`,
// and not `Sync` (making them `Sync` must be a deliberate API addition).
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
