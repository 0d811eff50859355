//! End-to-end tests of the uring-bench binary on tiny datasets (fast; every
//! cell runs 0.2 s).
//!
//! Skipped tests: a test that needs something the machine may not have
//! (fio, O_DIRECT on the build filesystem, root and a memory cgroup) checks
//! at run time and, without it, prints `SKIPPED: <reason>` to stderr and
//! returns — cargo still reports it `ok`, so look for `SKIPPED` (run with
//! `--nocapture` to see the lines). Where CI provides the requirement
//! (`.ci/run` installs fio) the test fails instead when the `CI` environment
//! variable is set, so CI never skips it silently.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_uring-bench");

/// Says on stderr that the calling test is skipped and why. With
/// `ci_provides` (CI installs what is missing) it panics when `CI` is set.
fn skip(reason: &str, ci_provides: bool) {
    if ci_provides && std::env::var_os("CI").is_some() {
        panic!("{reason}, but CI is set and .ci/run provides it: not skipping silently");
    }
    eprintln!("SKIPPED: {reason}");
}

/// The output's lines with the terminal wrapping undone: a line indented
/// exactly four spaces more than the one before continues it.
fn unwrapped(out: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start_matches(' ').len();
    let mut v: Vec<String> = Vec::new();
    for l in out.lines() {
        match v.last_mut() {
            Some(prev) if !prev.trim().is_empty() && indent(l) == indent(prev) + 4 => {
                prev.push(' ');
                prev.push_str(l.trim_start());
            }
            _ => v.push(l.to_string()),
        }
    }
    v
}

/// A temp dir on the build filesystem (not tmpfs, so O_DIRECT works).
fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn bench(dir: &Path, extra: &[&str]) -> Output {
    let data: PathBuf = dir.join("data");
    let out: PathBuf = dir.join("results");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--quiet",
        "--files",
        "2",
        "--file-size",
        "256K",
        "--data-dir",
    ])
    .arg(&data)
    .arg("--output-dir")
    .arg(&out)
    .args(extra);
    let o = cmd.output().expect("run uring-bench");
    eprintln!("--- stdout\n{}", String::from_utf8_lossy(&o.stdout));
    eprintln!("--- stderr\n{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether files in `dir` can be opened with O_DIRECT (not on tmpfs, say).
fn direct_io_works(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join("odirect-probe");
    std::fs::write(&p, vec![0u8; 4096]).unwrap();
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(o_direct())
        .open(&p)
        .is_ok();
    let _ = std::fs::remove_file(&p);
    ok
}

/// O_DIRECT on Linux: 0o200000 on arm/aarch64/powerpc, 0o40000 elsewhere.
fn o_direct() -> i32 {
    if cfg!(any(
        target_arch = "arm",
        target_arch = "aarch64",
        target_arch = "powerpc64"
    )) {
        0o200000
    } else {
        0o40000
    }
}

/// Runs one engine in every regime at depth 4 and checks the reports.
fn engine_end_to_end(engine: &str) {
    let dir = tmp();
    let regimes = if direct_io_works(dir.path()) {
        "hot,cold,direct"
    } else {
        skip(
            &format!(
                "the direct regime of {engine}: no O_DIRECT under {}",
                dir.path().display()
            ),
            false,
        );
        "hot,cold"
    };
    let o = bench(
        dir.path(),
        &["-e", engine, "-d", "4", "-r", regimes, "-t", "0.2"],
    );
    assert!(o.status.success(), "{engine} failed: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(engine), "{out}");
    assert!(!out.contains("FAILED"), "{out}");
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1);
    let json = std::fs::read_to_string(runs[0].join("report.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), regimes.split(',').count());
    for c in cells {
        let status = c["status"].as_str().unwrap();
        if engine.starts_with("mmap") && c["regime"] == "direct" {
            assert_eq!(status, "n/a");
            continue;
        }
        assert_eq!(status, "ok", "{c}");
        assert!(c["reads"].as_u64().unwrap() > 0, "{c}");
        assert!(c["latency_us"]["p99"].as_f64().unwrap() > 0.0, "{c}");
    }
    // the machine's wake-up latency, measured before the cells
    assert!(out.contains("machine: thread wake-up"), "{out}");
    let same = &v["info"]["thread_wake"]["same_cpu"];
    assert!(same["p50_us"].as_f64().unwrap() > 0.0, "{same}");
    assert!(std::fs::read_to_string(runs[0].join("report.md"))
        .unwrap()
        .contains("thread wake-up after an idle gap"),);
    assert!(runs[0].join("throughput-hot.svg").exists());
    assert!(runs[0].join("latency-cold-depth4.svg").exists());
}

#[test]
fn engine_uring() {
    engine_end_to_end("uring");
}

#[test]
fn engine_mmap() {
    engine_end_to_end("mmap");
}

#[test]
fn engine_mmap_tasks() {
    engine_end_to_end("mmap-tasks");
}

#[test]
fn engine_pread() {
    engine_end_to_end("pread");
}

#[test]
fn engine_tokio_fs() {
    engine_end_to_end("tokio-fs");
}

#[test]
fn engine_tokio_uring() {
    engine_end_to_end("tokio-uring");
}

#[test]
fn engine_uring_raw() {
    engine_end_to_end("uring-raw");
}

#[test]
fn engine_uring_cache() {
    engine_end_to_end("uring-cache");
}

#[test]
fn engine_uring_cache_ref() {
    engine_end_to_end("uring-cache-ref");
}

/// The cache engines fill the cache before hot cells (every read of the
/// window a hit), start cold cells empty, and print each cell's counters.
#[test]
fn cache_engines_report_hit_ratios() {
    let dir = tmp();
    let o = bench(
        dir.path(),
        &[
            "-e",
            "uring-cache,uring-cache-ref",
            "-d",
            "4",
            "-r",
            "hot,cold",
            "-t",
            "0.2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let logical = unwrapped(&out);
    let lines: Vec<&str> = logical
        .iter()
        .map(String::as_str)
        .filter(|l| l.contains("cache hit ratio"))
        .collect();
    assert_eq!(lines.len(), 4, "{out}");
    for engine in ["uring-cache ", "uring-cache-ref "] {
        let hot = lines
            .iter()
            .find(|l| l.trim_start().starts_with(engine) && l.contains(" hot "))
            .unwrap_or_else(|| panic!("no hot line for {engine}: {out}"));
        assert!(hot.contains("cache hit ratio 100.00% ("), "{hot}");
        assert!(hot.contains(" 0 misses, "), "{hot}");
        assert!(hot.contains("filled with the working set"), "{hot}");
        let cold = lines
            .iter()
            .find(|l| l.trim_start().starts_with(engine) && l.contains(" cold "))
            .unwrap_or_else(|| panic!("no cold line for {engine}: {out}"));
        assert!(cold.contains("started empty"), "{cold}");
    }
}

#[test]
fn engine_fio() {
    if Command::new("fio").arg("--version").output().is_err() {
        skip("engine_fio needs fio (apt-get install fio)", true);
        let dir = tmp();
        let o = bench(
            dir.path(),
            &["-e", "fio", "-d", "4", "-r", "hot", "-t", "0.2"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("not run"), "{}", stdout(&o));
        return;
    }
    engine_end_to_end("fio");
}

#[test]
fn corrupted_block_stops_the_run_naming_file_and_block() {
    let dir = tmp();
    let o = bench(dir.path(), &["--generate-only"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // corrupt file 1, block 17 (the reuse check only spot-checks first/last blocks)
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("data/data-0001.bin"))
        .unwrap();
    f.write_all_at(&[0xAB; 16], 17 * 4096 + 2000).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // the write went through the page cache, so every regime sees it
    let o = bench(
        dir.path(),
        &[
            "-e",
            "pread",
            "-d",
            "4",
            "-r",
            "hot",
            "-t",
            "2",
            "--no-generate",
        ],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("verification failed in engine pread"), "{err}");
    assert!(err.contains("file 1 block 17"), "{err}");
}

#[test]
fn missing_dataset_is_a_clear_error() {
    let dir = tmp();
    let o = bench(dir.path(), &["--no-generate", "-e", "pread"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("no usable dataset"), "{err}");
    assert!(err.contains("--no-generate"), "{err}");
}

#[test]
fn bad_flags_are_clear_errors() {
    let dir = tmp();
    let o = bench(dir.path(), &["-e", "nope"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("invalid value 'nope'"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("tokio-uring"), "possible values listed");

    let o = bench(dir.path(), &["-d", "0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("invalid depth"), "{}", stderr(&o));

    let o = Command::new(BIN)
        .args(["--quiet", "--file-size", "3000", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--output-dir")
        .arg(dir.path().join("results"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("multiple of 4096"), "{}", stderr(&o));

    // tokio asserts a positive interval: a 0 must not reach it.
    let o = bench(dir.path(), &["--tokio-global-queue-interval", "0"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("tokio-global-queue-interval") && !stderr(&o).contains("panicked"),
        "{}",
        stderr(&o)
    );

    let o = bench(dir.path(), &["--uring-shallow-batch", "0"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--uring-shallow-batch") && stderr(&o).contains("not in 1..=32768"),
        "{}",
        stderr(&o)
    );

    let o = bench(dir.path(), &["-t", "soon"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("invalid duration"), "{}", stderr(&o));
    assert!(!dir.path().join("results").exists());
}

#[test]
fn cpu_per_read_mode() {
    let dir = tmp();
    let o = Command::new(BIN)
        .args([
            "cpu-per-read",
            "--secs",
            "0.2",
            "--file-mib",
            "1",
            "--depths",
            "4,8",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .expect("run uring-bench cpu-per-read");
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for row in [
        "raw-ring (1 thread)",
        "crate ring/1w",
        "crate ring/2w",
        "crate nowait/2w",
    ] {
        for depth in [4, 8] {
            let line = out
                .lines()
                .find(|l| {
                    l.starts_with(row) && l.split_whitespace().any(|w| w == depth.to_string())
                })
                .unwrap_or_else(|| panic!("no {row} row at depth {depth}: {out}"));
            assert!(line.contains("µs"), "{line}");
        }
    }
    // the kernel floor of the page-cache path: both syscalls timed
    let floor = out
        .lines()
        .find(|l| l.starts_with("syscall floor"))
        .unwrap_or_else(|| panic!("no syscall floor line: {out}"));
    assert!(
        floor.contains("pread ")
            && floor.contains("preadv2(RWF_NOWAIT) ")
            && floor.contains("ns/read"),
        "{floor}"
    );
    // the dataset is reused by the next run
    assert!(dir.path().join("manifest.json").exists());

    let o = Command::new(BIN)
        .args(["cpu-per-read", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
    for flag in ["--secs", "--file-mib", "--depths", "--only", "raw-ring"] {
        assert!(stdout(&o).contains(flag), "{flag}: {}", stdout(&o));
    }
    let o = Command::new(BIN).arg("--help").output().unwrap();
    assert!(stdout(&o).contains("cpu-per-read"), "{}", stdout(&o));
}

/// `uring-bench open-loop` on a tiny dataset: every engine of the hot
/// regime, two rounds (each started by another engine), the medians, and
/// the crate-free `tokio-pread` floor skipped where it would block the
/// workers on the device.
#[test]
fn open_loop_rounds_and_medians() {
    let dir = tmp();
    let o = Command::new(BIN)
        .args([
            "open-loop",
            "-r",
            "hot,cold",
            "-e",
            "uring,tokio-pread,mmap,pread,tokio-fs,uring-cache",
            "--rate",
            "2000",
            "-t",
            "0.2",
            "--repeat",
            "2",
            "--threads",
            "4",
            "--files",
            "2",
            "--file-size",
            "256K",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .arg("--output-dir")
        .arg(dir.path().join("results"))
        .output()
        .expect("run uring-bench open-loop");
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("hot medians over 2 rounds"), "{out}");
    assert!(out.contains("cold medians over 2 rounds"), "{out}");
    assert!(out.contains("tokio-pread cold    skipped"), "{out}");
    assert!(out.contains("p99 - mmap's:"), "{out}");
    let run = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(run.join("open-loop.json")).unwrap())
            .unwrap();
    // Hot: 6 engines × 2 rounds + 6 medians; cold: 5 × 2 + 5.
    assert_eq!(rows.len(), 18 + 15, "{rows:?}");
    // uring-cache: every hot read a hit (the cache was filled first).
    assert_eq!(
        out.matches("cache hit ratio 100.00% over the run").count(),
        2,
        "{out}"
    );
    assert_eq!(out.matches("started empty").count(), 2, "{out}");
    for r in &rows {
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["lookups"].as_u64().unwrap() > 0, "{r}");
    }
    let first = |round: u64| {
        rows.iter()
            .find(|r| r["regime"] == "hot" && r["round"] == round)
            .map(|r| r["engine"].as_str().unwrap().to_owned())
    };
    assert_eq!(first(0).as_deref(), Some("uring"));
    assert_eq!(first(1).as_deref(), Some("tokio-pread"));
}

/// `uring-bench sched` on a tiny dataset, buffered and (where the build
/// filesystem allows it) O_DIRECT: every row, two runs and their medians,
/// every lookup done and verified, the scans looping over their file.
#[test]
fn sched_rows_ratios_and_medians() {
    let dir = tmp();
    let mut modes: Vec<&[&str]> = vec![&["--buffered"]];
    if direct_io_works(dir.path()) {
        modes.push(&[]);
    } else {
        skip(
            "sched's O_DIRECT run: no O_DIRECT on the build filesystem",
            false,
        );
    }
    for extra in modes {
        let o = Command::new(BIN)
            .args([
                "sched",
                "--rate",
                "2000",
                "-t",
                "0.2",
                "--repeat",
                "2",
                "--threads",
                "4",
                "--background-share",
                "1",
                "--file-size",
                "256K",
                "--data-dir",
            ])
            .arg(dir.path().join("data"))
            .arg("--output-dir")
            .arg(dir.path().join("results"))
            .args(extra)
            .output()
            .expect("run uring-bench sched");
        let out = stdout(&o);
        assert!(o.status.success(), "{out}\n{}", stderr(&o));
        for row in [
            "lookups alone",
            "scan alone",
            "lookups + scan, classes",
            "lookups + scan, no classes",
            "pread lookups alone",
            "BufReader scan alone",
            "pread lookups + BufReader scan",
        ] {
            assert!(out.contains(&format!(" {row} ")), "{row}: {out}");
        }
        assert_eq!(
            out.matches("verdict: with classes: lookup p99 ").count(),
            2,
            "{out}"
        );
        assert!(out.contains("medians over 2 runs"), "{out}");
        assert!(
            out.contains("median ratios, with classes: lookup p99"),
            "{out}"
        );
        assert!(
            out.contains("ctx.stats() of 'lookups + scan, classes': latency ops"),
            "{out}"
        );
        assert!(out.contains("ioprio_honoured: lookup file "), "{out}");
    }
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for run in runs {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("sched.json")).unwrap())
                .unwrap();
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3 * 7, "{v}");
        for r in rows {
            if let Some(l) = r["lookups"].as_object() {
                assert_eq!(l["errors"], 0, "{r}");
                assert_eq!(l["done"], l["offered"], "{r}");
            }
            if let Some(s) = r["scan"].as_object() {
                assert!(s["passes"].as_u64().unwrap() >= 1, "{r}");
            }
        }
        let classes = rows
            .iter()
            .find(|r| r["row"] == "lookups + scan, classes")
            .unwrap();
        assert!(classes["stats"]["background"]["ops"].as_u64().unwrap() > 0);
        let no_classes = rows
            .iter()
            .find(|r| r["row"] == "lookups + scan, no classes")
            .unwrap();
        assert_eq!(no_classes["stats"]["background"]["ops"], 0);
    }
}

/// `uring-bench lines --size 3M --repeat 1 --quiet` with its data and
/// results under `dir`, plus `extra` arguments.
fn run_lines(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["lines", "--size", "3M", "--repeat", "1", "--quiet"])
        .args(extra)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--output-dir")
        .arg(dir.join("results"))
        .output()
        .expect("run uring-bench lines")
}

/// Held by the tests whose runs reserve the machine's huge pages for fio
/// (`lines`, `write --parts seqwrite`): run at once, one run's restoring
/// `nr_hugepages` took the pages the other's fio was about to map.
fn huge_pages() -> std::sync::MutexGuard<'static, ()> {
    static HUGE_PAGES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HUGE_PAGES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `uring-bench lines` on a tiny file: every method counts the same lines
/// (a mismatch exits non-zero), and the JSON, Markdown and SVG are written.
#[test]
fn lines_mode_end_to_end() {
    let _huge = huge_pages();
    let dir = tmp();
    let o = run_lines(dir.path(), &[]);
    eprintln!("--- stdout\n{}", stdout(&o));
    eprintln!("--- stderr\n{}", stderr(&o));
    assert!(o.status.success(), "lines mode failed");
    let out = stdout(&o);
    for m in [
        "BufReader lines().count()",
        "mmap + memchr",
        "io_uring, 1 in flight",
        "scan O_DIRECT depth 16",
        "wc -l",
        "#### cold",
        "#### hot",
    ] {
        assert!(out.contains(m), "no {m:?} in the table");
    }
    assert!(!stderr(&o).contains("MISMATCH"));
    let run = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .next()
        .expect("a run directory")
        .unwrap()
        .path();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("lines.json")).unwrap()).unwrap();
    let lines = json["lines"].as_u64().unwrap();
    assert!(lines > 30_000, "{lines} lines in 3 MiB");
    assert!(run.join("lines.md").exists());
    assert!(run.join("lines-cold.svg").exists() && run.join("lines-hot.svg").exists());
    // The second run reuses the file (manifest); `--only` takes a list.
    let o = run_lines(dir.path(), &["--only", "wc,mmap + memchr"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(!out.contains("making"), "the file was made again");
    assert!(
        out.contains("| wc -l |") && out.contains("| mmap + memchr |"),
        "{out}"
    );
    assert!(!out.contains("| mmap naive |"), "--only ran more: {out}");
}

/// `uring-bench write <args> --dir <dir>`, its output echoed for a failing
/// test's log.
fn run_write(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new(BIN)
        .arg("write")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run uring-bench write");
    eprintln!("--- stdout\n{}\n--- stderr\n{}", stdout(&o), stderr(&o));
    o
}

/// `uring-bench write --parts seqwrite` on a small file: this crate's runs
/// (huge-page and ordinary buffers) are read back block by block, and the
/// table names every engine.
#[test]
fn seqwrite_end_to_end() {
    let _huge = huge_pages();
    let dir = tmp();
    if !direct_io_works(dir.path()) {
        skip(
            &format!("seqwrite needs O_DIRECT under {}", dir.path().display()),
            false,
        );
        return;
    }
    let o = run_write(
        dir.path(),
        &["--parts", "seqwrite", "--seq-mib", "8", "--repeat", "1"],
    );
    let out = stdout(&o);
    assert!(o.status.success(), "seqwrite failed");
    assert!(out.contains("uring, new_huge buffers") && out.contains("uring, 4 KiB-page buffers"));
    // 8 MiB = 2048 blocks, two runs of this crate.
    assert!(
        out.contains("(4096 blocks of this crate's runs read back and verified)"),
        "{out}"
    );
    let o = run_write(dir.path(), &["--parts", "seqwrite", "--seq-mib", "3"]);
    assert!(
        !o.status.success() && stderr(&o).contains("multiple of 2"),
        "{}",
        stderr(&o)
    );
}

/// `uring-bench write --parts wal`, short: every engine commits and has its
/// log verified, and the flush floor and the ceiling it sets are reported.
#[test]
fn wal_end_to_end() {
    let dir = tmp();
    let o = run_write(
        dir.path(),
        &[
            "--parts",
            "wal",
            "--repeat",
            "1",
            "-t",
            "0.2",
            "--wal-writers",
            "8",
        ],
    );
    let out = stdout(&o);
    assert!(o.status.success(), "wal failed");
    // Both kinds of log, each with its own table, floor and ceiling.
    for kind in ["== wal, preallocated log", "== wal, appended log"] {
        assert_eq!(out.matches(kind).count(), 1, "one {kind} table");
    }
    for engine in [
        "uring",
        "uring-serial",
        "tokio-fs",
        "threads",
        "no-backend",
        "flush floor",
    ] {
        assert_eq!(
            out.lines()
                .filter(|l| l.trim_start().starts_with(&format!("{engine} ")))
                .count(),
            2,
            "a row for {engine} in each table"
        );
    }
    let ceilings: Vec<f64> = out
        .lines()
        .filter_map(|l| l.strip_prefix("ceiling: 8 closed-loop writers / "))
        .map(|c| {
            c.rsplit_once(" = ")
                .and_then(|(_, r)| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .expect("commits/s of the ceiling")
        })
        .collect();
    assert_eq!(ceilings.len(), 2, "a ceiling per table");
    assert!(ceilings.iter().all(|&c| c > 0.0), "{ceilings:?}");
    assert!(out.contains("of the ceiling"));
    assert_eq!(
        out.matches("reference, the serial group commit with no I/O backend cost")
            .count(),
        2
    );
    assert_eq!(out.matches("do flushes overlap?").count(), 2);
    assert_eq!(
        out.matches("(every acknowledged record verified after each run)")
            .count(),
        2
    );
    assert!(!dir.path().join("wal.log").exists(), "the log is removed");
}

/// `mem-fair` on a tiny dataset (a 64 MiB budget: the cache engines' hot
/// fill needs ~20 MiB beyond their capacity): every engine in its own
/// memory cgroup, hot, zipf and fill, every block verified; or a clean skip (exit 0, the
/// reason printed) without root or a memory cgroup controller.
#[test]
fn mem_fair_small() {
    let dir = tmp();
    if !direct_io_works(dir.path()) {
        skip(
            &format!("mem-fair needs O_DIRECT under {}", dir.path().display()),
            false,
        );
        return;
    }
    let mut cmd = Command::new(BIN);
    cmd.args([
        "mem-fair",
        "--quiet",
        "--budget",
        "64MiB",
        "--allowance",
        "40MiB",
        "--file-size",
        "1MiB",
        "--dataset-size",
        "80MiB",
        "--workloads",
        "hot,zipf,fill",
        "-d",
        "4",
        "-t",
        "0.1",
        "--warmup",
        "0",
        "--max-warmup",
        "1",
        "--fill-secs",
        "1",
        "--data-dir",
    ])
    .arg(dir.path().join("data"))
    .arg("--output-dir")
    .arg(dir.path().join("results"));
    let o = cmd.output().expect("run uring-bench mem-fair");
    eprintln!("--- stdout\n{}", stdout(&o));
    eprintln!("--- stderr\n{}", stderr(&o));
    assert!(o.status.success(), "mem-fair failed: {}", stderr(&o));
    let out = stdout(&o);
    if out.contains("mem-fair skipped:") {
        skip(
            &format!("mem-fair needs root and a memory cgroup: {}", out.trim()),
            false,
        );
        return;
    }
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs[0].join("report.json")).unwrap())
            .unwrap();
    let all = v["runs"].as_array().unwrap();
    // hot: 5 engines + uring-raw n/a; zipf and fill: 6 each
    assert_eq!(all.len(), 18, "{v}");
    for r in all {
        if r["workload"] == "hot" && r["engine"] == "uring-raw" {
            assert_eq!(r["status"], "n/a", "{r}");
            continue;
        }
        assert_eq!(r["status"], "ok", "{r}");
        assert!(r["result"]["verified"].as_bool().unwrap(), "{r}");
        assert!(r["result"]["reads"].as_u64().unwrap() > 0, "{r}");
        // each run started cold
        assert!(r["cold_residency"].as_f64().unwrap() <= 0.01, "{r}");
        if r["workload"] == "fill" {
            assert!(r["result"]["samples"].as_array().unwrap().len() >= 8, "{r}");
        }
        if r["engine"] == "uring-cache" || r["engine"] == "uring-cache-ref" {
            assert!(r["hit_ratio"].as_f64().is_some(), "{r}");
        }
    }
    assert!(out.contains("#### fill"), "{out}");
    assert!(out.contains("machine: "), "{out}");
}

/// Bad `mem-fair` flags are errors with a message, not panics.
#[test]
fn mem_fair_bad_flags() {
    for bad in [
        &["--budget", "1MiB"][..],
        &["--budget", "64MiB", "--allowance", "64MiB"],
        &["--engines", "fio"],
        &["--file-size", "1000"],
        &["--theta", "0"],
        &["--hot-fraction", "1.5"],
        &["--depths", "0"],
        &["--budget", "12Q"],
    ] {
        let mut args = vec!["mem-fair"];
        args.extend(bad);
        let o = Command::new(BIN).args(&args).output().unwrap();
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

/// The terminal output of a tiny default-engine run speaks to the user: no
/// project goals or issue numbers, every line within 100 columns (bytes,
/// with COLUMNS unset and stdout a pipe), one verdict line per regime.
#[test]
fn terminal_output_is_user_facing() {
    let dir = tmp();
    let o = Command::new(BIN)
        .env_remove("COLUMNS")
        .args([
            "--quiet",
            "--files",
            "2",
            "--file-size",
            "256K",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .arg("--output-dir")
        .arg(dir.path().join("results"))
        .args(["-d", "4", "-t", "0.2"])
        .output()
        .expect("run uring-bench");
    let out = stdout(&o);
    eprintln!("--- stdout\n{out}\n--- stderr\n{}", stderr(&o));
    assert!(o.status.success());
    // the default engines
    for e in ["uring", "mmap", "pread"] {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(&format!("{e} "))),
            "no {e} row: {out}"
        );
    }
    for l in out.lines() {
        assert!(l.len() <= 100, "{} bytes: {l}", l.len());
        assert!(!l.contains("issue #"), "{l}");
        assert!(
            !l.split(|c: char| !c.is_alphanumeric()).any(|w| w == "met"),
            "{l}"
        );
    }
    for regime in ["hot", "cold"] {
        let v: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("{regime}: ")) && l.contains(" fastest ("))
            .collect();
        assert_eq!(v.len(), 1, "verdict lines for {regime}: {out}");
        assert!(v[0].contains("x mmap") && out.contains("x pread"), "{out}");
    }
    let run = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(md.contains("## Verdict") && !md.contains("Targets"), "{md}");
    let json = std::fs::read_to_string(run.join("report.json")).unwrap();
    assert!(!json.contains("\"targets\"") && !json.contains("\"met\""));
}

/// `--help` states the default engines, pread threads among them.
#[test]
fn help_states_the_default_engines() {
    let o = Command::new(BIN).arg("--help").output().unwrap();
    let help = stdout(&o);
    assert!(help.contains("[default: uring mmap pread]"), "{help}");
}
