//! `uring-bench mem-fair`: engines under the same memory limit.
//!
//! Every (workload, depth, engine) run is a child process (this binary's
//! hidden `mem-fair-child`) that first moves itself into a memory cgroup
//! made for it with the limit `--budget` ([`crate::cgroup`]). Before each
//! run the dataset's pages are dropped from the page cache
//! (`posix_fadvise(DONTNEED)`) and checked cold with `mincore`, so the page
//! cache the `mmap`, `pread` and `uring` engines get is what their cgroup
//! lets them keep, and the cache engines (`uring-cache`, `uring-cache-ref`,
//! files opened O_DIRECT) get the budget minus `--allowance` as `BlockCache`
//! capacity. `uring-raw` (O_DIRECT, no cache) is the device's rate for
//! misses.
//!
//! The child runs one cell of the main matrix's engine (every block
//! verified), then reports its reads, CPU (getrusage over the window), the
//! bytes it read from the device (`/proc/self/io` `read_bytes` over the
//! window: misses, for every engine), the cache's hit ratio (cache
//! engines), its peak RSS (`VmHWM`) and, for `fill`, its completed reads
//! every 100 ms. The parent adds the cgroup's peak usage and `/proc/meminfo`
//! `Cached` before and after, and prints a table per workload.

use crate::cgroup::{self, MemCgroup, Version};
use crate::cli::{MemFairArgs, MemFairChildArgs, MemWorkload};
use crate::dataset::{gib, Dataset, Progress};
use crate::engines::{self, CellSpec, Keys, ProbeOpts, UringOpts};
use crate::kinds::{EngineKind, Regime};
use crate::machine::{cpu_model, git_commit, kernel, loadavg, meminfo, utc_now};
use crate::memory_ceiling::{Ceiling, HotCopy};
use crate::report::rate;
use crate::verify::{VerifyMode, BLOCK};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The engines this mode compares, in report order.
const ENGINES: [EngineKind; 6] = [
    EngineKind::Mmap,
    EngineKind::Pread,
    EngineKind::Uring,
    EngineKind::UringCache,
    EngineKind::UringCacheRef,
    EngineKind::UringRaw,
];

/// Length of one `fill` sample.
const SAMPLE: Duration = Duration::from_millis(100);

/// The last share of `fill`'s samples whose median is the steady state.
const STEADY_SHARE: f64 = 0.25;

/// Set by Ctrl-C (SIGINT/SIGTERM): the running child is killed, its cgroup
/// removed, and the run stops.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// One run, as the parent hands it to the child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    engine: String,
    workload: MemWorkload,
    depth: usize,
    secs: f64,
    /// Warm-up seconds (after the cache is full, when `max_warmup` > 0).
    warmup: f64,
    /// Longest warm-up waiting for the cache to fill (0: a plain warm-up).
    max_warmup: f64,
    workers: usize,
    data_dir: PathBuf,
    files: u32,
    file_size: u64,
    seed: u64,
    /// Files `0..set_files` are read.
    set_files: u32,
    cache_bytes: u64,
    theta: f64,
    cgroup: PathBuf,
    cgroup_version: Version,
    /// Where the child writes its [`ChildResult`].
    out: PathBuf,
}

/// What the child measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChildResult {
    reads: u64,
    secs: f64,
    cpu_user: f64,
    cpu_sys: f64,
    read_bytes: Option<u64>,
    cache_hit_ratio: Option<f64>,
    vm_hwm: Option<u64>,
    p50_us: f64,
    p99_us: f64,
    verified: bool,
    /// Page-cache residency of the set when the window started (hot).
    cached_set: Option<f64>,
    /// Seconds from the child's start to the engine's start (joining the
    /// cgroup, opening, warming the page cache for hot).
    prep_secs: f64,
    /// Length of the warm-up, and when the cache was full in it.
    warm_secs: Option<f64>,
    full_after: Option<f64>,
    /// `fill`: reads completed in each 100 ms sample (scaled to 100 ms by
    /// the sample's real length).
    samples: Vec<u64>,
    /// `fill`: each sample's real length, ms.
    sample_ms: Vec<f64>,
    /// `fill`: the first sample in which the engine's cache was full
    /// (cgroup limit hit, or a `BlockCache` eviction).
    evict_start: Option<usize>,
    notes: Vec<String>,
}

/// One run as reported.
#[derive(Debug, Clone, Serialize)]
struct Run {
    workload: MemWorkload,
    engine: &'static str,
    depth: usize,
    status: String,
    reason: Option<String>,
    reads_per_sec: f64,
    cpu_us_per_read: Option<f64>,
    /// Hit ratio and where it comes from.
    hit_ratio: Option<f64>,
    hit_source: &'static str,
    /// Device reads per second (read_bytes / 4 KiB / s).
    misses_per_sec: Option<f64>,
    vm_hwm: Option<u64>,
    cgroup_peak: Option<u64>,
    cached_before: Option<u64>,
    cached_after: Option<u64>,
    /// Residency (mincore) of the dataset right before the child started.
    cold_residency: f64,
    runs_reads_per_sec: Vec<f64>,
    result: ChildResult,
}

impl Run {
    fn ok(&self) -> bool {
        self.status == "ok"
    }

    fn skipped(
        workload: MemWorkload,
        engine: EngineKind,
        depth: usize,
        status: &str,
        why: String,
    ) -> Run {
        Run {
            workload,
            engine: engine.name(),
            depth,
            status: status.into(),
            reason: Some(why),
            reads_per_sec: 0.0,
            cpu_us_per_read: None,
            hit_ratio: None,
            hit_source: "",
            misses_per_sec: None,
            vm_hwm: None,
            cgroup_peak: None,
            cached_before: None,
            cached_after: None,
            cold_residency: 0.0,
            runs_reads_per_sec: Vec::new(),
            result: ChildResult::default(),
        }
    }
}

/// The `VmHWM` (peak resident set) of this process, bytes.
fn vm_hwm() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = t.lines().find(|l| l.starts_with("VmHWM:"))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// The hidden `mem-fair-child`: joins the cgroup, runs the engine, writes
/// the result.
pub fn child(a: &MemFairChildArgs) -> Result<bool, String> {
    let t_start = Instant::now();
    let spec: ChildSpec =
        serde_json::from_str(&a.spec).map_err(|e| format!("mem-fair-child --spec: {e}"))?;
    MemCgroup::join_self(&spec.cgroup)?;
    let _ = CGROUP.set((spec.cgroup.clone(), spec.cgroup_version));
    engines::LEAN_HISTOGRAMS.store(true, Ordering::Relaxed);
    let engine = <EngineKind as clap::ValueEnum>::from_str(&spec.engine, false)
        .map_err(|e| format!("mem-fair-child: engine {:?}: {e}", spec.engine))?;
    let ds = Dataset::ensure(
        &spec.data_dir,
        spec.files,
        spec.file_size,
        spec.seed,
        false,
        Progress::Quiet,
    )?;
    let cache_engine = matches!(engine, EngineKind::UringCache | EngineKind::UringCacheRef);
    let hot = spec.workload == MemWorkload::Hot;
    let regime = match engine {
        EngineKind::UringRaw => Regime::Direct,
        _ if hot => Regime::Hot,
        _ if cache_engine => Regime::Direct,
        _ => Regime::Cold,
    };
    let mut cached_set = None;
    if hot && !cache_engine {
        // the working set read into the page cache from inside the cgroup,
        // so that it is charged to it
        cached_set = ds.prepare(Regime::Hot, spec.set_files, true)?;
    }
    let keys = if spec.workload == MemWorkload::Zipf {
        Keys::zipf(u64::from(spec.set_files) * ds.blocks_per_file(), spec.theta)?
    } else {
        Keys::Uniform
    };
    let fill = spec.workload == MemWorkload::Fill;
    let cell = CellSpec {
        engine,
        regime,
        depth: spec.depth,
        duration: Duration::from_secs_f64(spec.secs),
        workers: spec.workers,
        verify: VerifyMode::Checksum,
        dataset: &ds,
        set_files: spec.set_files,
        uring: UringOpts::default(),
        fio: PathBuf::from("fio"),
        fio_jobs: 1,
        mmap_populate: true,
        probes: ProbeOpts::OFF,
        cache_bytes: Some(spec.cache_bytes),
        keys,
        warmup: Duration::from_secs_f64(spec.warmup),
        warm_full: (spec.max_warmup > 0.0).then(|| engines::WarmFull {
            full: cache_full,
            max: Duration::from_secs_f64(spec.max_warmup),
        }),
        direct_files: cache_engine,
    };
    let prep_secs = t_start.elapsed().as_secs_f64();
    let sampler = fill.then(|| {
        engines::SAMPLING.store(true, Ordering::Relaxed);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let h = std::thread::spawn(move || sample(&d));
        (done, h)
    });
    let m = engines::run(&cell);
    let (samples, evict_start) = match sampler {
        Some((done, h)) => {
            done.store(true, Ordering::Relaxed);
            h.join().map_err(|_| "fill sampler thread panicked")?
        }
        None => (Vec::new(), None),
    };
    let m = m?;
    let (samples, evict_start) = trim_samples(samples, evict_start);
    let (samples, sample_ms) = samples.into_iter().unzip();
    let h = &m.hist;
    let r = ChildResult {
        reads: m.reads,
        secs: m.elapsed.as_secs_f64(),
        cpu_user: m.cpu.user,
        cpu_sys: m.cpu.sys,
        read_bytes: m.read_bytes,
        cache_hit_ratio: m.cache_hit_ratio,
        vm_hwm: vm_hwm(),
        p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
        verified: m.verified,
        cached_set,
        prep_secs,
        warm_secs: m.warmed.map(|w| w.secs),
        full_after: m.warmed.and_then(|w| w.full_after),
        samples,
        sample_ms,
        evict_start,
        notes: m.notes,
    };
    let json = serde_json::to_string(&r).map_err(|e| e.to_string())?;
    std::fs::write(&spec.out, json).map_err(|e| format!("write {}: {e}", spec.out.display()))?;
    Ok(true)
}

/// The child's cgroup (set when it joins).
static CGROUP: std::sync::OnceLock<(PathBuf, Version)> = std::sync::OnceLock::new();

/// Whether the engine's cache is full: its cgroup hit the limit (page
/// cache, or the process as a whole), or the `BlockCache` evicted.
fn cache_full() -> bool {
    let limit = CGROUP
        .get()
        .is_some_and(|(dir, v)| MemCgroup::limit_hits(dir, *v).unwrap_or(0) > 0);
    limit
        || engines::uring_cache::SAMPLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(|c| c.stats().evictions > 0)
}

/// `fill`'s sampler: every 100 ms (on a fixed schedule) the reads completed
/// since the last sample, scaled to 100 ms by the time that really passed
/// between the two counts, until `done`; and the first sample in which the
/// cgroup had hit its limit or the block cache had evicted. The sampler's
/// own wake-ups are late by milliseconds to tens of milliseconds on a busy
/// machine: unscaled, a sample after a late one covers less than 100 ms
/// and reads as a dip of the engine.
fn sample(done: &AtomicBool) -> (Vec<(u64, f64)>, Option<usize>) {
    let t0 = Instant::now();
    let (mut last, mut last_at) = (engines::COMPLETED.load(Ordering::Relaxed), t0);
    let mut out = Vec::new();
    let mut evict_start = None;
    let mut k = 1u32;
    while !done.load(Ordering::Relaxed) {
        let next = t0 + SAMPLE * k;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let now = engines::COMPLETED.load(Ordering::Relaxed);
        let at = Instant::now();
        let took = at - last_at;
        out.push((scaled(now - last, took), took.as_secs_f64() * 1e3));
        (last, last_at) = (now, at);
        if evict_start.is_none() && cache_full() {
            evict_start = Some(out.len() - 1);
        }
        k += 1;
    }
    (out, evict_start)
}

/// `count` reads completed in `took`, as reads per [`SAMPLE`].
fn scaled(count: u64, took: Duration) -> u64 {
    let took = took.as_secs_f64().max(1e-6);
    (count as f64 * SAMPLE.as_secs_f64() / took).round() as u64
}

/// Drops the samples before the measured window (setup: nothing completed
/// yet) and after it, and the partial first and last samples of the window.
fn trim_samples<T: Copy>(s: Vec<(u64, T)>, evict: Option<usize>) -> (Vec<(u64, T)>, Option<usize>) {
    let (Some(first), Some(last)) = (
        s.iter().position(|&(v, _)| v > 0),
        s.iter().rposition(|&(v, _)| v > 0),
    ) else {
        return (Vec::new(), None);
    };
    let (a, b) = (first + 1, last);
    if a >= b {
        return (Vec::new(), None);
    }
    let evict = evict.map(|e| e.clamp(a, b) - a);
    (s[a..b].to_vec(), evict)
}

/// The `fill` summary of a sample series (reads per 100 ms).
#[derive(Debug, Clone, Serialize)]
struct FillSummary {
    /// Median reads/s of the last quarter of the samples.
    steady: f64,
    /// Seconds into the window when the cache was first full.
    evict_at: Option<f64>,
    /// Lowest sample (reads/s) from then on, and its ratio to `steady`.
    min_after: Option<f64>,
    min_ratio: Option<f64>,
    /// Samples from then on below 0.8x steady, and how many there were.
    below: usize,
    after: usize,
    /// Mean reads/s of every second.
    per_second: Vec<f64>,
    /// The longest sample, ms: how late the sampler woke at worst.
    longest_ms: Option<f64>,
}

fn fill_summary(r: &ChildResult, no_cache: bool) -> Option<FillSummary> {
    let s = &r.samples;
    if s.len() < 8 {
        return None;
    }
    let per_sec = |v: u64| v as f64 / SAMPLE.as_secs_f64();
    let tail = ((s.len() as f64 * STEADY_SHARE) as usize).max(1);
    let mut last: Vec<u64> = s[s.len() - tail..].to_vec();
    last.sort_unstable();
    let steady = per_sec(last[last.len() / 2]);
    // no cache to fill (uring-raw): the whole run after its first second,
    // the device's own variation
    let first = (1.0 / SAMPLE.as_secs_f64()) as usize;
    let (min_after, below, after) = match r.evict_start.or(no_cache.then_some(first)) {
        Some(e) => {
            let from = &s[e.min(s.len() - 1)..];
            let min = from.iter().copied().min().map(per_sec);
            let below = from.iter().filter(|&&v| per_sec(v) < 0.8 * steady).count();
            (min, below, from.len())
        }
        None => (None, 0, 0),
    };
    let n = (1.0 / SAMPLE.as_secs_f64()) as usize;
    Some(FillSummary {
        steady,
        evict_at: r.evict_start.map(|e| e as f64 * SAMPLE.as_secs_f64()),
        min_after,
        min_ratio: min_after.map(|m| m / steady),
        below,
        after,
        per_second: s
            .chunks(n)
            .map(|c| c.iter().map(|&v| per_sec(v)).sum::<f64>() / c.len() as f64)
            .collect(),
        longest_ms: r.sample_ms.iter().copied().reduce(f64::max),
    })
}

/// Checks the flags; returns the engines in report order.
fn validate(a: &MemFairArgs) -> Result<Vec<EngineKind>, String> {
    let mut engines = Vec::new();
    for &e in &a.engines {
        if !ENGINES.contains(&e) {
            return Err(format!(
                "mem-fair: engine {} is not compared here (use mmap, pread, uring, uring-cache, \
                 uring-cache-ref, uring-raw)",
                e.name()
            ));
        }
    }
    for e in ENGINES {
        if a.engines.contains(&e) {
            engines.push(e);
        }
    }
    if a.budget < 16 << 20 {
        return Err(format!(
            "--budget must be at least 16 MiB (got {} bytes)",
            a.budget
        ));
    }
    if a.allowance >= a.budget || a.budget - a.allowance < 1 << 20 {
        return Err(format!(
            "--allowance ({} MiB) must leave at least 1 MiB of the budget ({} MiB) to the cache",
            a.allowance >> 20,
            a.budget >> 20
        ));
    }
    if a.file_size < BLOCK as u64 || a.file_size % BLOCK as u64 != 0 {
        return Err(format!(
            "--file-size must be a non-zero multiple of {BLOCK} bytes (got {})",
            a.file_size
        ));
    }
    if a.workloads.is_empty() || a.depths.is_empty() || engines.is_empty() {
        return Err("mem-fair: no workload, depth or engine to run".into());
    }
    Ok(engines)
}

/// The median-reads/s run of a cell's repetitions (a failure wins).
fn median_run(mut reps: Vec<Run>) -> Run {
    if let Some(i) = reps.iter().position(|r| !r.ok()) {
        return reps.swap_remove(i);
    }
    let all: Vec<f64> = reps.iter().map(|r| r.reads_per_sec).collect();
    reps.sort_by(|a, b| a.reads_per_sec.total_cmp(&b.reads_per_sec));
    let mut r = reps.swap_remove(reps.len() / 2);
    r.runs_reads_per_sec = all;
    r
}

/// Everything the parent needs to start runs.
struct Setup<'a> {
    a: &'a MemFairArgs,
    ds: &'a Dataset,
    parent: &'a cgroup::Parent,
    exe: PathBuf,
    tmp: PathBuf,
    hot_files: u32,
    cache_bytes: u64,
}

/// Runs one engine in its child process and cgroup.
fn run_one(
    s: &Setup<'_>,
    workload: MemWorkload,
    engine: EngineKind,
    depth: usize,
    n: usize,
) -> Result<Run, String> {
    let a = s.a;
    s.ds.evict()
        .map_err(|e| format!("posix_fadvise(DONTNEED): {e}"))?;
    let cold =
        s.ds.residency(s.ds.files)
            .map_err(|e| format!("mincore: {e}"))?;
    if cold > 0.01 {
        return Err(format!(
            "the dataset stays {:.1}% cached after posix_fadvise(DONTNEED) (mapped by another process?)",
            cold * 100.0
        ));
    }
    let (secs, warmup, max_warmup) = match workload {
        MemWorkload::Hot => (a.secs, 0.0, 0.0),
        MemWorkload::Zipf | MemWorkload::Uniform4x if engine == EngineKind::UringRaw => {
            (a.secs, a.warmup, 0.0)
        }
        MemWorkload::Zipf | MemWorkload::Uniform4x => (a.secs, a.warmup, a.max_warmup),
        MemWorkload::Fill => (a.fill_secs, 0.0, 0.0),
    };
    let out = s.tmp.join(format!("result-{n}.json"));
    let _ = std::fs::remove_file(&out);
    let cg = MemCgroup::create(
        s.parent,
        &format!("uring-bench-mem-fair-{}-{n}", std::process::id()),
        a.budget,
    )?;
    let spec = ChildSpec {
        engine: engine.name().into(),
        workload,
        depth,
        secs,
        warmup,
        max_warmup,
        workers: a.workers as usize,
        data_dir: s.ds.dir.clone(),
        files: s.ds.files,
        file_size: s.ds.file_size,
        seed: s.ds.seed,
        set_files: if workload == MemWorkload::Hot {
            s.hot_files
        } else {
            s.ds.files
        },
        cache_bytes: s.cache_bytes,
        theta: a.theta,
        cgroup: cg.dir.clone(),
        cgroup_version: cg.version,
        out: out.clone(),
    };
    let json = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
    let cached_before = meminfo("Cached:");
    let mut child = Command::new(&s.exe)
        .arg("mem-fair-child")
        .arg("--spec")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("start {}: {e}", s.exe.display()))?;
    // generous: the window, the warm-up and the fill of a slow device
    let limit = Duration::from_secs_f64(secs + warmup + max_warmup + 120.0);
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => return Err(format!("wait for the {} child: {e}", engine.name())),
        }
        if INTERRUPTED.load(Ordering::Relaxed) || t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            return Err(format!(
                "the {} child ran over {:.0} s and was killed",
                engine.name(),
                limit.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if INTERRUPTED.load(Ordering::Relaxed) {
        // the child got the terminal's Ctrl-C too
        return Err("interrupted".into());
    }
    let cgroup_peak = cg.peak();
    let oom = cg.oom_killed();
    drop(cg);
    let cached_after = meminfo("Cached:");
    if !status.success() {
        return Ok(Run::skipped(
            workload,
            engine,
            depth,
            "failed",
            format!(
                "child {status}{}",
                if oom {
                    " (OOM-killed in its cgroup: the budget is too small for it)"
                } else {
                    ""
                }
            ),
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    let r: ChildResult = serde_json::from_str(&text).map_err(|e| format!("child result: {e}"))?;
    let secs = r.secs.max(1e-9);
    let reads = r.reads as f64;
    let misses = r.read_bytes.map(|b| b as f64 / BLOCK as f64);
    let (hit_ratio, hit_source) = match engine {
        EngineKind::UringCache | EngineKind::UringCacheRef => (r.cache_hit_ratio, "cache stats"),
        EngineKind::UringRaw => (None, ""),
        _ => (
            misses
                .filter(|_| reads > 0.0)
                .map(|m| (1.0 - m / reads).max(0.0)),
            "read_bytes",
        ),
    };
    Ok(Run {
        workload,
        engine: engine.name(),
        depth,
        status: if r.verified { "ok" } else { "unverified" }.into(),
        reason: None,
        reads_per_sec: reads / secs,
        cpu_us_per_read: (r.reads > 0).then(|| (r.cpu_user + r.cpu_sys) / reads * 1e6),
        hit_ratio,
        hit_source,
        misses_per_sec: misses.map(|m| m / secs),
        vm_hwm: r.vm_hwm,
        cgroup_peak,
        cached_before,
        cached_after,
        cold_residency: cold,
        runs_reads_per_sec: vec![reads / secs],
        result: r,
    })
}

fn mib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.0}", b as f64 / f64::from(1 << 20))
    })
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 && a > 0.0 => format!("{:.2}×", a / b),
        _ => "-".into(),
    }
}

/// The table of one workload (Markdown).
fn table(runs: &[Run], workload: MemWorkload) -> String {
    let mut s = String::new();
    let rows: Vec<&Run> = runs.iter().filter(|r| r.workload == workload).collect();
    let raw_col = workload == MemWorkload::Uniform4x;
    let warm_col = matches!(workload, MemWorkload::Zipf | MemWorkload::Uniform4x);
    s += "| depth | engine | reads/s (runs) | × mmap | × pread | CPU/read | CPU × mmap | CPU × pread | hit ratio | misses/s |";
    if raw_col {
        s += " misses × uring-raw |";
    }
    s += " VmHWM MiB | cgroup peak MiB | Cached Δ MiB |";
    if warm_col {
        s += " cache full after |";
    }
    s += "\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|";
    if raw_col {
        s += "---:|";
    }
    s += "---:|---:|---:|";
    if warm_col {
        s += "---:|";
    }
    s.push('\n');
    for r in &rows {
        let same = |e: &str| {
            rows.iter()
                .find(|x| x.engine == e && x.depth == r.depth && x.ok())
                .copied()
        };
        if !r.ok() {
            let _ = writeln!(
                s,
                "| {} | `{}` | {}: {} |",
                r.depth,
                r.engine,
                r.status,
                r.reason.as_deref().unwrap_or("")
            );
            continue;
        }
        let base = |e: &str| same(e).map(|x| x.reads_per_sec);
        let cpu_base = |e: &str| same(e).and_then(|x| x.cpu_us_per_read);
        let cpu = r.cpu_us_per_read.unwrap_or(0.0);
        let runs = if r.runs_reads_per_sec.len() > 1 {
            format!(
                " ({})",
                r.runs_reads_per_sec
                    .iter()
                    .map(|&v| rate(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            String::new()
        };
        let hit = r
            .hit_ratio
            .map_or("-".into(), |h| format!("{:.1} %", h * 100.0));
        let _ = write!(
            s,
            "| {} | `{}` | {}{runs} | {} | {} | {} | {} | {} | {hit} | {} |",
            r.depth,
            r.engine,
            rate(r.reads_per_sec),
            ratio(r.reads_per_sec, base("mmap")),
            ratio(r.reads_per_sec, base("pread")),
            r.cpu_us_per_read
                .map_or("-".into(), |v| format!("{v:.2} µs")),
            ratio(cpu, cpu_base("mmap")),
            ratio(cpu, cpu_base("pread")),
            r.misses_per_sec.map_or("-".into(), rate),
        );
        if raw_col {
            let raw = same("uring-raw").and_then(|x| x.misses_per_sec);
            let _ = write!(s, " {} |", ratio(r.misses_per_sec.unwrap_or(0.0), raw));
        }
        let delta = match (r.cached_before, r.cached_after) {
            (Some(b), Some(a)) => format!("{:+.0}", (a as f64 - b as f64) / f64::from(1 << 20)),
            _ => "-".into(),
        };
        let _ = write!(s, " {} | {} | {delta} |", mib(r.vm_hwm), mib(r.cgroup_peak));
        if warm_col {
            let w = match (r.result.full_after, r.result.warm_secs) {
                (Some(f), _) => format!("{f:.1} s"),
                (None, Some(w)) if r.engine != "uring-raw" => format!("not full in {w:.0} s"),
                _ => "-".into(),
            };
            let _ = write!(s, " {w} |");
        }
        s.push('\n');
    }
    s
}

/// The `fill` summary table (Markdown).
fn fill_table(runs: &[Run]) -> String {
    let mut s = String::from(
        "| engine | steady reads/s | cache full at | lowest 100 ms after | × steady | samples < 0.8× | longest sample | reads/s each second |\n|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in runs.iter().filter(|r| r.workload == MemWorkload::Fill) {
        let no_cache = r.engine == EngineKind::UringRaw.name();
        let Some(f) = r.ok().then(|| fill_summary(&r.result, no_cache)).flatten() else {
            let _ = writeln!(
                s,
                "| `{}` | {} |",
                r.engine,
                r.reason.as_deref().unwrap_or("too few samples")
            );
            continue;
        };
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |",
            r.engine,
            rate(f.steady),
            match f.evict_at {
                Some(t) => format!("{t:.1} s"),
                None if no_cache => "no cache (from 1 s)".into(),
                None => "never".into(),
            },
            f.min_after.map_or("-".into(), rate),
            f.min_ratio.map_or("-".into(), |v| format!("{v:.2}×")),
            if f.after > 0 {
                format!("{} of {}", f.below, f.after)
            } else {
                "-".into()
            },
            f.longest_ms.map_or("-".into(), |v| format!("{v:.0} ms")),
            f.per_second
                .iter()
                .map(|&v| rate(v))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    s
}

/// Runs the mode; `Ok(false)` when a run failed.
pub fn run(a: &MemFairArgs) -> Result<bool, String> {
    let engines = validate(a)?;
    let parent = match cgroup::find_parent() {
        Ok(p) => p,
        Err(why) => {
            println!("mem-fair skipped: {why}");
            return Ok(true);
        }
    };
    if let Err(e) = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::Relaxed)) {
        eprintln!("warning: no Ctrl-C handler ({e}); an interrupted run may leave a cgroup behind");
    }
    let t_start = Instant::now();
    let (started, stamp) = utc_now();
    let dataset_size = a.dataset_size.unwrap_or(4 * a.budget);
    let files = u32::try_from(dataset_size.div_ceil(a.file_size).max(1))
        .map_err(|_| "--dataset-size / --file-size: too many files".to_string())?;
    let hot_files =
        ((a.budget as f64 * a.hot_fraction) as u64 / a.file_size).min(u64::from(files)) as u32;
    if a.workloads.contains(&MemWorkload::Hot) && hot_files == 0 {
        return Err(format!(
            "--file-size ({} MiB) is larger than the hot working set ({:.0} MiB): use a smaller --file-size",
            a.file_size >> 20,
            a.budget as f64 * a.hot_fraction / f64::from(1 << 20)
        ));
    }
    let ds = Dataset::ensure(
        &a.data_dir,
        files,
        a.file_size,
        a.seed,
        true,
        if a.quiet {
            Progress::Quiet
        } else {
            Progress::Bar
        },
    )?;
    let cache_bytes = a.budget - a.allowance;
    let out_dir = a.output_dir.join(format!("mem-fair-{stamp}"));
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create output dir {}: {e}", out_dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let machine = format!(
        "{}, {} CPUs, {:.0} GiB RAM, kernel {}",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        meminfo("MemTotal:").map_or(0.0, gib),
        kernel()
    );
    let wake = crate::wake::measure(crate::wake::SAMPLES);
    println!("machine: {machine}; {}", wake.summary());
    // what the cache engines pay per frame as they fill (first_touch.rs)
    let touch = crate::first_touch::measure(crate::first_touch::BYTES)?;
    println!("machine: {}", touch.summary());
    let regime = format!(
        "memory limit {} MiB per engine (cgroup {:?} under {}); cache engines: BlockCache of {} MiB \
         (budget - {} MiB allowance for the process), files O_DIRECT; dataset {} files x {} MiB = {:.2} GiB \
         ({}); hot set {} files = {} MiB ({:.2}x the budget); {} workers, 4 KiB reads, every block verified; \
         {} s per cell (zipf and uniform4x after a warm-up until the cache is full, then {} s more, \
         at most {} s), fill {} s; zipf theta {}",
        a.budget >> 20,
        parent.version,
        parent.dir.display(),
        cache_bytes >> 20,
        a.allowance >> 20,
        ds.files,
        ds.file_size >> 20,
        gib(ds.total_bytes()),
        if ds.generated { "generated" } else { "reused" },
        hot_files,
        (u64::from(hot_files) * ds.file_size) >> 20,
        (u64::from(hot_files) * ds.file_size) as f64 / a.budget as f64,
        a.workers,
        a.secs,
        a.warmup,
        a.max_warmup,
        a.fill_secs,
        a.theta
    );
    println!("{regime}");
    let max_depth = a.depths.iter().copied().max().unwrap_or(512);
    let setup = Setup {
        a,
        ds: &ds,
        parent: &parent,
        exe,
        tmp: out_dir.clone(),
        hot_files,
        cache_bytes,
    };
    let mut cells: Vec<Vec<Run>> = Vec::new();
    let mut ceilings: Vec<Ceiling> = Vec::new();
    let mut all_ok = true;
    let mut n = 0;
    for &workload in &a.workloads {
        let depths = match workload {
            MemWorkload::Hot | MemWorkload::Zipf => a.depths.clone(),
            MemWorkload::Uniform4x | MemWorkload::Fill => vec![max_depth],
        };
        // The hot set's memory ceiling, measured before each repetition.
        let hot_copy = if workload == MemWorkload::Hot {
            Some(HotCopy::new(a.seed, hot_files, ds.blocks_per_file())?)
        } else {
            None
        };
        for rep in 0..a.repeat {
            if let Some(copy) = &hot_copy {
                let c = copy.measure(
                    usize::try_from(a.workers).unwrap_or(1),
                    a.secs,
                    VerifyMode::Checksum,
                )?;
                if !a.quiet {
                    println!(
                        "{:<9} memory ceiling: {} reads/s in place, {} copied out",
                        workload.name(),
                        rate(c.in_place),
                        rate(c.copied)
                    );
                }
                ceilings.push(c);
            }
            for &depth in &depths {
                for &engine in &engines {
                    let slot = cells.iter().position(|v| {
                        v[0].workload == workload
                            && v[0].depth == depth
                            && v[0].engine == engine.name()
                    });
                    let slot = slot.unwrap_or_else(|| {
                        cells.push(Vec::new());
                        cells.len() - 1
                    });
                    let label = format!(
                        "{:<9} depth {:>4} {:<15}",
                        workload.name(),
                        depth,
                        engine.name()
                    );
                    if workload == MemWorkload::Hot && engine == EngineKind::UringRaw {
                        if rep == 0 {
                            cells[slot].push(Run::skipped(
                                workload,
                                engine,
                                depth,
                                "n/a",
                                "no cache: every read is a miss".into(),
                            ));
                        }
                        continue;
                    }
                    n += 1;
                    let r =
                        match run_one(&setup, workload, engine, depth, n) {
                            Err(e) if e == "interrupted" => return Err(
                                "interrupted; the running child was killed and its cgroup removed"
                                    .into(),
                            ),
                            Err(e) => Run::skipped(workload, engine, depth, "failed", e),
                            Ok(r) => r,
                        };
                    if r.ok() {
                        if !a.quiet {
                            println!(
                                "{label} {:>8} reads/s  CPU/read {:>7}  hit {:>6}  misses/s {:>7}  VmHWM {:>4} MiB  cgroup peak {:>4} MiB",
                                rate(r.reads_per_sec),
                                r.cpu_us_per_read.map_or("-".into(), |v| format!("{v:.2}µs")),
                                r.hit_ratio.map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
                                r.misses_per_sec.map_or("-".into(), rate),
                                mib(r.vm_hwm),
                                mib(r.cgroup_peak),
                            );
                        }
                    } else {
                        all_ok = false;
                        println!(
                            "{label} {}: {}",
                            r.status,
                            r.reason.as_deref().unwrap_or("")
                        );
                    }
                    cells[slot].push(r);
                }
            }
        }
    }
    let runs: Vec<Run> = cells.into_iter().map(median_run).collect();
    let ceiling = Ceiling::median(&ceilings);
    let mut md = format!(
        "machine: {machine}; {}; {}\n\n{regime}\n",
        wake.summary(),
        touch.summary()
    );
    // The zipf workload reads every file (`Spec::set_files`).
    let zipf_blocks = u64::from(ds.files) * ds.blocks_per_file();
    let ideal = |bytes: u64| zipf_top_mass(zipf_blocks, a.theta, bytes / BLOCK as u64);
    let zipf_ideal = a
        .workloads
        .contains(&MemWorkload::Zipf)
        .then(|| (ideal(cache_bytes), ideal(a.budget)));
    for &w in &a.workloads {
        let _ = write!(md, "\n#### {}\n\n{}", w.name(), table(&runs, w));
        if let (MemWorkload::Hot, Some(c)) = (w, &ceiling) {
            let _ = write!(md, "\n{}", ceiling_line(&runs, c, ceilings.len()));
        }
        if w == MemWorkload::Fill {
            let _ = write!(md, "\n{}", fill_table(&runs));
        }
        if let (MemWorkload::Zipf, Some((cache, budget))) = (w, zipf_ideal) {
            let _ = writeln!(
                md,
                "\nideal hit ratio (a cache that always holds the most likely blocks: \
                 with independent Zipf draws no policy that does not know the next \
                 reads does better): {:.1} % in the BlockCache's {} MiB, {:.1} % in \
                 the whole {} MiB budget",
                cache * 100.0,
                cache_bytes >> 20,
                budget * 100.0,
                a.budget >> 20
            );
        }
    }
    md +=
        "\nhit ratio: the cache engines' from BlockCache::stats over the window; mmap, pread and \
           uring's from the device reads (1 - read_bytes of /proc/self/io / 4 KiB / reads). \
           Cached Δ: /proc/meminfo Cached after the child minus before (machine-wide).\n";
    println!();
    print!("{md}");
    let json = serde_json::json!({
        "started_utc": started,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "git_commit": git_commit(),
        "machine": machine,
        "first_touch": touch,
        "loadavg_end": loadavg(),
        "regime": regime,
        "zipf_ideal_hit_ratio": zipf_ideal.map(|(cache, budget)| serde_json::json!({
            "cache": cache,
            "budget": budget,
        })),
        "memory_ceiling": ceiling,
        "memory_ceiling_runs": ceilings,
        "runs": runs,
        "fill": runs.iter().filter(|r| r.workload == MemWorkload::Fill)
            .map(|r| (r.engine, fill_summary(&r.result, r.engine == "uring-raw"))).collect::<Vec<_>>(),
    });
    std::fs::write(
        out_dir.join("report.json"),
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("write report.json: {e}"))?;
    std::fs::write(out_dir.join("report.md"), &md).map_err(|e| format!("write report.md: {e}"))?;
    println!(
        "\nresults: {} (report.json, report.md); total {:.1} s",
        out_dir.display(),
        t_start.elapsed().as_secs_f64()
    );
    Ok(all_ok)
}

/// The hot set's memory ceiling (`memory_ceiling.rs`) and each engine's
/// hot reads/s as a share of it, depth by depth.
fn ceiling_line(runs: &[Run], c: &Ceiling, n: usize) -> String {
    let mut s = format!(
        "memory ceiling (no engine: {} threads verifying uniformly random 4 KiB blocks of a copy of \
         the hot set in anonymous memory, {} in 2 MiB pages, found by index; median of {} run(s)): \
         **{} reads/s verified in place, {} copied out then verified**. Each engine's hot reads/s \
         as a share of the in-place figure:",
        c.threads,
        c.huge_share.map_or("share unknown".into(), |h| format!("{:.0} %", h * 100.0)),
        n,
        rate(c.in_place),
        rate(c.copied),
    );
    let mut depths: Vec<usize> = runs
        .iter()
        .filter(|r| r.workload == MemWorkload::Hot)
        .map(|r| r.depth)
        .collect();
    depths.dedup();
    for d in depths {
        let _ = write!(s, " depth {d}:");
        let cells: Vec<String> = runs
            .iter()
            .filter(|r| r.workload == MemWorkload::Hot && r.depth == d && r.ok())
            .map(|r| format!(" `{}` {:.2}×", r.engine, r.reads_per_sec / c.in_place))
            .collect();
        s += &cells.join(",");
        s.push(';');
    }
    s.pop();
    s += ".\n";
    s
}

/// The probability that a Zipf draw (exponent `theta`, ranks `1..=n`, as
/// `rand_distr::Zipf`) falls on one of the `k` most likely ranks: the hit
/// ratio of a cache of `k` blocks that always holds them. Under
/// independent draws that is the best any demand-paging policy can do.
fn zipf_top_mass(n: u64, theta: f64, k: u64) -> f64 {
    let k = k.min(n);
    let (mut top, mut all) = (0.0, 0.0);
    for r in 1..=n {
        let p = (r as f64).powf(-theta);
        all += p;
        if r == k {
            top = all;
        }
    }
    if all > 0.0 {
        top / all
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_top_mass_is_the_share_of_the_most_likely_ranks() {
        assert!((zipf_top_mass(1000, 0.0, 250) - 0.25).abs() < 1e-12);
        assert!((zipf_top_mass(1000, 0.99, 1000) - 1.0).abs() < 1e-12);
        assert!((zipf_top_mass(1000, 0.99, 5000) - 1.0).abs() < 1e-12);
        assert_eq!(zipf_top_mass(1000, 0.99, 0), 0.0);
        // ranks 1 and 2 of 3 with theta 1: (1 + 1/2) / (1 + 1/2 + 1/3)
        assert!((zipf_top_mass(3, 1.0, 2) - 1.5 / (11.0 / 6.0)).abs() < 1e-12);
        // the workload of BENCHMARKS: 2 GiB of 4 KiB blocks, theta 0.99, 448 MiB
        let h = zipf_top_mass(524_288, 0.99, 114_688);
        assert!((h - 0.8826).abs() < 1e-3, "{h}");
    }

    #[test]
    fn a_sample_is_scaled_to_its_length() {
        assert_eq!(scaled(1000, SAMPLE), 1000);
        assert_eq!(scaled(1300, SAMPLE * 13 / 10), 1000, "a late sample");
        assert_eq!(scaled(700, SAMPLE * 7 / 10), 1000, "the one after it");
        assert_eq!(scaled(0, Duration::ZERO), 0);
    }

    #[test]
    fn samples_are_trimmed_to_the_window() {
        let s: Vec<(u64, ())> = [0, 0, 5, 10, 10, 0, 10, 3, 0].map(|v| (v, ())).into();
        let (s, e) = trim_samples(s, Some(4));
        assert_eq!(s, [10, 10, 0, 10].map(|v| (v, ())));
        assert_eq!(e, Some(1));
        assert_eq!(
            trim_samples(vec![(0, ()), (0, ())], None),
            (Vec::new(), None)
        );
    }

    #[test]
    fn fill_summary_finds_the_dip() {
        let mut samples = vec![100u64; 40];
        samples[12] = 40;
        let r = ChildResult {
            samples,
            evict_start: Some(10),
            ..ChildResult::default()
        };
        let f = fill_summary(&r, false).unwrap();
        assert_eq!(f.steady, 1000.0);
        assert_eq!(f.min_after, Some(400.0));
        assert_eq!(f.min_ratio, Some(0.4));
        assert_eq!((f.below, f.after), (1, 30));
        assert_eq!(f.per_second.len(), 4);
        // no cache, fewer samples than the first second: the last one
        let r = ChildResult {
            samples: vec![100; 8],
            ..ChildResult::default()
        };
        let f = fill_summary(&r, true).unwrap();
        assert_eq!((f.min_ratio, f.after), (Some(1.0), 1));
    }
}
