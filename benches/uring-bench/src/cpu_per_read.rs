//! `uring-bench cpu-per-read`: CPU per read and throughput on cached data,
//! this crate against a raw io-uring loop, in the same run.
//!
//! Regime: one dataset file of M MiB (default 1024) in the page cache
//! (warmed before every cell), random aligned 4 KiB reads, every block
//! verified. CPU per read is (user + sys) / reads from getrusage over the
//! timed window. The cells are the main run's `uring-raw` and `uring`
//! engines with fixed settings:
//! - `raw-ring (1 thread)`: one thread, one ring, fixed file, keeps `depth`
//!   reads in flight, submits a batch per enter and reaps (the floor for ring
//!   overhead);
//! - `crate ring/1w`: this crate, ring path only (`inline_nowait(false)`),
//!   current_thread runtime, one ring;
//! - `crate ring/2w`: ring path only, multi_thread with 2 workers, 2 rings;
//! - `crate nowait/2w`: the default (page-cache hits served inline with
//!   RWF_NOWAIT), multi_thread with 2 workers, 2 rings.

use crate::cli::CpuPerReadArgs;
use crate::dataset::{Dataset, Progress};
use crate::engines::{self, CellSpec, UringOpts};
use crate::kinds::{EngineKind, OnOff, Regime, DEFAULT_SEED};
use crate::report::Cell;
use crate::verify::VerifyMode;
use std::path::PathBuf;
use std::time::Duration;

/// Tokio worker threads of the multi-thread rows.
const WORKERS: usize = 2;

/// The crate rows: name, rings (1 = current_thread runtime), inline fast path.
const CONFIGS: [(&str, usize, OnOff); 3] = [
    ("crate ring/1w", 1, OnOff::Off),
    ("crate ring/2w", WORKERS, OnOff::Off),
    ("crate nowait/2w", WORKERS, OnOff::On),
];

/// Re-warms the file if some of it was dropped from the page cache, then
/// runs one cell of `engine`.
fn cell(
    ds: &Dataset,
    engine: EngineKind,
    depth: usize,
    secs: f64,
    uring: UringOpts,
) -> Result<Cell, String> {
    let cached = ds.prepare(Regime::Hot, 1, true)?;
    let m = engines::run(&CellSpec {
        engine,
        regime: Regime::Hot,
        depth,
        duration: Duration::from_secs_f64(secs),
        workers: WORKERS,
        verify: VerifyMode::Checksum,
        dataset: ds,
        set_files: 1,
        uring,
        fio: PathBuf::from("fio"),
        fio_jobs: 1,
        mmap_populate: false,
        // printed figures as before: no probe perturbs these cells
        probes: engines::ProbeOpts::OFF,
        cache_bytes: None,
        keys: engines::Keys::Uniform,
        warmup: Duration::ZERO,
        warm_full: None,
        direct_files: false,
    })?;
    let c = Cell::from_measured(engine.name(), Regime::Hot, depth, m, cached);
    if let Some(why) = c.notes.iter().find(|n| n.starts_with("backend reason")) {
        eprintln!(
            "warning: {} ran on the pread fallback: {why}",
            engine.name()
        );
    }
    Ok(c)
}

/// The two syscalls a cached read can be: CPU (ns) per read of a tight
/// one-thread loop of random aligned 4 KiB reads, no verification.
#[derive(Debug, Clone, Copy)]
pub struct SyscallFloor {
    pub pread_ns: f64,
    pub preadv2_nowait_ns: f64,
    /// `preadv2(RWF_NOWAIT)` calls that found their block not cached.
    pub misses: u64,
    pub reads: u64,
}

/// Thread CPU time, in ns.
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU ns per read of `reads` random reads of `file` (`blocks` 4 KiB
/// blocks, cached) with `pread` (`nowait == false`) or
/// `preadv2(RWF_NOWAIT)`, and the `EAGAIN`s (blocks not in the cache: the
/// caller warms the file, but the kernel may have dropped some since). Any
/// other failure or a short read is an error.
fn syscall_loop(
    file: &std::fs::File,
    blocks: u64,
    reads: u64,
    nowait: bool,
) -> Result<(f64, u64), String> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut buf = vec![0u8; 4096];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut misses = 0;
    let t0 = thread_cpu_ns();
    for _ in 0..reads {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = ((x % blocks) * 4096) as libc::off_t;
        let n = if nowait {
            let iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: `iov` describes `buf`, alive and writable for the call.
            unsafe { libc::preadv2(fd, &raw const iov, 1, off, libc::RWF_NOWAIT) }
        } else {
            // SAFETY: `buf` is alive and writable for its length.
            unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off) }
        };
        if n < 0
            && nowait
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
        {
            misses += 1;
        } else if n != 4096 {
            return Err(format!(
                "syscall floor: {} at offset {off} returned {n} ({})",
                if nowait {
                    "preadv2(RWF_NOWAIT)"
                } else {
                    "pread"
                },
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(((thread_cpu_ns() - t0) as f64 / reads as f64, misses))
}

/// `pread` against `preadv2(RWF_NOWAIT)` on the cached file, alternating,
/// `rounds` each; the medians. This is the kernel floor of the crate's
/// page-cache path (one `preadv2(RWF_NOWAIT)` per read) against `pread`
/// threads' (one `pread`).
pub fn syscall_floor(ds: &Dataset, rounds: usize, reads: u64) -> Result<SyscallFloor, String> {
    let file = ds
        .open(1, false)
        .map_err(|e| format!("syscall floor: {e}"))?
        .remove(0);
    let blocks = ds.blocks_per_file();
    let (mut p, mut v, mut misses) = (Vec::new(), Vec::new(), 0);
    for _ in 0..rounds {
        p.push(syscall_loop(&file, blocks, reads, false)?.0);
        let (ns, m) = syscall_loop(&file, blocks, reads, true)?;
        v.push(ns);
        misses += m;
    }
    let med = |mut x: Vec<f64>| {
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    Ok(SyscallFloor {
        pread_ns: med(p),
        preadv2_nowait_ns: med(v),
        misses,
        reads: reads * rounds as u64,
    })
}

pub fn run(a: &CpuPerReadArgs) -> Result<bool, String> {
    let mib = a.file_mib;
    let ds = Dataset::ensure(&a.data_dir, 1, mib << 20, DEFAULT_SEED, true, Progress::Bar)?;
    ds.prepare(Regime::Hot, 1, false)?;
    println!(
        "hot page cache, {mib} MiB file, random 4 KiB reads, verified, {} s per cell",
        a.secs
    );
    // ~0.5 s at the default 3 s cells (≈1.1 µs a read here)
    let f = syscall_floor(&ds, 5, ((a.secs * 100_000.0) as u64).max(10_000))?;
    println!(
        "syscall floor (1 thread, cached, no verification, median of 5): pread {:.0} ns/read, \
         preadv2(RWF_NOWAIT) {:.0} ns/read ({:.2}x; {} of {} found their block uncached): \
         the page-cache path's kernel cost against pread threads'",
        f.pread_ns,
        f.preadv2_nowait_ns,
        f.preadv2_nowait_ns / f.pread_ns,
        f.misses,
        f.reads
    );
    println!(
        "{:<20} {:>6} {:>12} {:>10} {:>10} {:>12}",
        "engine", "depth", "reads/s", "cpu/read", "vs raw", "reads/enter"
    );
    for &depth in &a.depths {
        let raw_opts = UringOpts::default();
        let raw = cell(&ds, EngineKind::UringRaw, depth, a.secs, raw_opts.clone())?;
        let cpu_us = |c: &Cell| c.cpu_us_per_read.unwrap_or(f64::NAN);
        let row = |name: &str, c: &Cell| {
            println!(
                "{:<20} {:>6} {:>12.0} {:>8.2}µs {:>9.2}x {:>12.1}",
                name,
                depth,
                c.reads_per_sec,
                cpu_us(c),
                cpu_us(c) / cpu_us(&raw),
                c.reads_per_enter.unwrap_or(0.0)
            );
        };
        row("raw-ring (1 thread)", &raw);
        for (name, rings, inline) in CONFIGS {
            if a.only.as_deref().is_some_and(|o| !name.contains(o)) {
                continue;
            }
            let opts = UringOpts {
                rings: Some(rings),
                max_in_flight: Some(depth.max(rings)),
                inline: Some(inline),
                current_thread: rings == 1,
                ..raw_opts.clone()
            };
            row(name, &cell(&ds, EngineKind::Uring, depth, a.secs, opts)?);
        }
    }
    Ok(true)
}
