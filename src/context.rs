//! [`UringContext`], its [`Builder`], and the small public types around them.

use std::fmt;
use std::fs::File;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::buf::IoBufMut;
use crate::fallback::Fallback;
use crate::files::{FileTable, FixedFiles};
use crate::read::{Borrowed, Owned, ReadCore, UringReadFuture, UringReadOwnedFuture};
use crate::ring::{Driver, Ring, RingConfig};

/// Index of a file registered with a [`UringContext`]: its position in the
/// `Vec` given to [`UringContext::new`], or what
/// [`UringContext::register_file`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u32);

impl FileId {
    /// The raw index.
    pub fn index(self) -> u32 {
        self.0
    }
}

impl From<u32> for FileId {
    fn from(index: u32) -> Self {
        FileId(index)
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file #{}", self.0)
    }
}

/// Which backend a context runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// io_uring rings driven by background tasks.
    IoUring,
    /// `pread` on tokio's blocking thread pool.
    Fallback,
}

/// The backend the builder should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// io_uring, or the fallback when io_uring cannot be set up here
    /// (ENOSYS, EPERM/EACCES from seccomp or `kernel.io_uring_disabled`,
    /// ENOMEM from RLIMIT_MEMLOCK, EINVAL from an older kernel).
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// Always the fallback.
    Fallback,
}

/// Which backend runs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The backend in use.
    pub kind: BackendKind,
    /// Why the fallback runs (absent for io_uring).
    pub reason: Option<String>,
}

impl fmt::Display for BackendInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.kind, &self.reason) {
            (BackendKind::IoUring, _) => f.write_str("io_uring"),
            (BackendKind::Fallback, Some(r)) => write!(f, "pread fallback ({r})"),
            (BackendKind::Fallback, None) => f.write_str("pread fallback"),
        }
    }
}

/// Counters since the context was created (a snapshot; see [`UringContext::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Reads handed to the kernel (ring SQEs, or blocking-pool `pread`s).
    pub submitted: u64,
    /// Of those, how many the kernel has completed.
    pub completed: u64,
    /// `io_uring_enter` calls made to submit them (with SQPOLL: submit
    /// rounds, some of which need no syscall).
    pub enters: u64,
    /// Reads served at once from the page cache (`RWF_NOWAIT`), no ring involved.
    pub inline_completed: u64,
    /// Reads the kernel holds right now (`submitted - completed`).
    pub in_flight: u64,
}

impl Stats {
    /// Average reads submitted per `io_uring_enter` (0 when none).
    pub fn reads_per_enter(&self) -> f64 {
        if self.enters == 0 {
            0.0
        } else {
            self.submitted as f64 / self.enters as f64
        }
    }
}

pub(crate) enum Backend {
    Uring(Box<[Arc<Ring>]>),
    Fallback(Fallback),
}

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    pub(crate) files: FileTable,
    pub(crate) inline_nowait: bool,
    /// How long a thread may do inline reads before it yields.
    pub(crate) inline_stretch: Duration,
    /// Set by `shutdown`: every new read fails, the inline path included.
    pub(crate) closed: AtomicBool,
    info: BackendInfo,
}

impl Inner {
    fn fixed(&self) -> &dyn FixedFiles {
        struct NoRings;
        impl FixedFiles for NoRings {
            fn update(&self, _: u32, _: i32) -> io::Result<()> {
                Ok(())
            }
        }
        match &self.backend {
            Backend::Uring(rings) => rings,
            Backend::Fallback(_) => &NoRings,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No read future can outlive the last handle (they borrow it), but
        // abandoned reads may still be in the kernel: the drivers reap them
        // and exit; each ring is freed only after that (see `Ring::drop`).
        match &self.backend {
            Backend::Uring(rings) => rings.iter().for_each(|r| r.close()),
            Backend::Fallback(fb) => fb.close(),
        }
    }
}

/// Configures a [`UringContext`]. Start from [`UringContext::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    ring_entries: u32,
    rings: Option<usize>,
    max_in_flight: Option<usize>,
    sqpoll: Option<Duration>,
    coop_taskrun: bool,
    pool: Option<(usize, usize)>,
    inline_nowait: bool,
    backend: BackendChoice,
    max_files: Option<u32>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            ring_entries: 256,
            rings: None,
            max_in_flight: None,
            sqpoll: None,
            coop_taskrun: false,
            pool: None,
            inline_nowait: true,
            backend: BackendChoice::Auto,
            max_files: None,
        }
    }
}

const DEFAULT_IN_FLIGHT_PER_RING: usize = 512;
const DEFAULT_POOL_BUF: usize = 16 * 1024;
/// Each fallback read occupies a blocking-pool thread: more than a few dozen
/// runnable threads only add context switches (and starve the runtime's own
/// threads) without adding device parallelism worth having.
const DEFAULT_FALLBACK_IN_FLIGHT: usize = 64;

impl Builder {
    /// Submission-queue entries per ring (1..=32768; default 256). More reads
    /// than this may be queued: the rest wait in a backlog and go out with
    /// the next enter.
    pub fn ring_entries(mut self, entries: u32) -> Self {
        self.ring_entries = entries;
        self
    }

    /// Number of rings (default: the runtime's worker count). Each worker
    /// thread submits to its own ring, so the kernel work of submitting is
    /// spread over the threads.
    pub fn rings(mut self, rings: usize) -> Self {
        self.rings = Some(rings);
        self
    }

    /// Reads in the kernel at once, over all rings (default 512 per ring).
    /// Further reads wait asynchronously for a slot.
    pub fn max_in_flight(mut self, reads: usize) -> Self {
        self.max_in_flight = Some(reads);
        self
    }

    /// Use a kernel submission-polling thread that sleeps after `idle`
    /// (`None`: off, the default). Costs a kernel thread spinning while busy.
    pub fn sqpoll(mut self, idle: Option<Duration>) -> Self {
        self.sqpoll = idle;
        self
    }

    /// `IORING_SETUP_COOP_TASKRUN`: the kernel does not interrupt the thread
    /// to run completion work; the driver re-enters every 200 µs while reads
    /// are out instead. Only accepted on a `current_thread` runtime with the
    /// time driver enabled, where that keeps every completion reachable.
    pub fn coop_taskrun(mut self, on: bool) -> Self {
        self.coop_taskrun = on;
        self
    }

    /// Bounce buffers per ring for [`UringContext::read`]: `count` buffers of
    /// `size` bytes (rounded up to 4 KiB), registered with the ring when
    /// RLIMIT_MEMLOCK allows. Default: one per in-flight read, 16 KiB each.
    /// Larger reads get a one-off buffer.
    pub fn buffer_pool(mut self, count: usize, size: usize) -> Self {
        self.pool = Some((count, size));
        self
    }

    /// Try `preadv2(RWF_NOWAIT)` inline first: a read the page cache can
    /// serve completes in the calling task, on its own thread, with no ring
    /// round trip; anything else goes to the ring. Default: on.
    pub fn inline_nowait(mut self, on: bool) -> Self {
        self.inline_nowait = on;
        self
    }

    /// Which backend to use (default [`BackendChoice::Auto`]).
    pub fn backend(mut self, backend: BackendChoice) -> Self {
        self.backend = backend;
        self
    }

    /// Capacity of the file table (default: twice the initial files, at
    /// least 1024, at most RLIMIT_NOFILE).
    pub fn max_files(mut self, files: u32) -> Self {
        self.max_files = Some(files);
        self
    }

    /// Creates the context. Must be called inside a tokio runtime; spawns one
    /// driver task per ring on it. The context can be used from any runtime
    /// or thread, but its drivers run on this one: a `current_thread` home
    /// runtime must be running for reads to complete.
    pub fn build(self, files: Vec<File>) -> io::Result<UringContext> {
        let handle = Handle::try_current().map_err(|_| {
            io::Error::other(
                "UringContext must be created inside a tokio runtime (no runtime is running on this thread)",
            )
        })?;
        let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        if !(1..=32768).contains(&self.ring_entries) {
            return invalid(format!(
                "ring_entries must be 1..=32768, got {}",
                self.ring_entries
            ));
        }
        let workers = handle.metrics().num_workers().max(1);
        let rings = self.rings.unwrap_or(workers);
        if !(1..=256).contains(&rings) {
            return invalid(format!("rings must be 1..=256, got {rings}"));
        }
        let max_in_flight = self
            .max_in_flight
            .unwrap_or(DEFAULT_IN_FLIGHT_PER_RING * rings);
        if max_in_flight == 0 {
            return invalid("max_in_flight must be at least 1".into());
        }
        let in_flight = max_in_flight.div_ceil(rings);
        let (pool_count, pool_size) = self.pool.unwrap_or((in_flight, DEFAULT_POOL_BUF));
        if pool_size == 0 || pool_count > u16::MAX as usize * 16 {
            return invalid(format!(
                "buffer_pool({pool_count}, {pool_size}) is out of range"
            ));
        }
        if self.coop_taskrun && self.sqpoll.is_some() {
            return invalid(
                "coop_taskrun and sqpoll exclude each other: with SQPOLL the kernel thread runs completion work"
                    .into(),
            );
        }
        if self.coop_taskrun && self.backend != BackendChoice::Fallback {
            if handle.runtime_flavor() != RuntimeFlavor::CurrentThread {
                return invalid(
                    "coop_taskrun needs a current_thread runtime: on a multi-thread runtime the \
                     submitting worker may sleep with completion work pending"
                        .into(),
                );
            }
            if catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_err() {
                return invalid(
                    "coop_taskrun needs the runtime's time driver (enable_time)".into(),
                );
            }
        }
        let capacity = self
            .max_files
            .unwrap_or_else(|| {
                (files.len() as u32)
                    .saturating_mul(2)
                    .max(1024)
                    .min(nofile_limit())
            })
            .max(files.len() as u32)
            .max(1);
        let files = FileTable::new(files, capacity, rings)?;
        let cfg = RingConfig {
            entries: self.ring_entries,
            in_flight,
            sqpoll_idle: self.sqpoll,
            coop_taskrun: self.coop_taskrun,
            pool_count,
            pool_size,
            file_capacity: capacity,
        };

        let (backend, info) = match self.backend {
            BackendChoice::Fallback => fallback(
                self.max_in_flight,
                &handle,
                "forced by Builder::backend(BackendChoice::Fallback)".into(),
            ),
            choice => match setup_rings(&cfg, rings, &files) {
                Ok(rings) => (
                    Backend::Uring(rings),
                    BackendInfo {
                        kind: BackendKind::IoUring,
                        reason: None,
                    },
                ),
                Err(e) if choice == BackendChoice::Auto && falls_back(&e) => fallback(
                    self.max_in_flight,
                    &handle,
                    format!("io_uring could not be set up: {e}"),
                ),
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("io_uring setup failed: {e}"),
                    ))
                }
            },
        };
        let inner = Arc::new(Inner {
            backend,
            files,
            inline_nowait: self.inline_nowait,
            // A task woken on a current_thread runtime waits behind every
            // ready task (one queue), so its stretches must be short; a
            // multi-thread worker checks its injection queue, where timers
            // and cross-thread wakes land, every 61 polls, so 50 µs
            // stretches keep those within ~3 ms.
            inline_stretch: match handle.runtime_flavor() {
                RuntimeFlavor::CurrentThread => Duration::from_micros(8),
                _ => Duration::from_micros(50),
            },
            closed: AtomicBool::new(false),
            info,
        });
        if let Backend::Uring(rings) = &inner.backend {
            for ring in rings.iter() {
                handle.spawn(Driver::new(ring.clone()));
            }
        }
        Ok(UringContext { inner })
    }
}

fn fallback(
    max_in_flight: Option<usize>,
    runtime: &Handle,
    reason: String,
) -> (Backend, BackendInfo) {
    (
        Backend::Fallback(Fallback::new(
            max_in_flight.unwrap_or(DEFAULT_FALLBACK_IN_FLIGHT),
            runtime.clone(),
        )),
        BackendInfo {
            kind: BackendKind::Fallback,
            reason: Some(reason),
        },
    )
}

/// Errors that mean "no io_uring here", as opposed to a bad configuration.
fn falls_back(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::EPERM | libc::EACCES | libc::ENOMEM | libc::EINVAL)
    ) || e.kind() == io::ErrorKind::Unsupported
}

fn nofile_limit() -> u32 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the provided, properly sized struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur.min(1 << 20) as u32
}

fn setup_rings(cfg: &RingConfig, n: usize, files: &FileTable) -> io::Result<Box<[Arc<Ring>]>> {
    let fds = files.raw_fds();
    // Creating the ring's eventfd registration panics (inside tokio) when the
    // runtime has IO disabled: turn that into an error.
    (0..n)
        .map(
            |_| match catch_unwind(AssertUnwindSafe(|| Ring::new(cfg, &fds))) {
                Ok(r) => r.map(Arc::new),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the tokio runtime has IO disabled; build it with enable_io() or enable_all()",
                )),
            },
        )
        .collect()
}

/// A handle to io_uring rings (or the fallback) serving positioned reads of
/// a set of files. Cheap to clone; every clone serves the same files.
///
/// See the [crate documentation](crate) for an example.
#[derive(Clone)]
pub struct UringContext {
    inner: Arc<Inner>,
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
    /// A context with default settings over `files` (their [`FileId`]s are
    /// their indices). Must be called inside a tokio runtime.
    pub fn new(files: Vec<File>) -> io::Result<UringContext> {
        Builder::default().build(files)
    }

    /// A builder for non-default settings.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Reads up to `buf.len()` bytes of file `fid` at `offset`.
    ///
    /// Returns the number of bytes read: `Ok(0)` at or past end of file or
    /// for an empty `buf`. Errors: `InvalidInput` for an unknown `fid` or an
    /// offset beyond `i64::MAX`; the kernel's error otherwise.
    pub fn read<'a>(
        &'a self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &'a mut [u8],
    ) -> UringReadFuture<'a> {
        UringReadFuture {
            core: ReadCore::new(&self.inner, fid.into(), offset, Borrowed(buf)),
        }
    }

    /// Fills `buf` from file `fid` at `offset`, looping over short reads.
    /// Fails with `UnexpectedEof` if the file ends first.
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
                        format!("{fid} ends before offset {}", offset + buf.len() as u64),
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
    /// into `buf`, which is handed back with the result. `buf` may be a
    /// [`Vec<u8>`] (its `len()` bytes are filled), a `Box<[u8]>` or an
    /// [`AlignedBuf`](crate::AlignedBuf) (for `O_DIRECT`).
    pub fn read_owned<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> UringReadOwnedFuture<'_, B> {
        UringReadOwnedFuture {
            core: ReadCore::new(&self.inner, fid.into(), offset, Owned::new(buf)),
        }
    }

    /// Adds a file at run time and returns its id. An id freed by
    /// [`unregister_file`](Self::unregister_file) is reused only once no read
    /// of the old file is left.
    pub fn register_file(&self, file: File) -> io::Result<FileId> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(crate::ring::shut_down_error());
        }
        self.inner.files.insert(file, self.inner.fixed())
    }

    /// Removes a file. Reads already in flight on it complete (or fail with
    /// `EBADF` if they had not reached the kernel); later reads of `fid` fail
    /// with `InvalidInput`. The file is closed when the last read is done.
    pub fn unregister_file(&self, fid: impl Into<FileId>) -> io::Result<()> {
        self.inner.files.remove(fid.into(), self.inner.fixed())
    }

    /// Which backend runs, and why.
    pub fn backend(&self) -> &BackendInfo {
        &self.inner.info
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        match &self.inner.backend {
            Backend::Uring(rings) => {
                rings
                    .iter()
                    .map(|r| r.counters())
                    .fold(Stats::default(), |s, c| Stats {
                        submitted: s.submitted + c.submitted,
                        completed: s.completed + c.completed,
                        enters: s.enters + c.enters,
                        inline_completed: s.inline_completed + c.inline,
                        in_flight: s.in_flight + c.in_flight,
                    })
            }
            Backend::Fallback(fb) => {
                let c = fb.counters();
                Stats {
                    submitted: c.submitted,
                    completed: c.completed,
                    in_flight: c.submitted - c.completed,
                    ..Stats::default()
                }
            }
        }
    }

    /// Whether the bounce buffers are registered with the kernel (io_uring
    /// backend; false when RLIMIT_MEMLOCK did not allow it).
    pub fn buffers_registered(&self) -> bool {
        match &self.inner.backend {
            Backend::Uring(rings) => rings.iter().all(|r| r.buffers_registered()),
            Backend::Fallback(_) => false,
        }
    }

    /// Stops accepting reads, cancels what is in flight and waits until the
    /// kernel has returned every read. Pending reads resolve with their data
    /// or an error (`ECANCELED`, or "shut down" for reads not yet submitted).
    /// Every handle sees the shutdown.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Release);
        match &self.inner.backend {
            Backend::Uring(rings) => {
                rings.iter().for_each(|r| r.close());
                for r in rings.iter() {
                    r.wait_drained().await;
                }
            }
            Backend::Fallback(fb) => {
                fb.close();
                fb.wait_idle().await;
            }
        }
    }
}
