//! Command-line flags.

use crate::kinds::{EngineKind, LogKind, OnOff, OpenEngine, Part, Regime, DEFAULT_SEED};
use crate::verify::VerifyMode;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Parses sizes like `4096`, `64K`, `512MiB`, `1G`, `1.5GiB` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("invalid size unit {u:?} in {s:?} (use K, M, G, T)")),
    };
    let v = n * mult as f64;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("invalid size {s:?}"));
    }
    Ok(v as u64)
}

/// A lookup rate: positive and finite, at most 10 million per second.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 1e7 => Ok(r),
        _ => Err(format!(
            "invalid rate {s:?}: lookups per second, > 0 and <= 1e7"
        )),
    }
}

/// A load fraction: in (0, 4].
fn parse_load(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(l) if l.is_finite() && l > 0.0 && l <= 4.0 => Ok(l),
        _ => Err(format!("invalid load {s:?}: a fraction > 0 and <= 4")),
    }
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('s');
    let (v, scale) = match t.strip_suffix("m") {
        Some(ms) => (ms, 0.001),
        None => (t, 1.0),
    };
    let v: f64 = v
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (e.g. 2.5, 2.5s, 200ms)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("duration must be positive, got {s:?}"));
    }
    Ok(v * scale)
}

/// Like `parse_secs`, but 0 is allowed (it turns the thing off).
fn parse_secs_or_zero(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('s').trim_end_matches('m');
    match t.parse::<f64>() {
        Ok(0.0) => Ok(0.0),
        _ => parse_secs(s),
    }
}

fn parse_seq_mib(s: &str) -> Result<u64, String> {
    let v: u64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if v == 0 || v % 2 != 0 || v > 1 << 20 {
        return Err(format!(
            "{v}: must be a positive multiple of 2, at most 1048576"
        ));
    }
    Ok(v)
}

fn parse_depth(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(d) if (1..=65536).contains(&d) => Ok(d),
        _ => Err(format!(
            "invalid depth {s:?}: reads in flight must be 1..=65536"
        )),
    }
}

/// Random 4 KiB positioned reads: io_uring (uring-positioned-io) against mmap,
/// pread threads, tokio::fs, tokio-uring, a raw io_uring loop and fio, hot and
/// cold, every block verified.
///
/// With no arguments: makes (or reuses) an 8 x 1 GiB dataset in ./bench-data,
/// runs `uring`, `mmap` and `pread` (a thread per read in flight) at 8, 32
/// and 512 reads in flight, hot and cold, 2 s per cell (18 cells), prints
/// the table and writes JSON, Markdown and SVG charts to
/// ./bench-results/<time>/.
///
/// `uring-bench cpu-per-read` measures CPU per read on cached data instead:
/// this crate against a raw io-uring loop (see `uring-bench cpu-per-read --help`).
#[derive(Debug, Clone, Parser)]
#[command(name = "uring-bench", version, args_conflicts_with_subcommands = true)]
pub struct Args {
    /// Another mode instead of the random-read comparison.
    #[command(subcommand)]
    pub mode: Option<Mode>,

    /// Engines to run (comma separated or repeated); `all` runs every engine.
    /// The default compares this crate with mmap and with pread threads.
    #[arg(short, long, value_delimiter = ',', default_values = ["uring", "mmap", "pread"])]
    pub engines: Vec<EngineKind>,

    /// Reads in flight per engine (tasks / threads / ring slots / fio iodepth).
    #[arg(short, long, value_delimiter = ',', default_values = ["8", "32", "512"], value_parser = parse_depth)]
    pub depths: Vec<usize>,

    /// Page-cache regimes.
    #[arg(short, long, value_delimiter = ',', default_values = ["hot", "cold"])]
    pub regimes: Vec<Regime>,

    /// Measured time per cell, in seconds (`2.5`, `60s`, `200ms`). The
    /// default of 2 s keeps the default run (18 cells) short; use more (and
    /// `--repeat 3`) for figures to keep.
    #[arg(short = 't', long, default_value = "2", value_parser = parse_secs)]
    pub duration: f64,

    /// Run every cell this many times (interleaved with the other engines)
    /// and report the run with the median reads/s; on a noisy machine use 3.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,

    /// Tokio worker threads for the `uring` and `tokio-fs` engines.
    #[arg(short, long, default_value_t = 2)]
    pub workers: usize,

    /// Number of dataset files.
    #[arg(long, default_value_t = 8)]
    pub files: u32,

    /// Size of each dataset file (multiple of 4 KiB; K/M/G/T suffixes).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub file_size: u64,

    /// Directory holding the dataset (created and reused).
    #[arg(long, default_value = "bench-data")]
    pub data_dir: PathBuf,

    /// Seed of the dataset contents.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,

    /// Fail instead of generating when no matching dataset exists.
    #[arg(long)]
    pub no_generate: bool,

    /// Only make (or check) the dataset, run nothing.
    #[arg(long, conflicts_with = "no_generate")]
    pub generate_only: bool,

    /// Hot working set in bytes (whole files from file 0); default: the whole
    /// dataset if it fits in half of the available memory, otherwise what fits.
    #[arg(long, value_parser = parse_size)]
    pub hot_set: Option<u64>,

    /// Where run directories are created.
    #[arg(short, long, default_value = "bench-results")]
    pub output_dir: PathBuf,

    /// Per-read verification.
    #[arg(long, value_enum, default_value_t = VerifyMode::Checksum)]
    pub verify: VerifyMode,

    /// io_uring rings of the `uring` engine (library default if unset).
    #[arg(long)]
    pub uring_rings: Option<usize>,

    /// Entries per ring of the `uring` engine.
    #[arg(long, default_value_t = 256)]
    pub uring_entries: u32,

    /// Reads in flight the `uring` engine's context admits (default: max(1024, depth)).
    #[arg(long)]
    pub uring_max_in_flight: Option<usize>,

    /// RWF_NOWAIT page-cache fast path of the `uring` engine (library default if unset).
    #[arg(long, value_enum)]
    pub uring_inline: Option<OnOff>,

    /// Inline-read stretch of the `uring` engine in microseconds
    /// (`Builder::inline_stretch`: how long a worker serves page-cache hits
    /// before the next reading task yields; library default if unset).
    #[arg(long)]
    pub uring_inline_stretch_us: Option<u64>,

    /// Most reads one `io_uring_enter` hands a shallow ring (≤ 64 reads in
    /// the kernel) in the `uring` engine (`Builder::shallow_batch`; library
    /// default 8 if unset). Smaller enters reach the device sooner; which
    /// value wins depends on the disk.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=32768))]
    pub uring_shallow_batch: Option<u32>,

    /// `global_queue_interval` of the multi-thread tokio runtimes the
    /// async engines run on (tokio's default if unset: tuned to ~200 µs of
    /// task polls between looks at the global queue). With more runnable
    /// tasks than the workers' local queues hold (256 each), the overflow
    /// waits there: see "The hot tail at depth 512" in docs/BENCHMARKS.md.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub tokio_global_queue_interval: Option<u32>,

    /// Capacity of the `uring-cache` and `uring-cache-ref` engines'
    /// `BlockCache`, in MiB. Default: the cell's working set plus 1/16 —
    /// large enough for the whole hot set (which is read into the cache
    /// before each hot cell's measured window) and for every block a
    /// direct or cold cell reads (those start with an empty cache).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub cache_mib: Option<u64>,

    /// Path of the fio binary.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,

    /// Populate the mmap engine's mappings (MAP_POPULATE) before hot cells,
    /// outside the timed window; `off` makes hot mmap cells include
    /// first-touch minor faults.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub mmap_populate: OnOff,

    /// fio jobs sharing each cell's reads in flight (iodepth = depth / jobs);
    /// default: one per CPU. One fio job saturates a CPU before the device on
    /// small machines, so one job would understate the ceiling.
    #[arg(long)]
    pub fio_jobs: Option<usize>,

    /// Timer-lateness probe: a task looping `tokio::time::sleep(1 ms)` on
    /// the engine's tokio runtime during each cell (uring, tokio-fs,
    /// tokio-uring), reporting p99/max lateness.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub timer_probe: OnOff,

    /// Seconds of the syscall window that follows each in-process cell's
    /// measured window: the same work goes on while every thread's system
    /// calls are counted (perf_event_open on the raw_syscalls:sys_enter
    /// tracepoint, which needs tracefs mounted: `-` and a one-line hint when
    /// unavailable), reported per read. 0 turns it off.
    #[arg(long, default_value = "0.5", value_parser = parse_secs_or_zero)]
    pub syscall_window: f64,

    /// Skip charts (SVG).
    #[arg(long)]
    pub no_charts: bool,

    /// No progress bar, fewer messages.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Modes other than the default random-read comparison.
#[derive(Debug, Clone, Subcommand)]
pub enum Mode {
    /// CPU per read and throughput on cached data: this crate against a raw
    /// io-uring loop, in the same run.
    ///
    /// One file of M MiB (default 1024) in the page cache (warmed before every
    /// cell), random aligned 4 KiB reads, every block verified (header and
    /// checksum, as in the main run). CPU per read is (user + sys) / reads from
    /// getrusage over the timed window. Rows: `raw-ring (1 thread)`, one ring,
    /// fixed file, `depth` reads in flight, a batch per io_uring_enter (the
    /// floor for ring overhead; the `uring-raw` engine); `crate ring/1w`, this
    /// crate with the ring path only (inline_nowait off) on a current_thread
    /// runtime, one ring; `crate ring/2w`, ring path only, multi_thread with 2
    /// workers and 2 rings; `crate nowait/2w`, the default (page-cache hits
    /// served inline with RWF_NOWAIT), 2 workers, 2 rings.
    CpuPerRead(CpuPerReadArgs),

    /// Counting the lines of a large text file, every method of the study
    /// "Towards Fast IO on Linux using Rust" (BufReader lines/fill_buf, an
    /// O_DIRECT loop, mmap naive/AVX2/memchr, vectored reads, io_uring with
    /// one read or readv in flight) plus this crate's scan (buffered and
    /// O_DIRECT, depths 1/4/8/16), a hand-written two-thread reader (the
    /// ceiling of a copying reader), `wc -l` and fio's sequential O_DIRECT
    /// read (the device ceiling), cold and hot. Every count is checked
    /// against the file's known line count.
    Lines(LinesArgs),

    /// Open loop: lookups (1 read, or a batch) arrive at a fixed mean rate
    /// (Poisson) whatever the engine does; latency is measured from each
    /// lookup's arrival, so queueing cannot hide. Compares this crate with
    /// `tokio-fs` (spawn_blocking + pread), `pread` and `mmap` thread pools,
    /// hot and cold, and on request `tokio-pread` (a blocking `pread` on the
    /// same runtime, hot only: the runtime's own floor); every block
    /// verified. The rate is `--rate`, or `--load` times the highest rate
    /// the crate keeps up with (found first).
    OpenLoop(OpenLoopArgs),

    /// The write path: random 4 KiB O_DIRECT writes at each depth against
    /// fio `randwrite` and `pwrite` threads, and WAL-style appends (many
    /// writers, group commit with fdatasync, commit latency percentiles)
    /// against `tokio::fs` and threads. Every written block and every
    /// acknowledged record is read back and checked after each run; each
    /// cell is repeated (`--repeat`) and the medians reported with
    /// same-run ratios.
    Write(WriteArgs),

    /// Engines under the same memory limit: each engine runs in its own
    /// child process, in its own memory cgroup (v2 `memory.max`, else v1
    /// `memory.limit_in_bytes`) limited to `--budget`, after the dataset's
    /// pages were dropped from the page cache. `mmap`, `pread` and `uring`
    /// get the budget as page cache; `uring-cache` and `uring-cache-ref`
    /// open the files O_DIRECT and get a `BlockCache` of the budget minus
    /// `--allowance`; `uring-raw` reads O_DIRECT with no cache (the
    /// device's ceiling for misses). Workloads: `hot` (uniform over a
    /// working set of ~0.8x the budget, filled first), `zipf` (Zipf over
    /// the dataset, 4x the budget), `uniform4x` (uniform over the dataset,
    /// the largest depth), `fill` (from cold, reads/s every 100 ms). Needs
    /// root and a memory cgroup controller; otherwise it says why and exits
    /// with success.
    MemFair(MemFairArgs),

    /// One engine run of `mem-fair` (started by it, in its cgroup).
    #[command(hide = true)]
    MemFairChild(MemFairChildArgs),

    /// Eviction policies on the draws of `mem-fair`'s zipf workload,
    /// simulated (no I/O): LRU, S3-FIFO with an access bit (as
    /// `BlockCache` runs it), S3-FIFO with 2-bit counters, W-TinyLFU with
    /// exact counts, and the ideal (a cache that always holds the most
    /// likely blocks). Hit ratios over the same draws, after a warm-up.
    ZipfPolicies(ZipfPoliciesArgs),

    /// Lookups under a scan: cold random 4 KiB point lookups on one file,
    /// arriving at a fixed light rate (open loop, Poisson, latency from
    /// arrival), alone and with a full-speed scan of another file on the
    /// same context: the scan as a background op (`classes`, the scan's
    /// default) and as a latency op (`no classes`). Against the same
    /// lookups on a pool of pread threads with a `BufReader` scan on a
    /// thread. Files O_DIRECT unless `--buffered` (then both are dropped
    /// from the page cache before every row); every block verified.
    Sched(SchedArgs),
    /// One file on slow storage (a FUSE file system the bench mounts, each
    /// read answered after 1 to 20 ms), many reads in flight: the crate on
    /// its default route for FUSE files (the blocking pool, with borrowed
    /// and with owned buffers) and on the rings, against `spawn_blocking` +
    /// `pread`; with and without the page
    /// cache, every block verified, ratios per round. Needs root and
    /// `/dev/fuse`; otherwise it says why and exits with success.
    SlowFile(SlowFileArgs),
    /// The block cache and the context under hostile use, for `--secs`:
    /// rounds of random settings (backend, workers, rings, slots, block
    /// size, a cache of a few blocks, `O_DIRECT` or not), tasks that read,
    /// get, multi-get, prefetch, invalidate, write, punch holes, append
    /// to a file while the others read its end, register and unregister
    /// files, read through the context (borrowed,
    /// owned and batched, into buffers whose Drop calls back in), give up
    /// reads mid-flight and hold blocks on another thread; every byte
    /// checked (no stale byte after a
    /// completed write), nothing pinned or in flight after a round, and a
    /// watchdog that prints every ring's state if a task hangs. Fails
    /// (exit status 1) on the first wrong byte, error, leak or hang.
    Soak(SoakArgs),
    /// Parquet through the crate's `ParquetFileReader` against
    /// `tokio::fs::File` and a `spawn_blocking` reader (what
    /// `object_store`'s local file system does): random row lookups with
    /// the metadata loaded once, and full scans; hot and cold; every row
    /// checked. Needs the bench built with `--features parquet`.
    Parquet(ParquetArgs),
}

/// How `slow-file`'s FUSE file is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SlowCache {
    /// `FOPEN_DIRECT_IO`: no page cache, each `pread` one FUSE request.
    Direct,
    /// Through the page cache (every read of a block not read before).
    Cached,
}

/// Flags of `uring-bench slow-file`.
#[derive(Debug, Clone, clap::Args)]
pub struct SlowFileArgs {
    /// Reads in flight: tasks, each reading in a loop.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub in_flight: u64,

    /// Seconds per cell.
    #[arg(short = 't', long, default_value = "2", value_parser = parse_secs)]
    pub secs: f64,

    /// Rounds (each runs every engine once, in a rotated order).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,

    /// The slowest read, in ms: a read takes 1 to this many ms, by the
    /// MiB it is in.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_delay_ms: u64,

    /// The file's caching modes to run.
    #[arg(long, value_delimiter = ',', default_values = ["direct", "cached"])]
    pub cache: Vec<SlowCache>,

    /// Each runtime's `max_blocking_threads` (tokio's default: 512).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_blocking_threads: u64,

    /// Only these engines (`spawn-blocking`, `pool`, `pool-owned`,
    /// `ring`); the ratios need `spawn-blocking`.
    #[arg(long, value_delimiter = ',', default_values = ["spawn-blocking", "pool", "pool-owned", "ring"])]
    pub engines: Vec<SlowEngine>,
}

/// An engine of `slow-file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SlowEngine {
    /// `spawn_blocking` + `FileExt::read_at`.
    SpawnBlocking,
    /// The crate's default route for FUSE files: the blocking pool.
    Pool,
    /// The same route with owned buffers (`read_owned`, the task's one
    /// buffer passed in and back): no bounce copy.
    PoolOwned,
    /// The crate on the rings (`fuse_via_blocking_pool(false)`).
    Ring,
}

/// Flags of `uring-bench parquet`.
#[derive(Debug, Clone, clap::Args)]
pub struct ParquetArgs {
    /// Readers compared.
    #[arg(short, long, value_delimiter = ',', default_values = ["uring", "tokio-fs", "spawn-blocking"])]
    pub engines: Vec<ParquetEngine>,

    /// Regimes: `hot` (the file in the page cache) and `cold` (dropped from
    /// it before every cell).
    #[arg(short, long, value_delimiter = ',', default_values = ["hot", "cold"])]
    pub regimes: Vec<ParquetRegime>,

    /// Rows of the file the bench writes (once; reused afterwards).
    #[arg(long, default_value_t = 4_000_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub rows: u64,

    /// Rows per row group.
    #[arg(long, default_value_t = 131_072, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub group_rows: u64,

    /// Target size of a data page, KiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub page_kib: u64,

    /// Lookups in flight (tasks).
    #[arg(short, long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub depth: u64,

    /// Measured seconds of a hot lookups cell.
    #[arg(short = 't', long, default_value = "3", value_parser = parse_secs)]
    pub secs: f64,

    /// Lookups of a cold cell (the file dropped from the page cache first).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub cold_lookups: u64,

    /// Streams of a scan, each over every n-th row group, read at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub streams: u64,

    /// Runs of every cell, interleaved; the table gives the medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,

    /// Directory holding the Parquet file (created and reused).
    #[arg(long, default_value = "bench-data")]
    pub data_dir: PathBuf,

    /// Seed of the rows looked up.
    #[arg(long, default_value_t = 0x9a4e)]
    pub seed: u64,
}

/// The readers of `uring-bench parquet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ParquetEngine {
    /// The crate's `ParquetFileReader` over a `UringFile`.
    Uring,
    /// `tokio::fs::File`, opened per stream (it keeps a position).
    TokioFs,
    /// Each request's ranges read with `pread` in one `spawn_blocking`.
    SpawnBlocking,
}

#[cfg(feature = "parquet")]
impl ParquetEngine {
    pub fn name(self) -> &'static str {
        match self {
            ParquetEngine::Uring => "uring",
            ParquetEngine::TokioFs => "tokio-fs",
            ParquetEngine::SpawnBlocking => "spawn-blocking",
        }
    }
}

/// The regimes of `uring-bench parquet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ParquetRegime {
    Hot,
    Cold,
}

/// Flags of `uring-bench sched`.
#[derive(Debug, Clone, clap::Args)]
pub struct SchedArgs {
    /// Lookups per second (Poisson arrivals).
    #[arg(long, default_value = "2000", value_parser = parse_rate)]
    pub rate: f64,

    /// Measured seconds per row (after a 0.5 s warm-up).
    #[arg(short = 't', long, default_value = "5", value_parser = parse_secs)]
    pub secs: f64,

    /// Size of each of the two files: file 0 takes the lookups, file 1
    /// the scan (a multiple of 4 KiB; K/M/G/T suffixes).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub file_size: u64,

    /// Read through the page cache instead of O_DIRECT; both files are
    /// dropped from it before every row, and the scanned file after every
    /// pass over it, so that every read goes to the device.
    #[arg(long)]
    pub buffered: bool,

    /// Runs of the whole set of rows; with more than one, the medians are
    /// printed after the runs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,

    /// `Builder::background_share` of the crate's context (library default
    /// if unset).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub background_share: Option<u64>,

    /// `Builder::background_piece` of the crate's context, e.g. `64KiB`
    /// (library default if unset; the library checks it).
    #[arg(long, value_parser = parse_size)]
    pub background_piece: Option<u64>,

    /// The crate's scan runs on a tokio runtime of its own (one worker
    /// thread) over the same context, as a compaction on its own threads:
    /// its consumer's CPU work (verifying every block) then no longer holds
    /// up the lookups' tasks on the lookups' workers, and what is left is
    /// the I/O scheduling.
    #[arg(long)]
    pub scan_thread: bool,

    /// Threads of the pread lookup pool (as `open-loop`'s; a pool smaller
    /// than rate × read latency queues lookups behind each other).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub threads: u64,

    /// Directory holding the dataset (created and reused; the main run's
    /// dataset is reused when its file size matches).
    #[arg(long, default_value = "bench-data")]
    pub data_dir: PathBuf,

    /// Seed of the arrival schedule and the blocks looked up.
    #[arg(long, default_value_t = 0x5c4e)]
    pub seed: u64,

    /// Where the run directory (sched-<time>) is created.
    #[arg(short, long, default_value = "bench-results")]
    pub output_dir: PathBuf,
}

/// The workloads of `uring-bench mem-fair`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum MemWorkload {
    /// Uniform over a working set that fits the budget, filled before the
    /// window.
    Hot,
    /// Zipf (`--theta`) over the whole dataset, ranks scattered.
    Zipf,
    /// Uniform over the whole dataset at the largest depth (mostly misses).
    Uniform4x,
    /// From a cold start: reads/s in 100 ms samples while the cache fills
    /// and then evicts (uniform over the dataset, the largest depth).
    Fill,
}

impl MemWorkload {
    pub fn name(self) -> &'static str {
        match self {
            MemWorkload::Hot => "hot",
            MemWorkload::Zipf => "zipf",
            MemWorkload::Uniform4x => "uniform4x",
            MemWorkload::Fill => "fill",
        }
    }
}

/// A Zipf exponent: finite, > 0 and <= 10.
fn parse_theta(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 && t <= 10.0 => Ok(t),
        _ => Err(format!("invalid theta {s:?}: > 0 and <= 10")),
    }
}

/// A fraction in (0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("invalid fraction {s:?}: > 0 and <= 1")),
    }
}

/// Flags of `uring-bench mem-fair`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemFairArgs {
    /// Memory limit of every engine's cgroup (page cache, heap and the
    /// engine's own cache together).
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub budget: u64,

    /// What the cache engines leave of the budget for their process (heap,
    /// runtime, buffers, binary): their `BlockCache` capacity is the budget
    /// minus this.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub allowance: u64,

    /// Dataset size (default: 4x the budget); `zipf`, `uniform4x` and
    /// `fill` read all of it.
    #[arg(long, value_parser = parse_size)]
    pub dataset_size: Option<u64>,

    /// Size of each dataset file (the hot working set is whole files).
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    pub file_size: u64,

    /// The hot working set, as a fraction of the budget (rounded down to
    /// whole files).
    #[arg(long, default_value_t = 0.8, value_parser = parse_fraction)]
    pub hot_fraction: f64,

    /// Workloads to run.
    #[arg(long, value_delimiter = ',', default_values = ["hot", "zipf", "uniform4x", "fill"])]
    pub workloads: Vec<MemWorkload>,

    /// Engines to compare (of mmap, pread, uring, uring-cache,
    /// uring-cache-ref, uring-raw).
    #[arg(short, long, value_delimiter = ',', default_values = ["mmap", "pread", "uring", "uring-cache", "uring-cache-ref", "uring-raw"])]
    pub engines: Vec<EngineKind>,

    /// Reads in flight of `hot` and `zipf`; `uniform4x` and `fill` use the
    /// largest.
    #[arg(short, long, value_delimiter = ',', default_values = ["8", "32", "512"], value_parser = parse_depth)]
    pub depths: Vec<usize>,

    /// Measured seconds per cell (`hot`, `zipf`, `uniform4x`).
    #[arg(short = 't', long, default_value = "2", value_parser = parse_secs)]
    pub secs: f64,

    /// `zipf` and `uniform4x` start cold and run the same reads, not
    /// measured, until the engine's cache is full (its cgroup hit the
    /// limit, or the `BlockCache` evicted), then this many seconds more,
    /// before the measured window (`uring-raw`, with no cache: just this).
    #[arg(long, default_value = "2", value_parser = parse_secs_or_zero)]
    pub warmup: f64,

    /// Longest warm-up waiting for the cache to fill (the table says when
    /// a cache was not full).
    #[arg(long, default_value = "30", value_parser = parse_secs)]
    pub max_warmup: f64,

    /// Seconds of the `fill` workload (sampled every 100 ms).
    #[arg(long, default_value = "20", value_parser = parse_secs)]
    pub fill_secs: f64,

    /// Zipf exponent of `zipf`.
    #[arg(long, default_value_t = 0.99, value_parser = parse_theta)]
    pub theta: f64,

    /// Runs of every cell (engines interleaved); the median is reported.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,

    /// Tokio worker threads of the async engines.
    #[arg(short, long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub workers: u64,

    /// Directory holding the dataset (created and reused).
    #[arg(long, default_value = "bench-data/mem-fair")]
    pub data_dir: PathBuf,

    /// Seed of the dataset contents.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,

    /// Where the run directory (mem-fair-<time>) is created.
    #[arg(short, long, default_value = "bench-results")]
    pub output_dir: PathBuf,

    /// Fewer messages (no per-run lines).
    #[arg(short, long)]
    pub quiet: bool,
}

/// Flags of `uring-bench zipf-policies`.
#[derive(Debug, Clone, clap::Args)]
pub struct ZipfPoliciesArgs {
    /// Blocks drawn from: the dataset's size (4 KiB blocks). The default is
    /// `mem-fair`'s dataset (4 × its 512 MiB budget).
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    pub dataset_size: u64,

    /// The cache's capacity (4 KiB blocks). The default is `mem-fair`'s
    /// `BlockCache` (its budget minus its allowance).
    #[arg(long, default_value = "448MiB", value_parser = parse_size)]
    pub cache_size: u64,

    /// Zipf exponent.
    #[arg(long, default_value_t = 0.99, value_parser = parse_theta)]
    pub theta: f64,

    /// Draws counted, after the warm-up.
    #[arg(long, default_value_t = 2_000_000)]
    pub reads: usize,

    /// Draws before the counted ones (they fill the cache).
    #[arg(long, default_value_t = 2_000_000)]
    pub warmup: usize,

    /// Seed of the draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Flags of `uring-bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Seconds of rounds.
    #[arg(long, default_value_t = 60.0)]
    pub secs: f64,

    /// Seed of the rounds' settings (default: from the clock; printed).
    #[arg(long, value_parser = parse_seed)]
    pub seed: Option<u64>,

    /// Run every round with this round's settings (as printed by a
    /// failure), to reproduce it.
    #[arg(long, value_parser = parse_seed)]
    pub round_seed: Option<u64>,

    /// A task that finishes no operation for this long is a hang.
    #[arg(long, default_value_t = 10.0)]
    pub stall_secs: f64,

    /// Where the soak's files go (a directory it makes and removes).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,

    /// Without the flaky FUSE file (otherwise mounted when the process
    /// may: root and `/dev/fuse`).
    #[arg(long)]
    pub no_fuse: bool,
}

/// A seed, decimal or `0x` hex.
fn parse_seed(s: &str) -> Result<u64, String> {
    let t = s.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => t.parse(),
    }
    .map_err(|e| format!("invalid seed {s:?}: {e}"))
}

/// Flags of the hidden `mem-fair-child`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemFairChildArgs {
    /// The run, as JSON (see `mem_fair::ChildSpec`).
    #[arg(long)]
    pub spec: String,
}

/// Flags of `uring-bench write`.
#[derive(Debug, Clone, clap::Args)]
pub struct WriteArgs {
    /// Parts to run.
    #[arg(long, value_delimiter = ',', default_values = ["randwrite", "seqwrite", "wal"])]
    pub parts: Vec<Part>,

    /// Writes in flight (randwrite): tasks / threads / fio iodepth.
    #[arg(short, long, value_delimiter = ',', default_values = ["8", "32", "512"], value_parser = parse_depth)]
    pub depths: Vec<usize>,

    /// Worker threads of the `uring` randwrite engine's runtime.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub workers: u64,

    /// Size of the randwrite file in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub file_mib: u64,

    /// Size of the seqwrite file in MiB (a multiple of 2: it is written in
    /// 2 MiB writes).
    #[arg(long, default_value_t = 1024, value_parser = parse_seq_mib)]
    pub seq_mib: u64,

    /// Measured seconds per cell.
    #[arg(short = 't', long, default_value = "1.5", value_parser = parse_secs)]
    pub secs: f64,

    /// Repeats of every cell (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,

    /// WAL writers (each appends and waits for its commit, in a loop).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub wal_writers: u64,

    /// WAL log files: `preallocated` (zero-filled and synced before each
    /// run, so a commit's `fdatasync` overwrites allocated blocks and has no
    /// size change to journal — how production WALs recycle their logs) and
    /// `append` (a fresh empty file grown by every group). Each kind gets
    /// its own table, flush floor and ceiling.
    #[arg(long, value_delimiter = ',', default_values = ["preallocated", "append"])]
    pub wal_log: Vec<LogKind>,

    /// WAL record payload bytes.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(16..=1_048_576))]
    pub record_bytes: u64,

    /// Directory of the files written (on the device under test).
    #[arg(long, default_value = "bench-data")]
    pub dir: PathBuf,

    /// The fio binary.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,
}

/// Flags of `uring-bench open-loop`.
#[derive(Debug, Clone, clap::Args)]
pub struct OpenLoopArgs {
    /// Engines to compare.
    #[arg(short, long, value_delimiter = ',', default_values = ["uring", "mmap", "pread", "tokio-fs"])]
    pub engines: Vec<OpenEngine>,

    /// Page-cache regimes.
    #[arg(short, long, value_delimiter = ',', default_values = ["hot", "cold"])]
    pub regimes: Vec<Regime>,

    /// Reads per lookup (1: point lookups; 16: multi_get batches).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub batch: u64,

    /// Lookups per second (overrides --load).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,

    /// Target load as a fraction of the highest lookup rate the crate's
    /// engine keeps up with in this open loop (found first by stepping down
    /// from its closed-loop rate).
    #[arg(long, default_value_t = 0.5, value_parser = parse_load)]
    pub load: f64,

    /// Measured seconds per engine (after a 0.5 s warm-up).
    #[arg(short = 't', long, default_value = "3", value_parser = parse_secs)]
    pub secs: f64,

    /// Rounds of every engine per regime. Each round starts with the next
    /// engine in turn (the first engine after the set-up ran with a longer
    /// tail here, whichever it was); with more than one round the medians
    /// per engine are printed after the rounds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,

    /// The `uring` engine issues a batch as separate `ctx.read`s under
    /// `join_all` instead of one `ctx.read_batch` (to compare the two).
    #[arg(long)]
    pub join_all: bool,

    /// Threads of the `pread` and `mmap` pools.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,

    /// Dataset files (the main run's dataset is reused).
    #[arg(long, default_value_t = 8)]
    pub files: u32,

    /// Size of each dataset file.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub file_size: u64,

    /// Directory holding the dataset (created and reused).
    #[arg(long, default_value = "bench-data")]
    pub data_dir: PathBuf,

    /// Seed of the arrival schedule and the blocks read.
    #[arg(long, default_value_t = 0x0be1)]
    pub seed: u64,

    /// Where the run directory (open-loop-<time>) is created.
    #[arg(short, long, default_value = "bench-results")]
    pub output_dir: PathBuf,
}

/// Flags of `uring-bench lines`.
#[derive(Debug, Clone, clap::Args)]
pub struct LinesArgs {
    /// Size of the text file (K/M/G/T suffixes; the study's file is 22G).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub size: u64,

    /// Cache regimes: `cold` (evicted before each method) and `hot` (read
    /// once before each method).
    #[arg(short, long, value_delimiter = ',', default_values = ["cold", "hot"])]
    pub regimes: Vec<Regime>,

    /// Rounds per regime (methods interleaved); the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,

    /// Run only the methods whose name contains one of these texts
    /// (comma-separated: `--only "memchr,scan buffered depth 8"` puts the
    /// two in the same rounds).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,

    /// Leave out `BufReader lines().count()` (the slowest by far).
    #[arg(long)]
    pub skip_slow: bool,

    /// Directory of the text file and its manifest (created and reused).
    #[arg(long, default_value = "bench-data/lines")]
    pub data_dir: PathBuf,

    /// Seed of the file's contents.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,

    /// Where the run directory (lines-<time>) is created.
    #[arg(short, long, default_value = "bench-results")]
    pub output_dir: PathBuf,

    /// Path of the fio binary.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,

    /// Skip the SVG charts.
    #[arg(long)]
    pub no_charts: bool,

    /// Fewer messages (no per-round lines).
    #[arg(short, long)]
    pub quiet: bool,
}

/// Flags of `uring-bench cpu-per-read`.
#[derive(Debug, Clone, clap::Args)]
pub struct CpuPerReadArgs {
    /// Measured time per cell, in seconds (`3`, `3s`, `500ms`).
    #[arg(long, default_value = "3", value_parser = parse_secs)]
    pub secs: f64,

    /// Size of the file, in MiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub file_mib: u64,

    /// Reads in flight.
    #[arg(long, value_delimiter = ',', default_values = ["32", "512"], value_parser = parse_depth)]
    pub depths: Vec<usize>,

    /// Run only the crate rows whose name contains this text (the raw ring,
    /// the baseline, always runs).
    #[arg(long)]
    pub only: Option<String>,

    /// Directory of the one-file dataset (created and reused). `--data-dir
    /// bench-data` reuses the main run's dataset when `--file-mib` equals its
    /// file size.
    #[arg(long, default_value = "bench-data/cpu-per-read")]
    pub data_dir: PathBuf,
}

impl Args {
    /// Engines in a stable order, `all` expanded, duplicates removed.
    pub fn engine_list(&self) -> Vec<EngineKind> {
        let mut out = Vec::new();
        for &e in &self.engines {
            let add: Vec<EngineKind> = if e == EngineKind::All {
                EngineKind::ALL.to_vec()
            } else {
                vec![e]
            };
            for a in add {
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
        out
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.workers == 0 {
            return Err("--workers must be at least 1".into());
        }
        if self.uring_entries == 0 {
            return Err("--uring-entries must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
        assert_eq!(parse_secs("200ms").unwrap(), 0.2);
        assert_eq!(parse_secs("2.5").unwrap(), 2.5);
        assert!(parse_secs("0").is_err());
        assert_eq!(parse_secs_or_zero("0").unwrap(), 0.0);
        assert_eq!(parse_secs_or_zero("0s").unwrap(), 0.0);
        assert_eq!(parse_secs_or_zero("0ms").unwrap(), 0.0);
        assert_eq!(parse_secs_or_zero("500ms").unwrap(), 0.5);
        assert!(parse_secs_or_zero("-1").is_err());
        assert!(parse_secs_or_zero("x").is_err());
    }
    #[test]
    fn defaults() {
        let a = Args::parse_from(["uring-bench"]);
        assert_eq!(
            a.engine_list(),
            vec![EngineKind::Uring, EngineKind::Mmap, EngineKind::Pread]
        );
        assert_eq!(a.duration, 2.0);
        assert_eq!(a.depths, vec![8, 32, 512]);
        assert_eq!(a.regimes, vec![Regime::Hot, Regime::Cold]);
        assert_eq!(a.syscall_window, 0.5);
        assert_eq!(a.timer_probe, OnOff::On);
        assert!(a.mode.is_none());
        let a = Args::parse_from(["uring-bench", "-e", "all,uring"]);
        assert_eq!(a.engine_list().len(), EngineKind::ALL.len());
        let a = Args::parse_from(["uring-bench", "cpu-per-read", "--depths", "8"]);
        let Some(Mode::CpuPerRead(c)) = a.mode else {
            panic!("cpu-per-read parses as its mode")
        };
        assert_eq!((c.secs, c.file_mib, c.depths), (3.0, 1024, vec![8]));
        assert!(Args::try_parse_from(["uring-bench", "-e", "mmap", "cpu-per-read"]).is_err());
        let a = Args::parse_from([
            "uring-bench",
            "open-loop",
            "--batch",
            "16",
            "--rate",
            "1000",
        ]);
        let Some(Mode::OpenLoop(o)) = a.mode else {
            panic!("open-loop parses as its mode")
        };
        assert_eq!(
            (o.batch, o.rate, o.load, o.engines.len()),
            (16, Some(1000.0), 0.5, 4)
        );
        assert!(Args::try_parse_from(["uring-bench", "open-loop", "--batch", "0"]).is_err());
        for bad in ["0", "-5", "nan", "inf", "1e9"] {
            assert!(Args::try_parse_from(["uring-bench", "open-loop", "--rate", bad]).is_err());
        }
        for bad in ["0", "-0.5", "nan", "5"] {
            assert!(Args::try_parse_from(["uring-bench", "open-loop", "--load", bad]).is_err());
        }
        let a = Args::parse_from(["uring-bench", "sched"]);
        let Some(Mode::Sched(s)) = a.mode else {
            panic!("sched parses as its mode")
        };
        assert_eq!(
            (s.rate, s.secs, s.file_size, s.repeat, s.background_share),
            (2000.0, 5.0, 1 << 30, 1, None)
        );
        assert!(!s.buffered);
        let a = Args::parse_from(["uring-bench", "sched", "--background-share", "8"]);
        let Some(Mode::Sched(s)) = a.mode else {
            panic!("sched parses as its mode")
        };
        assert_eq!(s.background_share, Some(8));
        for bad in [
            ["--rate", "0"],
            ["--rate", "-1"],
            ["--secs", "0"],
            ["--repeat", "0"],
            ["--background-share", "0"],
            ["--threads", "0"],
            ["--file-size", "12Q"],
        ] {
            let mut args = vec!["uring-bench", "sched"];
            args.extend(bad);
            assert!(Args::try_parse_from(args).is_err(), "{bad:?}");
        }
        let a = Args::parse_from(["uring-bench", "write"]);
        let Some(Mode::Write(w)) = a.mode else {
            panic!("write parses as its mode")
        };
        assert_eq!((w.depths, w.repeat, w.workers), (vec![8, 32, 512], 3, 2));
        assert_eq!(w.parts.len(), 3);
        assert_eq!(w.seq_mib, 1024);
        let a = Args::parse_from(["uring-bench", "write", "--parts", "wal", "-t", "3"]);
        let Some(Mode::Write(w)) = a.mode else {
            panic!("write parses as its mode")
        };
        assert_eq!((w.parts, w.secs), (vec![Part::Wal], 3.0));
        for bad in [
            ["--depths", "0"],
            ["--repeat", "0"],
            ["--record-bytes", "8"],
            ["--seq-mib", "3"],
            ["--seq-mib", "0"],
        ] {
            let mut args = vec!["uring-bench", "write"];
            args.extend(bad);
            assert!(Args::try_parse_from(args).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parquet_mode_parses_and_checks() {
        let a = Args::parse_from(["uring-bench", "parquet"]);
        let Some(Mode::Parquet(p)) = a.mode else {
            panic!("parquet parses as its mode")
        };
        assert_eq!(
            p.engines,
            [
                ParquetEngine::Uring,
                ParquetEngine::TokioFs,
                ParquetEngine::SpawnBlocking
            ]
        );
        assert_eq!(p.regimes, [ParquetRegime::Hot, ParquetRegime::Cold]);
        let a = Args::parse_from([
            "uring-bench",
            "parquet",
            "-e",
            "uring",
            "-r",
            "cold",
            "-d",
            "8",
        ]);
        let Some(Mode::Parquet(p)) = a.mode else {
            panic!("parquet parses as its mode")
        };
        assert_eq!((p.engines.len(), p.regimes.len(), p.depth), (1, 1, 8));
        for bad in [
            &["-e", "mmap"][..],
            &["-r", "warm"],
            &["--rows", "0"],
            &["--depth", "0"],
            &["--streams", "0"],
            &["--page-kib", "0"],
        ] {
            let mut args = vec!["uring-bench", "parquet"];
            args.extend(bad);
            assert!(Args::try_parse_from(args).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn slow_file_mode_parses_and_checks() {
        let a = Args::parse_from(["uring-bench", "slow-file"]);
        let Some(Mode::SlowFile(f)) = a.mode else {
            panic!("slow-file parses as its mode")
        };
        assert_eq!(
            (
                f.in_flight,
                f.secs,
                f.repeat,
                f.max_delay_ms,
                f.max_blocking_threads
            ),
            (512, 2.0, 5, 20, 512)
        );
        assert_eq!(f.cache, [SlowCache::Direct, SlowCache::Cached]);
        assert_eq!(
            f.engines,
            [
                SlowEngine::SpawnBlocking,
                SlowEngine::Pool,
                SlowEngine::PoolOwned,
                SlowEngine::Ring
            ]
        );
        let a = Args::parse_from([
            "uring-bench",
            "slow-file",
            "--cache",
            "cached",
            "--engines",
            "pool,spawn-blocking",
            "--in-flight",
            "64",
            "--max-blocking-threads",
            "1024",
        ]);
        let Some(Mode::SlowFile(f)) = a.mode else {
            panic!("slow-file parses as its mode")
        };
        assert_eq!(
            (
                f.cache.len(),
                f.engines.len(),
                f.in_flight,
                f.max_blocking_threads
            ),
            (1, 2, 64, 1024)
        );
        for bad in [
            &["--in-flight", "0"][..],
            &["--max-blocking-threads", "0"],
            &["--engines", "pool-borrowed"],
            &["--repeat", "0"],
            &["--max-delay-ms", "0"],
            &["--cache", "warm"],
            &["--engines", "mmap"],
            &["-t", "0"],
        ] {
            let mut args = vec!["uring-bench", "slow-file"];
            args.extend(bad);
            assert!(Args::try_parse_from(args).is_err(), "{bad:?}");
        }
    }
}
