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

use crate::cli::{CpuPerReadArgs, OnOff, Regime, DEFAULT_SEED};
use crate::dataset::{Dataset, Progress};
use crate::engines::{self, CellSpec, EngineKind, UringOpts};
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
    let cached = crate::prepare(Regime::Hot, ds, 1, true)?;
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

pub fn run(a: &CpuPerReadArgs) -> Result<bool, String> {
    let mib = a.file_mib;
    let ds = Dataset::ensure(&a.data_dir, 1, mib << 20, DEFAULT_SEED, true, Progress::Bar)?;
    crate::prepare(Regime::Hot, &ds, 1, false)?;
    println!(
        "hot page cache, {mib} MiB file, random 4 KiB reads, verified, {} s per cell",
        a.secs
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
