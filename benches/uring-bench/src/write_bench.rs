//! `uring-bench write`: the write path (issue #11).
//!
//! Part `randwrite`: random 4 KiB `O_DIRECT` writes into a preallocated,
//! pre-written file at depths 8/32/512 (default): this crate
//! (`write_all_owned` of an `AlignedBuf`, `depth` tasks on a 2-worker
//! runtime), fio `randwrite` (`ioengine=io_uring`, registered files and
//! buffers) and `pwrite` threads (`depth` threads). Writer `w` of `depth`
//! owns the blocks `b` with `b % depth == w`, so the last write to each
//! block is known; every block is stamped (block, sequence, writer) and,
//! after each of our engines' runs, every block written is read back and
//! checked (fio writes its own data; its run is not verified).
//!
//! Part `seqwrite`: a file (`--seq-mib`, 1 GiB) written sequentially with 2 MiB
//! `O_DIRECT` writes, 4 in flight, then `fdatasync` (how a storage engine
//! writes a compaction's output): this crate (`write_all_owned`, 4 tasks)
//! from buffers of `AlignedBuf::new_huge` (transparent huge pages) and of
//! `AlignedBuf::new` (4 KiB pages), against fio `--rw=write` with the same
//! size, depth and `end_fsync` from huge-page (`--mem=shmhuge`) and `malloc`
//! buffers. Every 4 KiB block of the crate's runs is stamped and read back.
//!
//! Part `wal`: WAL-style appends — `--wal-writers` writers each append a
//! record and wait for its commit, in a loop; one committer writes every
//! record waiting as one group at the log's tail, `fdatasync`s, and then
//! acknowledges the group. Engines: this crate (`write_all` + `fdatasync`
//! through the ring) as `uring-serial` (one group at a time, as the others)
//! and as `uring` (pipelined: the next group is written while up to 4
//! groups' `fdatasync`s are in flight — each sync started after its group's
//! write completed, groups acknowledged in order; a design the crate's
//! cheap concurrent ops on one shared descriptor allow, and
//! `tokio::fs::File`'s `&mut self` API does not), as `uring-dsync` (no
//! sync op: the log opened `O_DIRECT | O_DSYNC`, each group one durable,
//! block-aligned, zero-padded write, two groups in flight, acknowledged in
//! order), `tokio::fs` (`File::write_all` + `sync_data`),
//! threads (`write_all_at` + `sync_data`, std channels) and `no-backend`
//! (the serial committer blocking its worker in `pwrite` + `fdatasync`: the
//! serial group commit with an I/O path that costs nothing — a bound, not a
//! design), `append-log` (the crate's `AppendLog` helper: no committer,
//! each writer appends itself; records appended while writes or a sync
//! are in flight gathered into one write, each group a durable
//! (`RWF_DSYNC`) write when all before it is durable, else written and
//! covered by one `fdatasync` at a time; its own framing, checked by its
//! own recovery; its records per write and per commit printed after the
//! table), `append-log-direct` (the same over the log opened `O_DIRECT`:
//! whole-block writes, the tail block rewritten) and `no-backend-dsync`
//! (the `no-backend` committer with the log opened `O_DIRECT | O_DSYNC`,
//! each group one durable write padded to whole blocks: the same bound
//! for durable direct writes). Commit latency is from `append` to its
//! acknowledgement. After each run the log is parsed and every
//! acknowledged record checked. Before
//! each round, the flush floor: one writer's serial record + `fdatasync`,
//! whose p50 sets the ceiling `writers / p50` commits/s that no engine can
//! pass; and whether flushes overlap: 4 threads doing the same at once,
//! against one. The log is `preallocated` (zero-filled and synced before
//! each run: commits overwrite allocated blocks) and `append` (empty: each
//! group grows the file), each with its own table (`--wal-log`).
//!
//! Each cell is repeated `--repeat` times (default 3) in rotation, and the
//! median is reported with the same-run ratios.

use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::io::Write as _;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hdrhistogram::Histogram;
use uring_positioned_io::{AlignedBuf, AppendLogOptions, OpenOptions, UringContext};

use crate::cli::WriteArgs;
use crate::kinds::{LogKind, Part};
use crate::machine::loadavg;

const BLOCK: usize = 4096;

/// user + system CPU seconds of this process so far.
fn cpu_secs() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

// ------------------------------------------------------------- randwrite

/// The stamp of block `block`'s `seq`-th write by `writer`: header words
/// then a body derived from them (so a misplaced or torn block shows).
fn stamp(buf: &mut [u8], block: u64, seq: u64, writer: u64) {
    buf[0..8].copy_from_slice(&block.to_le_bytes());
    buf[8..16].copy_from_slice(&seq.to_le_bytes());
    buf[16..24].copy_from_slice(&writer.to_le_bytes());
    let x = (block ^ seq.rotate_left(17) ^ writer.rotate_left(40)) as u8;
    for (k, b) in buf[24..64].iter_mut().enumerate() {
        *b = x.wrapping_add(k as u8);
    }
    buf[BLOCK - 8..].copy_from_slice(&(block ^ seq).to_le_bytes());
}

fn stamp_ok(buf: &[u8], block: u64, seq: u64, writer: u64) -> bool {
    let mut want = [0u8; BLOCK];
    want.copy_from_slice(buf);
    stamp(&mut want, block, seq, writer);
    want[..] == buf[..]
}

/// Per block: (seq + 1, writer) of its last write; 0 = not written.
type Written = Vec<(u64, u64)>;

/// Writer `w`'s next block: a random one among the blocks it owns.
fn pick(rng: &mut u64, w: u64, depth: u64, blocks: u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let owned = (blocks - w).div_ceil(depth);
    w + (*rng % owned) * depth
}

fn open_direct(path: &Path) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("open O_DIRECT {}: {e}", path.display()))
}

fn uring_randwrite(
    path: &Path,
    depth: usize,
    blocks: u64,
    secs: f64,
    workers: usize,
) -> Result<(f64, Written), String> {
    let file = open_direct(path)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let ctx = UringContext::builder()
            .max_in_flight(depth.max(64))
            .build(vec![file])
            .map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..depth as u64 {
            let (ctx, stop) = (ctx.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (w + 1).wrapping_mul(0xff51_afd7_ed55_8ccd);
                let mut buf = AlignedBuf::new(BLOCK, BLOCK);
                let mut last = HashMap::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let block = pick(&mut rng, w, depth as u64, blocks);
                    stamp(&mut buf, block, n, w);
                    let (r, back) = ctx.write_all_owned(0u32, block * BLOCK as u64, buf).await;
                    buf = back;
                    r.map_err(|e| format!("write of block {block}: {e}"))?;
                    last.insert(block, n);
                    n += 1;
                }
                Ok::<_, String>((n, last, w))
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut written = vec![(0, 0); blocks as usize];
        let mut total = 0;
        for t in tasks {
            let (n, last, w) = t.await.map_err(|e| e.to_string())??;
            total += n;
            for (b, s) in last {
                written[b as usize] = (s + 1, w);
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        Ok((total as f64 / elapsed, written))
    })
}

fn pwrite_randwrite(
    path: &Path,
    depth: usize,
    blocks: u64,
    secs: f64,
) -> Result<(f64, Written), String> {
    let file = Arc::new(open_direct(path)?);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let threads: Vec<_> = (0..depth as u64)
        .map(|w| {
            let (file, stop) = (file.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (w + 1).wrapping_mul(0xff51_afd7_ed55_8ccd);
                let mut buf = AlignedBuf::new(BLOCK, BLOCK);
                let mut last = HashMap::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let block = pick(&mut rng, w, depth as u64, blocks);
                    stamp(&mut buf, block, n, w);
                    file.write_all_at(&buf, block * BLOCK as u64)
                        .map_err(|e| format!("pwrite of block {block}: {e}"))?;
                    last.insert(block, n);
                    n += 1;
                }
                Ok::<_, String>((n, last, w))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut written = vec![(0, 0); blocks as usize];
    let mut total = 0;
    for t in threads {
        let (n, last, w) = t
            .join()
            .map_err(|_| "pwrite thread panicked".to_owned())??;
        total += n;
        for (b, s) in last {
            written[b as usize] = (s + 1, w);
        }
    }
    Ok((total as f64 / started.elapsed().as_secs_f64(), written))
}

fn fio_randwrite(fio: &Path, path: &Path, depth: usize, secs: f64) -> Result<f64, String> {
    let ms = (secs * 1000.0).round() as u64;
    let out = Command::new(fio)
        .arg("--name=uring-bench-write")
        .arg(format!("--filename={}", path.display()))
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--ioengine=io_uring",
            "--direct=1",
        ])
        .arg(format!("--iodepth={depth}"))
        .arg(format!("--iodepth_batch_complete_max={depth}"))
        .args([
            "--registerfiles=1",
            "--fixedbufs=1",
            "--norandommap",
            "--randrepeat=0",
        ])
        .args([
            "--invalidate=0",
            "--time_based",
            "--numjobs=1",
            "--group_reporting",
        ])
        .arg(format!("--runtime={ms}ms"))
        .arg("--output-format=json")
        .output()
        .map_err(|e| format!("fio: {e}"))?;
    if !out.status.success() {
        return Err(format!("fio: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&s[s.find('{').ok_or("fio: no JSON")?..])
        .map_err(|e| format!("fio JSON: {e}"))?;
    let job = &v["jobs"][0]["write"];
    let ios = job["total_ios"].as_f64().ok_or("fio: no total_ios")?;
    let ms = job["runtime"].as_f64().ok_or("fio: no runtime")?;
    Ok(ios / (ms / 1000.0).max(1e-9))
}

/// Reads back every block `written` says was written and checks its stamp.
fn verify_blocks(path: &Path, written: &Written) -> Result<u64, String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let mut chunk = vec![0u8; 256 * BLOCK];
    let mut checked = 0;
    for (c, blocks) in written.chunks(256).enumerate() {
        let at = (c * 256 * BLOCK) as u64;
        let buf = &mut chunk[..blocks.len() * BLOCK];
        f.read_exact_at(buf, at).map_err(|e| e.to_string())?;
        for (k, &(seq1, w)) in blocks.iter().enumerate() {
            if seq1 == 0 {
                continue;
            }
            let block = (c * 256 + k) as u64;
            if !stamp_ok(&buf[k * BLOCK..(k + 1) * BLOCK], block, seq1 - 1, w) {
                return Err(format!(
                    "block {block} does not hold its last write (seq {})",
                    seq1 - 1
                ));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

fn randwrite(a: &WriteArgs, dir: &Path) -> Result<bool, String> {
    let path = dir.join("randwrite.dat");
    let size = a.file_mib * 1024 * 1024;
    let blocks = size / BLOCK as u64;
    {
        // Pre-written (not just fallocated), so no engine pays for
        // converting unwritten extents.
        let mut f = File::create(&path).map_err(|e| e.to_string())?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..a.file_mib {
            f.write_all(&zeros).map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())?;
    }
    let fio_missing = Command::new(&a.fio).arg("--version").output().is_err();
    println!(
        "== randwrite: 4 KiB O_DIRECT random writes into {} MiB at {}, {} s per cell, {} repeats, uring on {} workers (load {})",
        a.file_mib,
        path.display(),
        a.secs,
        a.repeat,
        a.workers,
        loadavg()
    );
    println!(
        "{:>6} {:>12} {:>12} {:>12} {:>10} {:>10}  load",
        "depth", "uring w/s", "fio w/s", "pwrite w/s", "uring/fio", "uring/pw"
    );
    let mut ok = true;
    for &depth in &a.depths {
        let (mut u, mut fi, mut pw) = (Vec::new(), Vec::new(), Vec::new());
        let (mut u_cpu, mut pw_cpu) = (Vec::new(), Vec::new());
        let mut verified = 0;
        for _ in 0..a.repeat {
            if !fio_missing {
                fi.push(fio_randwrite(&a.fio, &path, depth, a.secs)?);
            }
            let c = cpu_secs();
            let (rate, written) =
                uring_randwrite(&path, depth, blocks, a.secs, a.workers as usize)?;
            u_cpu.push((cpu_secs() - c) / (rate * a.secs) * 1e6);
            verified += verify_blocks(&path, &written)?;
            u.push(rate);
            let c = cpu_secs();
            let (rate, written) = pwrite_randwrite(&path, depth, blocks, a.secs)?;
            pw_cpu.push((cpu_secs() - c) / (rate * a.secs) * 1e6);
            verified += verify_blocks(&path, &written)?;
            pw.push(rate);
        }
        let (u, pw) = (median(u), median(pw));
        let fi = if fi.is_empty() { f64::NAN } else { median(fi) };
        println!(
            "{depth:>6} {u:>12.0} {fi:>12.0} {pw:>12.0} {:>10.2} {:>10.2}  {}   (CPU µs/write: uring {:.1}, pwrite {:.1}; {verified} blocks verified)",
            u / fi,
            u / pw,
            loadavg(),
            median(u_cpu),
            median(pw_cpu),
        );
        ok &= verified > 0;
    }
    if fio_missing {
        println!("fio not found ({}): its column is NaN", a.fio.display());
    }
    std::fs::remove_file(&path).ok();
    Ok(ok)
}

// -------------------------------------------------------------- seqwrite

const SEQ_CHUNK: usize = 2 << 20;
const SEQ_DEPTH: usize = 4;

/// This crate writing the whole file in `SEQ_CHUNK`s, `SEQ_DEPTH` tasks
/// (task `t` writes chunks `t, t + SEQ_DEPTH, ...`), then `fdatasync`;
/// every block stamped with run `run`. Returns GB/s.
fn uring_seqwrite(path: &Path, size: u64, huge: bool, run: u64) -> Result<f64, String> {
    let file = open_direct(path)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let ctx = UringContext::new(vec![file]).map_err(|e| e.to_string())?;
        let chunks = size / SEQ_CHUNK as u64;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..SEQ_DEPTH as u64 {
            let ctx = ctx.clone();
            tasks.push(tokio::spawn(async move {
                let mut buf = if huge {
                    AlignedBuf::new_huge(SEQ_CHUNK, BLOCK)
                } else {
                    AlignedBuf::new(SEQ_CHUNK, BLOCK)
                };
                let mut c = t;
                while c < chunks {
                    for (i, b) in buf.chunks_exact_mut(BLOCK).enumerate() {
                        stamp(b, c * (SEQ_CHUNK / BLOCK) as u64 + i as u64, run, 0);
                    }
                    let (r, back) = ctx.write_all_owned(0u32, c * SEQ_CHUNK as u64, buf).await;
                    buf = back;
                    r.map_err(|e| format!("write of chunk {c}: {e}"))?;
                    c += SEQ_DEPTH as u64;
                }
                Ok::<_, String>(())
            }));
        }
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        ctx.fdatasync(0u32)
            .await
            .map_err(|e| format!("fdatasync: {e}"))?;
        Ok(size as f64 / started.elapsed().as_secs_f64() / 1e9)
    })
}

/// fio's sequential O_DIRECT write of the same file: GB/s (its runtime,
/// including the final fsync).
fn fio_seqwrite(fio: &Path, path: &Path, size: u64, huge: bool) -> Result<f64, String> {
    let out = Command::new(fio)
        .arg("--name=uring-bench-seqwrite")
        .arg(format!("--filename={}", path.display()))
        .args(["--rw=write", "--ioengine=io_uring", "--direct=1"])
        .arg(format!("--bs={SEQ_CHUNK}"))
        .arg(format!("--iodepth={SEQ_DEPTH}"))
        .arg(format!("--size={size}"))
        .arg(if huge {
            "--mem=shmhuge"
        } else {
            "--mem=malloc"
        })
        .args(["--end_fsync=1", "--invalidate=0", "--output-format=json"])
        .output()
        .map_err(|e| format!("fio: {e}"))?;
    if !out.status.success() {
        return Err(format!("fio: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&s[s.find('{').ok_or("fio: no JSON")?..])
        .map_err(|e| format!("fio JSON: {e}"))?;
    let bytes = v["jobs"][0]["write"]["io_bytes"]
        .as_f64()
        .ok_or("fio: no io_bytes")?;
    // job_runtime covers the whole job, end_fsync included.
    let ms = v["jobs"][0]["job_runtime"]
        .as_f64()
        .ok_or("fio: no job_runtime")?;
    Ok(bytes / (ms / 1000.0).max(1e-9) / 1e9)
}

/// Reads the file back and checks every block's stamp from run `run`.
fn verify_seq(path: &Path, size: u64, run: u64) -> Result<u64, String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    let mut block = 0u64;
    let mut at = 0u64;
    while at < size {
        f.read_exact_at(&mut buf, at)
            .map_err(|e| format!("read back @ {at}: {e}"))?;
        for b in buf.chunks_exact(BLOCK) {
            if !stamp_ok(b, block, run, 0) {
                return Err(format!("seqwrite: block {block} of run {run} is wrong"));
            }
            block += 1;
        }
        at += buf.len() as u64;
    }
    Ok(block)
}

fn seqwrite(a: &WriteArgs, dir: &Path) -> Result<bool, String> {
    let path = dir.join("seqwrite.dat");
    let size = a.seq_mib << 20;
    {
        // Pre-written, so no engine pays for allocating extents.
        let mut f = File::create(&path).map_err(|e| e.to_string())?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..a.seq_mib {
            f.write_all(&zeros).map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())?;
    }
    let fio_missing = Command::new(&a.fio).arg("--version").output().is_err();
    let huge = crate::machine::HugePages::reserve();
    println!(
        "== seqwrite: {} MiB written sequentially in 2 MiB O_DIRECT writes, 4 in flight, then fdatasync, at {}, {} repeats (load {}); fio huge pages: {}",
        a.seq_mib,
        path.display(),
        a.repeat,
        loadavg(),
        match &huge {
            Ok(_) => "yes".to_string(),
            Err(why) => format!("no ({why})"),
        }
    );
    let mut rows: Vec<(&str, Vec<f64>)> = vec![
        ("uring, new_huge buffers", Vec::new()),
        ("uring, 4 KiB-page buffers", Vec::new()),
        ("fio, huge pages (shmhuge)", Vec::new()),
        ("fio, malloc", Vec::new()),
    ];
    let mut verified = 0;
    for rep in 0..a.repeat {
        for (i, row) in rows.iter_mut().enumerate() {
            let gbs = match i {
                0 | 1 => {
                    let run = rep * 2 + i as u64 + 1;
                    let g = uring_seqwrite(&path, size, i == 0, run)?;
                    verified += verify_seq(&path, size, run)?;
                    g
                }
                2 if fio_missing || huge.is_err() => continue,
                3 if fio_missing => continue,
                2 => match fio_seqwrite(&a.fio, &path, size, true) {
                    Ok(g) => g,
                    // Another process took the reserved huge pages (see
                    // `lines::run_one`): this round has no figure for the row.
                    Err(e) if e.contains("huge pages") => {
                        eprintln!("warning: fio found no free huge pages (taken by another process); no shmhuge figure this round");
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                _ => fio_seqwrite(&a.fio, &path, size, false)?,
            };
            row.1.push(gbs);
        }
    }
    drop(huge);
    let med: Vec<Option<f64>> = rows
        .iter()
        .map(|(_, v)| (!v.is_empty()).then(|| median(v.clone())))
        .collect();
    println!(
        "{:<28} {:>8} {:>10} {:>10}",
        "engine", "GB/s", "x fio huge", "x fio malloc"
    );
    for ((name, _), m) in rows.iter().zip(&med) {
        let r = |base: Option<f64>| match (m, base) {
            (Some(m), Some(b)) => format!("{:.2}", m / b),
            _ => "-".into(),
        };
        println!(
            "{name:<28} {:>8} {:>10} {:>10}",
            m.map_or("-".into(), |m| format!("{m:.2}")),
            r(med[2]),
            r(med[3])
        );
    }
    println!("({verified} blocks of this crate's runs read back and verified)");
    std::fs::remove_file(&path).ok();
    Ok(verified > 0)
}

// ------------------------------------------------------------------- wal

const HEADER: usize = 16;

/// Group syncs in flight at once in the pipelined `uring` engine.
const PIPELINE: usize = 4;

/// Group writes in flight at once in the `uring-dsync` engine. Measured
/// (preallocated log, 64 writers; BENCHMARKS, WAL): 1 and 2 within a few per
/// cent of each other (2 ahead in two runs, with twice the p99.9); 4, 8 and
/// 16 fewer commits/s — the groups shrink to 2–8 records, and a durable
/// write's latency grows with the writes in flight.
const DSYNC_PIPELINE: usize = 2;

fn record(writer: u64, i: u64, len: usize) -> Vec<u8> {
    let mut r = vec![0u8; len];
    r[..8].copy_from_slice(&writer.to_le_bytes());
    r[8..16].copy_from_slice(&i.to_le_bytes());
    for (k, b) in r[16..].iter_mut().enumerate() {
        *b = (writer as u8) ^ (i as u8).wrapping_mul(7) ^ (k as u8);
    }
    r
}

/// Encodes one record: `[len u32][sum u32][seq u64][payload]`.
fn encode(seq: u64, payload: &[u8], out: &mut Vec<u8>) {
    let sum = payload
        .iter()
        .fold(seq as u32, |s, &b| s.rotate_left(5) ^ u32::from(b));
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&sum.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
}

/// Parses the log; checks every acknowledged (writer, i) is in it, whole.
fn verify_log(path: &Path, acked: &[(u64, u64)], len: usize) -> Result<usize, String> {
    let data = std::fs::read(path).map_err(|e| e.to_string())?;
    let mut found = std::collections::HashSet::new();
    let mut at = 0;
    let mut seq = 0u64;
    while at + HEADER <= data.len() {
        let n = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let sum = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap());
        let s = u64::from_le_bytes(data[at + 8..at + 16].try_into().unwrap());
        // A record's payload holds at least its writer and number (16
        // bytes). Zeroes inside a block are a group's padding (the
        // `uring-dsync` engine starts every group on a 4 KiB block); zeroes
        // at a block's start are unwritten space: the log's end.
        if n == 0 && sum == 0 && s == 0 && at % BLOCK != 0 {
            at = at.next_multiple_of(BLOCK);
            continue;
        }
        if n < 16 || s != seq || at + HEADER + n > data.len() {
            break;
        }
        let p = &data[at + HEADER..at + HEADER + n];
        if p.iter()
            .fold(s as u32, |x, &b| x.rotate_left(5) ^ u32::from(b))
            != sum
        {
            break;
        }
        let w = u64::from_le_bytes(p[..8].try_into().unwrap());
        let i = u64::from_le_bytes(p[8..16].try_into().unwrap());
        if p != &record(w, i, len)[..] {
            return Err(format!("record {seq} (writer {w}, #{i}) is corrupt"));
        }
        found.insert((w, i));
        at += HEADER + n;
        seq += 1;
    }
    for a in acked {
        if !found.contains(a) {
            return Err(format!("acknowledged record {a:?} is not in the log"));
        }
    }
    Ok(acked.len())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WalEngine {
    UringPipelined,
    Uring,
    TokioFs,
    Threads,
    /// Durable writes instead of `fdatasync`: the log opened `O_DIRECT |
    /// O_DSYNC`, each group one block-aligned write (zero-padded to 4 KiB,
    /// so no two groups share a block), up to `DSYNC_PIPELINE` groups in
    /// flight, acknowledged in order.
    UringDsync,
    /// The serial committer calling `pwrite` + `fdatasync` itself, blocking
    /// its runtime worker: what the serial group commit does with an I/O
    /// backend that costs nothing — the reference `uring-serial` and
    /// `tokio-fs` are measured against, not a strict bound (blocking a
    /// worker also changes how the writers are scheduled) and not a design
    /// to copy.
    Blocking,
    /// `Blocking` with the log opened `O_DIRECT | O_DSYNC`: each group one
    /// durable write, padded to whole blocks as in `uring-dsync`, the
    /// committer blocking its worker in it — the same bound for durable
    /// direct writes.
    BlockingDsync,
    /// The crate's `AppendLog` (feature `append-log`): each writer appends
    /// its records itself (no committer task); the log reserves offsets,
    /// gathers the records appended while writes or a sync are in flight
    /// into one write, and one `fdatasync` at a time covers every record
    /// written contiguously. Its own framing, so checked by its own
    /// recovery.
    AppendLog,
    /// `AppendLog` over the log opened `O_DIRECT` (where the file system
    /// takes it): every write whole blocks, the tail block rewritten.
    AppendLogDirect,
}

struct WalOutcome {
    commits_per_sec: f64,
    hist: Histogram<u64>,
    groups: u64,
    acked: Vec<(u64, u64)>,
    /// `append-log` only: records per write and per commit (an
    /// `fdatasync` or a durable write; its stats).
    per_write_sync: Option<(f64, f64)>,
}

type Ack = tokio::sync::oneshot::Sender<()>;

/// A group: `first` and every record already waiting behind it.
fn gather<T>(first: T, rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> Vec<T> {
    let mut group = vec![first];
    while let Ok(m) = rx.try_recv() {
        group.push(m);
    }
    group
}

/// One committer round: encode `group` at `seq`.
fn encode_group(group: &[(u64, u64)], seq: &mut u64, len: usize, buf: &mut Vec<u8>) {
    buf.clear();
    for &(w, i) in group {
        encode(*seq, &record(w, i, len), buf);
        *seq += 1;
    }
}

/// Opens the log `prepare_log` made, for writing at explicit offsets.
fn open_log(path: &Path) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Makes a fresh log at `path`: empty (`Append`), or `bytes` of zeroes
/// written and synced (`Preallocated`; written, not `fallocate`d, since
/// the first write into an unwritten extent would journal its conversion —
/// the cost preallocating avoids). Outside the timed window.
fn prepare_log(path: &Path, kind: LogKind, bytes: u64) -> Result<(), String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = File::create(path).map_err(err)?;
    if kind == LogKind::Preallocated {
        let zeroes = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(zeroes.len() as u64) as usize;
            f.write_all(&zeroes[..n]).map_err(err)?;
            left -= n as u64;
        }
    }
    f.sync_all().map_err(err)
}

/// Most bytes a log is preallocated with: beyond it (large records) a run
/// appends the rest, which the table reports.
const MAX_PREALLOC: u64 = 1 << 30;

/// Bytes to preallocate for a run at up to `rate` commits/s: the run's
/// records with half as much again to spare, whole MiB, at least 8 MiB, at
/// most `MAX_PREALLOC` and a quarter of the free space of `dir`.
fn prealloc_bytes(rate: f64, a: &WriteArgs, dir: &Path) -> u64 {
    let per = (HEADER as u64 + a.record_bytes) as f64;
    let want = (rate * per * (a.secs + 0.5) * 1.5) as u64;
    let cap = MAX_PREALLOC.min(free_bytes(dir).map_or(u64::MAX, |f| f / 4));
    (want.div_ceil(1 << 20).max(8) << 20).min(cap)
}

/// Free bytes of the file system holding `dir` (`statvfs`), if known.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a NUL-terminated path; statvfs fills the zeroed
    // struct it is given and reads nothing else.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &raw mut st) };
    (rc == 0).then(|| st.f_bavail.saturating_mul(st.f_frsize))
}

fn wal_async(engine: WalEngine, path: &Path, a: &WriteArgs) -> Result<WalOutcome, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (writers, len, secs) = (a.wal_writers, a.record_bytes as usize, a.secs);
    let path = path.to_path_buf();
    rt.block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<((u64, u64), Ack)>();
        let committer = tokio::spawn(async move {
            let mut seq = 0u64;
            let mut buf = Vec::new();
            let mut groups = 0u64;
            let mut tail = 0u64;
            let mut ctx = None;
            let mut tfile = None;
            let mut blocking = None;
            let dsync_file = || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
                    .open(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))
            };
            if engine == WalEngine::Blocking {
                blocking = Some(open_log(&path)?);
            } else if engine == WalEngine::BlockingDsync {
                blocking = Some(dsync_file()?);
            } else if engine == WalEngine::UringDsync {
                ctx = Some(UringContext::new(vec![dsync_file()?]).map_err(|e| e.to_string())?);
            } else if engine != WalEngine::TokioFs {
                let file = open_log(&path)?;
                ctx = Some(UringContext::new(vec![file]).map_err(|e| e.to_string())?);
            } else {
                tfile = Some(
                    tokio::fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .await
                        .map_err(|e| format!("{}: {e}", path.display()))?,
                );
            }
            if let (WalEngine::UringDsync | WalEngine::UringPipelined, Some(ctx)) = (engine, &ctx) {
                // Later groups are written while earlier ones are being made
                // durable, and groups are acknowledged in order as that
                // completes, so an acknowledged record never follows one
                // that may be lost. `uring`: each group's fdatasync starts
                // after its own write completed (so it covers it).
                // `uring-dsync`: each group is one O_DSYNC write, durable
                // when it completes, padded to whole blocks so that no two
                // writes in flight share one.
                let dsync = engine == WalEngine::UringDsync;
                let depth = if dsync { DSYNC_PIPELINE } else { PIPELINE };
                let mut durable = futures::stream::FuturesOrdered::new();
                let mut open = true;
                while open || !durable.is_empty() {
                    tokio::select! {
                        biased;
                        Some((res, group)) = durable.next(), if !durable.is_empty() => {
                            let res: std::io::Result<()> = res;
                            res.map_err(|e| e.to_string())?;
                            let group: Vec<((u64, u64), Ack)> = group;
                            for (_, ack) in group {
                                let _ = ack.send(());
                            }
                        }
                        first = rx.recv(), if open && durable.len() < depth => {
                            let Some(first) = first else {
                                open = false;
                                continue;
                            };
                            let group = gather(first, &mut rx);
                            let ids: Vec<_> = group.iter().map(|g| g.0).collect();
                            let mut block = Vec::new();
                            encode_group(&ids, &mut seq, len, &mut block);
                            let at = tail;
                            let done: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send + '_>> =
                                if dsync {
                                    block.resize(block.len().next_multiple_of(BLOCK), 0);
                                    tail += block.len() as u64;
                                    Box::pin(async move { ctx.write_all(0u32, at, &block).await })
                                } else {
                                    ctx.write_all(0u32, at, &block).await.map_err(|e| e.to_string())?;
                                    tail += block.len() as u64;
                                    Box::pin(ctx.fdatasync(0u32))
                                };
                            groups += 1;
                            durable.push_back(async move { (done.await, group) });
                        }
                    }
                }
                return Ok::<_, String>(groups);
            }
            while let Some(first) = rx.recv().await {
                let group = gather(first, &mut rx);
                let ids: Vec<_> = group.iter().map(|g| g.0).collect();
                encode_group(&ids, &mut seq, len, &mut buf);
                if let Some(ctx) = &ctx {
                    ctx.write_all(0u32, tail, &buf)
                        .await
                        .map_err(|e| e.to_string())?;
                    ctx.fdatasync(0u32).await.map_err(|e| e.to_string())?;
                } else if let Some(f) = &mut tfile {
                    use tokio::io::AsyncWriteExt;
                    f.write_all(&buf).await.map_err(|e| e.to_string())?;
                    f.sync_data().await.map_err(|e| e.to_string())?;
                } else if let Some(f) = &blocking {
                    // The bound, not a design: the worker blocks in the
                    // syscalls, so no hop of any backend is paid.
                    if engine == WalEngine::BlockingDsync {
                        buf.resize(buf.len().next_multiple_of(BLOCK), 0);
                        let mut aligned = AlignedBuf::new(buf.len(), BLOCK);
                        aligned.copy_from_slice(&buf);
                        f.write_all_at(&aligned, tail).map_err(|e| e.to_string())?;
                    } else {
                        f.write_all_at(&buf, tail).map_err(|e| e.to_string())?;
                        f.sync_data().map_err(|e| e.to_string())?;
                    }
                }
                tail += buf.len() as u64;
                groups += 1;
                for (_, ack) in group {
                    let _ = ack.send(());
                }
            }
            Ok::<_, String>(groups)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (tx, stop) = (tx.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new(3).unwrap();
                let mut acked = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let (ack, rx) = tokio::sync::oneshot::channel();
                    if tx.send(((w, i), ack)).is_err() || rx.await.is_err() {
                        break;
                    }
                    hist.record(t.elapsed().as_nanos() as u64).ok();
                    acked.push((w, i));
                    i += 1;
                }
                (hist, acked)
            }));
        }
        drop(tx);
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut hist = Histogram::<u64>::new(3).unwrap();
        let mut acked = Vec::new();
        for t in tasks {
            let (h, a) = t.await.map_err(|e| e.to_string())?;
            hist.add(&h).ok();
            acked.extend(a);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let groups = committer.await.map_err(|e| e.to_string())??;
        Ok(WalOutcome {
            commits_per_sec: acked.len() as f64 / elapsed,
            hist,
            groups,
            acked,
            per_write_sync: None,
        })
    })
}

/// The `append-log` engine: `AppendLog` over the log file, 64 writers
/// appending directly; its acknowledged records are checked by reopening
/// the log (recovery) right after the run.
fn wal_append_log(path: &Path, a: &WriteArgs, direct: bool) -> Result<WalOutcome, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (writers, len, secs) = (a.wal_writers, a.record_bytes as usize, a.secs);
    let path = path.to_path_buf();
    rt.block_on(async move {
        let err = |e: std::io::Error| e.to_string();
        let ctx = UringContext::new(vec![]).map_err(err)?;
        let opts = OpenOptions::new()
            .read(true)
            .write(true)
            .direct(direct)
            .clone();
        let file = ctx.open_file(&path, &opts).await.map_err(err)?;
        let (log, old) = AppendLogOptions::new().open(file).await.map_err(err)?;
        if !old.is_empty() {
            return Err("append-log: the prepared log is not empty".into());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (log, stop) = (log.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new(3).unwrap();
                let mut acked = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    log.append(record(w, i, len))
                        .await
                        .map_err(|e| e.to_string())?;
                    hist.record(t.elapsed().as_nanos() as u64).ok();
                    acked.push((w, i));
                    i += 1;
                }
                Ok::<_, String>((hist, acked))
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut hist = Histogram::<u64>::new(3).unwrap();
        let mut acked = Vec::new();
        for t in tasks {
            let (h, a) = t.await.map_err(|e| e.to_string())??;
            hist.add(&h).ok();
            acked.extend(a);
        }
        let elapsed = started.elapsed().as_secs_f64();
        log.close().await.map_err(err)?;
        let st = log.stats();
        // A commit is an fdatasync or a durable (RWF_DSYNC) write.
        let groups = st.syncs + st.durable_writes;
        let per_write_sync = (
            st.records as f64 / st.writes.max(1) as f64,
            st.records as f64 / groups.max(1) as f64,
        );
        drop(log);
        // Recovery through a fresh open: every acknowledged record back.
        let file = ctx.open_file(&path, &opts).await.map_err(err)?;
        let (_log, records) = AppendLogOptions::new().open(file).await.map_err(err)?;
        let mut found = std::collections::HashSet::new();
        for r in &records {
            let p = &r.payload;
            let w = u64::from_le_bytes(p[..8].try_into().unwrap());
            let i = u64::from_le_bytes(p[8..16].try_into().unwrap());
            if p[..] != record(w, i, len)[..] {
                return Err(format!("append-log: record at {} is corrupt", r.offset));
            }
            found.insert((w, i));
        }
        if let Some(a) = acked.iter().find(|a| !found.contains(a)) {
            return Err(format!(
                "append-log: acknowledged record {a:?} not recovered"
            ));
        }
        Ok(WalOutcome {
            commits_per_sec: acked.len() as f64 / elapsed,
            hist,
            groups,
            acked,
            per_write_sync: Some(per_write_sync),
        })
    })
}

fn wal_threads(path: &Path, a: &WriteArgs) -> Result<WalOutcome, String> {
    let (writers, len, secs) = (a.wal_writers, a.record_bytes as usize, a.secs);
    let file = open_log(path)?;
    let (tx, rx) = std::sync::mpsc::channel::<((u64, u64), std::sync::mpsc::SyncSender<()>)>();
    let committer = std::thread::spawn(move || {
        let (mut seq, mut tail, mut groups) = (0u64, 0u64, 0u64);
        let mut buf = Vec::new();
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while let Ok(m) = rx.try_recv() {
                group.push(m);
            }
            let ids: Vec<_> = group.iter().map(|g| g.0).collect();
            encode_group(&ids, &mut seq, len, &mut buf);
            file.write_all_at(&buf, tail).map_err(|e| e.to_string())?;
            file.sync_data().map_err(|e| e.to_string())?;
            tail += buf.len() as u64;
            groups += 1;
            for (_, ack) in group {
                let _ = ack.send(());
            }
        }
        Ok::<_, String>(groups)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (tx, stop, count) = (tx.clone(), stop.clone(), count.clone());
            std::thread::spawn(move || {
                let mut hist = Histogram::<u64>::new(3).unwrap();
                let mut acked = Vec::new();
                let (ack, done) = std::sync::mpsc::sync_channel(1);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if tx.send(((w, i), ack.clone())).is_err() || done.recv().is_err() {
                        break;
                    }
                    hist.record(t.elapsed().as_nanos() as u64).ok();
                    acked.push((w, i));
                    count.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                (hist, acked)
            })
        })
        .collect();
    drop(tx);
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new(3).unwrap();
    let mut acked = Vec::new();
    for t in threads {
        let (h, a) = t.join().map_err(|_| "writer thread panicked".to_owned())?;
        hist.add(&h).ok();
        acked.extend(a);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let groups = committer
        .join()
        .map_err(|_| "committer panicked".to_owned())??;
    Ok(WalOutcome {
        commits_per_sec: acked.len() as f64 / elapsed,
        hist,
        groups,
        acked,
        per_write_sync: None,
    })
}

/// commits/s, groups/s, p50, p99, p99.9 (µs).
type Row = (f64, f64, f64, f64, f64);

/// The device's flush floor: one thread appending one record at a time to
/// a fresh log with `write_all_at` + `fdatasync` (the least a commit can
/// wait for), for `secs` seconds. Returns (p50, p99) of one append+sync, µs.
///
/// A closed-loop writer waits for at least one such flush per commit, so
/// `writers` writers commit at most `writers / p50` records a second,
/// whatever the engine: the ceiling every engine's commits/s is compared
/// with.
fn wal_floor(path: &Path, a: &WriteArgs) -> Result<(f64, f64), String> {
    let file = open_log(path)?;
    let mut hist = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let (mut seq, mut tail) = (0u64, 0u64);
    let mut buf = Vec::new();
    let started = Instant::now();
    let mut i = 0u64;
    while started.elapsed().as_secs_f64() < a.secs || hist.len() < 10 {
        encode_group(&[(0, i)], &mut seq, a.record_bytes as usize, &mut buf);
        let t = Instant::now();
        file.write_all_at(&buf, tail).map_err(|e| e.to_string())?;
        file.sync_data().map_err(|e| e.to_string())?;
        hist.record(t.elapsed().as_nanos() as u64).ok();
        tail += buf.len() as u64;
        i += 1;
    }
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
    Ok((q(0.5), q(0.99)))
}

fn wal(a: &WriteArgs, dir: &Path) -> Result<bool, String> {
    for &kind in &a.wal_log {
        wal_kind(a, dir, kind)?;
    }
    Ok(true)
}

/// Commits/s no run is sized beyond when preallocating (a closed loop of
/// channel hand-offs on two CPUs stays far below it).
const MAX_PREALLOC_RATE: f64 = 1e6;

/// Threads of the flush-overlap probe (`wal_flushers`).
const FLUSHERS: usize = 4;

/// Whether the device overlaps flushes: `k` threads each write one record
/// into their own 4 KiB pages of the log and `fdatasync`, in a loop, for
/// `secs`. Returns flushes per second, all threads together.
///
/// With `wrap`, thread t's records cycle through its `wrap` pages (a
/// preallocated log of `wrap * k` pages: overwrites); without, they go ever
/// further (an appended log: the file grows).
fn wal_flushers(path: &Path, a: &WriteArgs, k: usize, wrap: Option<u64>) -> Result<f64, String> {
    let file = Arc::new(open_log(path)?);
    let len = a.record_bytes as usize;
    let started = Instant::now();
    let threads: Vec<_> = (0..k as u64)
        .map(|t| {
            let (file, secs) = (file.clone(), a.secs);
            std::thread::spawn(move || {
                let (mut seq, mut n) = (0u64, 0u64);
                let mut buf = Vec::new();
                while started.elapsed().as_secs_f64() < secs || n < 10 {
                    encode_group(&[(t, n)], &mut seq, len, &mut buf);
                    // Thread t's n-th record starts page n * k + t.
                    let page = wrap.map_or(n, |w| n % w);
                    let at =
                        (page * k as u64 + t) * (len as u64 + HEADER as u64).next_multiple_of(4096);
                    file.write_all_at(&buf, at)?;
                    file.sync_data()?;
                    n += 1;
                }
                Ok::<_, std::io::Error>(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        total += t
            .join()
            .map_err(|_| "flusher panicked".to_owned())?
            .map_err(|e| e.to_string())?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

fn wal_kind(a: &WriteArgs, dir: &Path, kind: LogKind) -> Result<(), String> {
    let path = dir.join("wal.log");
    let kind_name = match kind {
        LogKind::Preallocated => "preallocated log (zero-filled and synced first)",
        LogKind::Append => "appended log (every group grows the file)",
    };
    println!(
        "== wal, {kind_name}: {} writers, {}-byte records, group commit with fdatasync, {} s per cell, {} repeats (load {})",
        a.wal_writers,
        a.record_bytes,
        a.secs,
        a.repeat,
        loadavg()
    );
    println!(
        "{:>17} {:>11} {:>9} {:>10} {:>10} {:>10}  load",
        "engine", "commits/s", "groups/s", "p50 µs", "p99 µs", "p99.9 µs"
    );
    // `uring-dsync` needs O_DIRECT, which some file systems (tmpfs) refuse.
    prepare_log(&path, kind, 0)?;
    let direct = match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&path)
    {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let engines: Vec<WalEngine> = [
        WalEngine::UringPipelined,
        WalEngine::Uring,
        WalEngine::UringDsync,
        WalEngine::TokioFs,
        WalEngine::Threads,
        WalEngine::Blocking,
        WalEngine::BlockingDsync,
        WalEngine::AppendLog,
        WalEngine::AppendLogDirect,
    ]
    .into_iter()
    .filter(|&e| {
        direct
            || !matches!(
                e,
                WalEngine::UringDsync | WalEngine::BlockingDsync | WalEngine::AppendLogDirect
            )
    })
    .collect();
    let mut rows: HashMap<&str, Vec<Row>> = HashMap::new();
    let mut floors = Vec::new();
    let mut overflowed = 0u64;
    let mut concurrent = Vec::new();
    let mut coalescing: HashMap<&str, Vec<(f64, f64)>> = HashMap::new();
    for _ in 0..a.repeat {
        // One writer, one flush at a time: tens of thousands a second at most.
        prepare_log(&path, kind, prealloc_bytes(50_000.0, a, dir))?;
        let floor = wal_floor(&path, a)?;
        floors.push(floor);
        // Pages of 4 KiB each flusher cycles through on a preallocated log.
        const WRAP: u64 = 1024;
        let stride = (HEADER as u64 + a.record_bytes).next_multiple_of(4096);
        prepare_log(&path, kind, WRAP * FLUSHERS as u64 * stride)?;
        let wrap = (kind == LogKind::Preallocated).then_some(WRAP);
        concurrent.push(wal_flushers(&path, a, FLUSHERS, wrap)? / (1e6 / floor.0.max(1.0)));
        let rate = (a.wal_writers as f64 / (floor.0.max(1.0) / 1e6)).min(MAX_PREALLOC_RATE);
        let bytes = prealloc_bytes(rate, a, dir);
        for &e in &engines {
            prepare_log(&path, kind, bytes)?;
            let out = match e {
                WalEngine::Threads => wal_threads(&path, a)?,
                // Verified by its own recovery (its own framing).
                WalEngine::AppendLog => wal_append_log(&path, a, false)?,
                WalEngine::AppendLogDirect => wal_append_log(&path, a, true)?,
                e => wal_async(e, &path, a)?,
            };
            if !matches!(e, WalEngine::AppendLog | WalEngine::AppendLogDirect) {
                verify_log(&path, &out.acked, a.record_bytes as usize)?;
            }
            if let Some(c) = out.per_write_sync {
                coalescing.entry(engine_name(e)).or_default().push(c);
            }
            if kind == LogKind::Preallocated
                && std::fs::metadata(&path).map_err(|e| e.to_string())?.len() > bytes
            {
                overflowed += 1;
            }
            let q = |p: f64| out.hist.value_at_quantile(p) as f64 / 1000.0;
            rows.entry(engine_name(e)).or_default().push((
                out.commits_per_sec,
                out.groups as f64 / a.secs,
                q(0.5),
                q(0.99),
                q(0.999),
            ));
        }
    }
    let mut med = HashMap::new();
    for name in [
        "uring",
        "uring-serial",
        "uring-dsync",
        "tokio-fs",
        "threads",
        "no-backend",
        "no-backend-dsync",
        "append-log",
        "append-log-direct",
    ] {
        let Some(r) = rows.get(name) else {
            println!("{name:>17}  n/a: this file system refuses O_DIRECT");
            continue;
        };
        let m = |f: fn(&Row) -> f64| median(r.iter().map(f).collect());
        let row = (m(|x| x.0), m(|x| x.1), m(|x| x.2), m(|x| x.3), m(|x| x.4));
        println!(
            "{name:>17} {:>11.0} {:>9.0} {:>10.0} {:>10.0} {:>10.0}  {}",
            row.0,
            row.1,
            row.2,
            row.3,
            row.4,
            loadavg()
        );
        med.insert(name, row);
    }
    let floor_p50 = median(floors.iter().map(|f| f.0).collect());
    let floor_p99 = median(floors.iter().map(|f| f.1).collect());
    let ceiling = a.wal_writers as f64 / (floor_p50 / 1e6);
    println!(
        "{:>17} {:>11.0} {:>9} {:>10.0} {:>10.0} {:>10}  (one writer: one record + fdatasync at a time)",
        "flush floor", "-", "-", floor_p50, floor_p99, "-"
    );
    println!(
        "ceiling: {} closed-loop writers / {floor_p50:.0} µs per flush = {ceiling:.0} commits/s for any engine",
        a.wal_writers
    );
    for name in [
        "uring",
        "uring-serial",
        "uring-dsync",
        "tokio-fs",
        "threads",
        "no-backend",
        "no-backend-dsync",
        "append-log",
        "append-log-direct",
    ] {
        let Some(row) = med.get(name) else { continue };
        println!("  {name}: {:.2} of the ceiling", row.0 / ceiling.max(1e-9));
    }
    let (t, th) = (med["tokio-fs"], med["threads"]);
    for name in [
        "uring",
        "uring-serial",
        "uring-dsync",
        "append-log",
        "append-log-direct",
    ] {
        let Some(&u) = med.get(name) else { continue };
        println!(
            "ratios {name}: commits/s vs tokio-fs {:.2}, vs threads {:.2}; p99 vs tokio-fs {:.2}, vs threads {:.2}",
            u.0 / t.0,
            u.0 / th.0,
            u.3 / t.3,
            u.3 / th.3
        );
    }
    if overflowed > 0 {
        println!("({overflowed} runs wrote past the preallocated size and appended the rest)");
    }
    let nb = med["no-backend"];
    for name in ["append-log", "append-log-direct"] {
        if let Some(al) = med.get(name) {
            print!(
                "{name} (the crate's AppendLog): {:.2}x the no-backend reference",
                al.0 / nb.0
            );
            if let Some(nd) = med.get("no-backend-dsync") {
                print!(", {:.2}x no-backend-dsync", al.0 / nd.0);
            }
            println!();
        }
    }
    for name in ["append-log", "append-log-direct"] {
        let Some(c) = coalescing.get(name) else {
            continue;
        };
        println!(
            "{name}: {:.1} records per write, {:.1} per commit (fdatasync or durable write; its stats)",
            median(c.iter().map(|c| c.0).collect()),
            median(c.iter().map(|c| c.1).collect())
        );
    }
    println!(
        "reference, the serial group commit with no I/O backend cost (the committer blocking in pwrite + fdatasync): {:.2}x tokio-fs",
        nb.0 / t.0
    );
    println!(
        "do flushes overlap? {FLUSHERS} threads each writing a record + fdatasync at once: {:.2}x the flushes/s of one",
        median(concurrent)
    );
    println!("(every acknowledged record verified after each run)");
    std::fs::remove_file(&path).ok();
    Ok(())
}

fn engine_name(e: WalEngine) -> &'static str {
    match e {
        WalEngine::UringPipelined => "uring",
        WalEngine::Uring => "uring-serial",
        WalEngine::TokioFs => "tokio-fs",
        WalEngine::Threads => "threads",
        WalEngine::UringDsync => "uring-dsync",
        WalEngine::Blocking => "no-backend",
        WalEngine::BlockingDsync => "no-backend-dsync",
        WalEngine::AppendLog => "append-log",
        WalEngine::AppendLogDirect => "append-log-direct",
    }
}

pub fn run(a: &WriteArgs) -> Result<bool, String> {
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    let dir: PathBuf = a.dir.clone();
    let mut ok = true;
    for part in &a.parts {
        ok &= match part {
            Part::Randwrite => randwrite(a, &dir)?,
            Part::Seqwrite => seqwrite(a, &dir)?,
            Part::Wal => wal(a, &dir)?,
        };
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with(records: &[(u64, u64)], zeroes: usize) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.log");
        let (mut seq, mut buf) = (0u64, Vec::new());
        encode_group(records, &mut seq, 32, &mut buf);
        buf.extend(std::iter::repeat_n(0u8, zeroes));
        std::fs::write(&path, &buf).unwrap();
        (dir, path)
    }

    #[test]
    fn a_preallocated_log_ends_at_its_zeroes() {
        // Nothing written yet: all zeroes is an empty log, not a record.
        let (_d, path) = log_with(&[], 1 << 16);
        assert_eq!(verify_log(&path, &[], 32), Ok(0));
        assert!(verify_log(&path, &[(0, 0)], 32).is_err());
        // Records, then the zeroed rest.
        let (_d, path) = log_with(&[(1, 0), (2, 0), (1, 1)], 1 << 16);
        assert_eq!(verify_log(&path, &[(1, 0), (2, 0), (1, 1)], 32), Ok(3));
        assert!(verify_log(&path, &[(2, 1)], 32).is_err());
    }

    #[test]
    fn preallocation_is_bounded() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let args = |extra: &[&str]| {
            let mut v = vec!["uring-bench", "write"];
            v.extend_from_slice(extra);
            match crate::cli::Args::parse_from(v).mode {
                Some(crate::cli::Mode::Write(w)) => w,
                _ => unreachable!(),
            }
        };
        // Small records: the run's records and some, at least 8 MiB.
        let a = args(&["-t", "1"]);
        let b = prealloc_bytes(100_000.0, &a, dir.path());
        assert!(b >= 100_000 * 144 * 3 / 2 && b % (1 << 20) == 0, "{b}");
        assert_eq!(prealloc_bytes(1.0, &a, dir.path()), 8 << 20);
        // Megabyte records at the floor's 50 k/s would be 60+ GB: capped
        // (this was ENOSPC).
        let a = args(&["--record-bytes", "1048576"]);
        let b = prealloc_bytes(50_000.0, &a, dir.path());
        assert!(b <= MAX_PREALLOC, "{b}");
        assert!(b <= free_bytes(dir.path()).unwrap() / 4, "{b}");
    }

    #[test]
    fn prepared_logs_have_the_asked_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.log");
        prepare_log(&path, LogKind::Preallocated, 3 << 20).unwrap();
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len(), 3 << 20);
        assert!(data.iter().all(|&b| b == 0));
        prepare_log(&path, LogKind::Append, 3 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }
}
