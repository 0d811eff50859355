//! `uring-bench sched`: what a full-speed scan of one file does to cold
//! random 4 KiB point lookups on another file, at a fixed light arrival
//! rate, with the crate's priority classes and without.
//!
//! A dataset of two files (file 0 takes the lookups, file 1 the scan).
//! Lookups are `open-loop`'s: Poisson arrivals at `--rate` from one
//! thread, latency from each lookup's arrival, the first 0.5 s not
//! measured, every block verified. The scan reads file 1 from start to end
//! at full speed, again and again until the lookups are over, and verifies
//! every 4 KiB block it reads. The rows of a run:
//!
//! - `lookups alone`: `ctx.read` of one block per lookup, one task each,
//!   on a 2-worker tokio runtime;
//! - `scan alone`: a `ScanOptions::new()` scan (default options, so a
//!   background op) consumed by a task on the same runtime, as long as a
//!   lookup row lasts;
//! - `lookups + scan, classes`: both on one context, the scan background;
//! - `lookups + scan, no classes`: the same with the scan at
//!   `Priority::Latency` (one class for everything);
//! - `pread lookups alone`, `BufReader scan alone`, `pread lookups +
//!   BufReader scan`: the same lookups on a fixed pool of OS threads
//!   (`--threads`, each lookup a blocking `pread`), and one OS thread
//!   reading file 1 through a `std::io::BufReader` of 1 MiB. Under
//!   O_DIRECT the `BufReader` reads through an inner reader that preads
//!   into an aligned 1 MiB buffer and copies out (O_DIRECT needs aligned
//!   buffers; `BufReader`'s own is not).
//!
//! Before the first run, a short unmeasured pass of the `classes` row and
//! of the threads row with both. Every row gets a fresh context (so its
//! stats are the row's), a fresh runtime, freshly opened files and, first,
//! both files dropped from the page cache (checked with mincore). With
//! `--buffered` the scanned file is dropped again after every pass, so the
//! scan keeps reading the device.

use crate::buf::AlignedBlock;
use crate::cli::SchedArgs;
use crate::dataset::{gib, Dataset, Progress};
use crate::engines;
use crate::kinds::{Regime, DEFAULT_SEED};
use crate::machine::{cpu_model, git_commit, kernel, loadavg, meminfo, utc_now};
use crate::open_loop::{check, generate, schedule, us, Lookup, Recorder, WARMUP};
use crate::verify::{verify_block, VerifyMode, BLOCK};
use futures::StreamExt;
use std::fs::File;
use std::io::{self, BufRead, Read};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use uring_positioned_io::{AlignedBuf, ClassStats, Priority, ScanOptions, Stats, UringContext};

/// Tokio workers of the crate's rows (as in `open-loop`).
const WORKERS: usize = 2;
const LOOKUP_FILE: u32 = 0;
const SCAN_FILE: u32 = 1;
/// The `BufReader`'s buffer.
const BUFREADER_CAPACITY: usize = 1 << 20;
/// Set-up time between the start of a row's scan and its first arrival.
const LEAD: Duration = Duration::from_millis(50);
/// Longest wait for the last lookups, or for a scan to stop, after the
/// arrivals end.
const DRAIN: Duration = Duration::from_secs(30);
/// Measured seconds of the unmeasured warm-up rows before the first run.
const WARM_UP_SECS: f64 = 1.0;
/// Goals of the two same-run ratios.
const P99_GOAL: f64 = 1.3;
const SCAN_GOAL: f64 = 0.5;

/// The rows of a run, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    LookupsAlone,
    ScanAlone,
    Classes,
    NoClasses,
    PreadAlone,
    BufReaderAlone,
    PreadBufReader,
}

impl Case {
    const ALL: [Case; 7] = [
        Case::LookupsAlone,
        Case::ScanAlone,
        Case::Classes,
        Case::NoClasses,
        Case::PreadAlone,
        Case::BufReaderAlone,
        Case::PreadBufReader,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::LookupsAlone => "lookups alone",
            Case::ScanAlone => "scan alone",
            Case::Classes => "lookups + scan, classes",
            Case::NoClasses => "lookups + scan, no classes",
            Case::PreadAlone => "pread lookups alone",
            Case::BufReaderAlone => "BufReader scan alone",
            Case::PreadBufReader => "pread lookups + BufReader scan",
        }
    }

    fn threads(self) -> bool {
        matches!(
            self,
            Case::PreadAlone | Case::BufReaderAlone | Case::PreadBufReader
        )
    }

    fn lookups(self) -> bool {
        !matches!(self, Case::ScanAlone | Case::BufReaderAlone)
    }

    fn scan(self) -> bool {
        !matches!(self, Case::LookupsAlone | Case::PreadAlone)
    }

    /// The crate's scan priority in this row.
    fn scan_priority(self) -> Priority {
        if self == Case::NoClasses {
            Priority::Latency
        } else {
            Priority::Background
        }
    }
}

/// A row's lookups (latencies in ns, of the lookups that arrived in the
/// measured window).
#[derive(Debug, Clone, Copy, Default)]
struct LookupFig {
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
    /// Lookups completed, and arrived, over the whole row (warm-up too).
    done: u64,
    offered: u64,
    errors: u64,
}

/// A row's scan.
#[derive(Debug, Clone, Copy, Default)]
struct ScanFig {
    bytes: u64,
    secs: f64,
    /// Whole passes over the file.
    passes: u64,
}

impl ScanFig {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9) / 1e9
    }
}

/// What one row measured.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    lookups: Option<LookupFig>,
    scan: Option<ScanFig>,
    /// The context's counters at the end of the row (crate rows).
    stats: Option<Stats>,
    /// Fraction of the two files in the page cache before the row.
    residency: f64,
}

/// What every row of the run shares.
struct Env<'a> {
    a: &'a SchedArgs,
    ds: Dataset,
    lookups: Vec<Lookup>,
    direct: bool,
}

impl Env<'_> {
    fn lookup_file(&self) -> Result<File, String> {
        self.ds
            .open_for_random_reads(1, self.direct)
            .map_err(|e| format!("open the lookup file: {e}"))?
            .into_iter()
            .next()
            .ok_or_else(|| "no lookup file".to_string())
    }

    fn scan_file(&self) -> Result<File, String> {
        self.ds
            .open(2, self.direct)
            .map_err(|e| format!("open the scanned file: {e}"))?
            .pop()
            .ok_or_else(|| "no scanned file".to_string())
    }

    /// A handle on the scanned file to drop it from the page cache after
    /// every pass (`--buffered`).
    fn evictor(&self) -> Result<Option<File>, String> {
        if self.direct {
            return Ok(None);
        }
        File::open(&self.ds.paths[SCAN_FILE as usize])
            .map(Some)
            .map_err(|e| format!("open the scanned file: {e}"))
    }

    /// When a row without lookups ends: as long as the arrivals last.
    fn row_end(&self, t0: Instant) -> Instant {
        t0 + self.lookups.last().map_or(WARMUP, |l| l.at)
    }

    fn lookup_fig(&self, rec: &Recorder) -> LookupFig {
        let h = rec.hist.lock().unwrap();
        LookupFig {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            done: rec.done.load(Ordering::Relaxed),
            offered: self.lookups.len() as u64,
            errors: rec.errors.load(Ordering::Relaxed),
        }
    }
}

/// Checks that a piece of a pass over the scanned file starts where the
/// last one ended and that every block in it is the right one.
fn verify_piece(seed: u64, expected: u64, offset: u64, data: &[u8]) -> Result<(), String> {
    if offset != expected {
        return Err(format!(
            "scan of file {SCAN_FILE}: a piece at byte {offset}, expected one at {expected}"
        ));
    }
    if data.len() % BLOCK != 0 {
        return Err(format!(
            "scan of file {SCAN_FILE}: a piece of {} bytes at byte {offset}, not whole blocks",
            data.len()
        ));
    }
    for (i, b) in data.chunks_exact(BLOCK).enumerate() {
        verify_block(
            VerifyMode::Checksum,
            seed,
            SCAN_FILE,
            offset / BLOCK as u64 + i as u64,
            b,
        )
        .map_err(|e| format!("scan: {e}"))?;
    }
    Ok(())
}

/// The crate's scan of the scanned file, pass after pass, until `stop`.
async fn crate_scan(
    ctx: UringContext,
    priority: Priority,
    seed: u64,
    size: u64,
    evictor: Option<File>,
    stop: Arc<AtomicBool>,
) -> Result<ScanFig, String> {
    let opts = match priority {
        Priority::Background => ScanOptions::new(),
        Priority::Latency => ScanOptions::new().priority(Priority::Latency),
    };
    let start = Instant::now();
    let (mut bytes, mut passes) = (0u64, 0u64);
    'passes: loop {
        let mut s = opts
            .scan(&ctx, SCAN_FILE, ..)
            .map_err(|e| format!("scan of file {SCAN_FILE}: {e}"))?;
        let mut at = 0u64;
        while let Some(c) = s.next().await {
            let c = c.map_err(|e| format!("scan of file {SCAN_FILE} at byte {at}: {e}"))?;
            verify_piece(seed, at, c.offset(), &c)?;
            at += c.len() as u64;
            bytes += c.len() as u64;
            if stop.load(Ordering::Relaxed) {
                break 'passes;
            }
        }
        if at != size {
            return Err(format!(
                "scan of file {SCAN_FILE}: a pass ended at byte {at} of {size}"
            ));
        }
        passes += 1;
        if let Some(f) = &evictor {
            crate::dataset::fadvise(f, libc::POSIX_FADV_DONTNEED)
                .map_err(|e| format!("posix_fadvise(DONTNEED): {e}"))?;
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    Ok(ScanFig {
        bytes,
        secs: start.elapsed().as_secs_f64(),
        passes,
    })
}

/// Reads an O_DIRECT file from the start through an aligned buffer, and
/// copies out: what a `BufReader` needs under O_DIRECT.
struct DirectReader {
    file: File,
    offset: u64,
    buf: AlignedBuf,
}

impl Read for DirectReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let want = out.len().min(self.buf.len()) / BLOCK * BLOCK;
        if want == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "O_DIRECT reader: a read of {} bytes, under one block",
                    out.len()
                ),
            ));
        }
        let n = self.file.read_at(&mut self.buf[..want], self.offset)?;
        out[..n].copy_from_slice(&self.buf[..n]);
        self.offset += n as u64;
        Ok(n)
    }
}

/// One pass-after-pass `BufReader` scan of the scanned file, until `stop`.
fn bufreader_scan(
    env: &Env<'_>,
    evictor: Option<&File>,
    stop: &AtomicBool,
) -> Result<ScanFig, String> {
    let (seed, size) = (env.ds.seed, env.ds.file_size);
    let start = Instant::now();
    let (mut bytes, mut passes) = (0u64, 0u64);
    let mut block = vec![0u8; BLOCK];
    'passes: loop {
        let file = env.scan_file()?;
        let inner: Box<dyn Read + Send> = if env.direct {
            Box::new(DirectReader {
                file,
                offset: 0,
                buf: AlignedBuf::new(BUFREADER_CAPACITY, BLOCK),
            })
        } else {
            Box::new(file)
        };
        let mut r = io::BufReader::with_capacity(BUFREADER_CAPACITY, inner);
        let mut at = 0u64;
        let err =
            |at: u64, e: io::Error| format!("BufReader scan of file {SCAN_FILE} at byte {at}: {e}");
        while at < size {
            let buf = r.fill_buf().map_err(|e| err(at, e))?;
            if buf.is_empty() {
                return Err(format!(
                    "BufReader scan of file {SCAN_FILE}: end of file at byte {at} of {size}"
                ));
            }
            let whole = buf.len() / BLOCK * BLOCK;
            if whole == 0 {
                // Less than a block buffered: take it whole, across refills.
                r.read_exact(&mut block).map_err(|e| err(at, e))?;
                verify_piece(seed, at, at, &block)?;
                at += BLOCK as u64;
                bytes += BLOCK as u64;
            } else {
                verify_piece(seed, at, at, &buf[..whole])?;
                r.consume(whole);
                at += whole as u64;
                bytes += whole as u64;
            }
            if stop.load(Ordering::Relaxed) {
                break 'passes;
            }
        }
        passes += 1;
        if let Some(f) = evictor {
            crate::dataset::fadvise(f, libc::POSIX_FADV_DONTNEED)
                .map_err(|e| format!("posix_fadvise(DONTNEED): {e}"))?;
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    Ok(ScanFig {
        bytes,
        secs: start.elapsed().as_secs_f64(),
        passes,
    })
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// A row of the crate: a fresh runtime and context with both files.
fn run_crate(env: &Env<'_>, case: Case) -> Result<Measured, String> {
    let a = env.a;
    let rt = engines::tokio_runtime(Some(WORKERS), 512)?;
    let files = vec![env.lookup_file()?, env.scan_file()?];
    let ctx = {
        let _g = rt.enter();
        let mut b = UringContext::builder();
        if let Some(n) = a.background_share {
            b = b.background_share(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(n) = a.background_piece {
            b = b.background_piece(usize::try_from(n).unwrap_or(usize::MAX));
        }
        b.build(files).map_err(|e| format!("UringContext: {e}"))?
    };
    let seed = env.ds.seed;
    let stop = Arc::new(AtomicBool::new(false));
    let scan_rt = if a.scan_thread {
        Some(engines::tokio_runtime(Some(1), 8)?)
    } else {
        None
    };
    let scan = if case.scan() {
        Some(scan_rt.as_ref().unwrap_or(&rt).spawn(crate_scan(
            ctx.clone(),
            case.scan_priority(),
            seed,
            env.ds.file_size,
            env.evictor()?,
            stop.clone(),
        )))
    } else {
        None
    };
    let t0 = Instant::now() + LEAD;
    let lookups = if case.lookups() {
        crate_lookups(env, &rt, &ctx, t0).map(Some)
    } else {
        sleep_until(env.row_end(t0));
        Ok(None)
    };
    stop.store(true, Ordering::Relaxed);
    let scan = match scan {
        Some(h) => Some(
            scan_rt
                .as_ref()
                .unwrap_or(&rt)
                .block_on(async { tokio::time::timeout(DRAIN, h).await })
                .map_err(|_| format!("the scan did not stop within {DRAIN:?} of the end"))?
                .map_err(|e| format!("scan task: {e}"))??,
        ),
        None => None,
    };
    let lookups = lookups?;
    let stats = ctx.stats();
    rt.block_on(ctx.shutdown());
    Ok(Measured {
        lookups,
        scan,
        stats: Some(stats),
        residency: 0.0,
    })
}

/// The lookups of a crate row: a task per lookup, as `open-loop`'s `uring`.
fn crate_lookups(
    env: &Env<'_>,
    rt: &tokio::runtime::Runtime,
    ctx: &UringContext,
    t0: Instant,
) -> Result<LookupFig, String> {
    let seed = env.ds.seed;
    let rec = Recorder::new(t0 + WARMUP)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<(Instant, Lookup)>>();
    let (rec2, ctx2) = (rec.clone(), ctx.clone());
    let dispatcher = rt.spawn(async move {
        while let Some(arrivals) = rx.recv().await {
            for (arrived, l) in arrivals {
                let (rec, ctx) = (rec2.clone(), ctx2.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; BLOCK];
                    let mut ok = true;
                    for &(f, b) in &l.reads {
                        let n = ctx.read(f, b * BLOCK as u64, &mut buf).await;
                        ok &= matches!(n, Ok(n) if check(seed, f, b, &buf[..n]));
                    }
                    rec.record(arrived, ok);
                });
            }
        }
    });
    generate(t0, &env.lookups, |due| {
        let _ = tx.send(due);
    });
    drop(tx);
    let total = env.lookups.len() as u64;
    rt.block_on(async {
        let _ = dispatcher.await;
        let deadline = Instant::now() + DRAIN;
        while rec.done.load(Ordering::Relaxed) < total && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    Ok(env.lookup_fig(&rec))
}

/// A row of threads: the pread pool and the `BufReader` thread.
fn run_threads(env: &Env<'_>, case: Case) -> Result<Measured, String> {
    let stop = AtomicBool::new(false);
    let evictor = env.evictor()?;
    std::thread::scope(|s| {
        let scan = case
            .scan()
            .then(|| s.spawn(|| bufreader_scan(env, evictor.as_ref(), &stop)));
        let t0 = Instant::now() + LEAD;
        let lookups = if case.lookups() {
            pool_lookups(env, t0).map(Some)
        } else {
            sleep_until(env.row_end(t0));
            Ok(None)
        };
        stop.store(true, Ordering::Relaxed);
        let scan = match scan {
            Some(h) => Some(
                h.join()
                    .map_err(|_| "the BufReader scan thread panicked".to_string())??,
            ),
            None => None,
        };
        Ok(Measured {
            lookups: lookups?,
            scan,
            stats: None,
            residency: 0.0,
        })
    })
}

/// The lookups on a fixed pool of `--threads` OS threads, one lookup per
/// thread at a time, as `open-loop`'s `pread`.
fn pool_lookups(env: &Env<'_>, t0: Instant) -> Result<LookupFig, String> {
    let seed = env.ds.seed;
    let file = env.lookup_file()?;
    let rec = Recorder::new(t0 + WARMUP)?;
    let (tx, rx) = mpsc::channel::<(Instant, Lookup)>();
    let rx = Mutex::new(rx);
    std::thread::scope(|s| {
        for _ in 0..env.a.threads {
            let (rx, rec, file) = (&rx, &rec, &file);
            s.spawn(move || {
                let mut buf = AlignedBlock::new();
                loop {
                    let msg = rx.lock().unwrap().recv();
                    let Ok((arrived, l)) = msg else { return };
                    let mut ok = true;
                    for &(f, b) in &l.reads {
                        let n = file.read_at(&mut buf, b * BLOCK as u64);
                        ok &= matches!(n, Ok(n) if check(seed, f, b, &buf[..n]));
                    }
                    rec.record(arrived, ok);
                }
            });
        }
        generate(t0, &env.lookups, |due| {
            for d in due {
                let _ = tx.send(d);
            }
        });
        drop(tx);
    });
    Ok(env.lookup_fig(&rec))
}

/// Runs one row after dropping both files from the page cache.
fn run_case(env: &Env<'_>, case: Case) -> Result<Measured, String> {
    let residency = env.ds.prepare(Regime::Cold, 2, true)?.unwrap_or(0.0);
    let mut m = if case.threads() {
        run_threads(env, case)?
    } else {
        run_crate(env, case)?
    };
    m.residency = residency;
    Ok(m)
}

/// The same-run ratios: lookup p99 with the scan over alone, scan GB/s
/// with the lookups over alone.
#[derive(Debug, Clone, Copy)]
struct Ratios {
    p99: f64,
    scan: f64,
}

fn ratios(run: &[Measured], with: Case, lookups_alone: Case, scan_alone: Case) -> Option<Ratios> {
    let at = |c: Case| run[Case::ALL.iter().position(|&x| x == c).unwrap()];
    let (w, l, s) = (at(with), at(lookups_alone), at(scan_alone));
    Some(Ratios {
        p99: w.lookups?.p99 as f64 / l.lookups?.p99.max(1) as f64,
        scan: w.scan?.gbps() / s.scan?.gbps().max(1e-12),
    })
}

/// The three comparisons of a run: name, the row with both, and the rows
/// alone.
const COMPARISONS: [(&str, Case, Case, Case); 3] = [
    (
        "with classes",
        Case::Classes,
        Case::LookupsAlone,
        Case::ScanAlone,
    ),
    (
        "without classes",
        Case::NoClasses,
        Case::LookupsAlone,
        Case::ScanAlone,
    ),
    (
        "pread threads + BufReader",
        Case::PreadBufReader,
        Case::PreadAlone,
        Case::BufReaderAlone,
    ),
];

fn verdict(run: &[Measured]) -> String {
    COMPARISONS
        .iter()
        .map(|&(name, w, l, s)| match ratios(run, w, l, s) {
            Some(r) => format!(
                "{name}: lookup p99 {:.2}× alone, scan {:.2}× alone ({})",
                r.p99,
                r.scan,
                if r.p99 <= P99_GOAL && r.scan >= SCAN_GOAL {
                    "goals met"
                } else {
                    "goals missed"
                }
            ),
            None => format!("{name}: -"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn table(rows: &[(Case, Measured)]) -> String {
    use comfy_table::{CellAlignment, ContentArrangement, Table};
    let mut t = Table::new();
    t.load_preset("     --            ")
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header([
            "row",
            "p50",
            "p99",
            "p99.9",
            "max",
            "done/offered",
            "errors",
            "scan GB/s",
            "passes",
            "cached",
        ]);
    for (case, m) in rows {
        let mut row = vec![case.name().to_string()];
        match m.lookups {
            Some(l) => row.extend([
                us(l.p50),
                us(l.p99),
                us(l.p999),
                us(l.max),
                format!("{}/{}", l.done, l.offered),
                l.errors.to_string(),
            ]),
            None => row.extend(std::iter::repeat_n("-".to_string(), 6)),
        }
        match m.scan {
            Some(s) => row.extend([format!("{:.3}", s.gbps()), s.passes.to_string()]),
            None => row.extend(["-".to_string(), "-".to_string()]),
        }
        row.push(format!("{:.1}%", m.residency * 100.0));
        t.add_row(row);
    }
    for i in 1..10 {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    t.lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A class's slot counters.
fn class_line(name: &str, c: &ClassStats) -> String {
    #[allow(clippy::cast_precision_loss, reason = "MiB for a reader")]
    let mib = c.bytes as f64 / f64::from(1u32 << 20);
    format!(
        "{name} ops {} ({mib:.0} MiB), waited {} ({:.1} ms in all)",
        c.ops,
        c.waited,
        c.wait_time.as_secs_f64() * 1e3
    )
}

fn stats_lines(rows: &[(Case, Measured)]) -> Vec<String> {
    rows.iter()
        .filter(|(c, _)| matches!(c, Case::Classes | Case::NoClasses))
        .filter_map(|(c, m)| {
            m.stats.map(|s| {
                format!(
                    "  ctx.stats() of '{}': {}; {}",
                    c.name(),
                    class_line("latency", &s.latency),
                    class_line("background", &s.background)
                )
            })
        })
        .collect()
}

fn honoured(ctx: &UringContext, fid: u32) -> String {
    match ctx.ioprio_honoured(fid) {
        Ok(Some(true)) => "yes (bfq)".into(),
        Ok(Some(false)) => "no (its device's I/O scheduler is not bfq)".into(),
        Ok(None) => "unknown (no block device the kernel names)".into(),
        Err(e) => format!("error: {e}"),
    }
}

/// `ioprio_honoured` of both files, from a context made for the purpose.
fn ioprio_line(env: &Env<'_>) -> Result<String, String> {
    let rt = engines::tokio_runtime(None, 1)?;
    let ctx = {
        let _g = rt.enter();
        UringContext::new(vec![env.lookup_file()?, env.scan_file()?])
            .map_err(|e| format!("UringContext: {e}"))?
    };
    let line = format!(
        "ioprio_honoured: lookup file {}; scanned file {}",
        honoured(&ctx, LOOKUP_FILE),
        honoured(&ctx, SCAN_FILE)
    );
    rt.block_on(ctx.shutdown());
    Ok(line)
}

/// Each figure's median over the runs (the upper one of an even count).
fn median_of(runs: &[Vec<Measured>], k: usize) -> Measured {
    fn med<T: Copy + PartialOrd>(mut x: Vec<T>) -> Option<T> {
        x.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        x.get(x.len() / 2).copied()
    }
    let rows: Vec<&Measured> = runs.iter().map(|r| &r[k]).collect();
    let lookups: Vec<LookupFig> = rows.iter().filter_map(|m| m.lookups).collect();
    let scans: Vec<ScanFig> = rows.iter().filter_map(|m| m.scan).collect();
    let l = |f: fn(&LookupFig) -> u64| med(lookups.iter().map(f).collect());
    Measured {
        lookups: (!lookups.is_empty()).then(|| LookupFig {
            p50: l(|x| x.p50).unwrap_or(0),
            p99: l(|x| x.p99).unwrap_or(0),
            p999: l(|x| x.p999).unwrap_or(0),
            max: l(|x| x.max).unwrap_or(0),
            done: l(|x| x.done).unwrap_or(0),
            offered: l(|x| x.offered).unwrap_or(0),
            errors: lookups.iter().map(|x| x.errors).sum(),
        }),
        // The run with the median rate stands for the scan.
        scan: med(scans.iter().map(ScanFig::gbps).collect()).and_then(|g| {
            scans
                .iter()
                .find(|s| s.gbps().total_cmp(&g).is_eq())
                .copied()
        }),
        stats: None,
        residency: med(rows.iter().map(|m| m.residency).collect()).unwrap_or(0.0),
    }
}

fn json_row(run: serde_json::Value, case: Case, m: &Measured) -> serde_json::Value {
    let class = |c: &ClassStats| {
        serde_json::json!({
            "ops": c.ops, "bytes": c.bytes, "waited": c.waited,
            "wait_time_ns": u64::try_from(c.wait_time.as_nanos()).unwrap_or(u64::MAX),
        })
    };
    serde_json::json!({
        "run": run, "row": case.name(),
        "lookups": m.lookups.map(|l| serde_json::json!({
            "p50_ns": l.p50, "p99_ns": l.p99, "p999_ns": l.p999, "max_ns": l.max,
            "done": l.done, "offered": l.offered, "errors": l.errors,
        })),
        "scan": m.scan.map(|s| serde_json::json!({
            "bytes": s.bytes, "secs": s.secs, "gb_per_s": s.gbps(), "passes": s.passes,
        })),
        "stats": m.stats.map(|s| serde_json::json!({
            "latency": class(&s.latency), "background": class(&s.background),
        })),
        "cached_before": m.residency,
    })
}

pub fn run(a: &SchedArgs) -> Result<bool, String> {
    // The arrival times do not depend on the blocks: checked before the
    // dataset is made.
    if schedule(a.rate, a.secs, 1, 1, 1, a.seed).is_empty() {
        return Err(format!(
            "--rate {} over {} s (+{:?} warm-up) gives no lookup: raise the rate or the time",
            a.rate, a.secs, WARMUP
        ));
    }
    let ds = Dataset::ensure(
        &a.data_dir,
        2,
        a.file_size,
        DEFAULT_SEED,
        true,
        Progress::Bar,
    )?;
    if ds.generated {
        // The new files' dirty pages would otherwise be written back while
        // the first rows run.
        eprintln!("writing the new dataset back (sync) before the runs");
        // SAFETY: sync(2) takes no arguments and cannot fail.
        unsafe { libc::sync() };
    }
    let lookups = schedule(a.rate, a.secs, 1, 1, ds.blocks_per_file(), a.seed);
    let env = Env {
        a,
        ds,
        lookups,
        direct: !a.buffered,
    };
    println!(
        "command: {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!(
        "machine: {}, {} CPUs, {:.0} GiB RAM, kernel {}; load {}; commit {}; {}",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        meminfo("MemTotal:").map_or(0.0, gib),
        kernel(),
        loadavg(),
        git_commit(),
        crate::wake::measure(crate::wake::SAMPLES).summary()
    );
    println!(
        "sched: lookups of one random 4 KiB block of file 0 ({:.2} GiB), Poisson at {}/s, \
         latency from arrival, {} s measured after a {:?} warm-up, every block verified; \
         scan of file 1 ({:.2} GiB) at full speed, looped, every block verified; files {}; \
         crate: {WORKERS} tokio workers, background_share {}, background_piece {}, \
         scan ScanOptions::new(){}; \
         threads: {} pread threads, BufReader of {} MiB{}; an unmeasured {WARM_UP_SECS} s \
         pass of the classes row and of the threads row first",
        gib(env.ds.file_size),
        a.rate,
        a.secs,
        WARMUP,
        gib(env.ds.file_size),
        if env.direct {
            "O_DIRECT"
        } else {
            "buffered (both dropped from the page cache before every row, the scanned one after every pass)"
        },
        a.background_share
            .map_or("2 (library default)".to_string(), |n| n.to_string()),
        a.background_piece
            .map_or("128 KiB (library default)".to_string(), |n| format!(
                "{} KiB",
                n >> 10
            )),
        if a.scan_thread {
            " on a runtime of its own (one worker), same context"
        } else {
            " on the lookups' runtime"
        },
        a.threads,
        BUFREADER_CAPACITY >> 20,
        if env.direct {
            " over an aligned 1 MiB pread reader (one copy: O_DIRECT needs aligned buffers)"
        } else {
            ""
        },
    );
    println!("{}", ioprio_line(&env)?);
    // The first row after the set-up tends to have a longer tail (as in
    // `open-loop`), which would flatter the ratios of the rows measured
    // against it: a short unmeasured pass of both kinds of row goes first.
    let warm_up = Env {
        a,
        ds: env.ds.clone(),
        lookups: schedule(
            a.rate,
            WARM_UP_SECS,
            1,
            1,
            env.ds.blocks_per_file(),
            !a.seed,
        ),
        direct: env.direct,
    };
    eprintln!("unmeasured warm-up ...");
    for case in [Case::Classes, Case::PreadBufReader] {
        run_case(&warm_up, case)?;
    }
    let mut runs: Vec<Vec<Measured>> = Vec::new();
    let mut json = Vec::new();
    let mut ok = true;
    for run in 0..a.repeat {
        let mut rows = Vec::new();
        for case in Case::ALL {
            eprintln!("run {}/{}: {} ...", run + 1, a.repeat, case.name());
            let m = run_case(&env, case)?;
            ok &= m
                .lookups
                .is_none_or(|l| l.errors == 0 && l.done == l.offered);
            json.push(json_row(serde_json::json!(run), case, &m));
            rows.push((case, m));
        }
        println!("\nrun {}/{} (load {}):", run + 1, a.repeat, loadavg());
        println!("{}", table(&rows));
        for l in stats_lines(&rows) {
            println!("{l}");
        }
        let measured: Vec<Measured> = rows.iter().map(|&(_, m)| m).collect();
        println!("verdict: {}", verdict(&measured));
        runs.push(measured);
    }
    if a.repeat > 1 {
        let medians: Vec<Measured> = (0..Case::ALL.len()).map(|k| median_of(&runs, k)).collect();
        let rows: Vec<(Case, Measured)> = Case::ALL.iter().copied().zip(medians).collect();
        println!("\nmedians over {} runs:", a.repeat);
        println!("{}", table(&rows));
        for (name, w, l, s) in COMPARISONS {
            let mut r: Vec<Ratios> = runs.iter().filter_map(|m| ratios(m, w, l, s)).collect();
            if r.is_empty() {
                continue;
            }
            let mid = r.len() / 2;
            r.sort_by(|x, y| x.p99.total_cmp(&y.p99));
            let p99 = r[mid].p99;
            r.sort_by(|x, y| x.scan.total_cmp(&y.scan));
            println!(
                "median ratios, {name}: lookup p99 {p99:.2}× alone (goal ≤ {P99_GOAL}), scan {:.2}× alone (goal ≥ {SCAN_GOAL})",
                r[mid].scan
            );
        }
        for (case, m) in &rows {
            json.push(json_row(serde_json::json!("median"), *case, m));
        }
    }
    let dir = a.output_dir.join(format!("sched-{}", utc_now().1));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("sched.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "rate": a.rate, "secs": a.secs, "file_size": env.ds.file_size,
            "direct": env.direct, "background_share": a.background_share,
            "background_piece": a.background_piece, "scan_thread": a.scan_thread,
            "threads": a.threads, "rows": json,
        }))
        .unwrap_or_default(),
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("results: {}", path.display());
    if !ok {
        println!("some lookups failed verification or did not complete (see errors, done/offered)");
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p99: u64, gbps: f64) -> Measured {
        Measured {
            lookups: Some(LookupFig {
                p99,
                ..LookupFig::default()
            }),
            scan: Some(ScanFig {
                bytes: (gbps * 1e9) as u64,
                secs: 1.0,
                passes: 1,
            }),
            stats: None,
            residency: 0.0,
        }
    }

    #[test]
    fn ratios_are_taken_against_the_rows_alone() {
        let mut run = vec![Measured::default(); Case::ALL.len()];
        run[0] = row(100, 0.0); // lookups alone
        run[1] = row(0, 2.0); // scan alone
        run[2] = row(120, 1.5); // classes
        run[3] = row(400, 1.9); // no classes
        let r = ratios(&run, Case::Classes, Case::LookupsAlone, Case::ScanAlone).unwrap();
        assert!((r.p99 - 1.2).abs() < 1e-9 && (r.scan - 0.75).abs() < 1e-9);
        let v = verdict(&run);
        assert!(
            v.starts_with("with classes: lookup p99 1.20× alone, scan 0.75× alone (goals met)"),
            "{v}"
        );
        assert!(v.contains("without classes: lookup p99 4.00×"), "{v}");
        assert!(v.contains("goals missed"), "{v}");
        assert!(v.ends_with("pread threads + BufReader: -"), "{v}");
    }

    #[test]
    fn pieces_must_follow_and_verify() {
        let mut b = vec![0u8; 2 * BLOCK];
        crate::verify::fill_block(7, SCAN_FILE, 4, &mut b[..BLOCK]);
        crate::verify::fill_block(7, SCAN_FILE, 5, &mut b[BLOCK..]);
        verify_piece(7, 4 * BLOCK as u64, 4 * BLOCK as u64, &b).unwrap();
        assert!(verify_piece(7, 0, 4 * BLOCK as u64, &b).is_err());
        assert!(verify_piece(7, 4 * BLOCK as u64, 4 * BLOCK as u64, &b[..100]).is_err());
        b[BLOCK + 100] ^= 1;
        let e = verify_piece(7, 4 * BLOCK as u64, 4 * BLOCK as u64, &b).unwrap_err();
        assert!(e.contains("block 5"), "{e}");
    }
}
