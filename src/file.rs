//! [`UringFile`]: one registered file of a context as a value, with std's
//! method names and argument order (`file.read_at(&mut buf, offset)`), and
//! futures that hold the context rather than borrow it. Each method is a
//! thin front for the op the context's method of the same meaning builds;
//! the ops themselves are in `ops/`.

use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::ops::RangeBounds;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};

use crate::batch::ReadBatch;
use crate::buf::{IoBuf, IoBufMut};
use crate::context::UringContext;
use crate::error::shut_down_error;
use crate::flags::{FallocateMode, SyncRange};
use crate::id::FileId;
use crate::ops::open::{OpenOptions, UringOpenFuture};
use crate::ops::read::{UringReadExactOwnedFuture, UringReadFuture, UringReadOwnedFuture};
use crate::ops::readv::{UringReadVectoredFuture, UringReadVectoredOwnedFuture};
use crate::ops::statx::{Statx, UringStatxFuture};
use crate::ops::sync::{Sync, UringSyncFuture};
use crate::ops::write::{
    BorrowedSrc, OwnedSrc, UringWriteAllFuture, UringWriteAllOwnedFuture, UringWriteFuture,
    UringWriteOwnedFuture, Write,
};
use crate::ops::Core;
use crate::permit::Priority;
use crate::scan::{Scan, ScanOptions};
use crate::shared::Ctx;

/// A file registered with a [`UringContext`], as a handle: the context and
/// the file's checked [`FileId`], with the methods of
/// [`std::os::unix::fs::FileExt`] under std's names and argument order —
/// `read_at(&mut buf, offset)`, `write_all_at(&buf, offset)` — and
/// `sync_all`, `sync_data`, `metadata`, `len`, `allocate`, scans and
/// batches. Made by [`UringContext::file`] (for a file registered
/// already) or [`UringContext::open_file`].
///
/// A `UringFile` is cheap to clone (a reference count), `Send + Sync +
/// 'static`, and every future it returns holds the context itself rather
/// than borrowing the handle: the futures of the owned-buffer methods,
/// syncs, `metadata`, `len`, [`read_batch`](Self::read_batch) and
/// [`scan`](Self::scan) are `'static` and can be passed to `tokio::spawn`
/// as they are; those of the borrowed-buffer methods borrow only the
/// buffer. That hold costs one reference-count update per op (shared
/// between threads), which the context's own methods, borrowing it, avoid.
/// The handle keeps the context alive, not the file: after
/// [`UringContext::unregister_file`] every op through it fails with
/// `InvalidInput` (its id is checked, so it never reaches a file registered
/// later at the same index), and after [`UringContext::shutdown`] with the
/// shut-down error.
///
/// The owned-buffer methods behave exactly as the context's
/// ([`UringContext::read_owned`] and the others): the kernel reads into a
/// buffer from its start, at most `bytes_total()` bytes (a `Vec`'s
/// capacity; `buf.slice(..n)` for `n` bytes), and writes its initialised
/// bytes; the buffer comes back with the result.
///
/// ```
/// use uring_positioned_io::{OpenOptions, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let ctx = UringContext::new(vec![])?;
/// let opts = OpenOptions::new().read(true).write(true).create(true).clone();
/// let file = ctx.open_file(dir.path().join("data"), &opts).await?;
///
/// file.write_all_at(b"hello, world", 0).await?;
/// file.sync_data().await?;
/// let mut buf = [0u8; 5];
/// file.read_exact_at(&mut buf, 7).await?;
/// assert_eq!(&buf, b"world");
/// assert_eq!(file.len().await?, 12);
///
/// // Owned buffers and 'static futures: spawn them as they are.
/// let reader = file.clone();
/// let task = tokio::spawn(reader.read_at_owned(Vec::with_capacity(5), 0));
/// let (n, buf) = task.await?;
/// assert_eq!((n?, &buf[..]), (5, &b"hello"[..]));
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone)]
pub struct UringFile {
    ctx: UringContext,
    fid: FileId,
}

impl fmt::Debug for UringFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UringFile")
            .field("fid", &self.fid)
            .field("backend", self.ctx.backend())
            .finish()
    }
}

impl UringContext {
    /// A handle ([`UringFile`]) for the file `fid` names now: a plain index
    /// (`ctx.file(0)`, or a `usize` index into the `Vec` of files) is
    /// turned into the checked id of the file registered there, so the
    /// handle names that registration only.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `fid` names no registered file (as every call
    /// taking it would say); the shut-down error after
    /// [`shutdown`](Self::shutdown).
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?, tempfile::tempfile()?])?;
    /// let files = (0..2usize).map(|i| ctx.file(i)).collect::<std::io::Result<Vec<_>>>()?;
    /// files[1].write_all_at(b"two", 0).await?;
    /// assert_eq!(files[1].len().await?, 3);
    /// assert!(files[1].fid().is_tagged());
    /// assert!(ctx.file(2).is_err());
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn file(&self, fid: impl Into<FileId>) -> io::Result<UringFile> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(shut_down_error());
        }
        let fid = self.inner.files.get(fid.into())?.id();
        Ok(UringFile {
            ctx: self.clone(),
            fid,
        })
    }

    /// [`open`](Self::open) as a `'static` future that resolves to a
    /// handle ([`UringFile`]) of the newly registered file instead of its
    /// id: the form of `open` to pass to `tokio::spawn`. As `open`
    /// otherwise (`open(2)` on the blocking pool, then registered).
    ///
    /// ```
    /// # use uring_positioned_io::{OpenOptions, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let ctx = UringContext::new(vec![])?;
    /// let opts = OpenOptions::new().write(true).create(true).clone();
    /// let file = tokio::spawn(ctx.open_file(dir.path().join("log"), &opts)).await??;
    /// file.write_all_at(b"record", 0).await?;
    /// assert_eq!(std::fs::read(dir.path().join("log"))?, b"record");
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn open_file(&self, path: impl AsRef<Path>, options: &OpenOptions) -> UringOpenFileFuture {
        UringOpenFileFuture {
            open: UringOpenFuture::new(self.ctx_static(), path.as_ref(), options),
            ctx: Some(self.clone()),
        }
    }
}

impl UringFile {
    /// The file's checked id, for the context's own methods.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// let file = ctx.file(0)?;
    /// assert_eq!(file.fid(), ctx.file_id(0)?);
    /// ctx.write_all(file.fid(), 0, b"x").await?;
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn fid(&self) -> FileId {
        self.fid
    }

    /// The context the file is registered with.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// let file = ctx.file(0)?;
    /// assert_eq!(file.context().backend(), ctx.backend());
    /// file.context().unregister_file(file.fid())?;
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn context(&self) -> &UringContext {
        &self.ctx
    }

    /// A handle to the same file whose ops have `priority` (see
    /// [`UringContext::with_priority`]).
    ///
    /// ```
    /// use uring_positioned_io::{Priority, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// let backup = ctx.file(0)?.with_priority(Priority::Background);
    /// assert_eq!(backup.priority(), Priority::Background);
    /// backup.write_all_at(b"copy", 0).await?;
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn with_priority(&self, priority: Priority) -> UringFile {
        UringFile {
            ctx: self.ctx.with_priority(priority),
            fid: self.fid,
        }
    }

    /// The priority of this handle's ops.
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.ctx.priority()
    }

    /// The block size every write to this file must be a multiple of, and
    /// start at: `None` unless the file was opened with `O_DIRECT`; then
    /// the larger of the alignments `statx` reported (offset and memory)
    /// and 4096.
    #[cfg(feature = "append-log")]
    pub(crate) fn direct_block(&self) -> io::Result<Option<usize>> {
        let e = self.ctx.inner.files.get(self.fid)?;
        Ok(e.direct.then(|| {
            e.dio_align
                .map_or(4096, |(mem, off)| mem.max(off) as usize)
                .max(4096)
        }))
    }

    /// The context, held by a future that is to outlive `&self`.
    fn shared(&self) -> Ctx<'static> {
        self.ctx.ctx_static()
    }

    /// Reads up to `buf.len()` bytes at `offset`, as
    /// [`FileExt::read_at`](std::os::unix::fs::FileExt::read_at): returns
    /// the number of bytes read, `Ok(0)` at or past the end of the file or
    /// for an empty `buf`. The future borrows only `buf`; results, errors
    /// and cancellation as [`UringContext::read`].
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"0123456789", 0).await?;
    /// let mut buf = [0u8; 8];
    /// assert_eq!(file.read_at(&mut buf, 6).await?, 4); // short: the file ends
    /// assert_eq!(&buf[..4], b"6789");
    /// assert_eq!(file.read_at(&mut buf, 10).await?, 0);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_at<'a>(&self, buf: &'a mut [u8], offset: u64) -> UringReadFuture<'a> {
        UringReadFuture::new(self.shared(), self.fid, offset, buf)
    }

    /// Fills `buf` from `offset`, continuing short reads, as
    /// [`FileExt::read_exact_at`](std::os::unix::fs::FileExt::read_exact_at);
    /// the future borrows only `buf`.
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` if the file ends first (what `buf` then holds is
    /// unspecified, as for std); otherwise as [`read_at`](Self::read_at).
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[7u8; 100], 0).await?;
    /// let mut buf = [0u8; 50];
    /// file.read_exact_at(&mut buf, 50).await?;
    /// let err = file.read_exact_at(&mut buf, 51).await.unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_exact_at<'a>(
        &self,
        buf: &'a mut [u8],
        offset: u64,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        let file = self.clone();
        async move { file.ctx.read_exact(file.fid, offset, buf).await }
    }

    /// Reads into `bufs` in order from `offset` (`preadv(2)`), as
    /// [`UringContext::read_vectored`]; the future borrows only `bufs`.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// use std::io::IoSliceMut;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"headbody", 0).await?;
    /// let (mut head, mut body) = ([0u8; 4], [0u8; 4]);
    /// let mut bufs = [IoSliceMut::new(&mut head), IoSliceMut::new(&mut body)];
    /// assert_eq!(file.read_vectored_at(&mut bufs, 0).await?, 8);
    /// assert_eq!((&head, &body), (b"head", b"body"));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_vectored_at<'a, 'b>(
        &self,
        bufs: &'a mut [IoSliceMut<'b>],
        offset: u64,
    ) -> UringReadVectoredFuture<'a, 'b> {
        UringReadVectoredFuture::new(self.shared(), self.fid, offset, bufs)
    }

    /// Reads into the owned buffer `buf` at `offset`, with no copy, from
    /// its start, at most `bytes_total()` bytes (a `Vec`'s capacity, not
    /// its `len()`; `buf.slice(..n)` reads `n`), and hands it back with its
    /// initialised length raised to the count if shorter: exactly
    /// [`UringContext::read_owned`], with a `'static` future.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[3u8; 4096], 0).await?;
    /// let (n, buf) = tokio::spawn(file.read_at_owned(Vec::with_capacity(4096), 0)).await?;
    /// assert_eq!((n?, buf.len(), buf[0]), (4096, 4096, 3));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_at_owned<B: IoBufMut>(
        &self,
        buf: B,
        offset: u64,
    ) -> UringReadOwnedFuture<'static, B> {
        UringReadOwnedFuture::new(self.shared(), self.fid, offset, buf)
    }

    /// Fills the owned buffer with exactly `bytes_total()` bytes (a `Vec`'s
    /// capacity; `buf.slice(..n)` for `n`) from `offset`, into its start:
    /// exactly [`UringContext::read_exact_owned`], with a `'static` future.
    ///
    /// ```
    /// # use uring_positioned_io::{AlignedBuf, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[5u8; 8192], 0).await?;
    /// let (res, block) = file.read_exact_at_owned(AlignedBuf::with_capacity(4096, 4096), 4096).await;
    /// res?;
    /// assert_eq!((block.len(), block[4095]), (4096, 5));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_exact_at_owned<B: IoBufMut>(
        &self,
        buf: B,
        offset: u64,
    ) -> UringReadExactOwnedFuture<'static, B> {
        UringReadExactOwnedFuture::new(self.shared(), self.fid, offset, buf)
    }

    /// A vectored read into owned buffers from `offset`, each filled from
    /// its start up to its `bytes_total()` in turn: exactly
    /// [`UringContext::read_vectored_owned`], with a `'static` future.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"01234567", 0).await?;
    /// let bufs = vec![Vec::with_capacity(4), Vec::with_capacity(4)];
    /// let (n, bufs) = file.read_vectored_at_owned(bufs, 0).await;
    /// assert_eq!((n?, &bufs[1][..]), (8, &b"4567"[..]));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_vectored_at_owned<B: IoBufMut>(
        &self,
        bufs: Vec<B>,
        offset: u64,
    ) -> UringReadVectoredOwnedFuture<'static, B> {
        UringReadVectoredOwnedFuture::new(self.shared(), self.fid, offset, bufs)
    }

    /// Writes `buf` at `offset`, as
    /// [`FileExt::write_at`](std::os::unix::fs::FileExt::write_at): returns
    /// the bytes written (a short count is possible, as for `pwrite(2)`).
    /// The future borrows only `buf`; as [`UringContext::write`] otherwise.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// assert_eq!(file.write_at(b"abc", 2).await?, 3);
    /// assert_eq!(file.len().await?, 5); // bytes 0..2 are a hole
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn write_at<'a>(&self, buf: &'a [u8], offset: u64) -> UringWriteFuture<'a> {
        UringWriteFuture {
            core: Core::new(
                self.shared(),
                self.fid,
                Write::new(BorrowedSrc(buf), offset, false),
            ),
        }
    }

    /// Writes all of `buf` at `offset`, continuing short writes, as
    /// [`FileExt::write_all_at`](std::os::unix::fs::FileExt::write_all_at);
    /// the future borrows only `buf`; as [`UringContext::write_all`]
    /// otherwise.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[1u8; 100_000], 0).await?;
    /// assert_eq!(file.len().await?, 100_000);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn write_all_at<'a>(&self, buf: &'a [u8], offset: u64) -> UringWriteAllFuture<'a> {
        UringWriteAllFuture {
            core: Core::new(
                self.shared(),
                self.fid,
                Write::new(BorrowedSrc(buf), offset, true),
            ),
        }
    }

    /// Writes the initialised bytes of the owned buffer `buf` at `offset`,
    /// zero-copy, and hands it back: exactly [`UringContext::write_owned`],
    /// with a `'static` future.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// let (n, buf) = tokio::spawn(file.write_at_owned(vec![9u8; 512], 0)).await?;
    /// assert_eq!((n?, buf.len()), (512, 512));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn write_at_owned<B: IoBuf>(
        &self,
        buf: B,
        offset: u64,
    ) -> UringWriteOwnedFuture<'static, B> {
        UringWriteOwnedFuture {
            core: Core::new(
                self.shared(),
                self.fid,
                Write::new(OwnedSrc::new(buf), offset, false),
            ),
        }
    }

    /// Writes all the initialised bytes of `buf` at `offset`: exactly
    /// [`UringContext::write_all_owned`], with a `'static` future.
    ///
    /// ```
    /// # use uring_positioned_io::{AlignedBuf, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// let mut block = AlignedBuf::new(4096, 4096);
    /// block.fill(7);
    /// let (res, _block) = file.write_all_at_owned(block, 4096).await;
    /// res?;
    /// assert_eq!(file.len().await?, 8192);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn write_all_at_owned<B: IoBuf>(
        &self,
        buf: B,
        offset: u64,
    ) -> UringWriteAllOwnedFuture<'static, B> {
        UringWriteAllOwnedFuture {
            core: Core::new(
                self.shared(),
                self.fid,
                Write::new(OwnedSrc::new(buf), offset, true),
            ),
        }
    }

    fn sync_op(&self, op: Sync) -> UringSyncFuture<'static> {
        UringSyncFuture {
            core: Core::new(self.shared(), self.fid, op),
        }
    }

    /// `fsync(2)`, as [`File::sync_all`](std::fs::File::sync_all) and
    /// [`UringContext::fsync`]: every write that completed before it
    /// started is on stable storage, with the file's metadata.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"durable", 0).await?;
    /// tokio::spawn(file.sync_all()).await??;
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn sync_all(&self) -> UringSyncFuture<'static> {
        self.sync_op(Sync::Fsync { datasync: false })
    }

    /// `fdatasync(2)`, as [`File::sync_data`](std::fs::File::sync_data)
    /// and [`UringContext::fdatasync`].
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"record", 0).await?;
    /// file.sync_data().await?;
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn sync_data(&self) -> UringSyncFuture<'static> {
        self.sync_op(Sync::Fsync { datasync: true })
    }

    /// `sync_file_range(2)` of `len` bytes at `offset` (`len` 0: to the end
    /// of the file), as [`UringContext::sync_file_range`]: writeback
    /// pacing, not durability.
    ///
    /// ```
    /// # use uring_positioned_io::{SyncRange, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[0u8; 8192], 0).await?;
    /// file.sync_range(0, 0, SyncRange::WRITE_AND_WAIT).await?;
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn sync_range(&self, offset: u64, len: u32, flags: SyncRange) -> UringSyncFuture<'static> {
        self.sync_op(Sync::range(offset, len, flags))
    }

    /// `fallocate(2)` of `len` bytes at `offset` with `mode`, as
    /// [`UringContext::fallocate`].
    ///
    /// ```
    /// # use uring_positioned_io::{FallocateMode, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// // Reserve 1 MiB beyond the end without changing the size (if the
    /// // file system can).
    /// match file.fallocate(FallocateMode::KEEP_SIZE, 0, 1 << 20).await {
    ///     Ok(()) => assert_eq!(file.len().await?, 0),
    ///     Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP)),
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn fallocate(
        &self,
        mode: FallocateMode,
        offset: u64,
        len: u64,
    ) -> UringSyncFuture<'static> {
        self.sync_op(Sync::fallocate(mode, offset, len))
    }

    /// Allocates `len` bytes at `offset`, extending the file if it ends
    /// before `offset + len` (`fallocate(2)` with mode 0,
    /// [`FallocateMode::ALLOCATE`]). There is no `set_len`: the crate has
    /// no `ftruncate` op; shrink a file through its `std::fs::File`.
    ///
    /// # Errors
    ///
    /// `EINVAL` from the kernel for a `len` of 0; as
    /// [`fallocate`](Self::fallocate) otherwise.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.allocate(0, 4096).await?;
    /// assert_eq!(file.len().await?, 4096);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn allocate(&self, offset: u64, len: u64) -> UringSyncFuture<'static> {
        self.fallocate(FallocateMode::ALLOCATE, offset, len)
    }

    /// The file's metadata through `statx(2)` (size, allocation, `O_DIRECT`
    /// alignment), as [`UringContext::statx`].
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[1u8; 10], 0).await?;
    /// let st = tokio::spawn(file.metadata()).await??;
    /// assert_eq!(st.size, 10);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn metadata(&self) -> UringStatxFuture<'static> {
        UringStatxFuture {
            core: Core::new(self.shared(), self.fid, Statx::new()),
        }
    }

    /// The file's size in bytes, through [`metadata`](Self::metadata)
    /// (for a block device, the device's size). An `async` query (a
    /// `statx`), hence no `is_empty`.
    ///
    /// # Errors
    ///
    /// As [`metadata`](Self::metadata).
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// assert_eq!(file.len().await?, 0);
    /// file.write_all_at(b"x", 99).await?;
    /// assert_eq!(file.len().await?, 100);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[allow(
        clippy::len_without_is_empty,
        reason = "an async statx, not a collection's length"
    )]
    pub fn len(&self) -> impl Future<Output = io::Result<u64>> + Send + 'static {
        let stat = self.metadata();
        async move { Ok(stat.await?.size) }
    }

    /// A `'static` scan of `range` of the file with default
    /// [`ScanOptions`]: as [`ScanOptions::scan`], holding the context.
    ///
    /// # Errors
    ///
    /// As [`ScanOptions::scan`].
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// use futures::TryStreamExt;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[2u8; 300_000], 0).await?;
    /// let scan = file.scan(..)?;
    /// let total = tokio::spawn(async move {
    ///     scan.try_fold(0, |n, chunk| async move { Ok(n + chunk.len()) }).await
    /// });
    /// assert_eq!(total.await??, 300_000);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn scan(&self, range: impl RangeBounds<u64>) -> io::Result<Scan<'static>> {
        self.scan_with(&ScanOptions::new(), range)
    }

    /// [`scan`](Self::scan) with `options`.
    ///
    /// # Errors
    ///
    /// As [`ScanOptions::scan`].
    ///
    /// ```
    /// # use uring_positioned_io::{ScanOptions, UringContext};
    /// use futures::StreamExt;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[2u8; 10_000], 0).await?;
    /// let opts = ScanOptions::new().chunk_size(4096).in_flight(2);
    /// let mut scan = file.scan_with(&opts, 100..9000)?;
    /// let first = scan.next().await.expect("a chunk")?;
    /// assert_eq!((first.offset(), first.len()), (100, 3996));
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn scan_with(
        &self,
        options: &ScanOptions,
        range: impl RangeBounds<u64>,
    ) -> io::Result<Scan<'static>> {
        options.scan_in(self.shared(), self.fid, range)
    }

    /// Reads many `(buffer, offset)` of the file at once, each into the
    /// buffer from its start, at most `bytes_total()` bytes (a `Vec`'s
    /// capacity): [`UringContext::read_batch`] for this file
    /// (merging, unordered results and all), as a `'static` batch.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[4u8; 16384], 0).await?;
    /// let reads = (0..4u64).map(|i| (Vec::with_capacity(4096), i * 4096));
    /// for (res, block) in tokio::spawn(file.read_batch(reads)).await? {
    ///     assert_eq!((res?, block[0]), (4096, 4));
    /// }
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_batch<B, I>(&self, reads: I) -> ReadBatch<'static, B>
    where
        B: IoBufMut,
        I: IntoIterator<Item = (B, u64)>,
    {
        let fid = self.fid;
        ReadBatch::new(
            self.shared(),
            reads
                .into_iter()
                .map(|(buf, offset)| (fid, offset, buf))
                .collect(),
        )
    }
}

/// The future of [`UringContext::open_file`]: `'static`; resolves to a
/// handle of the newly registered file. Dropped before it resolves, the
/// file may or may not have been opened (and created); if it was, it is
/// closed again and never registered (as [`UringOpenFuture`]).
///
/// ```
/// # use uring_positioned_io::{OpenOptions, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![])?;
/// let missing = ctx.open_file("/no/such/file", OpenOptions::new().read(true));
/// assert_eq!(missing.await.unwrap_err().kind(), std::io::ErrorKind::NotFound);
/// # Ok(())
/// # })
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct UringOpenFileFuture {
    open: UringOpenFuture<'static>,
    /// Taken when the future resolves.
    ctx: Option<UringContext>,
}

impl Future for UringOpenFileFuture {
    type Output = io::Result<UringFile>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let res = ready!(Pin::new(&mut this.open).poll(cx));
        let ctx = this
            .ctx
            .take()
            .expect("UringOpenFileFuture polled after completion");
        Poll::Ready(res.map(|fid| UringFile { ctx, fid }))
    }
}

impl fmt::Debug for UringOpenFileFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UringOpenFileFuture")
            .field(&self.open)
            .finish()
    }
}

// The handle and the futures of its owned-buffer methods are `Send +
// 'static` (spawnable), and the handle `Sync`: part of the API.
const _: fn() = || {
    fn send_sync_static<T: Send + std::marker::Sync + 'static>() {}
    fn send_static<T: Send + 'static>() {}
    send_sync_static::<UringFile>();
    send_static::<UringOpenFileFuture>();
    send_static::<UringSyncFuture<'static>>();
    send_static::<UringStatxFuture<'static>>();
    send_static::<ReadBatch<'static, Vec<u8>>>();
};
