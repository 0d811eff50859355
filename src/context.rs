//! [`UringContext`], the public handle, and its counters ([`Stats`]). Its
//! [`Builder`] (settings, their checks, and the choice of backend) is in
//! `builder.rs`; the state behind the handle, which the ops share, is in
//! `shared.rs`.

use std::fmt;
use std::fs::File;
use std::io::{self, IoSliceMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::buf::IoBufMut;
use crate::builder::Builder;
use crate::files::FileRoute;
use crate::id::FileId;
use crate::read::{
    Borrowed, ReadCore, UringReadExactOwnedFuture, UringReadFuture, UringReadOwnedFuture,
};
use crate::ring::Ring;
use crate::shared::{Backend, BackendInfo, Ctx, Inner};
use crate::vectored::{UringReadVectoredFuture, UringReadVectoredOwnedFuture};

/// Counters since the context was created (a snapshot; see [`UringContext::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops handed to the kernel (ring SQEs, or blocking-pool calls): reads,
    /// and the writes, syncs, `statx`es and opens of the write path.
    pub submitted: u64,
    /// Of those, how many the kernel has completed.
    pub completed: u64,
    /// `io_uring_enter` calls made (by the drivers, and by readers that
    /// submitted while their ring's driver was idle). With SQPOLL only the
    /// calls that were needed (to wake the kernel thread) are made and
    /// counted.
    pub enters: u64,
    /// Reads served at once from the page cache (`RWF_NOWAIT`), no ring involved.
    pub inline_completed: u64,
    /// Ops the kernel holds right now (`submitted - completed`; with
    /// SQPOLL a completion can be seen before its submission is, so this
    /// never goes below 0).
    pub in_flight: u64,
    /// Times a ring's background driver task ran (io_uring backend): a
    /// measure of wake-ups, to set against `submitted`.
    pub driver_polls: u64,
    /// Cancel requests sent to the kernel for ops (reads, writes, …)
    /// whose future was dropped while the kernel held them (io_uring backend). A read the
    /// kernel can still stop comes back at once with `ECANCELED`, which
    /// frees its in-flight slot; one the device already has completes as
    /// usual.
    pub cancels: u64,
}

impl Stats {
    /// Average reads submitted per `io_uring_enter` (0 when none).
    #[must_use]
    #[allow(
        clippy::cast_precision_loss,
        reason = "a ratio: counts beyond 2^52 lose digits no one reads"
    )]
    pub fn reads_per_enter(&self) -> f64 {
        if self.enters == 0 {
            0.0
        } else {
            self.submitted as f64 / self.enters as f64
        }
    }
}

/// A handle to io_uring rings (or the fallback) serving positioned reads of
/// a set of files. Cheap to clone; every clone serves the same files.
///
/// See the [crate documentation](crate) for an example.
#[derive(Clone)]
pub struct UringContext {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for UringContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringContext")
            .field("backend", &self.inner.info)
            .field("stats", &self.stats())
            .finish()
    }
}

impl UringContext {
    /// A context with default settings over `files`. Each file's index in
    /// the `Vec` names it (`ctx.read(0u32, ..)`); [`file_ids`](Self::file_ids)
    /// gives checked ids for them (see [`FileId`]). Must be called inside a
    /// tokio runtime.
    ///
    /// # Errors
    ///
    /// As [`Builder::build`].
    pub fn new(files: Vec<File>) -> io::Result<UringContext> {
        Builder::default().build(files)
    }

    /// A builder for non-default settings.
    #[must_use]
    pub fn builder() -> Builder {
        Builder::default()
    }

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
        UringReadFuture {
            core: ReadCore::new(
                Ctx::Borrowed(&self.inner),
                fid.into(),
                offset,
                Borrowed(buf),
            ),
        }
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
    /// into `buf`'s **spare capacity**, `bytes_init()..bytes_total()` (a
    /// `Vec`'s `len()..capacity()`), and `buf` is handed back with the
    /// result, its initialised length grown by the bytes read (`Vec::set_len`).
    /// `buf` may be a [`Vec<u8>`], an [`AlignedBuf`](crate::AlignedBuf)
    /// (for `O_DIRECT`), a `bytes::BytesMut` (with the `bytes` feature), a
    /// [`Slice`](crate::Slice) of any of them (a window, filled from its
    /// start: [`IoBufMut::slice`]), or your own [`IoBufMut`].
    ///
    /// Returns the number of bytes read, as [`read`](Self::read) does:
    /// `Ok(0)` at or past the end of the file, with the buffer unchanged;
    /// fewer bytes than the spare capacity at the end of the file. A buffer
    /// with *no* spare capacity (`bytes_init() == bytes_total() > 0`, e.g.
    /// `vec![0u8; n]`) is refused with `InvalidInput` rather than read into
    /// nothing, which would look like the end of the file; an empty one
    /// (`Vec::new()`) reads `Ok(0)`. Errors are those of `read`; if an error
    /// comes after some bytes were read, the buffer still grows by them.
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
    /// // A Vec is filled from len() up to its capacity, and handed back.
    /// let (n, buf) = ctx.read_owned(0, 0, Vec::with_capacity(4096)).await;
    /// assert_eq!((n?, buf.len(), buf[0]), (4096, 4096, 1));
    /// // Reading again appends; at the end of the file nothing changes.
    /// let mut buf = buf;
    /// buf.reserve_exact(4096);
    /// let (n, buf) = ctx.read_owned(0, 4096, buf).await;
    /// assert_eq!((n?, buf.len()), (4096, 8192));
    /// let (n, buf) = ctx.read_owned(0, 8192, buf.slice(..10)).await; // a window
    /// assert_eq!((n?, buf.into_inner().len()), (0, 8192));
    /// // An aligned buffer, as O_DIRECT files need, works the same way.
    /// let (n, buf) = ctx.read_owned(0, 4096, AlignedBuf::with_capacity(4096, 4096)).await;
    /// assert_eq!((n?, buf.len(), buf.align()), (4096, 4096, 4096));
    /// // A full buffer has no room: an error, not a read of nothing.
    /// let (n, _) = ctx.read_owned(0, 0, vec![0u8; 16]).await;
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
        UringReadOwnedFuture::new(Ctx::Borrowed(&self.inner), fid.into(), offset, buf)
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
        UringReadOwnedFuture::new(Ctx::Shared(self.inner.clone()), fid.into(), offset, buf)
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
        UringReadVectoredFuture::new(Ctx::Borrowed(&self.inner), fid.into(), offset, bufs)
    }

    /// A vectored read into owned buffers with no copy: the kernel writes
    /// straight into the **spare capacity** of each buffer of `bufs`
    /// (`bytes_init()..bytes_total()`, see [`read_owned`](Self::read_owned)),
    /// in order — one `IORING_OP_READV` on the ring, `preadv` on the
    /// blocking pool, `preadv2(RWF_NOWAIT)` from the page cache. The buffers
    /// come back with the result, each grown by the bytes read into it.
    ///
    /// Returns the total number of bytes read, as
    /// [`read_owned`](Self::read_owned) does. Dropping the future while the
    /// read is in the kernel parks the buffers (and the iovec array) in the
    /// context until the kernel is done with them.
    ///
    /// # Errors
    ///
    /// As [`read_owned`](Self::read_owned): a buffer with no spare capacity
    /// (`bytes_init() == bytes_total() > 0`) is `InvalidInput`, and so are
    /// more than 1024 (`IOV_MAX`) buffers; the buffers are handed back.
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
        UringReadVectoredOwnedFuture::new(Ctx::Borrowed(&self.inner), fid.into(), offset, bufs)
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
        UringReadVectoredOwnedFuture::new(Ctx::Shared(self.inner.clone()), fid.into(), offset, bufs)
    }

    /// Fills `buf`'s whole spare capacity (`bytes_init()..bytes_total()`,
    /// see [`read_owned`](Self::read_owned)) from file `fid` at `offset`,
    /// continuing short reads; `buf` is handed back either way, its
    /// initialised length grown by every byte read.
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` if the file ends first (the buffer then holds what
    /// was there); `InvalidInput` for a buffer with no spare capacity (and
    /// `bytes_total() > 0`); otherwise as [`read`](Self::read)
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
        UringReadExactOwnedFuture::new(Ctx::Borrowed(&self.inner), fid.into(), offset, buf)
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
        UringReadExactOwnedFuture::new(Ctx::Shared(self.inner.clone()), fid.into(), offset, buf)
    }

    /// Adds a file at run time and returns its id, a checked one (see
    /// [`FileId`]): it works only with this context and only until the file
    /// is unregistered. An index freed by
    /// [`unregister_file`](Self::unregister_file) is reused only once no read
    /// of the old file is left, and then under a new generation, so the old
    /// id stays an error.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `file` is not a regular file or block device; an
    /// error if the file table is full ([`Builder::max_files`]), the
    /// context is shut down, or the kernel refuses the registration.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![])?;
    /// let fid = ctx.register_file(tempfile::tempfile()?)?;
    /// let mut buf = [0u8; 16];
    /// assert_eq!(ctx.read(fid, 0, &mut buf).await?, 0); // an empty file
    /// ctx.unregister_file(fid)?;
    /// assert!(ctx.read(fid, 0, &mut buf).await.is_err()); // InvalidInput
    /// // Its index may be reused; the old id still names only the old file.
    /// let again = ctx.register_file(tempfile::tempfile()?)?;
    /// assert!(ctx.read(fid, 0, &mut buf).await.is_err());
    /// assert_eq!(ctx.read(again, 0, &mut buf).await?, 0);
    /// // Only files that support positioned reads are accepted.
    /// let dir = std::fs::File::open(std::env::temp_dir())?;
    /// assert!(ctx.register_file(dir).is_err());
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn register_file(&self, file: File) -> io::Result<FileId> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(crate::error::shut_down_error());
        }
        let facts = crate::files::Facts::of(&file, &"the file passed to register_file")?;
        self.inner.files.insert(file, facts, self.inner.fixed())
    }

    /// Removes a file. Reads already in flight on it complete (or fail with
    /// `EBADF` if they had not reached the kernel); later reads of `fid` fail
    /// with `InvalidInput`. The file is closed when the last read is done.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `fid` is not registered, or is a checked id of
    /// another context or of a file already unregistered (nothing is
    /// removed then); the kernel's error if it refuses to clear the file
    /// from a ring's table.
    pub fn unregister_file(&self, fid: impl Into<FileId>) -> io::Result<()> {
        self.inner.files.remove(fid.into(), self.inner.fixed())
    }

    /// The checked id (see [`FileId`]) of the file registered at `index` now:
    /// for the files given to [`new`](Self::new) or
    /// [`Builder::build`], `index` is their position in the `Vec`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if no file is registered at `index`.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?, tempfile::tempfile()?])?;
    /// let second = ctx.file_id(1)?;
    /// assert_eq!((second.index(), second.is_tagged()), (1, true));
    /// assert!(ctx.file_id(2).is_err());
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn file_id(&self, index: u32) -> io::Result<FileId> {
        self.inner.files.get(FileId::from(index)).map(|e| e.id())
    }

    /// The checked ids (see [`FileId`]) of every file registered now, in
    /// index order: right after [`new`](Self::new), one per file of the
    /// `Vec`, in its order.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?, tempfile::tempfile()?])?;
    /// let fids = ctx.file_ids();
    /// assert_eq!(fids.iter().map(|f| f.index()).collect::<Vec<_>>(), [0, 1]);
    /// let mut buf = [0u8; 8];
    /// for fid in fids {
    ///     assert_eq!(ctx.read(fid, 0, &mut buf).await?, 0); // empty files
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn file_ids(&self) -> Vec<FileId> {
        self.inner.files.ids()
    }

    /// Which backend runs, and why.
    #[must_use]
    pub fn backend(&self) -> &BackendInfo {
        &self.inner.info
    }

    /// A snapshot of the counters.
    #[must_use]
    ///
    /// ```
    /// # use std::io::Write;
    /// # use uring_positioned_io::{BackendKind, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[0u8; 4096])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// let mut buf = [0u8; 512];
    /// ctx.read(0, 0, &mut buf).await?;
    /// let s = ctx.stats();
    /// // Served from the page cache inline, or through the ring (or pread).
    /// assert!(s.inline_completed + s.completed >= 1);
    /// if ctx.backend().kind == BackendKind::Fallback {
    ///     eprintln!("no io_uring here: {}", ctx.backend());
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        let rings: &[Arc<Ring>] = match &self.inner.backend {
            Backend::Uring(rings) => rings,
            Backend::Fallback => &[],
        };
        let c = self.inner.blocking.counters();
        let blocking = Stats {
            submitted: c.submitted,
            completed: c.completed,
            in_flight: c.submitted.saturating_sub(c.completed),
            ..Stats::default()
        };
        rings
            .iter()
            .map(|r| r.counters())
            .fold(blocking, |s, c| Stats {
                submitted: s.submitted + c.submitted,
                completed: s.completed + c.completed,
                enters: s.enters + c.enters,
                inline_completed: s.inline_completed + c.inline,
                in_flight: s.in_flight + c.submitted.saturating_sub(c.completed),
                driver_polls: s.driver_polls + c.driver_polls,
                cancels: s.cancels + c.cancels,
            })
    }

    /// How reads of file `fid` are issued: through the rings (straight to
    /// io-wq for a FUSE or network file opted onto them), or through
    /// `pread` on the blocking pool and why (every file of a context on the
    /// fallback backend; files on a file system where io_uring is not
    /// trustworthy, such as FUSE — see the design document).
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `fid` is not registered.
    ///
    /// ```
    /// use uring_positioned_io::{BackendKind, FileRoute, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// match ctx.file_route(0)? {
    ///     FileRoute::Ring => assert_eq!(ctx.backend().kind, BackendKind::IoUring),
    ///     FileRoute::RingAsync(why) => println!("file #0 is read through io-wq: {why}"),
    ///     FileRoute::BlockingPool(why) => println!("file #0 is read with pread: {why}"),
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn file_route(&self, fid: impl Into<FileId>) -> io::Result<FileRoute> {
        let file = self.inner.files.get(fid.into())?;
        Ok(match self.inner.backend {
            Backend::Fallback => {
                FileRoute::BlockingPool("the context runs on the fallback backend")
            }
            Backend::Uring(_) => file.route,
        })
    }

    /// Whether file `fid` was opened with `O_DIRECT`; for an id this
    /// context refuses, the `InvalidInput` every call taking it gives.
    pub(crate) fn file_is_direct(&self, fid: FileId) -> io::Result<bool> {
        self.inner.files.get(fid).map(|f| f.direct)
    }

    /// Whether the bounce buffers are registered with the kernel (io_uring
    /// backend; false when RLIMIT_MEMLOCK did not allow it).
    #[must_use]
    pub fn buffers_registered(&self) -> bool {
        match &self.inner.backend {
            Backend::Uring(rings) => rings.iter().all(|r| r.buffers_registered()),
            Backend::Fallback => false,
        }
    }

    /// Stops accepting reads, cancels what is in flight and waits until the
    /// kernel has returned every read, or until
    /// [`Builder::shutdown_timeout`] has passed. Pending reads resolve with
    /// their data or an error (`ECANCELED`, or "shut down" for reads not
    /// yet submitted); past the timeout, borrowed reads still in the kernel
    /// fail with `TimedOut` (their bounce buffers stay with the context
    /// until the kernel lets go), while owned reads keep waiting for the
    /// kernel, since their buffer cannot be handed back before it is done.
    /// Every handle sees the shutdown.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// let other = ctx.clone();
    /// ctx.shutdown().await;
    /// let mut buf = [0u8; 8];
    /// assert!(other.read(0, 0, &mut buf).await.is_err()); // every handle sees it
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Release);
        if let Backend::Uring(rings) = &self.inner.backend {
            rings.iter().for_each(|r| r.close());
        }
        let blocking = &self.inner.blocking;
        blocking.close();
        if let Backend::Uring(rings) = &self.inner.backend {
            for r in rings {
                r.wait_drained().await;
            }
        }
        blocking.wait_idle(self.inner.shutdown_timeout).await;
    }
}
