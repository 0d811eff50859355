//! Positioned writes: the [`Write`] op over a [`Source`] of bytes —
//! borrowed ([`UringWriteFuture`], [`UringWriteAllFuture`]: each piece is
//! copied into a bounce buffer the op owns) or an owned buffer
//! ([`UringWriteOwnedFuture`], [`UringWriteAllOwnedFuture`]: zero-copy).
//! There is no inline path: a buffered write through the ring is copied
//! into the page cache inside the submitting `io_uring_enter` anyway.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use super::read::BORROWED_CHUNK;
use super::{Access, Core, Op, Piece};
use crate::blocking::BlockingPool;
use crate::blocking::PoolJob;
use crate::buf::IoBuf;
use crate::error;
use crate::files::FileEntry;
use crate::id::FileId;
use crate::latency::OpKind;
use crate::ring::{RingOp, Src, MAX_RW};

/// Where a write's bytes come from.
pub(crate) trait Source {
    /// Bytes to write.
    fn len(&self) -> usize;
    /// Largest piece handed to the kernel at once.
    fn max_piece(&self) -> usize;
    /// The ring op writing bytes `done..done + len` at `offset`.
    fn sqe(&mut self, offset: u64, done: usize, len: usize) -> RingOp<'_>;
    /// The same on the blocking pool (`RWF_DSYNC` with `dsync`).
    #[allow(clippy::too_many_arguments)]
    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Arc<FileEntry>,
        offset: u64,
        done: usize,
        len: usize,
        dsync: bool,
    ) -> io::Result<PoolJob<io::Result<usize>>>;
    /// A blocking piece is over: bring a lent buffer home.
    fn home(&mut self) {}
    /// See `Op::BLOCKING_DETACHABLE`.
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
    /// The cap on the next piece ([`Op::limit_piece`]); a `u32` (pieces
    /// are at most `MAX_RW`), which fits beside the flags.
    limit: u32,
    /// `write_all`: continue every short piece; a failure is an error.
    exact: bool,
    /// Each piece `RWF_DSYNC`: durable when the write completes.
    pub(crate) dsync: bool,
}

impl<S: Source> Write<S> {
    pub(crate) fn new(src: S, offset: u64, exact: bool) -> Self {
        Write {
            src,
            offset,
            done: 0,
            piece: 0,
            limit: u32::MAX,
            exact,
            dsync: false,
        }
    }

    fn next_piece(&mut self) -> (u64, usize) {
        self.piece = (self.src.len() - self.done)
            .min(self.src.max_piece())
            .min(self.limit as usize)
            .min(MAX_RW);
        (self.offset + self.done as u64, self.piece)
    }
}

impl<S: Source> Op for Write<S> {
    type Blocking = io::Result<usize>;
    const BLOCKING_DETACHABLE: bool = S::BLOCKING_DETACHABLE;
    const KIND: OpKind = OpKind::Write;

    fn limit_piece(&mut self, max: usize) {
        self.limit = u32::try_from(max).unwrap_or(u32::MAX);
    }

    fn name(&self) -> &'static str {
        "write"
    }

    fn iowq_serialized(&self) -> bool {
        true
    }

    #[cfg(feature = "cache")]
    fn changes(&self) -> Option<(u64, u64)> {
        Some((self.offset, self.src.len() as u64))
    }

    fn access(&self) -> Access {
        Access::Write
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

    #[cfg(feature = "tracing")]
    fn request(&self) -> Option<(u64, usize)> {
        Some((self.offset, self.src.len()))
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

    fn sqe(&mut self) -> RingOp<'_> {
        let (offset, len) = self.next_piece();
        let dsync = self.dsync;
        match self.src.sqe(offset, self.done, len) {
            RingOp::Write { offset, src, .. } => RingOp::Write { offset, src, dsync },
            op => op,
        }
    }

    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Option<Arc<FileEntry>>,
    ) -> io::Result<PoolJob<io::Result<usize>>> {
        let (offset, len) = self.next_piece();
        let file = file.ok_or_else(|| io::Error::other("write without a file (a bug)"))?;
        self.src
            .blocking_job(pool, file, offset, self.done, len, self.dsync)
    }

    fn finish_blocking(&mut self, out: io::Result<usize>) -> io::Result<usize> {
        self.src.home();
        out
    }

    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        self.src.park()
    }

    /// `EAGAIN` from a ring write is a write that wrote nothing (io_uring's
    /// retry of a 0-byte write): `Ok(0)`, as `pwrite` gives, not `WouldBlock`.
    fn ring_result(&mut self, res: io::Result<usize>) -> io::Result<usize> {
        match res {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(0),
            res => res,
        }
    }

    fn advance(&mut self, piece: Piece<'_>) -> Option<io::Result<usize>> {
        let tainted = piece.tainted;
        let n = match piece.res {
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
    fn sqe(&mut self, offset: u64, done: usize, len: usize) -> RingOp<'_> {
        RingOp::Write {
            offset,
            src: Src::Copy(&self.0[done..done + len]),
            dsync: false,
        }
    }
    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Arc<FileEntry>,
        offset: u64,
        done: usize,
        len: usize,
        dsync: bool,
    ) -> io::Result<PoolJob<io::Result<usize>>> {
        // Page-aligned, so that O_DIRECT files work as on the ring.
        let mut copy = crate::buf::AlignedBuf::try_new(len, crate::buf::BOUNCE_ALIGN)?;
        copy.copy_from_slice(&self.0[done..done + len]);
        pool.job(move || crate::sys::pwrite(&file.file, &copy, offset, dsync))
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
}

/// An owned buffer, written from its initialised bytes; on the blocking
/// pool lent to its task through `lent`, so it comes back even if that task
/// is cancelled before it runs.
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
        MAX_RW
    }
    fn sqe(&mut self, offset: u64, done: usize, len: usize) -> RingOp<'_> {
        assert!(done + len <= self.len, "write piece out of bounds");
        let b = self.buf.as_ref().expect("owned buffer is at home");
        // SAFETY: done + len <= data_len(): in bounds of the buffer.
        let ptr = unsafe { b.data_ptr().add(done) };
        RingOp::Write {
            offset,
            src: Src::Caller(ptr, len),
            dsync: false,
        }
    }
    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Arc<FileEntry>,
        offset: u64,
        done: usize,
        len: usize,
        dsync: bool,
    ) -> io::Result<PoolJob<io::Result<usize>>> {
        let lent = Arc::new(Mutex::new(self.buf.take()));
        self.lent = Some(lent.clone());
        pool.job(move || {
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
            crate::sys::pwrite(&file.file, src, offset, dsync)
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
    pub(crate) core: Core<'a, Write<BorrowedSrc<'a>>>,
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
    pub(crate) core: Core<'a, Write<BorrowedSrc<'a>>>,
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
    pub(crate) core: Core<'a, Write<OwnedSrc<B>>>,
}

impl<B: IoBuf> Future for UringWriteOwnedFuture<'_, B> {
    type Output = (io::Result<usize>, B);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_op(cx));
        Poll::Ready((res, this.core.op.src.take()))
    }
}

/// The future of
/// [`UringContext::write_all_owned`](crate::UringContext::write_all_owned)
/// (borrowing the context) and
/// [`write_all_owned_static`](crate::UringContext::write_all_owned_static)
/// (`'static`).
#[must_use = "futures do nothing unless polled"]
pub struct UringWriteAllOwnedFuture<'a, B: IoBuf> {
    pub(crate) core: Core<'a, Write<OwnedSrc<B>>>,
}

impl<B: IoBuf> Future for UringWriteAllOwnedFuture<'_, B> {
    type Output = (io::Result<()>, B);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_op(cx));
        Poll::Ready((res.map(drop), this.core.op.src.take()))
    }
}

macro_rules! durable {
    ($($t:ident $(<$b:ident>)?),*) => {$(
        impl<$($b: IoBuf)?> $t<'_ $(, $b)?> {
            /// Makes the write durable when it completes: it is issued with
            /// `RWF_DSYNC`, as if the file were opened `O_DSYNC` for this
            /// write alone. Its bytes, and what is needed to read them back
            /// (a new file size, an allocated block), reach stable storage
            /// before the future resolves, in one op where a write and a
            /// [`sync_data`](crate::UringFile::sync_data) take two. Only
            /// this write's range is flushed: earlier writes still need a
            /// sync. Call it before the first poll.
            pub fn durable(mut self) -> Self {
                self.core.op.dsync = true;
                self
            }
        }
    )*};
}

durable!(
    UringWriteFuture,
    UringWriteAllFuture,
    UringWriteOwnedFuture<B>,
    UringWriteAllOwnedFuture<B>
);

debug_via_core!(
    UringWriteFuture,
    UringWriteAllFuture,
    UringWriteOwnedFuture<B>,
    UringWriteAllOwnedFuture<B>
);

// As the read futures: `Send` and `Unpin`.
const _: fn() = || {
    fn send_unpin<T: Send + Unpin>() {}
    send_unpin::<UringWriteFuture<'static>>();
    send_unpin::<UringWriteAllFuture<'static>>();
    send_unpin::<UringWriteOwnedFuture<'static, Vec<u8>>>();
    send_unpin::<UringWriteAllOwnedFuture<'static, crate::buf::AlignedBuf>>();
};
