//! Vectored reads at an offset: [`UringReadVectoredFuture`] (borrowed
//! `IoSliceMut`s) and [`UringReadVectoredOwnedFuture`] (a `Vec` of owned
//! buffers). Both are the read op of `read.rs` with a destination made of
//! several buffers, so checks, clamping, routing,
//! the inline path, permits, cancellation and shutdown are those
//! of `read` / `read_owned`.
//!
//! | path | borrowed (`read_vectored`) | owned (`read_vectored_owned`) |
//! |---|---|---|
//! | page cache, inline | `preadv2(RWF_NOWAIT)` straight into the slices | the same, into the buffers' storage |
//! | ring | `IORING_OP_READ(_FIXED)` into one bounce buffer the op owns, scattered into the slices on completion | `IORING_OP_READV` straight into the buffers' storage; the iovec array and the buffers stay with the op until its CQE |
//! | blocking pool (fallback backend, FUSE) | `pread` into a buffer the blocking task owns, then scattered | `preadv` into the buffers' storage (the buffers are lent to the task) |
//!
//! An owned buffer's part of the iovec array is its whole storage, from its
//! start: `bytes_total()` bytes, whatever its initialised length.
//!
//! The kernel is never handed a borrowed slice: a dropped borrowed future
//! leaves only its bounce buffer with the ring, as `read` does.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::mem;
use std::ops::Range;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use crate::blocking::PoolJob;

use super::read::{Dest, Read, ReadCore, BORROWED_CHUNK};
use super::Core;
use crate::blocking::BlockingPool;
use crate::buf::{AlignedBuf, IoBufMut};
use crate::error;
use crate::files::FileEntry;
use crate::id::FileId;
use crate::ring::{Dst, MAX_RW};
use crate::shared::Ctx;
use crate::sys::{self, Nowait, IOV_MAX};

/// An iovec array the kernel may read while an op is in flight. Its heap
/// block stays in place when the value moves (it is a `Vec` that is never
/// grown while an op uses it), and it is parked with the buffers if the
/// future is dropped.
#[derive(Default)]
struct Iovecs(Vec<libc::iovec>);

// SAFETY: the iovecs are plain (address, length) pairs describing memory
// owned by the same destination (buffers that are `Send`); they are never
// dereferenced by this crate, only handed to the kernel.
unsafe impl Send for Iovecs {}

/// Appends to `out` the iovecs covering bytes `range` of the concatenation
/// of `segs` (start, length), skipping empty pieces.
fn iovecs_for(
    segs: impl Iterator<Item = (*mut u8, usize)>,
    range: Range<usize>,
    out: &mut Vec<libc::iovec>,
) {
    let mut pos = 0usize;
    for (ptr, len) in segs {
        let (seg_start, seg_end) = (pos, pos + len);
        pos = seg_end;
        let (from, to) = (range.start.max(seg_start), range.end.min(seg_end));
        if from < to {
            out.push(libc::iovec {
                // `from - seg_start < len`: in bounds of the segment.
                iov_base: ptr.wrapping_add(from - seg_start).cast(),
                iov_len: to - from,
            });
        }
        if pos >= range.end {
            break;
        }
    }
}

/// Copies `src` into the concatenation of `bufs`, starting at byte `at`;
/// returns the bytes copied.
fn scatter(bufs: &mut [IoSliceMut<'_>], mut at: usize, mut src: &[u8]) -> usize {
    let mut copied = 0;
    for b in bufs.iter_mut() {
        if src.is_empty() {
            break;
        }
        if at >= b.len() {
            at -= b.len();
            continue;
        }
        let dst = &mut b[at..];
        at = 0;
        let n = dst.len().min(src.len());
        dst[..n].copy_from_slice(&src[..n]);
        src = &src[n..];
        copied += n;
    }
    copied
}

fn too_many(fid: FileId, n: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("vectored read of {fid} into {n} buffers: at most {IOV_MAX} (IOV_MAX) per read"),
    )
}

/// Borrowed destination: `IoSliceMut`s, filled in order.
pub(crate) struct BorrowedVec<'a, 'b> {
    bufs: &'a mut [IoSliceMut<'b>],
    len: usize,
}

impl<'a, 'b> BorrowedVec<'a, 'b> {
    fn new(bufs: &'a mut [IoSliceMut<'b>]) -> Self {
        let len = bufs.iter().map(|b| b.len()).fold(0, usize::saturating_add);
        BorrowedVec { bufs, len }
    }
}

impl Dest for BorrowedVec<'_, '_> {
    const BLOCKING_DETACHABLE: bool = true;

    type Blocking = io::Result<(AlignedBuf, usize)>;
    fn len(&self) -> usize {
        self.len
    }
    fn check(&self, fid: FileId) -> io::Result<()> {
        if self.bufs.len() > IOV_MAX {
            return Err(too_many(fid, self.bufs.len()));
        }
        Ok(())
    }
    fn max_piece(&self) -> usize {
        BORROWED_CHUNK
    }
    fn nowait(&mut self, fd: RawFd, range: Range<usize>, at: u64) -> Nowait {
        let mut iov = Vec::with_capacity(self.bufs.len());
        iovecs_for(
            self.bufs.iter_mut().map(|b| (b.as_mut_ptr(), b.len())),
            range,
            &mut iov,
        );
        // SAFETY: the iovecs describe parts of the caller's slices, borrowed
        // mutably for the whole (synchronous) call; the kernel writes only
        // bytes it read, so they stay initialised. `at + range.len()` is
        // within i64::MAX (the read's length is clamped).
        unsafe { sys::preadv_nowait(fd, &iov, at) }
    }
    fn ring_dst(&mut self, _done: usize, len: usize) -> Dst {
        Dst::Bounce(len)
    }
    fn bounced(&self) -> bool {
        true
    }
    fn copy_out(&mut self, done: usize, src: &[u8]) {
        let n = src.len().min(self.len - done);
        scatter(self.bufs, done, &src[..n]);
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
        let n = n.min(data.len()).min(self.len - done);
        let copied = scatter(self.bufs, done, &data[..n]);
        crate::blocking::recycle_bounce(data);
        Ok(copied)
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        None
    }
}

/// Owned destination: the storage of a `Vec` of owned buffers, each from
/// its start, filled in order. On the ring the kernel writes straight into
/// them (`IORING_OP_READV`), through `iov`, which stays with them.
pub(crate) struct OwnedVec<B> {
    bufs: Option<Vec<B>>,
    /// The buffers, lent to a blocking-pool read (see `read::Owned`).
    lent: Option<Arc<Mutex<Option<Vec<B>>>>>,
    /// Per buffer, `bytes_total()` when the read was made.
    totals: Vec<usize>,
    /// Their sum.
    room: usize,
    iov: Iovecs,
}

impl<B: IoBufMut> OwnedVec<B> {
    fn new(bufs: Vec<B>) -> Self {
        let totals: Vec<usize> = bufs.iter().map(IoBufMut::bytes_total).collect();
        OwnedVec {
            room: totals.iter().fold(0, |a, &t| a.saturating_add(t)),
            bufs: Some(bufs),
            lent: None,
            totals,
            iov: Iovecs::default(),
        }
    }

    fn bring_home(&mut self) {
        if let Some(lent) = self.lent.take() {
            self.bufs = crate::util::lock(&lent).take();
        }
    }

    /// The buffers once the read is over, each with its initialised length
    /// raised to its share of the `filled` bytes (in order).
    fn take(&mut self, filled: usize) -> Vec<B> {
        self.bring_home();
        let mut bufs = self
            .bufs
            .take()
            .expect("the owned buffers were lost by a panicking blocking read");
        let mut left = filled.min(self.room);
        for (b, &total) in bufs.iter_mut().zip(&self.totals) {
            let n = left.min(total);
            if n > 0 {
                // SAFETY: the read wrote its bytes in order into the
                // buffers' storage (counted only after a successful syscall
                // or CQE): this buffer's first `n` bytes; n <= total.
                unsafe { b.set_init(n) };
            }
            left -= n;
        }
        bufs
    }
}

/// The storage of `bufs`, as (start, length): each buffer's whole storage.
fn storage<'s, B: IoBufMut>(
    bufs: &'s mut [B],
    totals: &'s [usize],
) -> impl Iterator<Item = (*mut u8, usize)> + 's {
    bufs.iter_mut()
        .zip(totals)
        .map(|(b, &total)| (b.stable_mut_ptr(), total))
}

impl<B: IoBufMut> Dest for OwnedVec<B> {
    const BLOCKING_DETACHABLE: bool = false;

    type Blocking = io::Result<usize>;
    fn len(&self) -> usize {
        self.room
    }
    fn check(&self, fid: FileId) -> io::Result<()> {
        if self.totals.len() > IOV_MAX {
            return Err(too_many(fid, self.totals.len()));
        }
        if self.room == 0 {
            return Err(error::nothing_to_read_into("read_vectored_owned", fid));
        }
        Ok(())
    }
    fn max_piece(&self) -> usize {
        MAX_RW
    }
    fn nowait(&mut self, fd: RawFd, range: Range<usize>, at: u64) -> Nowait {
        let mut iov = Vec::with_capacity(self.totals.len());
        let bufs = self.bufs.as_mut().expect("owned buffers are at home");
        iovecs_for(storage(bufs, &self.totals), range, &mut iov);
        // SAFETY: IoBufMut promises bytes_total() writable bytes at each
        // buffer's pointer while it lives (possibly uninitialised); the
        // iovecs lie within that storage, and the buffers are held
        // here for the whole (synchronous) call. `at + range.len()` is
        // within i64::MAX (the read's length is clamped).
        unsafe { sys::preadv_nowait(fd, &iov, at) }
    }
    fn ring_dst(&mut self, done: usize, len: usize) -> Dst {
        assert!(done + len <= self.room, "read piece out of bounds");
        let bufs = self.bufs.as_mut().expect("owned buffers are at home");
        // Rebuilt only between pieces, when no op uses the array.
        self.iov.0.clear();
        iovecs_for(
            storage(bufs, &self.totals),
            done..done + len,
            &mut self.iov.0,
        );
        debug_assert!(self.iov.0.len() <= IOV_MAX);
        Dst::CallerVec(self.iov.0.as_ptr(), self.iov.0.len())
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
        let lent = Arc::new(Mutex::new(self.bufs.take()));
        self.lent = Some(lent.clone());
        let totals = self.totals.clone();
        pool.job(move || {
            let mut guard = crate::util::lock(&lent);
            let bufs = guard
                .as_mut()
                .expect("owned buffers lent to the blocking read");
            let mut iov = Vec::with_capacity(totals.len());
            iovecs_for(storage(bufs, &totals), done..done + len, &mut iov);
            // SAFETY: the iovecs lie within the buffers' storage
            // (IoBufMut: writable while the buffer lives); the lock keeps
            // the buffers in place for the call.
            unsafe { sys::preadv(&file.file, &iov, offset) }
        })
    }
    fn finish_blocking(&mut self, res: Self::Blocking, _done: usize) -> io::Result<usize> {
        // Bring the buffers home now: a next piece needs them.
        self.bring_home();
        res
    }
    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        let bufs = self.bufs.take();
        let iov = mem::take(&mut self.iov);
        Some(Box::new((bufs, iov)))
    }
}

/// The future returned by
/// [`UringContext::read_vectored`](crate::UringContext::read_vectored).
///
/// Resolves to the number of bytes read into the slices, in order (fewer
/// than their total only at end of file). Dropping it at any point is
/// sound: the kernel writes into a buffer owned by the context, never into
/// the slices.
#[must_use = "futures do nothing unless polled"]
pub struct UringReadVectoredFuture<'a, 'b> {
    core: ReadCore<'a, BorrowedVec<'a, 'b>>,
}

impl<'a, 'b> UringReadVectoredFuture<'a, 'b> {
    pub(crate) fn new(
        ctx: Ctx<'a>,
        fid: FileId,
        offset: u64,
        bufs: &'a mut [IoSliceMut<'b>],
    ) -> Self {
        UringReadVectoredFuture {
            core: Core::new(ctx, fid, Read::new(fid, offset, BorrowedVec::new(bufs))),
        }
    }
}

impl Future for UringReadVectoredFuture<'_, '_> {
    type Output = io::Result<usize>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.get_mut().core.poll_op(cx)
    }
}

impl fmt::Debug for UringReadVectoredFuture<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

/// The future returned by
/// [`UringContext::read_vectored_owned`](crate::UringContext::read_vectored_owned)
/// and [`read_vectored_owned_static`](crate::UringContext::read_vectored_owned_static):
/// each buffer is filled from its start, up to its `bytes_total()`, in
/// turn; the buffers come back with the result, each with its initialised
/// length raised to the bytes read into it if shorter. Dropped while the read is in the kernel, the buffers are kept by the
/// context until the kernel is done, then freed.
#[must_use = "futures do nothing unless polled"]
pub struct UringReadVectoredOwnedFuture<'a, B: IoBufMut> {
    core: ReadCore<'a, OwnedVec<B>>,
}

impl<'a, B: IoBufMut> UringReadVectoredOwnedFuture<'a, B> {
    pub(crate) fn new(ctx: Ctx<'a>, fid: FileId, offset: u64, bufs: Vec<B>) -> Self {
        UringReadVectoredOwnedFuture {
            core: Core::new(ctx, fid, Read::new(fid, offset, OwnedVec::new(bufs))),
        }
    }
}

impl<B: IoBufMut> Future for UringReadVectoredOwnedFuture<'_, B> {
    type Output = (io::Result<usize>, Vec<B>);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(this.core.poll_op(cx));
        let done = this.core.op.done();
        Poll::Ready((res, this.core.op.dest.take(done)))
    }
}

impl<B: IoBufMut> fmt::Debug for UringReadVectoredOwnedFuture<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

const _: fn() = || {
    fn send_unpin<T: Send + Unpin>() {}
    send_unpin::<UringReadVectoredFuture<'static, 'static>>();
    send_unpin::<UringReadVectoredOwnedFuture<'static, Vec<u8>>>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iovecs_cover_exactly_the_range() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 0];
        let mut c = [0u8; 5];
        let segs = || {
            [
                (a.as_ptr().cast_mut(), 3),
                (b.as_ptr().cast_mut(), 0),
                (c.as_ptr().cast_mut(), 5),
            ]
        };
        for start in 0..=8 {
            for end in start..=8 {
                let mut out = Vec::new();
                iovecs_for(segs().into_iter(), start..end, &mut out);
                assert_eq!(out.iter().map(|v| v.iov_len).sum::<usize>(), end - start);
                assert!(out.iter().all(|v| v.iov_len > 0));
            }
        }
        let _ = (&mut a, &mut b, &mut c);
    }

    #[test]
    fn scatter_fills_in_order_from_an_offset() {
        let (mut a, mut b, mut c) = ([0u8; 2], [0u8; 0], [0u8; 3]);
        let mut bufs = [
            IoSliceMut::new(&mut a),
            IoSliceMut::new(&mut b),
            IoSliceMut::new(&mut c),
        ];
        assert_eq!(scatter(&mut bufs, 1, &[1, 2, 3, 4, 5, 6]), 4);
        assert_eq!((a, c), ([0, 1], [2, 3, 4]));
    }
}
