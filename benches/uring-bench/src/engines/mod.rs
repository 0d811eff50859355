//! Engines and the per-cell machinery they share: random target selection,
//! verification, latency histograms, the stop clock and CPU accounting.
//!
//! Every engine does the same work per read: pick a uniformly random
//! (file, block) of the working set from its own RNG, read those 4 KiB,
//! verify the block, record the latency. Thread engines use [`run_threads`],
//! async engines [`read_loop`]; `uring-raw` and `fio` drive their own loops
//! but use the same [`Worker`] (or report fio's own figures).
//!
//! A cell has up to two windows (see [`Clock`]): the measured window
//! (throughput, latency, CPU, the timer probe), then, when syscalls are
//! counted, a short syscall window in which the same work goes on with
//! per-thread perf counters open; its reads are counted apart.

pub mod fio;
pub mod mmap;
pub mod pread;
pub mod tokio_fs;
pub mod tokio_uring;
pub mod uring;
pub mod uring_cache;
pub mod uring_raw;

use crate::buf::AlignedBlock;
use crate::dataset::Dataset;
use crate::kinds::{EngineKind, OnOff, Regime};
use crate::probes;
use crate::stop::{new_histogram, Phase, Stop};
use crate::verify::{verify_block, VerifyMode, BLOCK};
use hdrhistogram::Histogram;
use rand_distr::Distribution;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Options of the `uring` engine.
#[derive(Debug, Clone)]
pub struct UringOpts {
    pub rings: Option<usize>,
    pub entries: u32,
    pub max_in_flight: Option<usize>,
    pub inline: Option<OnOff>,
    /// `Builder::inline_stretch`, if set.
    pub inline_stretch: Option<std::time::Duration>,
    /// `Builder::shallow_batch`, if set.
    pub shallow_batch: Option<u32>,
    /// A current_thread runtime instead of a multi-thread one with `workers`
    /// workers.
    pub current_thread: bool,
}

impl Default for UringOpts {
    /// The library's defaults (256-entry rings), multi-thread runtime.
    fn default() -> Self {
        UringOpts {
            rings: None,
            entries: 256,
            max_in_flight: None,
            inline: None,
            inline_stretch: None,
            shallow_batch: None,
            current_thread: false,
        }
    }
}

/// Everything one cell needs.
#[derive(Debug, Clone)]
pub struct CellSpec<'a> {
    pub engine: EngineKind,
    pub regime: Regime,
    pub depth: usize,
    pub duration: Duration,
    pub workers: usize,
    pub verify: VerifyMode,
    pub dataset: &'a Dataset,
    /// Files `0..set_files` form the working set.
    pub set_files: u32,
    pub uring: UringOpts,
    pub fio: PathBuf,
    /// fio jobs sharing the depth.
    pub fio_jobs: usize,
    /// Populate mmap mappings before hot cells.
    pub mmap_populate: bool,
    /// Which probes to run (timer lateness, syscall count).
    pub probes: ProbeOpts,
    /// Capacity of the cache engines' `BlockCache` (None: the working set
    /// plus 1/16, see [`uring_cache::default_capacity`]).
    pub cache_bytes: Option<u64>,
    /// Which blocks of the working set are read (uniform or Zipf).
    pub keys: Keys,
    /// The same work before the measured window, not counted (the window,
    /// CPU and device counters start after it): this long, or with
    /// `warm_full` this long after the engine's cache is full.
    pub warmup: Duration,
    /// Warm up until `full()` says the engine's cache is full (then
    /// `warmup` more), for at most `max`.
    pub warm_full: Option<WarmFull>,
    /// Open the files `O_DIRECT` whatever the regime (the cache engines of
    /// `mem-fair`: filled when hot, but never through the page cache).
    pub direct_files: bool,
}

/// A warm-up that lasts until the engine's cache is full.
#[derive(Debug, Clone, Copy)]
pub struct WarmFull {
    pub full: fn() -> bool,
    pub max: Duration,
}

/// How a worker picks the block of its next read.
#[derive(Debug, Clone, Copy)]
pub enum Keys {
    /// Uniformly random over the working set.
    Uniform,
    /// Zipf over the working set's blocks (rank 1 the most frequent), with
    /// ranks scattered over the set: rank `r` is global block
    /// `(r - 1) * scramble mod n` (`scramble` coprime with `n`), so that hot
    /// blocks are not adjacent.
    Zipf {
        zipf: rand_distr::Zipf<f64>,
        scramble: u64,
    },
}

impl Keys {
    /// Zipf with exponent `theta` over `n` blocks.
    pub fn zipf(n: u64, theta: f64) -> Result<Keys, String> {
        let zipf = rand_distr::Zipf::new(n as f64, theta)
            .map_err(|e| format!("Zipf over {n} blocks, theta {theta}: {e}"))?;
        // an odd multiplier near n times the golden ratio, coprime with n
        let gcd = |mut a: u64, mut b: u64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        let mut scramble = ((n as f64 * 0.618_033_988_75) as u64) | 1;
        while n > 1 && gcd(scramble, n) != 1 {
            scramble += 2;
        }
        Ok(Keys::Zipf { zipf, scramble })
    }
}

/// The per-cell probes: timer lateness and syscalls per read (see [`crate::probes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOpts {
    /// A 1 ms sleep loop on the engine's tokio runtime during the measured
    /// window, recording lateness.
    pub timer: bool,
    /// Length of the syscall window after the measured one (None: syscalls
    /// are not counted).
    pub syscall_window: Option<Duration>,
}

impl ProbeOpts {
    pub const OFF: ProbeOpts = ProbeOpts {
        timer: false,
        syscall_window: None,
    };
}

impl CellSpec<'_> {
    pub fn direct(&self) -> bool {
        self.regime == Regime::Direct
    }

    pub fn workload(&self) -> Workload {
        Workload {
            files: self.set_files,
            blocks: self.dataset.blocks_per_file(),
            seed: self.dataset.seed,
            verify: self.verify,
            engine: self.engine.name(),
            keys: self.keys,
        }
    }

    pub fn open_files(&self) -> Result<Vec<std::fs::File>, String> {
        self.dataset
            .open_for_random_reads(self.set_files, self.direct() || self.direct_files)
            .map_err(|e| format!("{}: open dataset: {e}", self.engine.name()))
    }
}

/// The random-read workload (shared, read-only).
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub files: u32,
    pub blocks: u64,
    pub seed: u64,
    pub verify: VerifyMode,
    pub engine: &'static str,
    pub keys: Keys,
}

/// One read: a block of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub file: u32,
    pub block: u64,
}

impl Target {
    pub fn offset(self) -> u64 {
        self.block * BLOCK as u64
    }
}

/// Latencies a [`Worker`] keeps before it records them into its histogram.
const PENDING: usize = 32;

/// Per-thread / per-task state: RNG, latency histogram, read count.
pub struct Worker {
    rng: u64,
    wl: Workload,
    /// Latency of the reads of the measured window (see [`Worker::hist`]).
    hist: Histogram<u64>,
    /// Latencies (ns) of the measured window not yet in `hist`. A histogram
    /// is ~230 KiB, and recording touches two of its cache lines; with 512
    /// tasks on 2 workers those lines are cold at every record (each task
    /// runs a few reads, then the next one's buffer evicts them), which cost
    /// 9 % of a cached read's CPU in the `uring` engine against 1 % for
    /// `pread` threads (whose thread keeps its histogram hot for a whole
    /// time slice). Recording in batches of `PENDING` makes the harness's
    /// cost the same whatever the engine's scheduling.
    pending: [u32; PENDING],
    npending: usize,
    /// Reads completed in the measured window.
    pub reads: u64,
    /// Reads completed in the syscall window.
    pub syscall_window_reads: u64,
}

impl Worker {
    pub fn new(wl: Workload, id: u64) -> Worker {
        let mut rng = (id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ wl.seed.rotate_left(17);
        if rng == 0 {
            rng = 1;
        }
        Worker {
            rng,
            wl,
            hist: if LEAN_HISTOGRAMS.load(Ordering::Relaxed) {
                lean_histogram()
            } else {
                new_histogram()
            },
            pending: [0; PENDING],
            npending: 0,
            reads: 0,
            syscall_window_reads: 0,
        }
    }

    /// The latency histogram of the measured window.
    pub fn hist(&mut self) -> &Histogram<u64> {
        self.flush();
        &self.hist
    }

    fn flush(&mut self) {
        for &ns in &self.pending[..self.npending] {
            self.hist.saturating_record(u64::from(ns));
        }
        self.npending = 0;
    }

    #[inline]
    fn record(&mut self, ns: u64) {
        let ns = ns.max(1);
        match u32::try_from(ns) {
            Ok(v) if self.npending < PENDING => {
                self.pending[self.npending] = v;
                self.npending += 1;
                if self.npending == PENDING {
                    self.flush();
                }
            }
            _ => self.hist.saturating_record(ns),
        }
    }

    #[inline]
    fn rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The next block to read: uniformly random over the working set, or
    /// drawn from its Zipf distribution.
    #[inline]
    pub fn next(&mut self) -> Target {
        if let Keys::Zipf { zipf, scramble } = self.wl.keys {
            let n = u64::from(self.wl.files) * self.wl.blocks;
            let rank = (zipf.sample(&mut WorkerRng(self)) as u64).clamp(1, n) - 1;
            let g = ((u128::from(rank) * u128::from(scramble)) % u128::from(n)) as u64;
            return Target {
                file: (g / self.wl.blocks) as u32,
                block: g % self.wl.blocks,
            };
        }
        let a = self.rand();
        let b = self.rand();
        let file = ((u128::from(a) * u128::from(self.wl.files)) >> 64) as u32;
        let block = ((u128::from(b) * u128::from(self.wl.blocks)) >> 64) as u64;
        Target { file, block }
    }

    /// Checks the result of a read of `t` into `buf` started at `started`
    /// and records it in the window `phase` says (every read is verified).
    #[inline]
    pub fn complete(
        &mut self,
        t: Target,
        res: io::Result<usize>,
        buf: &[u8],
        started: Instant,
        phase: Phase,
    ) -> Result<(), String> {
        let ns = started.elapsed().as_nanos() as u64;
        let n = res.map_err(|e| {
            format!(
                "engine {}: read of file {} block {} failed: {e}",
                self.wl.engine, t.file, t.block
            )
        })?;
        verify_block(
            self.wl.verify,
            self.wl.seed,
            t.file,
            t.block,
            &buf[..n.min(buf.len())],
        )
        .map_err(|e| format!("verification failed in engine {}: {e}", self.wl.engine))?;
        match phase {
            Phase::Measure => {
                self.record(ns);
                self.reads += 1;
            }
            Phase::Syscalls => self.syscall_window_reads += 1,
            Phase::Between => {}
        }
        if SAMPLING.load(Ordering::Relaxed) {
            COMPLETED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// The worker's xorshift as a `rand` generator (for `rand_distr`).
struct WorkerRng<'a>(&'a mut Worker);

impl rand_core::TryRng for WorkerRng<'_> {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.0.rand() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.0.rand())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for c in dst.chunks_mut(8) {
            let v = self.0.rand().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        Ok(())
    }
}

/// When set, workers record latencies in [`lean_histogram`]s: `mem-fair`
/// runs up to 512 workers in a process whose memory is limited, where 512
/// full histograms (~230 KiB each, partly touched) would take tens of MiB
/// from the engine's budget.
pub static LEAN_HISTOGRAMS: AtomicBool = AtomicBool::new(false);

/// A latency histogram in nanoseconds with microsecond resolution and 2
/// significant digits (~20 KiB).
pub fn lean_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1000, 100_000_000_000, 2).expect("valid histogram bounds")
}

/// When set, every verified read of every worker also counts in
/// [`COMPLETED`] (`mem-fair`'s fill workload samples it every 100 ms; off
/// elsewhere, so no other mode pays for the shared counter).
pub static SAMPLING: AtomicBool = AtomicBool::new(false);
/// Reads completed by all workers while [`SAMPLING`] is set.
pub static COMPLETED: AtomicU64 = AtomicU64::new(0);

/// Bytes this process has caused to be read from the storage layer
/// (`read_bytes` of `/proc/self/io`: every thread, io_uring's workers
/// included), if readable.
pub fn proc_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    let line = text.lines().find(|l| l.starts_with("read_bytes:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User and system CPU seconds of this process so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    pub user: f64,
    pub sys: f64,
}

pub fn cpu_now() -> Cpu {
    // SAFETY: rusage is plain integers, for which all zeroes is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Cpu {
        user: s(ru.ru_utime),
        sys: s(ru.ru_stime),
    }
}

/// What an engine measured in one cell.
pub struct Measured {
    pub hist: Histogram<u64>,
    pub reads: u64,
    pub elapsed: Duration,
    pub cpu: Cpu,
    pub reads_per_enter: Option<f64>,
    /// Reads the engine completed without the ring (uring's RWF_NOWAIT path).
    pub inline_completed: Option<u64>,
    /// Extra facts for the report (backend, limits hit, ...).
    pub notes: Vec<String>,
    /// Latency CDF points (ns, quantile) when no histogram is available (fio).
    pub cdf: Option<Vec<(f64, f64)>>,
    /// Whether every read was verified.
    pub verified: bool,
    /// System calls and reads of the syscall window (None: not counted).
    pub syscalls: Option<probes::SyscallWindow>,
    /// Lateness (ns) of the 1 ms timer probe's wake-ups (None: no probe).
    pub timer_lateness: Option<Histogram<u64>>,
    /// `io_uring_enter` calls and driver task polls over the measured
    /// window (uring).
    pub enters: Option<u64>,
    pub driver_polls: Option<u64>,
    /// Bytes read from the device over the measured window
    /// ([`proc_read_bytes`]; None for fio, a separate process).
    pub read_bytes: Option<u64>,
    /// The block cache's hit ratio over the measured window (cache engines).
    pub cache_hit_ratio: Option<f64>,
    /// The warm-up before the window, if any.
    pub warmed: Option<Warmed>,
}

/// The windows of a cell. [`Clock::start`] starts the cell and a watchdog
/// thread which, after the warm-up (if any: the same work, not counted),
/// runs the `at_start` hook and opens the measured window; after the cell's
/// duration it ends it (the reads in flight then no longer count), takes
/// the time, CPU and device reads, runs the engine's `at_end` hook, then —
/// when syscalls are counted — runs the syscall window
/// ([`probes::count_syscalls`]: per-thread counters are opened only then,
/// so their cost stays out of the measured window), and finally raises the
/// stop flag.
pub struct Clock {
    watchdog: std::thread::JoinHandle<WindowEnd>,
}

/// What the watchdog saw over the measured window.
struct WindowEnd {
    elapsed: Duration,
    cpu: Cpu,
    read_bytes: Option<u64>,
    warmed: Option<Warmed>,
    syscalls: Option<Result<probes::SyscallCounts, String>>,
}

/// How the warm-up went.
#[derive(Debug, Clone, Copy)]
pub struct Warmed {
    /// Its length.
    pub secs: f64,
    /// When the cache was full (with [`WarmFull`]; None: not full by the end).
    pub full_after: Option<f64>,
}

/// Run by the watchdog thread the moment the measured window starts or ends.
pub type AtEnd = Box<dyn FnOnce() + Send>;

/// Hooks the watchdog runs when the measured window starts and ends.
#[derive(Default)]
pub struct WindowHooks {
    pub at_start: Option<AtEnd>,
    pub at_end: Option<AtEnd>,
}

impl Clock {
    pub fn start(spec: &CellSpec<'_>, stop: &std::sync::Arc<Stop>) -> Clock {
        Clock::start_with(spec, stop, WindowHooks::default())
    }

    pub fn start_with(
        spec: &CellSpec<'_>,
        stop: &std::sync::Arc<Stop>,
        hooks: WindowHooks,
    ) -> Clock {
        let duration = spec.duration;
        let warmup = spec.warmup;
        let warm_full = spec.warm_full;
        let syscall_window = spec.probes.syscall_window;
        let stop = stop.clone();
        if !warmup.is_zero() || warm_full.is_some() {
            stop.set_phase(Phase::Between);
        }
        let watchdog = std::thread::spawn(move || {
            let w0 = Instant::now();
            let mut full_at = None;
            while !stop.stopped() {
                let left = match warm_full {
                    None => warmup.saturating_sub(w0.elapsed()),
                    Some(w) => {
                        if full_at.is_none() && (w.full)() {
                            full_at = Some(w0.elapsed());
                        }
                        let until = full_at.map_or(w.max, |t| (t + warmup).min(w.max));
                        until.saturating_sub(w0.elapsed())
                    }
                };
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(20)));
            }
            let warmed = (!warmup.is_zero() || warm_full.is_some()).then(|| Warmed {
                secs: w0.elapsed().as_secs_f64(),
                full_after: full_at.map(|t| t.as_secs_f64()),
            });
            if let Some(f) = hooks.at_start {
                f();
            }
            let t0 = Instant::now();
            let cpu0 = cpu_now();
            let io0 = proc_read_bytes();
            stop.set_phase(Phase::Measure);
            while !stop.stopped() {
                let left = duration.saturating_sub(t0.elapsed());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(20)));
            }
            stop.set_phase(Phase::Between);
            let elapsed = t0.elapsed();
            let cpu1 = cpu_now();
            let read_bytes = proc_read_bytes().zip(io0).map(|(b, a)| b.saturating_sub(a));
            if let Some(f) = hooks.at_end {
                f();
            }
            let syscalls = match syscall_window {
                Some(w) if !stop.stopped() => Some(probes::count_syscalls(&stop, w)),
                _ => None,
            };
            stop.stop();
            WindowEnd {
                elapsed,
                cpu: Cpu {
                    user: cpu1.user - cpu0.user,
                    sys: cpu1.sys - cpu0.sys,
                },
                read_bytes,
                warmed,
                syscalls,
            }
        });
        Clock { watchdog }
    }

    /// Ends the cell (after every worker has finished) and merges the workers.
    pub fn finish(self, workers: Vec<Worker>, stop: &Stop) -> Result<Measured, String> {
        stop.stop();
        let end = self.watchdog.join().expect("cell watchdog thread panicked");
        if let Some(e) = stop.error() {
            return Err(e);
        }
        let mut hist = new_histogram();
        let mut reads = 0;
        let mut window_reads = 0;
        for mut w in workers {
            hist.add(w.hist()).expect("same histogram bounds");
            reads += w.reads;
            window_reads += w.syscall_window_reads;
        }
        let syscalls = match end.syscalls {
            Some(Ok(c)) => Some(probes::SyscallWindow {
                counts: c,
                reads: window_reads,
            }),
            Some(Err(why)) => {
                probes::warn_once_unavailable(&why);
                None
            }
            None => None,
        };
        Ok(Measured {
            hist,
            reads,
            elapsed: end.elapsed,
            cpu: end.cpu,
            reads_per_enter: None,
            inline_completed: None,
            notes: Vec::new(),
            cdf: None,
            verified: true,
            syscalls,
            timer_lateness: None,
            enters: None,
            driver_polls: None,
            read_bytes: end.read_bytes,
            cache_hit_ratio: None,
            warmed: end.warmed,
        })
    }
}

/// A start gate for threads: the clock starts only once all are running.
struct Gate {
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl Gate {
    fn arrive_and_wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 += 1;
        self.cv.notify_all();
        while !s.1 {
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn wait_for(&self, n: usize) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while s.0 < n {
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn open(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.cv.notify_all();
    }
}

/// Runs `spec.depth` OS threads, each looping read -> verify -> record with
/// its own buffer, for the cell's duration. `read` fills the buffer with
/// block `t` and returns the byte count.
pub fn run_threads<R>(spec: &CellSpec<'_>, read: R) -> Result<Measured, String>
where
    R: Fn(Target, &mut AlignedBlock) -> io::Result<usize> + Sync,
{
    let wl = spec.workload();
    let stop = std::sync::Arc::new(Stop::default());
    let gate = Gate {
        state: Mutex::new((0, false)),
        cv: Condvar::new(),
    };
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(spec.depth);
        let mut spawn_error = None;
        for id in 0..spec.depth {
            let (stop, gate, read) = (&stop, &gate, &read);
            let h = std::thread::Builder::new()
                .name(format!("{}-{id}", wl.engine))
                .stack_size(256 << 10)
                .spawn_scoped(s, move || {
                    let mut w = Worker::new(wl, id as u64);
                    let mut buf = AlignedBlock::new();
                    gate.arrive_and_wait();
                    while !stop.stopped() {
                        let t = w.next();
                        let t0 = Instant::now();
                        let r = read(t, &mut buf);
                        if let Err(e) = w.complete(t, r, &buf, t0, stop.phase()) {
                            stop.fail(e);
                            break;
                        }
                    }
                    w
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    spawn_error = Some(format!(
                        "{}: could not start thread {id} of {}: {e}",
                        wl.engine, spec.depth
                    ));
                    break;
                }
            }
        }
        gate.wait_for(handles.len());
        if let Some(e) = spawn_error {
            stop.fail(e);
        }
        let clock = Clock::start(spec, &stop);
        gate.open();
        let workers: Vec<Worker> = handles
            .into_iter()
            .map(|h| h.join().expect("bench worker thread panicked"))
            .collect();
        clock.finish(workers, &stop)
    })
}

/// The async per-task loop shared by the async engines: `read` is the
/// engine's read of one block into an owned aligned buffer.
pub async fn read_loop<F, Fut>(mut read: F, mut w: Worker, stop: &Stop) -> Worker
where
    F: FnMut(Target, AlignedBlock) -> Fut,
    Fut: Future<Output = (io::Result<usize>, AlignedBlock)>,
{
    let mut buf = AlignedBlock::new();
    while !stop.stopped() {
        let t = w.next();
        let t0 = Instant::now();
        let (r, b) = read(t, buf).await;
        buf = b;
        if let Err(e) = w.complete(t, r, &buf, t0, stop.phase()) {
            stop.fail(e);
            break;
        }
    }
    w
}

/// Runs one cell of an engine (the regime has already been applied).
pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let name = spec.engine.name();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match spec.engine {
        EngineKind::Uring => uring::run(spec),
        EngineKind::Mmap | EngineKind::MmapTasks => mmap::run(spec),
        EngineKind::Pread => pread::run(spec),
        EngineKind::TokioFs => tokio_fs::run(spec),
        EngineKind::TokioUring => tokio_uring::run(spec),
        EngineKind::UringRaw => uring_raw::run(spec),
        EngineKind::Fio => fio::run(spec),
        EngineKind::UringCache | EngineKind::UringCacheRef => uring_cache::run(spec),
        EngineKind::All => Err("`all` is not an engine".into()),
    }));
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(ToString::to_string))
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("engine {name} panicked: {msg}"))
        }
    }
}

/// Why an engine cannot run a regime at all (reported as n/a).
pub fn not_applicable(engine: EngineKind, regime: Regime) -> Option<&'static str> {
    match (engine, regime) {
        (EngineKind::Mmap | EngineKind::MmapTasks, Regime::Direct) => {
            Some("mmap always goes through the page cache; O_DIRECT does not apply")
        }
        _ => None,
    }
}

/// Runs `tokio` multi-thread runtime tasks of the async loop: `spawn_task`
/// is called once per task with its worker and must return the task's future.
pub fn run_tokio_tasks<S, Fut>(
    spec: &CellSpec<'_>,
    rt: &tokio::runtime::Runtime,
    hooks: WindowHooks,
    mut spawn_task: S,
) -> Result<Measured, String>
where
    S: FnMut(Worker, std::sync::Arc<Stop>) -> Fut,
    Fut: Future<Output = Worker> + Send + 'static,
{
    let wl = spec.workload();
    let stop = std::sync::Arc::new(Stop::default());
    let clock = Clock::start_with(spec, &stop, hooks);
    let probe = spec
        .probes
        .timer
        .then(|| rt.spawn(probes::timer_probe(stop.clone())));
    let handles: Vec<_> = (0..spec.depth)
        .map(|id| rt.spawn(spawn_task(Worker::new(wl, id as u64), stop.clone())))
        .collect();
    let workers = rt.block_on(async {
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            match h.await {
                Ok(w) => out.push(w),
                Err(e) => stop.fail(format!("engine {}: task failed: {e}", wl.engine)),
            }
        }
        out
    });
    let m = clock.finish(workers, &stop);
    // the probe ended with the measured window (after its current sleep)
    let lateness = probe.and_then(|p| rt.block_on(p).ok());
    let mut m = m?;
    m.timer_lateness = lateness;
    Ok(m)
}

/// `--tokio-global-queue-interval`, set once by `main` before any runtime
/// is built.
pub static GLOBAL_QUEUE_INTERVAL: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// A tokio runtime: multi-thread with `workers` workers, or current_thread
/// when `workers` is `None`; at most `blocking` blocking-pool threads.
pub fn tokio_runtime(
    workers: Option<usize>,
    blocking: usize,
) -> Result<tokio::runtime::Runtime, String> {
    let mut b = match workers {
        Some(w) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(w);
            if let Some(&n) = GLOBAL_QUEUE_INTERVAL.get() {
                b.global_queue_interval(n);
            }
            b
        }
        None => tokio::runtime::Builder::new_current_thread(),
    };
    b.max_blocking_threads(blocking.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build tokio runtime: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_latencies_all_reach_the_histogram() {
        let wl = Workload {
            files: 1,
            blocks: 1,
            seed: 7,
            verify: VerifyMode::Checksum,
            engine: "test",
            keys: Keys::Uniform,
        };
        let mut w = Worker::new(wl, 0);
        // not a multiple of the batch, one value past u32, and a zero
        let mut expect = new_histogram();
        for i in 0..(3 * PENDING as u64 + 5) {
            let ns = 1000 + i * 37;
            w.record(ns);
            expect.record(ns).unwrap();
        }
        w.record(u64::from(u32::MAX) + 10);
        expect.record(u64::from(u32::MAX) + 10).unwrap();
        w.record(0);
        expect.record(1).unwrap();
        let h = w.hist();
        assert_eq!(h.len(), expect.len());
        assert_eq!(h.max(), expect.max());
        assert_eq!(h.min(), expect.min());
        assert_eq!(h.value_at_quantile(0.5), expect.value_at_quantile(0.5));
        // flushing twice changes nothing
        assert_eq!(w.hist().len(), expect.len());
    }
}
