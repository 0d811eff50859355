//! The public methods of [`UringContext`] that read; their ops are in
//! `ops/read.rs` and `ops/readv.rs`.

use std::io::{self, IoSliceMut};

use super::UringContext;
use crate::buf::IoBufMut;
use crate::id::FileId;
use crate::ops::read::{UringReadExactOwnedFuture, UringReadFuture, UringReadOwnedFuture};
use crate::ops::readv::{UringReadVectoredFuture, UringReadVectoredOwnedFuture};

impl UringContext {
    /// Reads up to `buf.len()` bytes of file `fid` at `offset`.
    ///
    /// Returns the number of bytes read: `Ok(0)` at or past end of file or
    /// for an empty `buf`. No file extends past `i64::MAX`, so a read is
    /// clamped to end there (an offset of `i64::MAX` reads `Ok(0)`, like
    /// any offset past the end of the file). A read larger than
    /// [`BORROWED_CHUNK`](crate::BORROWED_CHUNK) goes to the kernel in
    /// pieces of that size, one after another, through a bounce buffer of
    /// at most that size; the caller still sees one read. Bytes read before
    /// a later piece fails are returned (`Ok`, short), as `read(2)` would.
    ///
    /// Errors: `InvalidInput` for an unknown `fid` (or a checked one of
    /// another context or of an unregistered file, see [`FileId`]) or an
    /// offset beyond `i64::MAX`; the kernel's error otherwise; an error
    /// naming the cause
    /// when the context is shut down, its ring broke, or its home runtime
    /// shut down while the read was in the kernel.
    ///
    /// Dropping the future at any point is sound. A future that is
    /// [`mem::forget`](std::mem::forget)-ten instead is sound too, but its
    /// in-flight slot and bounce buffer are never returned.
    pub fn read<'a>(
        &'a self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &'a mut [u8],
    ) -> UringReadFuture<'a> {
        UringReadFuture::new(self.ctx(), fid.into(), offset, buf)
    }

    /// Fills `buf` from file `fid` at `offset`, looping over short reads.
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` if the file ends first; otherwise as
    /// [`read`](Self::read) (`Interrupted` is retried).
    ///
    /// ```
    /// # use std::io::Write;
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[7u8; 10_000])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let mut block = vec![0u8; 4096];
    /// ctx.read_exact(0, 4096, &mut block).await?;
    /// assert!(block.iter().all(|&b| b == 7));
    /// // Past the end of the file:
    /// let err = ctx.read_exact(0, 8192, &mut block).await.unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub async fn read_exact(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let fid = fid.into();
        let (mut offset, mut buf) = (offset, buf);
        while !buf.is_empty() {
            match self.read(fid, offset, buf).await {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "{fid} ends before offset {}",
                            offset.saturating_add(buf.len() as u64)
                        ),
                    ))
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads into an owned buffer with no copy: the kernel writes straight
    /// into `buf` **from its start, at most `bytes_total()` bytes** (a
    /// `Vec`'s `capacity()`, not its `len()`; [`buf.slice(..n)`](IoBufMut::slice)
    /// reads `n` bytes), and `buf` is handed back with the result, its
    /// initialised length raised to the count if shorter, never lowered
    /// ([`IoBufMut::set_init`]): `vec![0u8; 4096]` keeps `len() == 4096`,
    /// `Vec::with_capacity(4096)` comes back with `len()` the count.
    /// `buf` may be a [`Vec<u8>`], an [`AlignedBuf`](crate::AlignedBuf)
    /// (for `O_DIRECT`), a `Box<[u8]>`, a `bytes::BytesMut` (with the
    /// `bytes` feature), a [`Slice`](crate::Slice) of any of them (a
    /// window, filled from its start), or your own [`IoBufMut`].
    ///
    /// Returns the number of bytes read, as [`read`](Self::read) does:
    /// `Ok(0)` at or past the end of the file, with the buffer unchanged;
    /// fewer bytes than `bytes_total()` at the end of the file. Bytes the
    /// buffer held are overwritten from its start; those past the count
    /// are left as they were. A buffer of 0 bytes (`bytes_total() == 0`,
    /// e.g. `Vec::new()`) is refused with `InvalidInput` rather than read
    /// into nothing, which would look like the end of the file. Errors are
    /// those of `read`; if an error comes after some bytes were read, the
    /// buffer still counts them.
    ///
    /// The future borrows the context; [`read_owned_static`](Self::read_owned_static)
    /// makes one that can be spawned. Dropping the future while the read is
    /// in the kernel parks `buf` in the context until the kernel is done
    /// with it; forgetting the future ([`mem::forget`](std::mem::forget))
    /// leaks `buf` and the read's slot.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{AlignedBuf, IoBufMut, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[1u8; 8192])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// // A Vec is filled from its start up to its capacity, and handed back.
    /// let (n, buf) = ctx.read_owned(0, 0, Vec::with_capacity(4096)).await;
    /// assert_eq!((n?, buf.len(), buf[0]), (4096, 4096, 1));
    /// // Reused: read again into the same place; at the end of the file
    /// // nothing changes.
    /// let (n, buf) = ctx.read_owned(0, 6000, buf).await;
    /// assert_eq!((n?, buf.len()), (2192, 4096));
    /// let (n, buf) = ctx.read_owned(0, 8192, buf).await;
    /// assert_eq!((n?, buf.len()), (0, 4096));
    /// // A full Vec works the same: its len() stays.
    /// let (n, buf) = ctx.read_owned(0, 0, vec![0u8; 16]).await;
    /// assert_eq!((n?, buf.len()), (16, 16));
    /// // An explicit length: a window of 10 bytes.
    /// let (n, buf) = ctx.read_owned(0, 0, buf.slice(..10)).await;
    /// assert_eq!((n?, buf.into_inner().len()), (10, 16));
    /// // An aligned buffer, as O_DIRECT files need, works the same way.
    /// let (n, buf) = ctx.read_owned(0, 4096, AlignedBuf::with_capacity(4096, 4096)).await;
    /// assert_eq!((n?, buf.len(), buf.align()), (4096, 4096, 4096));
    /// // A buffer of 0 bytes: an error, not a read of nothing.
    /// let (n, _) = ctx.read_owned(0, 0, Vec::new()).await;
    /// assert_eq!(n.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_owned<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringReadOwnedFuture<'_, B> {
        UringReadOwnedFuture::new(self.ctx(), fid.into(), offset, buf)
    }

    /// [`read_owned`](Self::read_owned) as a `'static` future, which holds
    /// a handle to the context instead of borrowing it: pass it to
    /// `tokio::spawn` as it is. It keeps the context alive (as a clone of
    /// this handle would) until it is done or dropped. The handle costs a
    /// reference-count update per read (and one on the ring it goes to),
    /// shared between threads, which `read_owned` avoids — hence two
    /// methods.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[3u8; 8192])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let reads: Vec<_> = (0..2u64)
    ///     .map(|i| tokio::spawn(ctx.read_owned_static(0, i * 4096, Vec::with_capacity(4096))))
    ///     .collect();
    /// drop(ctx); // the spawned reads keep the context alive
    /// for read in reads {
    ///     let (n, buf) = read.await?;
    ///     assert_eq!((n?, buf[0]), (4096, 3));
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_owned_static<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringReadOwnedFuture<'static, B> {
        UringReadOwnedFuture::new(self.ctx_static(), fid.into(), offset, buf)
    }

    /// Reads up to the total length of `bufs` from file `fid` at `offset`
    /// into `bufs`, in order — `preadv(2)` as a future: the first slice is
    /// filled first, and the next is read only once it is full.
    ///
    /// Returns the number of bytes read, as [`read`](Self::read) does
    /// (fewer than the total only at the end of the file; `Ok(0)` past it or
    /// for empty slices), with `read`'s clamping at `i64::MAX`, checks of
    /// `fid`, routing, errors and cancellation. The kernel never writes into
    /// the slices: a ring read goes into one bounce buffer owned by the
    /// operation (in pieces of at most
    /// [`BORROWED_CHUNK`](crate::BORROWED_CHUNK)) and is scattered into the
    /// slices on completion, so dropping the future at any point is sound;
    /// a read the page cache holds is copied straight into the slices with
    /// `preadv2(RWF_NOWAIT)`. [`read_vectored_owned`](Self::read_vectored_owned)
    /// has the kernel write into owned buffers instead.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read); `InvalidInput` for more than 1024
    /// (`IOV_MAX`) slices, as `preadv` would.
    ///
    /// ```
    /// # use std::io::Write;
    /// use std::io::IoSliceMut;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(b"header:body-of-the-block")?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let (mut header, mut body) = ([0u8; 7], [0u8; 64]);
    /// let mut bufs = [IoSliceMut::new(&mut header), IoSliceMut::new(&mut body)];
    /// let n = ctx.read_vectored(0, 0, &mut bufs).await?;
    /// assert_eq!(n, 24); // short: the file ends
    /// assert_eq!((&header, &body[..17]), (b"header:", &b"body-of-the-block"[..]));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_vectored<'a, 'b>(
        &'a self,
        fid: impl Into<FileId>,
        offset: u64,
        bufs: &'a mut [IoSliceMut<'b>],
    ) -> UringReadVectoredFuture<'a, 'b> {
        UringReadVectoredFuture::new(self.ctx(), fid.into(), offset, bufs)
    }

    /// A vectored read into owned buffers with no copy: the kernel writes
    /// straight into each buffer of `bufs` in turn, **each from its start,
    /// at most its `bytes_total()` bytes** (a `Vec`'s capacity; see
    /// [`read_owned`](Self::read_owned)), so the read's length is their
    /// sum — one `IORING_OP_READV` on the ring, `preadv` on the blocking
    /// pool, `preadv2(RWF_NOWAIT)` from the page cache. The buffers come
    /// back with the result, each with its initialised length raised to the
    /// bytes read into it if shorter (never lowered).
    ///
    /// Returns the total number of bytes read, as
    /// [`read_owned`](Self::read_owned) does. Dropping the future while the
    /// read is in the kernel parks the buffers (and the iovec array) in the
    /// context until the kernel is done with them.
    ///
    /// # Errors
    ///
    /// As [`read_owned`](Self::read_owned): buffers of 0 bytes in all (no
    /// buffer, or only empty ones) are `InvalidInput` (an empty buffer
    /// among others is skipped), and so are more than 1024 (`IOV_MAX`)
    /// buffers; the buffers are handed back.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{AlignedBuf, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[9u8; 12288])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let bufs = vec![AlignedBuf::with_capacity(4096, 4096), AlignedBuf::with_capacity(8192, 4096)];
    /// let (n, bufs) = ctx.read_vectored_owned(0, 0, bufs).await;
    /// assert_eq!(n?, 12288);
    /// assert_eq!((bufs[0].len(), bufs[1].len(), bufs[1][8191]), (4096, 8192, 9));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_vectored_owned<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        bufs: Vec<B>,
    ) -> UringReadVectoredOwnedFuture<'_, B> {
        UringReadVectoredOwnedFuture::new(self.ctx(), fid.into(), offset, bufs)
    }

    /// [`read_vectored_owned`](Self::read_vectored_owned) as a `'static`
    /// future holding a handle to the context, for `tokio::spawn` (see
    /// [`read_owned_static`](Self::read_owned_static)).
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(b"0123456789")?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let bufs = vec![Vec::with_capacity(4), Vec::with_capacity(4)];
    /// let (n, bufs) = tokio::spawn(ctx.read_vectored_owned_static(0, 2, bufs)).await?;
    /// assert_eq!((n?, &bufs[0][..], &bufs[1][..]), (8, &b"2345"[..], &b"6789"[..]));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_vectored_owned_static<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        bufs: Vec<B>,
    ) -> UringReadVectoredOwnedFuture<'static, B> {
        UringReadVectoredOwnedFuture::new(self.ctx_static(), fid.into(), offset, bufs)
    }

    /// Fills `buf` with **exactly `bytes_total()` bytes from its start** (a
    /// `Vec`'s capacity, not its `len()`; [`buf.slice(..n)`](IoBufMut::slice)
    /// reads exactly `n`), see [`read_owned`](Self::read_owned), from file
    /// `fid` at `offset`, continuing short reads where they stopped; `buf`
    /// is handed back either way, its initialised length raised to cover
    /// every byte read (never lowered).
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` if the file ends first (the buffer then holds what
    /// was there at its start); `InvalidInput` for a buffer of 0 bytes;
    /// otherwise as [`read`](Self::read)
    /// (`Interrupted` is retried). All pieces read the same file, the one
    /// `fid` named at the first poll.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{AlignedBuf, IoBufMut, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[5u8; 10_000])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let (res, block) = ctx.read_exact_owned(0, 4096, AlignedBuf::with_capacity(4096, 4096)).await;
    /// res?;
    /// assert_eq!(block.len(), 4096);
    /// // 8192 + 4096 is past the end (10 000): the bytes up to it are kept.
    /// let (res, buf) = ctx.read_exact_owned(0, 8192, Vec::with_capacity(4096)).await;
    /// assert_eq!(res.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    /// assert_eq!(buf.len(), 10_000 - 8192);
    /// // A full Vec: exactly its len() (= capacity) bytes, from its start.
    /// let (res, buf) = ctx.read_exact_owned(0, 0, vec![0u8; 100]).await;
    /// res?;
    /// assert_eq!(buf, [5u8; 100]);
    /// // A window of a buffer: exactly bytes 2..6.
    /// let (res, s) = ctx.read_exact_owned(0, 0, vec![0u8; 8].slice(2..6)).await;
    /// res?;
    /// assert_eq!(s.into_inner(), [0, 0, 5, 5, 5, 5, 0, 0]);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_exact_owned<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringReadExactOwnedFuture<'_, B> {
        UringReadExactOwnedFuture::new(self.ctx(), fid.into(), offset, buf)
    }

    /// [`read_exact_owned`](Self::read_exact_owned) as a `'static` future
    /// holding a handle to the context, for `tokio::spawn` (see
    /// [`read_owned_static`](Self::read_owned_static)).
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[4u8; 4096])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let task = tokio::spawn(ctx.read_exact_owned_static(0, 0, Vec::with_capacity(4096)));
    /// let (res, buf) = task.await?;
    /// res?;
    /// assert_eq!(buf, vec![4u8; 4096]);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_exact_owned_static<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringReadExactOwnedFuture<'static, B> {
        UringReadExactOwnedFuture::new(self.ctx_static(), fid.into(), offset, buf)
    }
}
