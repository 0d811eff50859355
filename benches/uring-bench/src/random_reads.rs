//! The default mode, the random-read comparison: every (regime, depth,
//! engine) cell of the command line, repeated and interleaved, then the
//! terminal table, the JSON and Markdown reports and the charts of the run.

use crate::cli::Args;
use crate::dataset::{gib, Dataset, Progress};
use crate::engines::{self, CellSpec, ProbeOpts, UringOpts};
use crate::kinds::{EngineKind, OnOff, Regime};
use crate::machine::{cpu_model, git_commit, kernel, loadavg, meminfo, utc_now};
use crate::report::{self, Cell, Report, RunInfo};
use crate::{charts, first_touch, probes, wake};
use std::time::{Duration, Instant};

/// Files in the hot working set.
fn hot_set_files(args: &Args, ds: &Dataset) -> u32 {
    let want = match args.hot_set {
        Some(b) => b,
        None => {
            let avail = meminfo("MemAvailable:").unwrap_or(u64::MAX / 4);
            ds.total_bytes().min(avail / 2)
        }
    };
    (want / ds.file_size).clamp(1, u64::from(ds.files)) as u32
}

/// The probes' figures of a cell for its progress line ("" when none ran).
fn probe_summary(c: &Cell) -> String {
    let mut s = String::new();
    if let Some(t) = &c.timer_lateness {
        s.push_str(&format!(
            "  timer p99/max {}ms",
            report::timer_text(Some(t))
        ));
    }
    if let Some(v) = c.syscalls_per_read {
        s.push_str(&format!(
            "  syscalls/read {}",
            report::per_read_text(Some(v))
        ));
    }
    if let Some(v) = c.enters_per_read {
        s.push_str(&format!("  enters/read {}", report::per_read_text(Some(v))));
    }
    s
}

/// The repetition with the median reads/s, carrying every repetition's reads/s.
fn median_cell(mut reps: Vec<Cell>) -> Cell {
    if reps.len() == 1 || !reps[0].ok() {
        return reps.swap_remove(0);
    }
    let all: Vec<f64> = reps.iter().map(|c| c.reads_per_sec).collect();
    reps.sort_by(|a, b| a.reads_per_sec.total_cmp(&b.reads_per_sec));
    let mut c = reps.swap_remove(reps.len() / 2);
    c.runs_reads_per_sec = all;
    c
}

/// The cache engines' hit-ratio notes, one line per cell (the markdown
/// report has them under "Engine notes").
fn cache_notes(r: &Report) -> Vec<String> {
    r.cells
        .iter()
        .filter(|c| c.ok())
        .flat_map(|c| {
            c.notes
                .iter()
                .filter(|n| n.starts_with("cache hit ratio"))
                .map(move |n| {
                    format!(
                        "{:<15} {:<6} depth {:>4}: {n}",
                        c.engine,
                        c.regime.name(),
                        c.depth
                    )
                })
        })
        .collect()
}

/// Runs the comparison; `Ok(false)` when a cell failed.
pub fn run(args: &Args) -> Result<bool, String> {
    args.validate()?;
    let t_start = Instant::now();
    let load_start = loadavg();
    let (started, stamp) = utc_now();
    let engines = args.engine_list();
    let progress = if args.quiet {
        Progress::Quiet
    } else {
        Progress::Bar
    };

    let t_ds = Instant::now();
    let ds = Dataset::ensure(
        &args.data_dir,
        args.files,
        args.file_size,
        args.seed,
        !args.no_generate,
        progress,
    )?;
    let ds_secs = t_ds.elapsed().as_secs_f64();
    report::say(&format!(
        "dataset: {} files x {:.2} GiB = {:.2} GiB in {} ({} in {:.1} s)",
        ds.files,
        gib(ds.file_size),
        gib(ds.total_bytes()),
        ds.dir.display(),
        if ds.generated { "generated" } else { "reused" },
        ds_secs
    ));
    if args.generate_only {
        return Ok(true);
    }
    let hot_files = hot_set_files(args, &ds);
    // the unit this machine charges for a thread hand-off (see wake.rs)
    let thread_wake = wake::measure(wake::SAMPLES);
    report::say(&format!("machine: {}", thread_wake.summary()));
    // what a cache filling its frames pays per frame (see first_touch.rs)
    let first_touch = if engines
        .iter()
        .any(|e| matches!(e, EngineKind::UringCache | EngineKind::UringCacheRef))
    {
        let t = first_touch::measure(first_touch::BYTES)?;
        report::say(&format!("machine: {}", t.summary()));
        Some(t)
    } else {
        None
    };
    let fio_missing = if engines.contains(&EngineKind::Fio) {
        engines::fio::unavailable(&args.fio)
    } else {
        None
    };

    let out_dir = args.output_dir.join(format!("run-{stamp}"));
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create output dir {}: {e}", out_dir.display()))?;

    // regime-major (so the hot set is warmed once), then repetition, depth, engine
    let mut order = Vec::new();
    for &regime in &args.regimes {
        for rep in 0..args.repeat {
            for &depth in &args.depths {
                for &engine in &engines {
                    order.push((regime, rep, depth, engine));
                }
            }
        }
    }
    if let Some(n) = args.tokio_global_queue_interval {
        let _ = engines::GLOBAL_QUEUE_INTERVAL.set(n);
    }
    let uring = UringOpts {
        rings: args.uring_rings,
        entries: args.uring_entries,
        max_in_flight: args.uring_max_in_flight,
        inline: args.uring_inline,
        inline_stretch: args
            .uring_inline_stretch_us
            .map(std::time::Duration::from_micros),
        shallow_batch: args.uring_shallow_batch,
        current_thread: false,
    };
    // every repetition of every (regime, depth, engine)
    let mut runs: Vec<Vec<Cell>> = Vec::new();
    let mut all_ok = true;
    let n = order.len();
    report::say(&format!(
        "{n} cells x {} s{} (regimes {}; hot set {hot_files} of {} files); results go to {}",
        args.duration,
        if args.syscall_window > 0.0 {
            format!(" (+ {} s syscall window)", args.syscall_window)
        } else {
            String::new()
        },
        args.regimes
            .iter()
            .map(|r| r.name())
            .collect::<Vec<_>>()
            .join(","),
        ds.files,
        out_dir.display()
    ));
    for (i, &(regime, rep, depth, engine)) in order.iter().enumerate() {
        let label = format!(
            "[{:>2}/{n}] {:<6} depth {:>4} {:<11}",
            i + 1,
            regime.name(),
            depth,
            engine.name()
        );
        let slot = match runs.iter().position(|v| {
            v[0].regime == regime && v[0].depth == depth && v[0].engine == engine.name()
        }) {
            Some(p) => p,
            None => {
                runs.push(Vec::new());
                runs.len() - 1
            }
        };
        let mut push = |c: Cell| {
            if runs[slot].is_empty() || runs[slot][0].ok() {
                runs[slot].push(c);
            }
        };
        // (status, what the terminal says, why)
        let skip = match (
            engines::not_applicable(engine, regime),
            engine,
            &fio_missing,
        ) {
            (Some(why), _, _) => Some(("n/a", "n/a", why.to_string())),
            (None, EngineKind::Fio, Some(why)) => Some(("not-run", "not run", why.clone())),
            _ => None,
        };
        if let Some((status, said, why)) = skip {
            if rep == 0 {
                report::say(&format!("{label} {said}: {why}"));
            }
            push(Cell::skipped(engine.name(), regime, depth, status, why));
            continue;
        }
        let set_files = if regime == Regime::Hot {
            hot_files
        } else {
            ds.files
        };
        let cached = ds.prepare(regime, hot_files, args.quiet)?;
        let spec = CellSpec {
            engine,
            regime,
            depth,
            duration: Duration::from_secs_f64(args.duration),
            workers: args.workers,
            verify: args.verify,
            dataset: &ds,
            set_files,
            uring: uring.clone(),
            fio: args.fio.clone(),
            mmap_populate: args.mmap_populate == OnOff::On,
            probes: ProbeOpts {
                timer: args.timer_probe == OnOff::On,
                syscall_window: (args.syscall_window > 0.0)
                    .then(|| Duration::from_secs_f64(args.syscall_window)),
            },
            cache_bytes: args.cache_mib.map(|m| m << 20),
            keys: engines::Keys::Uniform,
            warmup: Duration::ZERO,
            warm_full: None,
            direct_files: false,
            fio_jobs: args.fio_jobs.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
            }),
        };
        match engines::run(&spec) {
            Ok(m) => {
                let mut c = Cell::from_measured(engine.name(), regime, depth, m, cached);
                if cached.is_some() {
                    c.cached_after = ds.residency(set_files).ok();
                }
                if regime != Regime::Hot {
                    let blocks = f64::from(set_files) * ds.blocks_per_file() as f64;
                    let reads = c.reads as f64;
                    if reads > 0.0 {
                        let distinct = blocks * (1.0 - (-reads / blocks).exp());
                        c.reread_share_est = Some(((reads - distinct) / reads).max(0.0));
                    }
                }
                let l = c.latency_us.clone();
                let line = format!(
                    "{label} {:>7} reads/s p50 {:>7} p99.9 {:>7} CPU/read {:>7}",
                    report::rate(c.reads_per_sec),
                    l.as_ref().map_or("-".into(), |l| report::micros(l.p50)),
                    l.as_ref().map_or("-".into(), |l| report::micros(l.p999)),
                    c.cpu_us_per_read
                        .map_or("-".into(), |v| format!("{v:.2}µs")),
                );
                let probes = format!(
                    "{}{}",
                    c.reads_per_enter
                        .map_or(String::new(), |v| format!("  reads/enter {v:.1}")),
                    probe_summary(&c)
                );
                // the probes' figures on a line of their own when both do not fit
                if line.len() + probes.len() <= report::term_width() {
                    println!("{line}{probes}");
                } else {
                    println!("{line}");
                    if !probes.is_empty() {
                        println!("       {}", probes.trim_start());
                    }
                }
                push(c);
            }
            Err(e) if e.starts_with("verification failed") => {
                return Err(format!(
                    "{e} (regime {}, depth {depth}); run stopped",
                    regime.name()
                ));
            }
            Err(e) => {
                report::say(&format!("{label} FAILED: {e}"));
                all_ok = false;
                // a failure replaces any successful repetition of this cell
                runs[slot] = vec![Cell::skipped(engine.name(), regime, depth, "failed", e)];
            }
        }
    }
    let mut cells: Vec<Cell> = runs.into_iter().map(median_cell).collect();

    let names: Vec<String> = engines.iter().map(|e| e.name().to_string()).collect();
    report::fill_ratios(&mut cells, &names);
    let cells = cells;
    let report = Report {
        info: RunInfo {
            started_utc: started,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            git_commit: git_commit(),
            kernel: kernel(),
            cpu_model: cpu_model(),
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            mem_total_gib: meminfo("MemTotal:").map_or(0.0, gib),
            dataset_dir: ds.dir.display().to_string(),
            files: ds.files,
            file_size: ds.file_size,
            dataset_gib: gib(ds.total_bytes()),
            dataset_generated: ds.generated,
            dataset_seconds: ds_secs,
            hot_set_files: hot_files,
            hot_set_gib: gib(u64::from(hot_files) * ds.file_size),
            duration_s: args.duration,
            repeat: args.repeat,
            workers: args.workers,
            verify: args.verify,
            engines: names,
            depths: args.depths.clone(),
            regimes: args.regimes.clone(),
            total_seconds: 0.0,
            loadavg_start: load_start,
            loadavg_end: loadavg(),
            syscall_probe: probes::syscall_probe_description(args.syscall_window > 0.0),
            thread_wake: Some(thread_wake),
            first_touch,
        },
        cells,
    };
    let mut report = report;
    report.info.total_seconds = t_start.elapsed().as_secs_f64();

    println!();
    report::say(&format!(
        "random 4 KiB reads, {} s per cell; hot = {} of {} files cached; cold = evicted before each cell; direct = O_DIRECT; x base = reads/s / {}'s (all figures: report.md)",
        args.duration,
        hot_files,
        ds.files,
        report
            .cells
            .iter()
            .find_map(|c| c.baseline.clone())
            .unwrap_or_else(|| "-".into())
    ));
    print!("{}", report::terminal_cells(&report, report::term_width()));
    let cache_lines = cache_notes(&report);
    if !cache_lines.is_empty() {
        println!("\nblock cache (uring-cache, uring-cache-ref), per cell:");
        for l in cache_lines {
            report::say(&format!("  {l}"));
        }
    }
    for l in report::skipped(&report) {
        report::say(&format!("  {l}"));
    }

    let charts = if args.no_charts {
        Vec::new()
    } else {
        charts::write_all(&report, &out_dir).unwrap_or_else(|e| {
            eprintln!("warning: {e}");
            Vec::new()
        })
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(out_dir.join("report.json"), json)
        .map_err(|e| format!("write {}: {e}", out_dir.join("report.json").display()))?;
    std::fs::write(
        out_dir.join("report.md"),
        report::markdown(&report, &charts),
    )
    .map_err(|e| format!("write {}: {e}", out_dir.join("report.md").display()))?;
    println!();
    report::say(&format!(
        "results: {} (report.json, report.md, {} SVG charts); total {:.1} s",
        out_dir.display(),
        charts.len(),
        t_start.elapsed().as_secs_f64()
    ));
    println!();
    for v in report::verdicts(&report) {
        report::say(&v);
    }
    Ok(all_ok)
}
