//! Results: per-cell summaries, ratios, the terminal table, JSON and Markdown.

use crate::engines::Measured;
use crate::kinds::Regime;
use crate::probes::TimerLateness;
use crate::verify::BLOCK;
use serde::Serialize;
use std::fmt::Write as _;

/// Latency summary in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub p9999: f64,
    pub max: f64,
}

/// One (engine, regime, depth) result.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub engine: String,
    pub regime: Regime,
    pub depth: usize,
    /// "ok", "n/a" (engine cannot do this regime), "not-run" (tool missing)
    /// or "failed".
    pub status: String,
    pub reason: Option<String>,
    pub reads: u64,
    pub seconds: f64,
    pub reads_per_sec: f64,
    pub mb_per_sec: f64,
    /// reads/s divided by the baseline engine's reads/s in the same regime and depth.
    pub ratio: Option<f64>,
    pub baseline: Option<String>,
    pub latency_us: Option<Latency>,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// (user + sys CPU) / reads, microseconds.
    pub cpu_us_per_read: Option<f64>,
    /// Reads per io_uring_enter (uring: from ctx.stats(); uring-raw: own count).
    pub reads_per_enter: Option<f64>,
    /// Page-cache residency of the files read, measured (mincore) just
    /// before the timed window.
    pub cached_before: Option<f64>,
    /// The same, measured right after the timed window.
    pub cached_after: Option<f64>,
    /// Share of reads completed inline, without the ring (uring).
    pub inline_share: Option<f64>,
    /// Cold: expected share of this cell's reads that hit a block the cell
    /// had already read (uniform random reads over the working set).
    pub reread_share_est: Option<f64>,
    /// reads/s of every repetition of this cell (the cell reports the median).
    pub runs_reads_per_sec: Vec<f64>,
    /// Lateness of a 1 ms `tokio::time::sleep` loop on the engine's runtime
    /// during the window (None: the engine runs no tokio runtime, or the
    /// probe was off).
    pub timer_lateness: Option<TimerLateness>,
    /// System calls of the process in the syscall window that follows the
    /// measured one, the reads completed in it, its length, and the threads
    /// counted (None: not counted).
    pub syscalls: Option<u64>,
    pub syscall_window_reads: Option<u64>,
    pub syscall_window_s: Option<f64>,
    pub syscall_window_threads: Option<usize>,
    /// `syscalls` / `syscall_window_reads`.
    pub syscalls_per_read: Option<f64>,
    /// `io_uring_enter` calls / reads (uring, from `ctx.stats()`).
    pub enters_per_read: Option<f64>,
    /// Driver task polls / reads (uring, from `ctx.stats()`).
    pub driver_polls_per_read: Option<f64>,
    pub verified: bool,
    pub notes: Vec<String>,
    /// Latency CDF: (microseconds, quantile).
    pub cdf: Vec<(f64, f64)>,
}

impl Cell {
    pub fn skipped(
        engine: &str,
        regime: Regime,
        depth: usize,
        status: &str,
        reason: String,
    ) -> Cell {
        Cell {
            engine: engine.into(),
            regime,
            depth,
            status: status.into(),
            reason: Some(reason),
            reads: 0,
            seconds: 0.0,
            reads_per_sec: 0.0,
            mb_per_sec: 0.0,
            ratio: None,
            baseline: None,
            latency_us: None,
            cpu_user_s: 0.0,
            cpu_sys_s: 0.0,
            cpu_us_per_read: None,
            reads_per_enter: None,
            cached_before: None,
            cached_after: None,
            inline_share: None,
            reread_share_est: None,
            runs_reads_per_sec: Vec::new(),
            timer_lateness: None,
            syscalls: None,
            syscall_window_reads: None,
            syscall_window_s: None,
            syscall_window_threads: None,
            syscalls_per_read: None,
            enters_per_read: None,
            driver_polls_per_read: None,
            verified: false,
            notes: Vec::new(),
            cdf: Vec::new(),
        }
    }

    pub fn ok(&self) -> bool {
        self.status == "ok"
    }

    pub fn from_measured(
        engine: &str,
        regime: Regime,
        depth: usize,
        m: Measured,
        cached_before: Option<f64>,
    ) -> Cell {
        let secs = m.elapsed.as_secs_f64().max(1e-9);
        let us = |ns: f64| ns / 1000.0;
        let (latency, cdf) = match &m.cdf {
            Some(points) => {
                let at = |q: f64| {
                    points
                        .iter()
                        .find(|p| p.1 >= q - 1e-12)
                        .or(points.last())
                        .map_or(0.0, |p| us(p.0))
                };
                (
                    Latency {
                        p50: at(0.5),
                        p90: at(0.9),
                        p99: at(0.99),
                        p999: at(0.999),
                        p9999: at(0.9999),
                        max: at(1.0),
                    },
                    points.iter().map(|&(ns, q)| (us(ns), q)).collect(),
                )
            }
            None => {
                let h = &m.hist;
                let q = |q: f64| us(h.value_at_quantile(q) as f64);
                let mut cdf = vec![(us(h.min() as f64), 0.0)];
                for i in 1..20 {
                    let qq = f64::from(i) / 20.0;
                    cdf.push((q(qq), qq));
                }
                for k in 14..=50 {
                    let qq = 1.0 - 10f64.powf(-f64::from(k) / 10.0);
                    cdf.push((q(qq), qq));
                }
                cdf.push((us(h.max() as f64), 1.0));
                (
                    Latency {
                        p50: q(0.5),
                        p90: q(0.9),
                        p99: q(0.99),
                        p999: q(0.999),
                        p9999: q(0.9999),
                        max: us(h.max() as f64),
                    },
                    cdf,
                )
            }
        };
        let cpu = m.cpu.user + m.cpu.sys;
        let per_read =
            |n: Option<u64>| n.filter(|_| m.reads > 0).map(|n| n as f64 / m.reads as f64);
        Cell {
            engine: engine.into(),
            regime,
            depth,
            status: "ok".into(),
            reason: None,
            reads: m.reads,
            seconds: secs,
            reads_per_sec: m.reads as f64 / secs,
            mb_per_sec: m.reads as f64 * BLOCK as f64 / secs / 1e6,
            ratio: None,
            baseline: None,
            latency_us: (m.reads > 0).then_some(latency),
            cpu_user_s: m.cpu.user,
            cpu_sys_s: m.cpu.sys,
            cpu_us_per_read: (m.reads > 0).then(|| cpu * 1e6 / m.reads as f64),
            reads_per_enter: m.reads_per_enter,
            cached_before,
            cached_after: None,
            inline_share: m
                .inline_completed
                .filter(|_| m.reads > 0)
                .map(|i| i as f64 / m.reads as f64),
            reread_share_est: None,
            runs_reads_per_sec: vec![m.reads as f64 / secs],
            timer_lateness: m
                .timer_lateness
                .as_ref()
                .and_then(TimerLateness::from_histogram),
            syscalls: m.syscalls.map(|w| w.counts.syscalls),
            syscall_window_reads: m.syscalls.map(|w| w.reads),
            syscall_window_s: m.syscalls.map(|w| w.counts.seconds),
            syscall_window_threads: m.syscalls.map(|w| w.counts.threads),
            syscalls_per_read: m
                .syscalls
                .filter(|w| w.reads > 0)
                .map(|w| w.counts.syscalls as f64 / w.reads as f64),
            enters_per_read: per_read(m.enters),
            driver_polls_per_read: per_read(m.driver_polls),
            verified: m.verified,
            notes: m.notes,
            cdf,
        }
    }
}

/// Fills `ratio`/`baseline`: per (regime, depth) the baseline is mmap when it
/// ran, otherwise the first engine (in run order) that ran.
pub fn fill_ratios(cells: &mut [Cell], engine_order: &[String]) {
    let keys: Vec<(Regime, usize)> = cells.iter().map(|c| (c.regime, c.depth)).collect();
    for (regime, depth) in keys {
        let find = |name: &str, cells: &[Cell]| {
            cells
                .iter()
                .find(|c| c.regime == regime && c.depth == depth && c.engine == name && c.ok())
                .map(|c| (c.engine.clone(), c.reads_per_sec))
        };
        let base = find("mmap", cells).or_else(|| engine_order.iter().find_map(|e| find(e, cells)));
        if let Some((name, rate)) = base {
            for c in cells
                .iter_mut()
                .filter(|c| c.regime == regime && c.depth == depth && c.ok())
            {
                c.baseline = Some(name.clone());
                c.ratio = (rate > 0.0).then(|| c.reads_per_sec / rate);
            }
        }
    }
}

/// Run-level facts.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub started_utc: String,
    pub command: String,
    pub git_commit: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub mem_total_gib: f64,
    pub dataset_dir: String,
    pub files: u32,
    pub file_size: u64,
    pub dataset_gib: f64,
    pub dataset_generated: bool,
    pub dataset_seconds: f64,
    pub hot_set_files: u32,
    pub hot_set_gib: f64,
    pub duration_s: f64,
    pub repeat: u32,
    pub workers: usize,
    pub verify: crate::verify::VerifyMode,
    pub engines: Vec<String>,
    pub depths: Vec<usize>,
    pub regimes: Vec<Regime>,
    pub total_seconds: f64,
    /// /proc/loadavg (1, 5, 15 min) at the start and end of the run: other
    /// load on the machine shows up here.
    pub loadavg_start: String,
    pub loadavg_end: String,
    /// How syscalls were counted, or why they were not ("not counted: ...").
    pub syscall_probe: String,
    /// The machine's thread wake-up latency, measured before the cells
    /// (`wake.rs`): the cost of each thread hand-off in the latencies.
    pub thread_wake: Option<crate::wake::WakeLatency>,
    /// What touching fresh memory costs, measured when a cache engine runs
    /// (`first_touch.rs`): part of what a cache filling its frames pays.
    pub first_touch: Option<crate::first_touch::FirstTouch>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub info: RunInfo,
    pub cells: Vec<Cell>,
}

pub fn rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

pub fn micros(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else if us >= 100.0 {
        format!("{us:.0}µs")
    } else {
        format!("{us:.1}µs")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Markdown,
}

/// Renders rows as a Markdown table with aligned columns. The first row is the header.
pub fn table(rows: &[Vec<String>], style: Style) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width = |i: usize| {
        rows.iter()
            .map(|r| r.get(i).map_or(0, |s| s.chars().count()))
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..cols).map(width).collect();
    let mut out = String::new();
    for (n, r) in rows.iter().enumerate() {
        let cells: Vec<String> = (0..cols)
            .map(|i| {
                let s = r.get(i).map_or("", |s| s.as_str());
                let pad = widths[i].saturating_sub(s.chars().count());
                if i == 0 {
                    format!("{s}{}", " ".repeat(pad))
                } else {
                    format!("{}{s}", " ".repeat(pad))
                }
            })
            .collect();
        match style {
            Style::Markdown => {
                let _ = writeln!(out, "| {} |", cells.join(" | "));
                if n == 0 {
                    let seps: Vec<String> = widths
                        .iter()
                        .enumerate()
                        .map(|(i, w)| {
                            let w = (*w).max(3);
                            if i == 0 {
                                "-".repeat(w)
                            } else {
                                format!("{}:", "-".repeat(w - 1))
                            }
                        })
                        .collect();
                    let _ = writeln!(out, "| {} |", seps.join(" | "));
                }
            }
        }
    }
    out
}

fn status_text(c: &Cell) -> String {
    match c.status.as_str() {
        "ok" => String::new(),
        s => s.to_string(),
    }
}

/// Side-by-side: one row per (regime, depth), one column per engine with
/// reads/s and the ratio to the baseline.
pub fn side_by_side(r: &Report, style: Style) -> String {
    let engines = &r.info.engines;
    let mut rows = vec![{
        let mut h = vec!["regime".to_string(), "depth".to_string()];
        h.extend(engines.iter().map(|e| format!("{e} reads/s (x base)")));
        h.push("base".into());
        h
    }];
    for &regime in &r.info.regimes {
        for &depth in &r.info.depths {
            let mut row = vec![regime.name().to_string(), depth.to_string()];
            let mut base = String::from("-");
            for e in engines {
                let c = r
                    .cells
                    .iter()
                    .find(|c| c.regime == regime && c.depth == depth && &c.engine == e);
                row.push(match c {
                    Some(c) if c.ok() => {
                        if let Some(b) = &c.baseline {
                            base.clone_from(b);
                        }
                        match c.ratio {
                            Some(x) => format!("{} ({x:.2}x)", rate(c.reads_per_sec)),
                            None => rate(c.reads_per_sec),
                        }
                    }
                    Some(c) => status_text(c),
                    None => "-".into(),
                });
            }
            row.push(base);
            rows.push(row);
        }
    }
    table(&rows, style)
}

/// "p99 / max" of the timer probe, or "n/a".
pub fn timer_text(t: Option<&TimerLateness>) -> String {
    t.map_or("n/a".into(), |t| {
        format!("{:.2} / {:.2}", t.p99_ms, t.max_ms)
    })
}

/// A count per read (syscalls, enters, polls), or `-` (not counted).
pub fn per_read_text(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| {
        if v >= 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.3}")
        }
    })
}

/// Every cell with all of its figures.
pub fn details(r: &Report, style: Style) -> String {
    let mut rows = vec![[
        "engine",
        "regime",
        "depth",
        "reads/s",
        "MB/s",
        "x base",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "p99.99",
        "max",
        "CPU/read",
        "reads/enter",
        "cached before→after",
        "runs",
        "timer p99/max (ms)",
        "syscalls/read",
        "enters/read",
        "polls/read",
    ]
    .iter()
    .map(ToString::to_string)
    .collect::<Vec<_>>()];
    for c in &r.cells {
        let mut row = vec![
            c.engine.clone(),
            c.regime.name().into(),
            c.depth.to_string(),
        ];
        if !c.ok() {
            row.push(c.status.clone());
            rows.push(row);
            continue;
        }
        row.push(rate(c.reads_per_sec));
        row.push(format!("{:.0}", c.mb_per_sec));
        row.push(c.ratio.map_or("-".into(), |x| format!("{x:.2}")));
        match &c.latency_us {
            Some(l) => {
                for v in [l.p50, l.p90, l.p99, l.p999, l.p9999, l.max] {
                    row.push(micros(v));
                }
            }
            None => row.extend(std::iter::repeat_n("-".to_string(), 6)),
        }
        row.push(
            c.cpu_us_per_read
                .map_or("-".into(), |v| format!("{v:.2}µs")),
        );
        row.push(match (c.reads_per_enter, c.inline_share) {
            (Some(v), Some(i)) if i >= 0.005 => format!("{v:.1} ({:.0}% inline)", i * 100.0),
            (Some(v), _) => format!("{v:.1}"),
            (None, Some(i)) => format!("no enter ({:.0}% inline)", i * 100.0),
            (None, None) => "-".into(),
        });
        let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.0}%", v * 100.0));
        row.push(match c.cached_after {
            Some(_) => format!("{}→{}", pct(c.cached_before), pct(c.cached_after)),
            None => pct(c.cached_before),
        });
        row.push(if c.runs_reads_per_sec.len() > 1 {
            let lo = c
                .runs_reads_per_sec
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min);
            let hi = c.runs_reads_per_sec.iter().copied().fold(0.0, f64::max);
            format!("{}: {}–{}", c.runs_reads_per_sec.len(), rate(lo), rate(hi))
        } else {
            "1".into()
        });
        row.push(timer_text(c.timer_lateness.as_ref()));
        row.push(per_read_text(c.syscalls_per_read));
        row.push(per_read_text(c.enters_per_read));
        row.push(per_read_text(c.driver_polls_per_read));
        rows.push(row);
    }
    table(&rows, style)
}

/// The width the terminal output keeps to: `COLUMNS` when it is set (and at
/// least 40), otherwise 100.
pub fn term_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&w| w >= 40)
        .unwrap_or(100)
}

/// Prints `line` wrapped to [`term_width`].
pub fn say(line: &str) {
    for l in wrap(line, term_width()) {
        println!("{l}");
    }
}

/// The terminal's per-cell table: the essential columns only (report.md and
/// report.json have every figure), laid out to fit in `width` columns.
pub fn terminal_cells(r: &Report, width: usize) -> String {
    use comfy_table::{CellAlignment, ContentArrangement, Table};
    let mut t = Table::new();
    // no borders or column lines; a line of `-` under the header
    t.load_preset("     --            ")
        .set_content_arrangement(ContentArrangement::Dynamic)
        // three `µ` a row at most: keep the rows within `width` bytes too
        .set_width(u16::try_from(width.saturating_sub(3)).unwrap_or(u16::MAX))
        .set_header([
            "engine", "regime", "depth", "reads/s", "x base", "p50", "p99.9", "CPU/read",
        ]);
    for c in &r.cells {
        let mut row = vec![
            c.engine.clone(),
            c.regime.name().to_string(),
            c.depth.to_string(),
        ];
        if c.ok() {
            row.push(rate(c.reads_per_sec));
            row.push(c.ratio.map_or("-".into(), |x| format!("{x:.2}")));
            match &c.latency_us {
                Some(l) => row.extend([micros(l.p50), micros(l.p999)]),
                None => row.extend(["-".to_string(), "-".to_string()]),
            }
            row.push(
                c.cpu_us_per_read
                    .map_or("-".into(), |v| format!("{v:.2}µs")),
            );
        } else {
            row.push(c.status.clone());
            row.extend(std::iter::repeat_n("-".to_string(), 4));
        }
        t.add_row(row);
    }
    for i in 2..8 {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = String::new();
    for l in t.lines() {
        let _ = writeln!(out, "{}", l.trim_end());
    }
    out
}

/// Cells that did not run, with why.
pub fn skipped(r: &Report) -> Vec<String> {
    r.cells
        .iter()
        .filter(|c| !c.ok())
        .map(|c| {
            format!(
                "{} {} depth {}: {}: {}",
                c.engine,
                c.regime.name(),
                c.depth,
                c.status,
                c.reason.as_deref().unwrap_or("")
            )
        })
        .collect()
}

pub fn markdown(r: &Report, charts: &[String]) -> String {
    let i = &r.info;
    let mut s = String::new();
    let _ = writeln!(s, "# uring-bench results\n");
    let _ = writeln!(s, "- started: {} UTC", i.started_utc);
    let _ = writeln!(s, "- command: `{}`", i.command);
    let _ = writeln!(s, "- commit: {}", i.git_commit);
    let _ = writeln!(
        s,
        "- machine: {} ({} CPUs), {:.1} GiB RAM, Linux {}",
        i.cpu_model, i.cpus, i.mem_total_gib, i.kernel
    );
    if let Some(w) = &i.thread_wake {
        let _ = writeln!(s, "- {}", w.summary());
    }
    if let Some(t) = &i.first_touch {
        let _ = writeln!(s, "- {}", t.summary());
    }
    let _ = writeln!(
        s,
        "- dataset: {} files x {:.2} GiB = {:.2} GiB in `{}` ({})",
        i.files,
        i.file_size as f64 / (1u64 << 30) as f64,
        i.dataset_gib,
        i.dataset_dir,
        if i.dataset_generated {
            "generated"
        } else {
            "reused"
        }
    );
    let _ = writeln!(
        s,
        "- hot working set: {} files ({:.2} GiB); cold: all files evicted before each cell; direct: O_DIRECT",
        i.hot_set_files, i.hot_set_gib
    );
    let _ = writeln!(
        s,
        "- load average at start / end: {} / {}",
        i.loadavg_start, i.loadavg_end
    );
    let _ = writeln!(
        s,
        "- {} s per cell, {} repetition(s) per cell (median reported), {} tokio workers, \
         every block verified ({}) except fio's",
        i.duration_s,
        i.repeat,
        i.workers,
        match i.verify {
            crate::verify::VerifyMode::Checksum => "header + checksum",
            crate::verify::VerifyMode::Full => "full compare",
        }
    );
    let _ = writeln!(s, "\n## Throughput (ratio to the baseline engine)\n");
    s.push_str(&side_by_side(r, Style::Markdown));
    let reread = r
        .cells
        .iter()
        .filter_map(|c| c.reread_share_est)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    if let Some(x) = reread {
        let _ = writeln!(
            s,
            "\nCold/direct cells re-read at most an expected {:.1}% of their blocks \
             (uniform random reads over the whole dataset).",
            x * 100.0
        );
    }
    let _ = writeln!(s, "\n## Verdict\n");
    for v in verdicts(r) {
        let _ = writeln!(s, "- {v}");
    }
    let _ = writeln!(s, "\n## All figures\n");
    let _ = writeln!(
        s,
        "Latency per read in the engine's own terms (task/thread view; fio: clat). \
         CPU/read = (user+sys CPU of the process) / reads. `cached` = page-cache residency \
         of the files read, measured just before the cell. \
         `timer p99/max` = lateness (ms) of a task looping `tokio::time::sleep(1 ms)` on the \
         engine's own runtime during the measured window (tokio's 1 ms timer wheel rounds a \
         deadline up, so even an idle runtime shows ~1.1 ms; n/a: the engine runs no tokio \
         runtime). `syscalls/read` = system calls of the whole process / reads, both counted in \
         a short window after the measured one in which the same work goes on ({}). \
         `enters/read`, `polls/read` = `io_uring_enter` \
         calls and ring driver task polls / reads in the measured window (uring, \
         `ctx.stats()`).\n",
        r.info.syscall_probe
    );
    s.push_str(&details(r, Style::Markdown));
    let sk = skipped(r);
    if !sk.is_empty() {
        let _ = writeln!(s, "\n## Not run\n");
        for l in sk {
            let _ = writeln!(s, "- {l}");
        }
    }
    let notes: Vec<String> = r
        .cells
        .iter()
        .filter(|c| c.ok() && !c.notes.is_empty())
        .map(|c| {
            format!(
                "- {} {} {}: {}",
                c.engine,
                c.regime.name(),
                c.depth,
                c.notes.join("; ")
            )
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\n## Engine notes\n");
        for n in notes {
            let _ = writeln!(s, "{n}");
        }
    }
    if !charts.is_empty() {
        let _ = writeln!(s, "\n## Charts\n");
        for c in charts {
            let _ = writeln!(s, "![{c}]({c})");
        }
    }
    s
}

/// The engine whose figures the verdict states as ratios: this crate's.
const OURS: &str = "uring";

/// One line per regime, for the end of the run: the fastest engine (its best
/// depth and reads/s) and, at every depth, the `uring` engine's reads/s as a
/// ratio to each other engine that ran, e.g.
/// `hot: mmap fastest (1.44M reads/s at depth 32); uring at depth 8/32: 0.50/0.52x mmap, 0.74/0.80x pread`.
pub fn verdicts(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for &regime in &r.info.regimes {
        let ok: Vec<&Cell> = r
            .cells
            .iter()
            .filter(|c| c.regime == regime && c.ok() && c.reads > 0)
            .collect();
        let Some(best) = ok
            .iter()
            .max_by(|a, b| a.reads_per_sec.total_cmp(&b.reads_per_sec))
        else {
            out.push(format!("{}: no engine ran", regime.name()));
            continue;
        };
        let mut line = format!(
            "{}: {} fastest ({} reads/s at depth {})",
            regime.name(),
            best.engine,
            rate(best.reads_per_sec),
            best.depth
        );
        let depths: Vec<usize> = r
            .info
            .depths
            .iter()
            .copied()
            .filter(|&d| ok.iter().any(|c| c.engine == OURS && c.depth == d))
            .collect();
        let at = |e: &str, d: usize| {
            ok.iter()
                .find(|c| c.engine == e && c.depth == d)
                .map(|c| c.reads_per_sec)
        };
        let others: Vec<String> = r
            .info
            .engines
            .iter()
            .filter(|e| e.as_str() != OURS)
            .filter_map(|e| {
                let xs: Vec<String> = depths
                    .iter()
                    .map(|&d| match (at(OURS, d), at(e, d)) {
                        (Some(u), Some(o)) if o > 0.0 => format!("{:.2}", u / o),
                        _ => "-".into(),
                    })
                    .collect();
                xs.iter()
                    .any(|x| x != "-")
                    .then(|| format!("{}x {e}", xs.join("/")))
            })
            .collect();
        if !others.is_empty() {
            let ds: Vec<String> = depths.iter().map(ToString::to_string).collect();
            let _ = write!(
                line,
                "; {OURS} at depth {}: {}",
                ds.join("/"),
                others.join(", ")
            );
        }
        out.push(line);
    }
    out
}

/// Breaks `line` at spaces into lines of at most `width` bytes (a longer
/// word stays whole); continuation lines get the line's own indentation and
/// four spaces more. Bytes, not characters: a `µ` counts twice, so the lines
/// also fit tools that count bytes (`awk 'length > 100'` under mawk).
pub fn wrap(line: &str, width: usize) -> Vec<String> {
    let body = line.trim_start_matches(' ');
    let indent = &line[..line.len() - body.len()];
    let more = format!("{indent}    ");
    let mut out: Vec<String> = Vec::new();
    let mut cur = indent.to_string();
    let mut empty = true;
    for word in body.split(' ').filter(|w| !w.is_empty()) {
        if !empty && cur.len() + 1 + word.len() > width {
            out.push(std::mem::replace(&mut cur, more.clone()));
        } else if !empty {
            cur.push(' ');
        }
        cur.push_str(word);
        empty = false;
    }
    if !empty {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn tables_align() {
        let rows = vec![
            vec!["a".to_string(), "bb".to_string()],
            vec!["ccc".to_string(), "d".to_string()],
        ];
        let m = table(&rows, Style::Markdown);
        assert!(m.starts_with("| a   | bb |"), "{m}");
    }

    #[test]
    fn wrap_keeps_lines_short() {
        let l = "hot: mmap fastest (1.44M reads/s at depth 32); uring at depth 8/32/512: \
                 0.50/0.52/0.48x mmap, 0.74/0.80/0.90x pread, 3.10/2.90/2.20x tokio-fs";
        let w = wrap(l, 60);
        assert!(w.len() > 1, "{w:?}");
        assert!(w.iter().all(|l| l.len() <= 60), "{w:?}");
        assert_eq!(wrap("  a b c", 5), ["  a b", "      c"]);
        assert_eq!(
            w.join(" ").split_whitespace().collect::<Vec<_>>().join(" "),
            l
        );
    }
}
