//! [`UringContext`], the public handle, and its counters ([`Stats`]). Its
//! [`Builder`] (settings, their checks, and the choice of backend) is in
//! `builder.rs`; the state behind the handle, which the ops share, is in
//! `shared.rs`.

use std::fmt;
use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::builder::Builder;
use crate::files::FileRoute;
use crate::id::FileId;
use crate::permit::Priority;
use crate::ring::Ring;
use crate::shared::{Backend, BackendInfo, Ctx, Inner};

mod read;
mod write;

/// Counters since the context was created (a snapshot; see [`UringContext::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops handed to the kernel (ring SQEs, or blocking-pool calls): reads,
    /// and the writes, syncs, `statx`es and opens of the write path.
    pub submitted: u64,
    /// Of those, how many the kernel has completed.
    pub completed: u64,
    /// `io_uring_enter` calls made (by the drivers, and by ops that
    /// submitted while their ring's driver was idle). With SQPOLL only the
    /// calls that were needed (to wake the kernel thread) are made and
    /// counted.
    pub enters: u64,
    /// Reads served on the inline path: at once from the page cache
    /// (`RWF_NOWAIT`), no ring involved.
    pub inline_completed: u64,
    /// Ops the kernel holds right now (`submitted - completed`; with
    /// SQPOLL a completion can be seen before its submission is, so this
    /// never goes below 0).
    pub in_flight: u64,
    /// Times a ring's background driver task ran (io_uring backend): a
    /// measure of wake-ups, to set against `submitted`.
    pub driver_polls: u64,
    /// Cancel requests sent to the kernel for ops (reads, writes, …)
    /// whose future was dropped while the kernel held them (io_uring backend). An op the
    /// kernel can still stop comes back at once with `ECANCELED`, which
    /// frees its in-flight slot; one the device already has completes as
    /// usual.
    pub cancels: u64,
    /// The in-flight slots [`Priority::Latency`] ops took (ring and
    /// blocking-pool ops; the inline path takes none).
    pub latency: ClassStats,
    /// The same for [`Priority::Background`] ops.
    pub background: ClassStats,
}

/// What one priority class's ops took of the in-flight slots (see
/// [`Stats::latency`], [`Stats::background`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Ops that took a slot (an op in pieces takes one per piece).
    pub ops: u64,
    /// Bytes those ops asked to read or write.
    pub bytes: u64,
    /// Of the ops, how many waited for their slot.
    pub waited: u64,
    /// The time they waited, in all.
    pub wait_time: std::time::Duration,
    /// Slots the class holds now.
    pub in_flight: u64,
}

impl ClassStats {
    fn add(self, c: crate::permit::ClassCounts) -> ClassStats {
        ClassStats {
            ops: self.ops + c.ops,
            bytes: self.bytes + c.bytes,
            waited: self.waited + c.waited,
            wait_time: self.wait_time + std::time::Duration::from_nanos(c.wait_ns),
            in_flight: self.in_flight + c.in_flight,
        }
    }
}

impl Stats {
    /// Average ops submitted per `io_uring_enter` (0 when none).
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

/// A handle to io_uring rings (or the fallback backend) serving positioned
/// I/O on a set of files. Cheap to clone; every clone serves the same files.
///
/// See the [crate documentation](crate) for an example.
///
/// # Borrowing futures, `'static` futures and file handles
///
/// The futures of the context's methods borrow the context (no reference
/// count touched per op): they live no longer than `&self`. Every op also
/// has a `'static` form, for `tokio::spawn` without cloning the context by
/// hand, by one rule: **a `'static` future holds the context itself** — it
/// comes from a [`UringFile`](crate::UringFile) or from a `*_static`
/// method, and it keeps the context alive until it is done or dropped (one
/// reference-count update per op).
///
/// - Every op on one file: through its handle, [`file`](Self::file) (or
///   [`open_file`](Self::open_file)) — `read_at_owned`,
///   `read_exact_at_owned`, `read_vectored_at_owned`, `write_at_owned`,
///   `write_all_at_owned`, `sync_all`, `sync_data`, `sync_range`,
///   `fallocate`, `allocate`, `metadata`, `len`, `scan`, `read_batch` are
///   all `'static`; its borrowed-buffer methods (`read_at`, `write_at`, …)
///   borrow only the buffer.
/// - Opening: [`open_file`](Self::open_file), which resolves to a handle.
/// - Batches over several files: [`read_batch_static`](Self::read_batch_static).
/// - The context's older `'static` forms stay:
///   [`read_owned_static`](Self::read_owned_static),
///   [`read_exact_owned_static`](Self::read_exact_owned_static),
///   [`read_vectored_owned_static`](Self::read_vectored_owned_static),
///   [`write_all_owned_static`](Self::write_all_owned_static).
///
/// ```
/// use uring_positioned_io::UringContext;
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
/// let file = ctx.file(0)?;
/// let write = tokio::spawn(file.write_all_at_owned(b"spawned".to_vec(), 0));
/// write.await?.0?;
/// tokio::spawn(file.sync_data()).await??;
/// let reads = (0..2u64).map(|i| (0, i * 4, Vec::with_capacity(3)));
/// let batch = tokio::spawn(ctx.read_batch_static(reads)).await?;
/// assert_eq!(batch[1].1, b"ned");
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone)]
pub struct UringContext {
    pub(crate) inner: Arc<Inner>,
    /// The priority of this handle's ops (see [`with_priority`](Self::with_priority)).
    pub(crate) priority: Priority,
}

/// The backend, the counters, and with `{:#?}` what every ring is doing
/// now (ops queued and in the kernel, the driver's flags, the in-flight
/// slots) and the blocking pool (jobs started and ended, its slots): the
/// dump to take when reads seem stuck.
impl fmt::Debug for UringContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let alternate = f.alternate();
        let mut d = f.debug_struct("UringContext");
        d.field("backend", &self.inner.info)
            .field("priority", &self.priority)
            .field("stats", &self.stats());
        if alternate {
            if let Backend::Uring(rings) = &self.inner.backend {
                d.field("rings", rings);
            }
            d.field("blocking_pool", &self.inner.blocking);
        }
        d.finish()
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

    /// A handle to the same context whose ops — reads, writes, syncs,
    /// batches, opens, and the handles it gives out — have `priority`
    /// (this one's ops keep theirs; a new context's are
    /// [`Priority::Latency`]). Scans are
    /// [`Priority::Background`] whatever the handle's priority, unless
    /// [`ScanOptions::priority`](crate::ScanOptions::priority) says
    /// otherwise.
    ///
    /// ```
    /// use uring_positioned_io::{Priority, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// // Compaction's reads and writes wait while lookups are active.
    /// let compaction = ctx.with_priority(Priority::Background);
    /// compaction.write_all(0, 0, b"merged").await?;
    /// let mut buf = [0u8; 6];
    /// ctx.read_exact(0, 0, &mut buf).await?; // a lookup, at latency priority
    /// assert_eq!(ctx.stats().background.ops, 1);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn with_priority(&self, priority: Priority) -> UringContext {
        UringContext {
            inner: self.inner.clone(),
            priority,
        }
    }

    /// The priority of this handle's ops.
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// How an op of this handle holds the context: borrowed.
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        Ctx::borrowed(&self.inner, self.priority)
    }

    /// How a `'static` op of this handle holds the context: a reference.
    pub(crate) fn ctx_static(&self) -> Ctx<'static> {
        Ctx::shared(self.inner.clone(), self.priority)
    }

    /// Adds a file at run time and returns its id, a checked one (see
    /// [`FileId`]): it works only with this context and only until the file
    /// is unregistered. An index freed by
    /// [`unregister_file`](Self::unregister_file) is reused only once no op
    /// on the old file is left, and then under a new generation, so the old
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

    /// Removes a file. Ops already in flight on it complete (or fail with
    /// `EBADF` if they had not reached the kernel); later ops on `fid` fail
    /// with `InvalidInput`. The file is closed when the last op is done.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `fid` is not registered, or is a checked id of
    /// another context or of a file already unregistered (nothing is
    /// removed then); the kernel's error if it refuses to clear the file
    /// from a ring's table.
    pub fn unregister_file(&self, fid: impl Into<FileId>) -> io::Result<()> {
        let fid = fid.into();
        #[cfg(feature = "cache")]
        let id = self.inner.files.get(fid).map(|file| file.id());
        let removed = self.inner.files.remove(fid, self.inner.fixed());
        // Block caches drop the file's blocks (feature `cache`) once no new
        // read can reach it: a miss that started before this finds its
        // flight gone and caches nothing, one that starts after cannot
        // resolve the file.
        #[cfg(feature = "cache")]
        if let Ok(id) = id {
            self.inner.invalidation.notify(id, 0, u64::MAX);
        }
        removed
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
    /// // Served on the inline path, or through the ring (or the blocking pool).
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
        let mut classes = [ClassStats::default(); 2];
        for counts in std::iter::once(&self.inner.blocking.permits)
            .chain(rings.iter().map(|r| &r.permits))
            .map(crate::permit::Slots::counts)
        {
            for (total, c) in classes.iter_mut().zip(counts) {
                *total = total.add(c);
            }
        }
        let blocking = Stats {
            submitted: c.submitted,
            completed: c.completed,
            in_flight: c.submitted.saturating_sub(c.completed),
            latency: classes[Priority::Latency.index()],
            background: classes[Priority::Background.index()],
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
                ..s
            })
    }

    /// The latency histograms of the context's ops (from their first poll
    /// to their result, per priority class and kind of op), if the context
    /// keeps them ([`Builder::latency_histograms`](crate::Builder::latency_histograms));
    /// `None` otherwise. Counts since the context was built: diff two
    /// snapshots with [`Latencies::since`](crate::Latencies::since).
    ///
    /// ```
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// assert!(ctx.latencies().is_none()); // off by default
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn latencies(&self) -> Option<crate::Latencies> {
        self.inner
            .latencies
            .as_ref()
            .map(crate::latency::Recorder::snapshot)
    }

    /// How the ops on file `fid` are issued: through the rings (straight to
    /// io-wq for a FUSE or network file opted onto them), or on the
    /// blocking pool (`pread`, `pwrite`, ...) and why (every file of a context on the
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

    /// Whether the kernel honours the I/O priority of file `fid`'s
    /// [`Priority::Background`] ops (best effort, level 7): `Some(true)`
    /// when the block device the file is on uses the `bfq` I/O scheduler,
    /// `Some(false)` under another (`none`, the usual one for `NVMe` disks,
    /// and `kyber` ignore priorities; `mq-deadline` separates only classes,
    /// and both of the crate's are best effort), `None` when the file is on
    /// no block device the
    /// kernel names (tmpfs, FUSE, network file systems, overlays) or
    /// `/sys` does not say. The crate's own scheduling of slots (see
    /// [`Priority`]) applies either way.
    ///
    /// Background ring ops carry the priority in their SQE; on the blocking
    /// pool the thread takes it (`ioprio_set(2)`) for the op's syscall.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `fid` is not registered.
    pub fn ioprio_honoured(&self, fid: impl Into<FileId>) -> io::Result<Option<bool>> {
        let file = self.inner.files.get(fid.into())?;
        Ok(crate::sys::io_scheduler(&file.file, file.kind).map(|s| s == "bfq"))
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

    /// Stops accepting ops, cancels what is in flight and waits until the
    /// kernel has returned every op, or until
    /// [`Builder::shutdown_timeout`] has passed. Pending ops resolve with
    /// their result or an error (`ECANCELED`, or "shut down" for ops not
    /// yet submitted); past the timeout, borrowed ops still in the kernel
    /// fail with `TimedOut` (their bounce buffers stay with the context
    /// until the kernel lets go), while owned ops keep waiting for the
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
