//! The benchmark's shared kinds: what the command line chooses among
//! (regimes, engines, parts) and the names the reports print for them.
//! Every mode and the command-line parser use these; this module uses none
//! of the benchmark's own.

/// Seed of the dataset contents unless `--seed` says otherwise.
pub const DEFAULT_SEED: u64 = 0x5eed;

/// How the page cache is set up before each cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Regime {
    /// Working set read once beforehand and resident in the page cache.
    Hot,
    /// Every dataset file evicted (posix_fadvise DONTNEED) before the cell.
    Cold,
    /// O_DIRECT: the page cache is bypassed (mmap: n/a).
    Direct,
}

impl Regime {
    pub fn name(self) -> &'static str {
        match self {
            Regime::Hot => "hot",
            Regime::Cold => "cold",
            Regime::Direct => "direct",
        }
    }
}

/// A switch flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// The engines of the random-read comparison, by report name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// uring-positioned-io on a multi-thread tokio runtime.
    Uring,
    /// OS threads copying out of MADV_RANDOM mappings.
    Mmap,
    /// The same copies on tokio tasks (`--workers` workers, one task per
    /// read in flight) that yield as the crate's inline reads and cache hits
    /// do: the price of that fairness, without the crate.
    MmapTasks,
    /// OS threads calling pread(2).
    Pread,
    /// tokio tasks doing spawn_blocking + pread (what tokio::fs does).
    TokioFs,
    /// tokio-uring 0.5 (own runtime), read_at on owned buffers.
    TokioUring,
    /// Single-thread raw io_uring loop (io-uring crate, fixed files).
    UringRaw,
    /// fio, ioengine=io_uring, on the same files.
    Fio,
    /// `BlockCache` over the `uring` context, copying each block out
    /// (`cache.read`); `--cache-mib`; hot: filled before the window.
    UringCache,
    /// `BlockCache` over the `uring` context, zero-copy (`cache.get` gives a
    /// `BlockRef`, verified in place); `--cache-mib`; hot: filled before the
    /// window.
    UringCacheRef,
    /// Every engine above (uring, mmap, mmap-tasks, pread, tokio-fs, tokio-uring,
    /// uring-raw, fio, uring-cache, uring-cache-ref).
    All,
}

impl EngineKind {
    pub const ALL: [EngineKind; 10] = [
        EngineKind::Uring,
        EngineKind::Mmap,
        EngineKind::MmapTasks,
        EngineKind::Pread,
        EngineKind::TokioFs,
        EngineKind::TokioUring,
        EngineKind::UringRaw,
        EngineKind::Fio,
        EngineKind::UringCache,
        EngineKind::UringCacheRef,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Uring => "uring",
            EngineKind::Mmap => "mmap",
            EngineKind::MmapTasks => "mmap-tasks",
            EngineKind::Pread => "pread",
            EngineKind::TokioFs => "tokio-fs",
            EngineKind::TokioUring => "tokio-uring",
            EngineKind::UringRaw => "uring-raw",
            EngineKind::Fio => "fio",
            EngineKind::UringCache => "uring-cache",
            EngineKind::UringCacheRef => "uring-cache-ref",
            EngineKind::All => "all",
        }
    }
}

/// The engines `uring-bench open-loop` compares, by report name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpenEngine {
    Uring,
    /// `uring` through a `BlockCache` (copy-out `cache.read`; filled first
    /// when hot).
    UringCache,
    TokioFs,
    TokioPread,
    Pread,
    Mmap,
}

impl OpenEngine {
    pub fn name(self) -> &'static str {
        match self {
            OpenEngine::Uring => "uring",
            OpenEngine::UringCache => "uring-cache",
            OpenEngine::TokioFs => "tokio-fs",
            OpenEngine::TokioPread => "tokio-pread",
            OpenEngine::Pread => "pread",
            OpenEngine::Mmap => "mmap",
        }
    }
}

/// The parts of `uring-bench write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Randwrite,
    Seqwrite,
    Wal,
}

/// How the WAL part's log file starts (see `--wal-log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogKind {
    /// Zero-filled to its full size and synced before the run: commits
    /// overwrite allocated blocks, so `fdatasync` has no size change to
    /// journal.
    Preallocated,
    /// Empty: every group grows the file, and every `fdatasync` commits the
    /// new size through the file system's journal.
    Append,
}
