//! [`UringContext`], its [`Builder`], and the small public types around them.

use std::fmt;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::buf::IoBufMut;
use crate::error::invalid;
use crate::fallback::Fallback;
use crate::files::{FileRoute, FileTable, FixedFiles};
use crate::inline;
use crate::read::{Borrowed, Owned, ReadCore, UringReadFuture, UringReadOwnedFuture};
use crate::ring::{Driver, Ring, RingConfig};
use crate::sys;

/// Index of a file registered with a [`UringContext`]: its position in the
/// `Vec` given to [`UringContext::new`], or what
/// [`UringContext::register_file`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u32);

impl FileId {
    /// The raw index.
    #[must_use]
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
    /// Times a ring's background driver task ran (io_uring backend): a
    /// measure of wake-ups, to set against `submitted`.
    pub driver_polls: u64,
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

pub(crate) enum Backend {
    Uring(Box<[Arc<Ring>]>),
    Fallback,
}

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    /// `pread` on the blocking pool: every read of the fallback backend, and
    /// the reads of files routed away from the rings (see `FileRoute`).
    pub(crate) blocking: Fallback,
    pub(crate) files: FileTable,
    pub(crate) inline_nowait: bool,
    /// How long a thread may do inline reads before it yields.
    pub(crate) inline_stretch: Duration,
    /// Set by `shutdown`: every new read fails, the inline path included.
    pub(crate) closed: AtomicBool,
    /// `Builder::shutdown_timeout`.
    pub(crate) shutdown_timeout: Duration,
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
            Backend::Fallback => &NoRings,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No read future can outlive the last handle (they borrow it), but
        // abandoned reads may still be in the kernel: the drivers reap them
        // and exit; each ring is freed only after that (see `Ring::drop`).
        if let Backend::Uring(rings) = &self.backend {
            rings.iter().for_each(|r| r.orphan());
        }
        self.blocking.close();
    }
}

/// Configures a [`UringContext`]. Start from [`UringContext::builder`].
///
/// Every setting is checked when [`build`](Builder::build) runs: a value out
/// of range is an `InvalidInput` error that names the setting and its limit,
/// never a panic, a silent change or a silent switch to the fallback.
///
/// ```
/// use std::time::Duration;
/// use uring_positioned_io::{BackendChoice, UringContext};
///
/// # fn main() -> std::io::Result<()> {
/// # let rt = tokio::runtime::Runtime::new()?;
/// # rt.block_on(async {
/// let file = tempfile::tempfile()?;
/// let ctx = UringContext::builder()
///     .rings(2)
///     .max_in_flight(256)            // over both rings
///     .ring_entries(128)
///     .buffer_pool(128, 8192)        // per ring
///     .shutdown_timeout(Duration::from_secs(2))
///     .backend(BackendChoice::Auto)  // io_uring, or pread where it is missing
///     .build(vec![file])?;
/// println!("{}", ctx.backend());
///
/// // A setting out of range is an error that names it.
/// let err = UringContext::builder().max_in_flight(0).build(vec![]).unwrap_err();
/// assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
/// assert!(err.to_string().contains("max_in_flight"));
/// # Ok(())
/// # })
/// # }
/// ```
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
    shutdown_timeout: Duration,
    fuse_via_blocking_pool: bool,
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
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            fuse_via_blocking_pool: true,
        }
    }
}

const DEFAULT_IN_FLIGHT_PER_RING: usize = 512;
/// The kernel's largest completion queue (`IORING_MAX_CQ_ENTRIES`); each
/// ring's CQ holds all its in-flight reads, so this bounds them per ring.
pub(crate) const MAX_IN_FLIGHT_PER_RING: usize = 65_536;
/// The fallback's bound: each of its reads may occupy a thread.
const MAX_FALLBACK_IN_FLIGHT: usize = 65_536;
const MAX_RINGS: usize = 256;
const MAX_RING_ENTRIES: u32 = 32_768;
const DEFAULT_POOL_BUF: usize = 16 * 1024;
/// Largest bounce buffer of the pool (a read larger than the pool's buffers
/// gets a one-off buffer of at most `read::BORROWED_CHUNK`).
const MAX_POOL_BUF: usize = 64 << 20;
const MAX_POOL_COUNT: usize = 65_536;
/// Largest pool per ring, in bytes.
const MAX_POOL_BYTES: usize = 4 << 30;
/// The kernel's largest fixed-file table (`IORING_MAX_FIXED_FILES`).
const MAX_FIXED_FILES: u32 = 1 << 20;
const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Each fallback read occupies a blocking-pool thread: more than a few dozen
/// runnable threads only add context switches (and starve the runtime's own
/// threads) without adding device parallelism worth having.
const DEFAULT_FALLBACK_IN_FLIGHT: usize = 64;
/// tokio's default `max_blocking_threads`: more routed reads than this would
/// only queue inside tokio.
const MAX_ROUTED_IN_FLIGHT: usize = 512;

impl Builder {
    /// Submission-queue entries per ring (1..=32768; default 256). More reads
    /// than this may be queued: the rest wait in a backlog and go out with
    /// the next enter.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn ring_entries(mut self, entries: u32) -> Self {
        self.ring_entries = entries;
        self
    }

    /// Number of rings (1..=256; default: the runtime's worker count, but no
    /// more than `max_in_flight`). Each worker thread submits to its own
    /// ring, so the kernel work of submitting is spread over the threads.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn rings(mut self, rings: usize) -> Self {
        self.rings = Some(rings);
        self
    }

    /// Reads in the kernel at once, over all rings (default 512 per ring).
    /// Further reads wait asynchronously for a slot. The limit is split over
    /// the rings exactly (the first `max_in_flight % rings` rings get one
    /// more), so it must be at least the number of rings set with
    /// [`rings`](Self::rings), and at most 65536 per ring (the kernel's
    /// largest completion queue); on the fallback, at most 65536.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn max_in_flight(mut self, reads: usize) -> Self {
        self.max_in_flight = Some(reads);
        self
    }

    /// Use a kernel submission-polling thread that sleeps after `idle`
    /// (`None`: off, the default). Costs a kernel thread spinning while busy.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn sqpoll(mut self, idle: Option<Duration>) -> Self {
        self.sqpoll = idle;
        self
    }

    /// `IORING_SETUP_COOP_TASKRUN`: the kernel does not interrupt the thread
    /// to run completion work; the driver re-enters every 200 µs while reads
    /// are out instead (on a timerfd: no time driver needed). Only accepted
    /// on a `current_thread` runtime, where that keeps every completion
    /// reachable, and not with SQPOLL.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn coop_taskrun(mut self, on: bool) -> Self {
        self.coop_taskrun = on;
        self
    }

    /// Bounce buffers per ring for [`UringContext::read`]: `count` buffers of
    /// `size` bytes (rounded up to 4 KiB), registered with the ring when
    /// RLIMIT_MEMLOCK allows. Default: one per in-flight read, 16 KiB each.
    /// Limits: `count` ≤ 65536, `size` 1..=64 MiB, `count × size` ≤ 4 GiB
    /// per ring; `count` 0 means no pool (every borrowed read gets a
    /// one-off buffer). Larger reads get a one-off buffer.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn buffer_pool(mut self, count: usize, size: usize) -> Self {
        self.pool = Some((count, size));
        self
    }

    /// Try `preadv2(RWF_NOWAIT)` inline first: a read the page cache can
    /// serve completes in the calling task, on its own thread, with no ring
    /// round trip; anything else goes to the ring. Default: on.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn inline_nowait(mut self, on: bool) -> Self {
        self.inline_nowait = on;
        self
    }

    /// Which backend to use (default [`BackendChoice::Auto`]).
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn backend(mut self, backend: BackendChoice) -> Self {
        self.backend = backend;
        self
    }

    /// Capacity of the file table (default: twice the initial files, at
    /// least 1024, at most RLIMIT_NOFILE). Set explicitly, it must hold the
    /// initial files and be at most the smaller of RLIMIT_NOFILE and the
    /// kernel's 1048576.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn max_files(mut self, files: u32) -> Self {
        self.max_files = Some(files);
        self
    }

    /// How long [`UringContext::shutdown`] (and the teardown of a ring whose
    /// runtime went away) waits for the kernel to return reads it was asked
    /// to cancel (default 10 s). Past it, shutdown returns, borrowed reads
    /// still waiting fail with `TimedOut`, and the buffers the kernel may
    /// still write into are kept (leaked at teardown) rather than freed.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Read files on FUSE file systems with `pread` on the blocking pool
    /// instead of the rings (default: on). On FUSE, io_uring returns wrong
    /// bytes when the server replies short to a `FOPEN_DIRECT_IO` read, and
    /// a request the server never answers blocks `io_uring_enter` on a
    /// runtime worker (see the design document's storage model). Turn it off
    /// only for a FUSE file system known to use the page cache and to
    /// answer every request.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn fuse_via_blocking_pool(mut self, on: bool) -> Self {
        self.fuse_via_blocking_pool = on;
        self
    }

    /// Creates the context. Must be called inside a tokio runtime with IO
    /// enabled (io_uring backend); spawns one driver task per ring on it.
    /// The context can be used from any runtime or thread, but its drivers
    /// run on this one (its *home* runtime): a `current_thread` home runtime
    /// must be running for reads to complete, and when the home runtime
    /// shuts down, so does the context.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a setting out of range (naming it), for a file that
    /// is not a regular file or block device, and for settings the kernel
    /// rejects; an error when no tokio runtime is running or it has IO
    /// disabled; with [`BackendChoice::IoUring`], the reason io_uring cannot
    /// be set up. [`BackendChoice::Auto`] falls back to the `pread` backend
    /// only when io_uring itself is unavailable here (ENOSYS, EPERM/EACCES,
    /// ENOMEM from RLIMIT_MEMLOCK, or a kernel too old for the features
    /// used), never because of a setting.
    pub fn build(self, files: Vec<File>) -> io::Result<UringContext> {
        let handle = Handle::try_current().map_err(|_| {
            io::Error::other(
                "UringContext must be created inside a tokio runtime (no runtime is running on this thread)",
            )
        })?;
        let plan = self.validate(&handle, files.len())?;
        let files = FileTable::new(
            files,
            plan.capacity,
            plan.rings,
            self.fuse_via_blocking_pool,
        )?;
        let (backend, info) = match self.backend {
            BackendChoice::Fallback => {
                fallback("forced by Builder::backend(BackendChoice::Fallback)".into())
            }
            choice => match setup_rings(&plan, &files) {
                Ok(rings) => (
                    Backend::Uring(rings),
                    BackendInfo {
                        kind: BackendKind::IoUring,
                        reason: None,
                    },
                ),
                Err(e) => match (choice, unavailable_here(&e)) {
                    (BackendChoice::Auto, Some(why)) => {
                        fallback(format!("io_uring could not be set up: {why}"))
                    }
                    (_, why) => {
                        return Err(io::Error::new(
                            if why.is_some() {
                                e.kind()
                            } else {
                                io::ErrorKind::InvalidInput
                            },
                            format!(
                                "io_uring setup failed: {e}{}",
                                if why.is_some() {
                                    ""
                                } else {
                                    " (the kernel rejected these settings; a minimal ring works here)"
                                }
                            ),
                        ))
                    }
                },
            },
        };
        let backend_kind = info.kind;
        let inner = Arc::new(Inner {
            backend,
            blocking: Fallback::new(
                match backend_kind {
                    BackendKind::Fallback => plan.fallback_in_flight,
                    BackendKind::IoUring => plan.routed_in_flight,
                },
                handle.clone(),
            ),
            files,
            inline_nowait: self.inline_nowait,
            inline_stretch: inline::stretch(&handle.runtime_flavor()),
            closed: AtomicBool::new(false),
            shutdown_timeout: self.shutdown_timeout,
            info,
        });
        if let Backend::Uring(rings) = &inner.backend {
            for ring in rings {
                handle.spawn(Driver::new(ring.clone()));
            }
        }
        Ok(UringContext { inner })
    }

    /// Checks every setting and resolves the defaults.
    #[allow(
        clippy::too_many_lines,
        reason = "one check per setting, in the order the docs list them"
    )]
    fn validate(&self, handle: &Handle, nfiles: usize) -> io::Result<Plan> {
        if !(1..=MAX_RING_ENTRIES).contains(&self.ring_entries) {
            return invalid(format!(
                "ring_entries must be 1..={MAX_RING_ENTRIES}, got {}",
                self.ring_entries
            ));
        }
        if let Some(r) = self.rings {
            if !(1..=MAX_RINGS).contains(&r) {
                return invalid(format!("rings must be 1..={MAX_RINGS}, got {r}"));
            }
        }
        if self.max_in_flight == Some(0) {
            return invalid("max_in_flight must be at least 1".into());
        }
        let workers = handle.metrics().num_workers().clamp(1, MAX_RINGS);
        let rings = match (self.rings, self.max_in_flight) {
            (Some(r), Some(m)) if m < r => {
                return invalid(format!(
                    "max_in_flight ({m}) is less than rings ({r}): every ring needs at least one read in flight"
                ))
            }
            (Some(r), _) => r,
            // Documented clamp: no more rings than reads in flight.
            (None, Some(m)) => workers.min(m),
            (None, None) => workers,
        };
        let max_in_flight = self
            .max_in_flight
            .unwrap_or(DEFAULT_IN_FLIGHT_PER_RING * rings);
        if self.backend != BackendChoice::Fallback && max_in_flight > MAX_IN_FLIGHT_PER_RING * rings
        {
            return invalid(format!(
                "max_in_flight ({max_in_flight}) exceeds {MAX_IN_FLIGHT_PER_RING} per ring \
                 ({rings} rings: at most {}), the kernel's largest completion queue",
                MAX_IN_FLIGHT_PER_RING * rings
            ));
        }
        let fallback_in_flight = self.max_in_flight.unwrap_or(DEFAULT_FALLBACK_IN_FLIGHT);
        if fallback_in_flight > MAX_FALLBACK_IN_FLIGHT && self.backend == BackendChoice::Fallback {
            return invalid(format!(
                "max_in_flight ({fallback_in_flight}) exceeds the fallback's limit of {MAX_FALLBACK_IN_FLIGHT}"
            ));
        }
        let base = max_in_flight / rings;
        let (pool_count, pool_size) = self.pool.unwrap_or((base + 1, DEFAULT_POOL_BUF));
        if pool_count > MAX_POOL_COUNT {
            return invalid(format!(
                "buffer_pool count must be at most {MAX_POOL_COUNT}, got {pool_count}"
            ));
        }
        if !(1..=MAX_POOL_BUF).contains(&pool_size) {
            return invalid(format!(
                "buffer_pool size must be 1..={MAX_POOL_BUF} bytes, got {pool_size}"
            ));
        }
        let rounded = pool_size.next_multiple_of(crate::buf::BOUNCE_ALIGN);
        if rounded
            .checked_mul(pool_count)
            .is_none_or(|total| total > MAX_POOL_BYTES)
        {
            return invalid(format!(
                "buffer_pool({pool_count}, {pool_size}) needs more than {MAX_POOL_BYTES} bytes per ring"
            ));
        }
        if self.coop_taskrun && self.sqpoll.is_some() {
            return invalid(
                "coop_taskrun and sqpoll exclude each other: with SQPOLL the kernel thread runs completion work"
                    .into(),
            );
        }
        if self.coop_taskrun
            && self.backend != BackendChoice::Fallback
            && handle.runtime_flavor() != RuntimeFlavor::CurrentThread
        {
            return invalid(
                "coop_taskrun needs a current_thread runtime: on a multi-thread runtime the \
                 submitting worker may sleep with completion work pending"
                    .into(),
            );
        }
        let nofile = u32::try_from(sys::nofile_limit()).unwrap_or(u32::MAX);
        let limit = nofile.min(MAX_FIXED_FILES);
        let nfiles_u32 = u32::try_from(nfiles).unwrap_or(u32::MAX);
        let capacity = match self.max_files {
            Some(m) if m < nfiles_u32 => {
                return invalid(format!(
                    "max_files ({m}) is less than the {nfiles} files given"
                ))
            }
            Some(m) if m > limit => {
                return invalid(format!(
                    "max_files ({m}) exceeds the limit of {limit} (RLIMIT_NOFILE {nofile}, kernel {MAX_FIXED_FILES})"
                ))
            }
            Some(m) => m.max(1),
            None if nfiles_u32 > limit => {
                return invalid(format!(
                    "{nfiles} files exceed the limit of {limit} (RLIMIT_NOFILE {nofile}, kernel {MAX_FIXED_FILES})"
                ))
            }
            None => nfiles_u32.saturating_mul(2).clamp(1024, limit.max(1)).max(nfiles_u32).max(1),
        };
        let rem = max_in_flight % rings;
        Ok(Plan {
            rings,
            capacity,
            fallback_in_flight,
            routed_in_flight: max_in_flight.clamp(1, MAX_ROUTED_IN_FLIGHT),
            ring_cfgs: (0..rings)
                .map(|i| RingConfig {
                    entries: self.ring_entries,
                    in_flight: base + usize::from(i < rem),
                    sqpoll_idle: self.sqpoll,
                    coop_taskrun: self.coop_taskrun,
                    pool_count,
                    pool_size,
                    file_capacity: capacity,
                    shutdown_timeout: self.shutdown_timeout,
                })
                .collect(),
        })
    }
}

/// The resolved settings.
#[derive(Debug)]
struct Plan {
    rings: usize,
    capacity: u32,
    fallback_in_flight: usize,
    /// Blocking-pool reads at once for files routed off the rings: such
    /// reads mostly wait on slow storage, so they get the context's whole
    /// in-flight limit, up to tokio's default of 512 blocking threads.
    routed_in_flight: usize,
    ring_cfgs: Vec<RingConfig>,
}

fn fallback(reason: String) -> (Backend, BackendInfo) {
    (
        Backend::Fallback,
        BackendInfo {
            kind: BackendKind::Fallback,
            reason: Some(reason),
        },
    )
}

/// Whether a setup error means "no io_uring here" (the environment), as
/// opposed to "not with these settings"; `Some(reason)` for the former.
/// An EINVAL is ambiguous (an old kernel lacking a feature, or a setting
/// the kernel rejects), so a minimal ring with the same features decides.
fn unavailable_here(e: &io::Error) -> Option<String> {
    match e.raw_os_error() {
        Some(libc::ENOSYS | libc::EPERM | libc::EACCES | libc::ENOMEM) => Some(e.to_string()),
        Some(libc::EINVAL | libc::EOPNOTSUPP) => {
            let minimal = RingConfig {
                entries: 1,
                in_flight: 1,
                sqpoll_idle: None,
                coop_taskrun: false,
                pool_count: 1,
                pool_size: 4096,
                file_capacity: 1,
                shutdown_timeout: Duration::ZERO,
            };
            match Ring::new(&minimal, &[]) {
                Ok(_) => None,
                Err(probe) => Some(format!("{e} (a minimal ring fails too: {probe})")),
            }
        }
        _ => None,
    }
}

fn setup_rings(plan: &Plan, files: &FileTable) -> io::Result<Box<[Arc<Ring>]>> {
    let fds = files.raw_fds();
    io_driver_present()?;
    plan.ring_cfgs
        .iter()
        .map(|cfg| Ring::new(cfg, &fds).map(Arc::new))
        .collect()
}

/// Registering the ring's eventfd with tokio's reactor panics inside tokio
/// when the runtime was built without IO, and tokio offers no way to ask
/// beforehand. Under `panic = "unwind"` the panic is caught here, before
/// anything else is set up, and becomes an error.
#[cfg(panic = "unwind")]
fn io_driver_present() -> io::Result<()> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let probe = sys::eventfd()?;
    // SAFETY: the AsyncFd owns `probe` for its whole (short) life.
    let registered = catch_unwind(AssertUnwindSafe(|| unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(probe, tokio::io::Interest::READABLE)
    }));
    match registered {
        Ok(_) => Ok(()),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the tokio runtime has IO disabled; build it with enable_io() or enable_all()",
        )),
    }
}

/// Under `panic = "abort"` a panic cannot be caught: a runtime without IO
/// aborts in tokio, as any tokio IO resource would (documented on `build`).
#[cfg(not(panic = "unwind"))]
fn io_driver_present() -> io::Result<()> {
    Ok(())
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
    /// Errors: `InvalidInput` for an unknown `fid` or an offset beyond
    /// `i64::MAX`; the kernel's error otherwise; an error naming the cause
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
            core: ReadCore::new(&self.inner, fid.into(), offset, Borrowed(buf)),
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
    /// into `buf`, which is handed back with the result. `buf` may be a
    /// [`Vec<u8>`] (its `len()` bytes are filled), a `Box<[u8]>` or an
    /// [`AlignedBuf`](crate::AlignedBuf) (for `O_DIRECT`).
    ///
    /// Dropping the future while the read is in the kernel parks `buf` in
    /// the context until the kernel is done with it; forgetting the future
    /// ([`mem::forget`](std::mem::forget)) leaks `buf` and the read's slot.
    ///
    /// ```
    /// # use std::io::Write;
    /// use uring_positioned_io::{AlignedBuf, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # let mut file = tempfile::tempfile()?;
    /// # file.write_all(&[1u8; 8192])?;
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![file])?;
    /// // A Vec is filled up to its len(), and handed back with the result.
    /// let (n, buf) = ctx.read_owned(0, 0, vec![0u8; 4096]).await;
    /// assert_eq!((n?, buf[0]), (4096, 1));
    /// // An aligned buffer, as O_DIRECT files need, works the same way.
    /// let (n, buf) = ctx.read_owned(0, 4096, AlignedBuf::new(4096, 4096)).await;
    /// assert_eq!((n?, buf.align()), (4096, 4096));
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
        UringReadOwnedFuture {
            core: ReadCore::new(&self.inner, fid.into(), offset, Owned::new(buf)),
        }
    }

    /// Adds a file at run time and returns its id. An id freed by
    /// [`unregister_file`](Self::unregister_file) is reused only once no read
    /// of the old file is left.
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
        self.inner.files.insert(file, self.inner.fixed())
    }

    /// Removes a file. Reads already in flight on it complete (or fail with
    /// `EBADF` if they had not reached the kernel); later reads of `fid` fail
    /// with `InvalidInput`. The file is closed when the last read is done.
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `fid` is not registered; the kernel's error if it
    /// refuses to clear the file from a ring's table.
    pub fn unregister_file(&self, fid: impl Into<FileId>) -> io::Result<()> {
        self.inner.files.remove(fid.into(), self.inner.fixed())
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
            in_flight: c.submitted - c.completed,
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
                in_flight: s.in_flight + (c.submitted - c.completed),
                driver_polls: s.driver_polls + c.driver_polls,
            })
    }

    /// How reads of file `fid` are issued: through the rings, or through
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
