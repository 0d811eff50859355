//! The public methods of [`UringContext`] that write, make durable, ask
//! for metadata and open files; their ops are in `ops/`.

use std::io;
use std::path::Path;

use super::UringContext;
use crate::buf::IoBuf;
use crate::flags::{FallocateMode, SyncRange};
use crate::id::FileId;
use crate::ops::open::{OpenOptions, UringOpenFuture};
use crate::ops::statx::{Statx, UringStatxFuture};
use crate::ops::sync::{Sync, UringSyncFuture};
use crate::ops::write::{
    BorrowedSrc, OwnedSrc, UringWriteAllFuture, UringWriteAllOwnedFuture, UringWriteFuture,
    UringWriteOwnedFuture, Write,
};
use crate::ops::Core;

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
            core: Core::new(
                self.ctx(),
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
            core: Core::new(
                self.ctx(),
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
            core: Core::new(
                self.ctx(),
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
            core: Core::new(
                self.ctx(),
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
            core: Core::new(
                self.ctx_static(),
                fid.into(),
                Write::new(OwnedSrc::new(buf), offset, true),
            ),
        }
    }

    fn sync_op(&self, fid: FileId, op: Sync) -> UringSyncFuture<'_> {
        UringSyncFuture {
            core: Core::new(self.ctx(), fid, op),
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
    /// of the file) with `flags` (see [`SyncRange`]). It starts or
    /// waits for writeback of data only — no metadata, no device cache
    /// flush — so it **does not make writes durable**; use it to pace
    /// writeback, and [`fdatasync`](Self::fdatasync) to commit.
    ///
    /// ```
    /// use uring_positioned_io::{SyncRange, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// ctx.write_all(0, 0, &[1u8; 4096]).await?;
    /// ctx.sync_file_range(0, 0, 4096, SyncRange::WRITE).await?;
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn sync_file_range(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        len: u32,
        flags: SyncRange,
    ) -> UringSyncFuture<'_> {
        self.sync_op(fid.into(), Sync::range(offset, len, flags))
    }

    /// `fallocate(2)` of `len` bytes at `offset` with `mode` (see
    /// [`FallocateMode`]; [`FallocateMode::ALLOCATE`] allocates and extends
    /// the file). Errors as the kernel's (`EOPNOTSUPP` where the file
    /// system has no such mode, `EINVAL` for a `len` of 0),
    /// `InvalidInput` for a range beyond `i64::MAX`.
    ///
    /// ```
    /// use uring_positioned_io::{FallocateMode, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// ctx.fallocate(0, FallocateMode::ALLOCATE, 0, 1 << 20).await?;
    /// assert_eq!(ctx.file_size(0).await?, 1 << 20);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn fallocate(
        &self,
        fid: impl Into<FileId>,
        mode: FallocateMode,
        offset: u64,
        len: u64,
    ) -> UringSyncFuture<'_> {
        self.sync_op(fid.into(), Sync::fallocate(mode, offset, len))
    }

    /// `statx(2)` of file `fid` (`IORING_OP_STATX`): its size, allocation
    /// and `O_DIRECT` alignment needs.
    pub fn statx(&self, fid: impl Into<FileId>) -> UringStatxFuture<'_> {
        UringStatxFuture {
            core: Core::new(self.ctx(), fid.into(), Statx::new()),
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
        UringOpenFuture::new(self.ctx(), path.as_ref(), options)
    }
}
