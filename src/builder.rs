//! [`Builder`]: the settings of a [`UringContext`], their checks against
//! the documented limits and the kernel's, and the choice of backend
//! (io_uring, or the `pread` fallback and why) when the context is built.

use std::fs::File;
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::{Handle, RuntimeFlavor};

use crate::blocking::BlockingPool;
use crate::context::UringContext;
use crate::error::invalid;
use crate::files::{FileTable, RoutePolicy};
use crate::inline;
use crate::permit::{Priority, SlotsConfig};
use crate::ring::{Driver, Ring, RingConfig, DEFAULT_SHALLOW_BATCH};
use crate::shared::{Backend, BackendChoice, BackendInfo, BackendKind, Inner};
use crate::sys;

/// Configures a [`UringContext`]. Start from [`UringContext::builder`].
///
/// Every setting is checked when [`build`](Builder::build) runs: a value out
/// of range is an `InvalidInput` error that names the setting and its limit,
/// never a panic, a silent change or a silent switch to the fallback backend.
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
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent settings, each a plain on/off"
)]
pub struct Builder {
    ring_entries: u32,
    rings: Option<usize>,
    max_in_flight: Option<usize>,
    sqpoll: Option<Duration>,
    coop_taskrun: bool,
    pool: Option<(usize, usize)>,
    inline_nowait: bool,
    inline_stretch: Option<Duration>,
    backend: BackendChoice,
    max_files: Option<u32>,
    shutdown_timeout: Duration,
    fuse_via_blocking_pool: bool,
    network_fs_via_blocking_pool: bool,
    max_in_flight_per_file: Option<usize>,
    background_share: Option<usize>,
    background_piece: Option<usize>,
    shallow_batch: u32,
    latency_histograms: bool,
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
            inline_stretch: None,
            backend: BackendChoice::Auto,
            max_files: None,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            fuse_via_blocking_pool: true,
            network_fs_via_blocking_pool: true,
            max_in_flight_per_file: None,
            background_share: None,
            background_piece: None,
            shallow_batch: DEFAULT_SHALLOW_BATCH,
            latency_histograms: false,
        }
    }
}

/// Shards of the latency histograms: threads record into shard
/// `thread_slot() % LATENCY_SHARDS`.
const LATENCY_SHARDS: usize = 8;

/// Default slots of each ring (and of the blocking pool) that background
/// ops may hold while latency ops are active.
const DEFAULT_BACKGROUND_SHARE: usize = 2;

/// Default largest piece of a background read or write while latency ops
/// are active.
const DEFAULT_BACKGROUND_PIECE: usize = 128 << 10;

/// Default ops in flight per runtime worker, or per ring when `rings` is set.
const DEFAULT_IN_FLIGHT_PER_RING: usize = 512;
/// Longest `inline_stretch`: beyond it a poll could hold a worker for
/// seconds, which no setting should allow.
const MAX_INLINE_STRETCH: Duration = Duration::from_secs(1);
/// The kernel's largest completion queue (`IORING_MAX_CQ_ENTRIES`); each
/// ring's CQ holds all its in-flight ops, so this bounds them per ring.
pub(crate) const MAX_IN_FLIGHT_PER_RING: usize = 65_536;
/// The fallback backend's bound: each of its ops may occupy a thread.
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
/// Each op on the fallback backend occupies a blocking-pool thread: more
/// than a few dozen only add context switches, not device parallelism.
const DEFAULT_FALLBACK_IN_FLIGHT: usize = 64;
/// tokio's default `max_blocking_threads`: more routed ops than this would
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

    /// Number of rings (1..=256; default: one per two runtime workers,
    /// rounded up, but no more than `max_in_flight`). A worker thread
    /// submits to ring `worker % rings`, so more rings spread the kernel
    /// work of submitting over more threads. On 2 workers one ring gives
    /// shorter read and timer tails and less CPU per read than two (DESIGN,
    /// "Low depth"). The default is tuned on 2-worker runtimes; with more
    /// workers, also try `rings` equal to the worker count (one ring per
    /// worker).
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn rings(mut self, rings: usize) -> Self {
        self.rings = Some(rings);
        self
    }

    /// Ops in the kernel at once, over all rings (default 512 per runtime
    /// worker, or 512 per ring when [`rings`](Self::rings) is set).
    /// Further ops wait asynchronously for a slot. The limit is split over
    /// the rings exactly (the first `max_in_flight % rings` rings get one
    /// more), so it must be at least the number of rings set with
    /// [`rings`](Self::rings), and at most 65536 per ring (the kernel's
    /// largest completion queue); on the fallback backend, at most 65536.
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
    /// to run completion work; the driver re-enters every 200 µs while ops
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

    /// The inline path: try `preadv2(RWF_NOWAIT)` first, so a read the page
    /// cache can serve completes in the calling task, on its own thread,
    /// with no ring round trip; anything else goes to the ring. Default: on.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn inline_nowait(mut self, on: bool) -> Self {
        self.inline_nowait = on;
        self
    }

    /// How long a task may serve page-cache hits on the inline path, from its first
    /// one, before it yields to the rest of the runtime (default:
    /// 10 µs on a multi-thread runtime, 8 µs on `current_thread`; at most
    /// 1 s).
    ///
    /// Inline reads never return `Pending`, so without a bound one task
    /// reading cached data would hold its worker for a whole coop budget.
    /// The stretch trades throughput for tail latency when many tasks read
    /// cached data at once: with N tasks per worker, the read that yields
    /// waits about N × stretch for its turn. Shorter stretches cut that
    /// wait, and cost a yield every few reads. `Duration::ZERO` yields
    /// before every inline read but the first of a poll. See the design
    /// document's fairness section for measurements.
    ///
    /// More than 256 runnable tasks per worker of a multi-thread runtime
    /// (say 512 tasks reading cached data on 2 workers) overflow tokio's
    /// local queues into its global queue, where they wait far longer than
    /// any stretch; there the runtime's
    /// [`global_queue_interval`](tokio::runtime::Builder::global_queue_interval)
    /// matters more than this setting (a small interval such as 8 shortens
    /// that tail; see the design document's fairness section).
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn inline_stretch(mut self, stretch: Duration) -> Self {
        self.inline_stretch = Some(stretch);
        self
    }

    /// The most SQEs one `io_uring_enter` hands to a *shallow* ring, one
    /// with at most 64 ops in the kernel (1..=32768; default 8). A deeper
    /// ring gets everything queued in one enter, and so does an explicit
    /// [`read_batch`](crate::UringContext::read_batch).
    ///
    /// The block layer holds one submission's requests until all of them
    /// are issued, so at low depth smaller enters reach the device sooner,
    /// for a syscall every `n` ops. The best value depends on the device
    /// and its state (DESIGN, "Low depth"). Measure yours
    /// (`uring-bench --uring-shallow-batch`).
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn shallow_batch(mut self, reads: u32) -> Self {
        self.shallow_batch = reads;
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
    /// runtime went away) waits for the kernel to return ops it was asked
    /// to cancel (default 10 s). Past it, shutdown returns, borrowed ops
    /// still waiting fail with `TimedOut`, and the buffers the kernel may
    /// still write into are kept (leaked at teardown) rather than freed.
    /// `Duration::MAX` waits as long as it takes (on storage that never
    /// answers, that is forever).
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
    /// answer every request. Even then, the file's writes and `fallocate`s
    /// stay on the blocking pool: io-wq runs those of files whose inodes
    /// hash alike one at a time, so one hung there would hold up other
    /// files' writes.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn fuse_via_blocking_pool(mut self, on: bool) -> Self {
        self.fuse_via_blocking_pool = on;
        self
    }

    /// Read files on network file systems (NFS, SMB/CIFS, 9p, Ceph, AFS,
    /// Coda, `OrangeFS`) with `pread` on the blocking pool instead of the
    /// rings (default: on). A network server that stalls holds io_uring's
    /// bounded io-wq workers the way a stalled FUSE server does, and these
    /// file systems are not covered by the crate's tests, so they take the
    /// route that is never worse than `spawn_blocking` +
    /// `pread`. Turned off, their ring reads are issued with `IOSQE_ASYNC`
    /// (so that no `io_uring_enter` waits for the server), as are those of
    /// FUSE files with [`fuse_via_blocking_pool(false)`](Self::fuse_via_blocking_pool),
    /// and their writes and `fallocate`s stay on the blocking pool, as
    /// theirs do.
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn network_fs_via_blocking_pool(mut self, on: bool) -> Self {
        self.network_fs_via_blocking_pool = on;
        self
    }

    /// A file's share of each ring's in-flight slots (and of the blocking
    /// pool's): the most its ops hold while an op of another file waits for
    /// a slot there (default: three quarters of the ring's slots — 384 of
    /// the default 512 — or of the pool's). The share is work-conserving: a
    /// file alone may use every slot but the last `slots / 32` (at least
    /// one), which stay for other files; once another file's op waits, a
    /// file at or over its share gets no new slot until it is back under
    /// it. Ops already in flight are never taken back, so ops stuck on one
    /// file (storage that never answers) hold at most what they had taken,
    /// and other files always find the reserved slots. At or above the
    /// ring's slots it turns the share off. Must be at least 1.
    ///
    /// See the design document, "Scheduling".
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn max_in_flight_per_file(mut self, reads: usize) -> Self {
        self.max_in_flight_per_file = Some(reads);
        self
    }

    /// The slots of each ring (and of the blocking pool) that
    /// [`Priority::Background`](crate::Priority::Background) ops may hold
    /// while latency ops are active there — in flight, waiting for a slot,
    /// or one finished within the last 10 ms (default 2). Background ops
    /// keep that many even under a flood of latency ops, so they never
    /// starve; with no latency op active they use every slot. Small is the
    /// point: a latency op queues behind whatever background reads the
    /// device already has. Must be at least 1.
    ///
    /// See the design document, "Scheduling".
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn background_share(mut self, ops: usize) -> Self {
        self.background_share = Some(ops);
        self
    }

    /// The largest piece a [`Priority::Background`](crate::Priority::Background)
    /// read or write moves while latency ops are active (default 128 KiB; a
    /// multiple of 4096). A longer background read or write is then issued
    /// in pieces of this size, one after another, each taking a slot; with
    /// no latency op active it goes in one piece. A latency op queues in
    /// the device behind the background bytes already there: this and
    /// [`background_share`](Self::background_share) bound them (256 KiB with
    /// the defaults, where a scan of an `O_DIRECT` file alone keeps 8 MiB
    /// in flight). Vectored reads are not split.
    ///
    /// See the design document, "Scheduling".
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn background_piece(mut self, bytes: usize) -> Self {
        self.background_piece = Some(bytes);
        self
    }

    /// Keep latency histograms of the context's ops (default off): the time
    /// from each op's first poll to its result, per priority class and kind
    /// of op, read with [`UringContext::latencies`]. Costs two clock reads
    /// and three relaxed atomic additions per op.
    ///
    /// ```
    /// use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::builder()
    ///     .latency_histograms(true)
    ///     .build(vec![tempfile::tempfile()?])?;
    /// ctx.file(0)?.sync_data().await?;
    /// let syncs = ctx.latencies().expect("enabled").latency.syncs;
    /// assert_eq!(syncs.count(), 1);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use = "a Builder does nothing until `build` is called"]
    pub fn latency_histograms(mut self, on: bool) -> Self {
        self.latency_histograms = on;
        self
    }

    /// Creates the context. Must be called inside a tokio runtime with IO
    /// enabled (io_uring backend); spawns one driver task per ring on it.
    /// The context can be used from any runtime or thread, but its drivers
    /// run on this one (its *home* runtime): a `current_thread` home runtime
    /// must be running for ops to complete, and when the home runtime
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
        let policy = RoutePolicy {
            fuse_via_blocking_pool: self.fuse_via_blocking_pool,
            network_via_blocking_pool: self.network_fs_via_blocking_pool,
        };
        let files = FileTable::new(files, plan.capacity, plan.shards, policy)?;
        if self.backend != BackendChoice::Fallback {
            // Not a ring problem, so said as is, not wrapped in
            // `setup_rings`'s "io_uring setup failed" error.
            io_driver_present()?;
        }
        let (backend, info) = match self.backend {
            BackendChoice::Fallback => {
                crate::util::decision!(
                    info,
                    "pread fallback on the blocking pool, as asked (BackendChoice::Fallback)"
                );
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
                        crate::util::decision!(warn, reason = %why, "io_uring unavailable: the fallback backend runs every op on the blocking pool");
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
        #[cfg(feature = "cache")]
        let regions = match &backend {
            Backend::Uring(rings) => Some(crate::ring::Regions::new(
                rings,
                plan.ring_cfgs.first().map_or(0, |c| c.owner),
            )),
            Backend::Fallback => None,
        };
        let inner = Arc::new(Inner {
            backend,
            blocking: BlockingPool::new(
                self.slots(match backend_kind {
                    BackendKind::Fallback => plan.fallback_in_flight,
                    BackendKind::IoUring => plan.routed_in_flight,
                }),
                handle.clone(),
            ),
            files,
            inline_nowait: self.inline_nowait,
            inline_stretch: self
                .inline_stretch
                .unwrap_or_else(|| inline::stretch(&handle.runtime_flavor())),
            closed: AtomicBool::new(false),
            shutdown_timeout: self.shutdown_timeout,
            info,
            #[cfg(feature = "cache")]
            invalidation: crate::changes::Listeners::default(),
            #[cfg(feature = "cache")]
            regions,
            latencies: self
                .latency_histograms
                .then(|| crate::latency::Recorder::new(LATENCY_SHARDS)),
        });
        if let Backend::Uring(rings) = &inner.backend {
            for ring in rings {
                handle.spawn(Driver::new(ring.clone()));
            }
        }
        Ok(UringContext {
            inner,
            priority: Priority::Latency,
        })
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
        if !(1..=MAX_RING_ENTRIES).contains(&self.shallow_batch) {
            return invalid(format!(
                "shallow_batch must be 1..={MAX_RING_ENTRIES}, got {}",
                self.shallow_batch
            ));
        }
        if self.background_share == Some(0) {
            return invalid("background_share must be at least 1".into());
        }
        if let Some(p) = self.background_piece {
            if p == 0 || p % 4096 != 0 || p > crate::ring::MAX_RW {
                return invalid(format!(
                    "background_piece must be a non-zero multiple of 4096 up to {}, got {p}",
                    crate::ring::MAX_RW
                ));
            }
        }
        if self.max_in_flight_per_file == Some(0) {
            return invalid("max_in_flight_per_file must be at least 1".into());
        }
        if let Some(s) = self.inline_stretch.filter(|s| *s > MAX_INLINE_STRETCH) {
            return invalid(format!(
                "inline_stretch must be at most {MAX_INLINE_STRETCH:?}, got {s:?}"
            ));
        }
        let workers = handle.metrics().num_workers().clamp(1, MAX_RINGS);
        // One ring per two workers (see `rings`).
        let default_rings = workers.div_ceil(2);
        let rings = match (self.rings, self.max_in_flight) {
            (Some(r), Some(m)) if m < r => {
                return invalid(format!(
                    "max_in_flight ({m}) is less than rings ({r}): every ring needs at least one op in flight"
                ))
            }
            (Some(r), _) => r,
            // Documented clamp: no more rings than ops in flight.
            (None, Some(m)) => default_rings.min(m),
            (None, None) => default_rings,
        };
        let max_in_flight = self.max_in_flight.unwrap_or(
            DEFAULT_IN_FLIGHT_PER_RING * if self.rings.is_some() { rings } else { workers },
        );
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
                "max_in_flight ({fallback_in_flight}) exceeds the fallback backend's limit of {MAX_FALLBACK_IN_FLIGHT}"
            ));
        }
        let base = max_in_flight / rings;
        // One bounce buffer per op a ring may have in flight: exactly
        // `max_in_flight` on one ring, so `max_in_flight(65536)` fits the pool.
        let default_pool = max_in_flight.div_ceil(rings);
        let (pool_count, pool_size) = self.pool.unwrap_or((default_pool, DEFAULT_POOL_BUF));
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
        let owner = crate::ring::next_owner();
        Ok(Plan {
            // One file-table replica per worker (at least one per ring): a
            // ring shared by two workers must not make them share the
            // table's lock word (see `files::FileTable`).
            shards: rings.max(workers),
            capacity,
            fallback_in_flight,
            routed_in_flight: max_in_flight.clamp(1, MAX_ROUTED_IN_FLIGHT),
            ring_cfgs: (0..rings)
                .map(|i| RingConfig {
                    entries: self.ring_entries,
                    in_flight: base + usize::from(i < rem),
                    slots: self.slots(base + usize::from(i < rem)),
                    sqpoll_idle: self.sqpoll,
                    coop_taskrun: self.coop_taskrun,
                    pool_count,
                    pool_size,
                    file_capacity: capacity,
                    shutdown_timeout: self.shutdown_timeout,
                    shallow_batch: self.shallow_batch,
                    owner,
                })
                .collect(),
        })
    }
}

impl Builder {
    /// The scheduler's settings for a ring (or the blocking pool) of
    /// `limit` slots: a file's share is three quarters of them unless set.
    fn slots(&self, limit: usize) -> SlotsConfig {
        let limit = limit.max(1);
        SlotsConfig {
            limit,
            share: self
                .max_in_flight_per_file
                .map_or(limit - limit / 4, |n| n.min(limit))
                .max(1),
            background_share: self
                .background_share
                .unwrap_or(DEFAULT_BACKGROUND_SHARE)
                .clamp(1, limit),
            background_piece: self.background_piece.unwrap_or(DEFAULT_BACKGROUND_PIECE),
        }
    }
}

/// The resolved settings.
#[derive(Debug)]
struct Plan {
    /// Replicas of the file table (see `files::FileTable`).
    shards: usize,
    capacity: u32,
    fallback_in_flight: usize,
    /// Blocking-pool ops at once for files routed off the rings: they mostly
    /// wait on slow storage, so they get the context's whole in-flight
    /// limit, up to tokio's default of 512 blocking threads.
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
                slots: SlotsConfig {
                    limit: 1,
                    share: 1,
                    background_share: 1,
                    background_piece: DEFAULT_BACKGROUND_PIECE,
                },
                sqpoll_idle: None,
                coop_taskrun: false,
                pool_count: 1,
                pool_size: 4096,
                file_capacity: 1,
                shutdown_timeout: Duration::ZERO,
                shallow_batch: DEFAULT_SHALLOW_BATCH,
                owner: 0,
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
    plan.ring_cfgs
        .iter()
        .map(|cfg| Ring::new(cfg, &fds).map(Arc::new))
        .collect()
}

/// Registering a descriptor with tokio's reactor panics inside tokio when
/// the runtime has no IO, and tokio cannot be asked beforehand: under
/// `panic = "unwind"` the panic is caught here, before any setup.
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
