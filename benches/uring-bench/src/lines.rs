//! `uring-bench lines`: the study "Towards Fast IO on Linux using Rust"
//! (counting the lines of a large text file) as a benchmark mode, every
//! method implemented the study's way, plus this crate's scan, `wc -l` and
//! fio's sequential read (the device ceiling), cold and hot.
//!
//! Every method must return the file's known line count (from the manifest
//! written when the file was made); a mismatch fails the run. Cache
//! treatment happens outside the timed window: `cold` evicts the file
//! (fsync + POSIX_FADV_DONTNEED) before each method, `hot` reads it fully
//! before each method. Each method runs `--repeat` times per regime,
//! interleaved with the others; the median wall time is reported.

use crate::cli::LinesArgs;
use futures::StreamExt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use uring_positioned_io::{AlignedBuf, ScanOptions, UringContext};

/// The study's BUFFER_SIZE and NUM_BUFFERS.
const BUFFER_SIZE: usize = 8192;
const NUM_BUFFERS: usize = 32;
/// The reference row: two threads that copy and count by hand
/// (`two_threads.rs`), what a copying reader can do on two CPUs.
const TWO_THREADS: &str = "2 threads: pread + memchr (reference)";

#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq, Clone)]
struct Manifest {
    version: u32,
    size: u64,
    seed: u64,
    lines: u64,
}

/// Deterministic text: ASCII lines of 0..=160 characters.
fn generate(path: &Path, size: u64, seed: u64) -> io::Result<u64> {
    let mut out = io::BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (mut written, mut lines) = (0u64, 0u64);
    let mut line = Vec::with_capacity(256);
    while written < size {
        let r = next();
        // The last line is cut to fit, and still ends with a newline.
        let len = ((r % 161) as usize).min((size - written - 1) as usize);
        line.clear();
        for i in 0..len {
            line.push(b' ' + ((r >> (i % 56)) as u8 ^ i as u8) % 95);
        }
        line.push(b'\n');
        out.write_all(&line)?;
        lines += 1;
        written += line.len() as u64;
    }
    out.into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .sync_all()?;
    Ok(lines)
}

/// Makes or reuses `lines-<size>.txt` in `dir`; returns its path and line count.
fn ensure(dir: &Path, size: u64, seed: u64) -> Result<(PathBuf, u64), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let path = dir.join(format!("lines-{size}.txt"));
    let mpath = dir.join(format!("lines-{size}.json"));
    if let (Ok(text), Ok(meta)) = (std::fs::read_to_string(&mpath), std::fs::metadata(&path)) {
        if let Ok(m) = serde_json::from_str::<Manifest>(&text) {
            if m.size == size && m.seed == seed && m.version == 2 && meta.len() == size {
                return Ok((path, m.lines));
            }
        }
    }
    let free = crate::dataset::free_space(dir).map_err(|e| format!("statvfs: {e}"))?;
    if free < size + (1 << 30) {
        return Err(format!(
            "{} has {:.1} GiB free; a {:.1} GiB file needs that plus 1 GiB",
            dir.display(),
            crate::dataset::gib(free),
            crate::dataset::gib(size)
        ));
    }
    println!(
        "making {} ({:.2} GiB)",
        path.display(),
        crate::dataset::gib(size)
    );
    let lines =
        generate(&path, size, seed).map_err(|e| format!("write {}: {e}", path.display()))?;
    let m = Manifest {
        version: 2,
        size,
        seed,
        lines,
    };
    std::fs::write(&mpath, serde_json::to_string_pretty(&m).expect("manifest"))
        .map_err(|e| format!("write {}: {e}", mpath.display()))?;
    Ok((path, lines))
}

/// fsync + POSIX_FADV_DONTNEED (as the dataset code does).
fn evict(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    f.sync_all()?;
    // SAFETY: valid fd for the duration of the call.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// The hot regime's page cache, made the same way for every run: evicted,
/// then read once from start to end in 1 MiB reads. What fills the cache
/// decides its folio sizes, and they decide the hot figures: the kernel's
/// readahead builds up to 2 MiB folios, which `mmap` maps a few hundred
/// faults apiece, while a cache filled by small random reads holds 4 KiB
/// folios, and every method slows down 1.7–4.5× (BENCHMARKS, "Counting
/// lines"). Left to chance, it depended on which methods ran before (fio's
/// O_DIRECT read used to evict the file). Returns MiB of the file's cache in
/// 2 MiB folios, as far as `/proc/meminfo` tells.
fn make_hot(path: &Path) -> io::Result<Option<u64>> {
    evict(path)?;
    // Page cache in PMD-sized (2 MiB) folios, system-wide, in kB.
    let huge = || crate::machine::meminfo_field("FileHugePages:");
    let before = huge();
    warm(path)?;
    Ok(before.zip(huge()).map(|(b, a)| a.saturating_sub(b) / 1024))
}

fn warm(path: &Path) -> io::Result<()> {
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

fn naive(b: &[u8]) -> u64 {
    b.iter().filter(|&&c| c == b'\n').count() as u64
}

fn simd(b: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', b).count() as u64
}

/// The study's hand-written AVX2 loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2(b: &[u8]) -> u64 {
    use std::arch::x86_64::{
        __m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_set1_epi8,
    };
    let nl = _mm256_set1_epi8(b'\n' as i8);
    let mut count = 0u64;
    let mut chunks = b.chunks_exact(32);
    for c in &mut chunks {
        // SAFETY: `c` is 32 readable bytes; loadu has no alignment need.
        let v = unsafe { _mm256_loadu_si256(c.as_ptr().cast::<__m256i>()) };
        count += u64::from(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, nl)).count_ones());
    }
    count + naive(chunks.remainder())
}

/// What a method returns: the line count and the reads (syscalls or SQEs)
/// it issued, where it knows.
type Counted = (u64, Option<u64>);

/// The study's methods, in its order.
fn bufreader_lines(p: &Path) -> io::Result<Counted> {
    let r = BufReader::with_capacity(16 * 1024, File::open(p)?);
    Ok((r.lines().count() as u64, None))
}

fn bufreader_fill_buf(p: &Path) -> io::Result<Counted> {
    let mut r = BufReader::with_capacity(64 * 1024, File::open(p)?);
    let (mut n, mut reads) = (0, 0);
    loop {
        let len = {
            let b = r.fill_buf()?;
            reads += 1;
            if b.is_empty() {
                break;
            }
            n += naive(b);
            b.len()
        };
        r.consume(len);
    }
    Ok((n, Some(reads)))
}

fn direct_io(p: &Path) -> io::Result<Counted> {
    let mut f = open_direct(p)?;
    // The study used a Vec; O_DIRECT needs an aligned buffer.
    let mut buf = AlignedBuf::new(BUFFER_SIZE, 4096);
    let (mut n, mut reads) = (0, 0);
    loop {
        let got = f.read(&mut buf)?;
        reads += 1;
        if got == 0 {
            break;
        }
        n += naive(&buf[..got]);
    }
    Ok((n, Some(reads)))
}

fn map(p: &Path) -> io::Result<memmap2::Mmap> {
    let f = File::open(p)?;
    // SAFETY: the benchmark's file is not modified while mapped.
    unsafe { memmap2::Mmap::map(&f) }
}

fn mmap_naive(p: &Path) -> io::Result<Counted> {
    Ok((naive(&map(p)?), None))
}

fn mmap_avx2(p: &Path) -> io::Result<Counted> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        let m = map(p)?;
        // SAFETY: AVX2 was detected on this CPU.
        return Ok((unsafe { avx2(&m) }, None));
    }
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no AVX2 on this CPU",
    ))
}

fn mmap_simd(p: &Path) -> io::Result<Counted> {
    Ok((simd(&map(p)?), None))
}

fn vectored(p: &Path) -> io::Result<Counted> {
    let mut f = File::open(p)?;
    let mut bufs: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; BUFFER_SIZE]).collect();
    let (mut n, mut reads) = (0, 0);
    loop {
        let mut iov: Vec<io::IoSliceMut<'_>> =
            bufs.iter_mut().map(|b| io::IoSliceMut::new(b)).collect();
        let got = f.read_vectored(&mut iov)?;
        reads += 1;
        if got == 0 {
            break;
        }
        n += count_filled(&bufs, got);
    }
    Ok((n, Some(reads)))
}

/// Submits one read SQE and waits for it: the study's io_uring loop, one
/// read in flight. Returns the bytes read.
///
/// # Safety
///
/// Every buffer the SQE points to must stay valid until this returns.
unsafe fn read_one(
    ring: &mut io_uring::IoUring,
    sqe: &io_uring::squeue::Entry,
) -> io::Result<usize> {
    // SAFETY: the caller keeps the SQE's buffers valid until we return, and
    // we return only after its completion.
    unsafe { ring.submission().push(sqe) }.map_err(io::Error::other)?;
    ring.submit_and_wait(1)?;
    let cqe = ring.completion().next().expect("a completion");
    usize::try_from(cqe.result()).map_err(|_| io::Error::from_raw_os_error(-cqe.result()))
}

/// Lines in the first `got` bytes of `bufs`, filled in order by one
/// vectored read.
fn count_filled(bufs: &[Vec<u8>], got: usize) -> u64 {
    let mut left = got;
    let mut n = 0;
    for b in bufs {
        if left == 0 {
            break;
        }
        let take = left.min(b.len());
        n += naive(&b[..take]);
        left -= take;
    }
    n
}

fn uring_one(p: &Path) -> io::Result<Counted> {
    use io_uring::{opcode, types, IoUring};
    let f = File::open(p)?;
    let mut ring = IoUring::new(8)?;
    let mut buf = vec![0u8; 4096];
    let (mut n, mut reads, mut off) = (0, 0, 0u64);
    loop {
        let sqe = opcode::Read::new(types::Fd(f.as_raw_fd()), buf.as_mut_ptr(), buf.len() as u32)
            .offset(off)
            .build();
        // SAFETY: `buf` outlives the call, which waits for the read.
        let got = unsafe { read_one(&mut ring, &sqe) }?;
        reads += 1;
        if got == 0 {
            break;
        }
        n += naive(&buf[..got]);
        off += got as u64;
    }
    Ok((n, Some(reads)))
}

fn uring_vectored(p: &Path) -> io::Result<Counted> {
    use io_uring::{opcode, types, IoUring};
    let f = File::open(p)?;
    let mut ring = IoUring::new(NUM_BUFFERS as u32)?;
    let mut bufs = vec![vec![0u8; BUFFER_SIZE]; NUM_BUFFERS];
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let (mut n, mut reads, mut off) = (0, 0, 0u64);
    loop {
        let sqe = opcode::Readv::new(types::Fd(f.as_raw_fd()), iov.as_ptr(), iov.len() as u32)
            .offset(off)
            .build();
        // SAFETY: the iovecs and buffers outlive the call, which waits for the read.
        let got = unsafe { read_one(&mut ring, &sqe) }?;
        reads += 1;
        if got == 0 {
            break;
        }
        n += count_filled(&bufs, got);
        off += got as u64;
    }
    Ok((n, Some(reads)))
}

/// This crate's scan: `depth` chunks in flight (the scan's default size),
/// counted with the same SIMD count as `mmap + memchr`, by `block_on`'s
/// thread or (`task`) by a spawned task on a runtime worker. Timed from the
/// first poll of the scan to its end: making the runtime and the
/// `UringContext` (11–13 ms here, mostly registering the rings' bounce
/// buffers: a cost an application pays once, not per scan) stays outside,
/// as fio's reported runtime leaves out fio's own setup.
fn scan(p: &Path, direct: bool, depth: usize, task: bool) -> io::Result<Measured> {
    let file = if direct {
        open_direct(p)?
    } else {
        File::open(p)?
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let run = async move {
        let ctx = UringContext::new(vec![file])?;
        let c0 = rusage(libc::RUSAGE_SELF);
        let t = Instant::now();
        // Default chunks: 1 MiB buffered, 2 MiB (huge-page buffers) O_DIRECT.
        let mut s = ScanOptions::new().in_flight(depth).scan(&ctx, 0u32, ..)?;
        let mut n = 0;
        while let Some(c) = s.next().await {
            n += simd(&c?);
        }
        drop(s);
        let wall = t.elapsed().as_secs_f64();
        let cpu = rusage(libc::RUSAGE_SELF) - c0;
        let st = ctx.stats();
        Ok((wall, cpu, Some(st.submitted + st.inline_completed), n))
    };
    if task {
        rt.block_on(async move { tokio::spawn(run).await.map_err(io::Error::other)? })
    } else {
        rt.block_on(run)
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    method: String,
    regime: &'static str,
    /// Median wall seconds, or None when not run (with `note`).
    secs: Option<f64>,
    all_secs: Vec<f64>,
    gb_per_s: Option<f64>,
    vs_wc: Option<f64>,
    vs_fio: Option<f64>,
    cpu_secs: Option<f64>,
    reads: Option<u64>,
    note: Option<String>,
}

fn rusage(who: i32) -> f64 {
    // SAFETY: getrusage writes only into the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `who` is RUSAGE_SELF or RUSAGE_CHILDREN.
    unsafe { libc::getrusage(who, &raw mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// One timed run: (wall secs, cpu secs, reads, count).
type Measured = (f64, f64, Option<u64>, u64);

fn external(cmd: &mut Command) -> Result<(f64, f64, String), String> {
    let c0 = rusage(libc::RUSAGE_CHILDREN);
    let t = Instant::now();
    let o = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let wall = t.elapsed().as_secs_f64();
    if !o.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok((
        wall,
        rusage(libc::RUSAGE_CHILDREN) - c0,
        String::from_utf8_lossy(&o.stdout).into_owned(),
    ))
}

fn wc(p: &Path) -> Result<Measured, String> {
    let (wall, cpu, out) = external(Command::new("wc").arg("-l").arg(p))?;
    let n = out
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("wc -l printed {out:?}"))?;
    Ok((wall, cpu, None, n))
}

/// fio's sequential read — O_DIRECT with 16 × 1 MiB in flight on
/// io_uring, or buffered with 1 MiB `read`s (`psync`; the kernel's
/// readahead keeps the device busy): wall time of the read itself
/// (fio's runtime), its CPU (children), and its I/O count.
fn fio(fio: &Path, p: &Path, size: u64, direct: bool, huge: bool) -> Result<Measured, String> {
    let how: &[&str] = if direct && huge {
        &[
            "--ioengine=io_uring",
            "--iodepth=16",
            "--direct=1",
            "--mem=shmhuge",
            "--invalidate=0",
        ]
    } else if direct {
        &[
            "--ioengine=io_uring",
            "--iodepth=16",
            "--direct=1",
            "--invalidate=0",
        ]
    } else {
        &["--ioengine=psync", "--direct=0", "--invalidate=0"]
    };
    let (_, cpu, out) = external(
        Command::new(fio)
            .args(["--name=seq", "--rw=read", "--bs=1M", "--output-format=json"])
            .args(how)
            .arg(format!("--filename={}", p.display()))
            .arg(format!("--size={size}")),
    )?;
    let v: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap_or(0)..])
        .map_err(|e| format!("fio json: {e}"))?;
    let read = &v["jobs"][0]["read"];
    let ms = read["runtime"].as_f64().unwrap_or(0.0);
    let ios = read["total_ios"].as_u64();
    let bytes = read["io_bytes"].as_u64().unwrap_or(0);
    if bytes != size || ms <= 0.0 {
        return Err(format!("fio read {bytes} of {size} bytes in {ms} ms"));
    }
    Ok((ms / 1000.0, cpu, ios, 0))
}

enum Method {
    InProc(fn(&Path) -> io::Result<Counted>),
    Scan {
        direct: bool,
        depth: usize,
        /// The consumer is a spawned task (on a runtime worker), not
        /// `block_on`'s thread.
        task: bool,
    },
    Wc,
    Fio {
        direct: bool,
    },
}

fn methods() -> Vec<(String, Method)> {
    let mut m: Vec<(String, Method)> = vec![
        (
            "BufReader lines().count()".into(),
            Method::InProc(bufreader_lines),
        ),
        (
            "BufReader fill_buf".into(),
            Method::InProc(bufreader_fill_buf),
        ),
        ("O_DIRECT read loop".into(), Method::InProc(direct_io)),
        ("mmap naive".into(), Method::InProc(mmap_naive)),
        ("mmap + AVX2".into(), Method::InProc(mmap_avx2)),
        ("mmap + memchr".into(), Method::InProc(mmap_simd)),
        ("vectored read (16 x 8K)".into(), Method::InProc(vectored)),
        ("io_uring, 1 in flight".into(), Method::InProc(uring_one)),
        (
            "io_uring readv, 1 in flight".into(),
            Method::InProc(uring_vectored),
        ),
    ];
    for direct in [false, true] {
        for depth in [1, 4, 8, 16] {
            let kind = if direct { "O_DIRECT" } else { "buffered" };
            m.push((
                format!("scan {kind} depth {depth}"),
                Method::Scan {
                    direct,
                    depth,
                    task: false,
                },
            ));
        }
    }
    m.push((
        "scan buffered depth 8, consumer a task".into(),
        Method::Scan {
            direct: false,
            depth: 8,
            task: true,
        },
    ));
    m.push((
        TWO_THREADS.into(),
        Method::InProc(|p| crate::two_threads::count(p, simd)),
    ));
    m.push(("wc -l".into(), Method::Wc));
    m.push((
        "fio seq read (direct, QD16)".into(),
        Method::Fio { direct: true },
    ));
    m.push((
        "fio seq read (buffered, 1M reads)".into(),
        Method::Fio { direct: false },
    ));
    m
}

/// Rounds of fio's O_DIRECT read that found the reserved huge pages gone
/// and ran on 4 KiB pages (see `run_one`); the report says how many.
static HUGE_PAGES_LOST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn run_one(a: &LinesArgs, p: &Path, size: u64, m: &Method, huge: bool) -> Result<Measured, String> {
    let inproc = |f: &dyn Fn() -> io::Result<Counted>| -> Result<Measured, String> {
        let c0 = rusage(libc::RUSAGE_SELF);
        let t = Instant::now();
        let (n, reads) = f().map_err(|e| e.to_string())?;
        let wall = t.elapsed().as_secs_f64();
        Ok((wall, rusage(libc::RUSAGE_SELF) - c0, reads, n))
    };
    match m {
        Method::InProc(f) => inproc(&|| f(p)),
        &Method::Scan {
            direct,
            depth,
            task,
        } => scan(p, direct, depth, task).map_err(|e| e.to_string()),
        Method::Wc => wc(p),
        &Method::Fio { direct } => match fio(&a.fio, p, size, direct, huge) {
            // Huge pages are the machine's, not the run's: another process
            // (a second bench, fio, a database) can hold or release them
            // between the reservation and fio's start. The round is then
            // measured on 4 KiB pages, and says so, rather than failing the
            // whole run.
            Err(e) if direct && huge && e.contains("huge pages") => {
                eprintln!(
                    "warning: fio found no free huge pages (taken by another process since the run \
                     reserved them); this round of fio's O_DIRECT read uses 4 KiB pages, \
                     which is slower on disks that pay per segment"
                );
                HUGE_PAGES_LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                fio(&a.fio, p, size, direct, false)
            }
            r => r,
        },
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

pub fn run(a: &LinesArgs) -> Result<bool, String> {
    let (path, lines) = ensure(&a.data_dir, a.size, a.seed)?;
    let size = a.size;
    let avx512 = cfg!(target_arch = "x86_64") && {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    };
    let fio_ok = Command::new(&a.fio).arg("--version").output().is_ok();
    let all = methods();
    let selected: Vec<&(String, Method)> = all
        .iter()
        .filter(|(name, _)| a.only.is_empty() || a.only.iter().any(|o| name.contains(o.as_str())))
        .filter(|(name, _)| !(a.skip_slow && name.starts_with("BufReader lines")))
        .collect();
    println!(
        "{}: {:.2} GiB, {lines} lines; {} round(s) per regime; median wall time",
        path.display(),
        crate::dataset::gib(size),
        a.repeat
    );
    let huge = if fio_ok
        && selected
            .iter()
            .any(|(n, _)| n.starts_with("fio seq read (direct"))
    {
        crate::machine::HugePages::reserve()
    } else {
        Err("not needed".into())
    };
    let fio_buffers = match &huge {
        Ok(_) => "fio's O_DIRECT buffers: huge pages (`--mem=shmhuge`).".to_string(),
        Err(why) => format!("fio's O_DIRECT buffers: 4 KiB pages (huge pages unavailable: {why})."),
    };
    println!("{fio_buffers}");
    let mut rows = Vec::new();
    let mut ok = true;
    let mut hot_state = None;
    for regime in &a.regimes {
        let regime = regime.name();
        if regime == "hot" {
            let huge = make_hot(&path).map_err(|e| format!("warm: {e}"))?;
            let said = match huge {
                Some(mib) => format!(
                    "hot: the file was evicted, then read once in 1 MiB reads; {mib} MiB of its {} MiB page cache is in 2 MiB folios.",
                    size >> 20
                ),
                None => "hot: the file was evicted, then read once in 1 MiB reads.".to_string(),
            };
            println!("{said}");
            hot_state = Some(said);
        }
        let mut times: Vec<Vec<Measured>> = vec![Vec::new(); selected.len()];
        let mut notes: Vec<Option<String>> = vec![None; selected.len()];
        for round in 0..a.repeat {
            for (i, (name, m)) in selected.iter().enumerate() {
                if notes[i].is_some() {
                    continue;
                }
                if matches!(m, Method::Fio { .. }) && !fio_ok {
                    notes[i] = Some(format!("fio not found ({})", a.fio.display()));
                    continue;
                }
                if name == "mmap + AVX2" && !cfg!(target_arch = "x86_64") {
                    notes[i] = Some("not x86_64".into());
                    continue;
                }
                match regime {
                    "cold" => evict(&path).map_err(|e| format!("evict: {e}"))?,
                    _ => warm(&path).map_err(|e| format!("warm: {e}"))?,
                }
                match run_one(a, &path, size, m, huge.is_ok()) {
                    Ok(meas) => {
                        if !matches!(m, Method::Fio { .. }) && meas.3 != lines {
                            eprintln!(
                                "MISMATCH: {name} ({regime}) counted {} lines, the file has {lines}",
                                meas.3
                            );
                            ok = false;
                        }
                        if !a.quiet {
                            eprintln!("  {regime} round {round}: {name:<30} {:>8.3} s", meas.0);
                        }
                        times[i].push(meas);
                    }
                    Err(e) if e.contains("no AVX2") => notes[i] = Some(e),
                    Err(e) => return Err(format!("{name} ({regime}): {e}")),
                }
            }
        }
        let med = |i: usize| -> Option<f64> {
            (!times[i].is_empty())
                .then(|| median(&times[i].iter().map(|t| t.0).collect::<Vec<_>>()))
        };
        let find = |pre: &str| {
            selected
                .iter()
                .position(|(n, _)| n.starts_with(pre))
                .and_then(med)
        };
        // The ceiling is the faster of fio's two sequential reads.
        let fio_s = selected
            .iter()
            .enumerate()
            .filter(|(_, (n, _))| n.starts_with("fio"))
            .filter_map(|(i, _)| med(i))
            .reduce(f64::min);
        let wc_s = find("wc -l");
        for (i, (name, _)) in selected.iter().enumerate() {
            let secs = med(i);
            // The run whose wall time is the median gives CPU and reads.
            let at = secs.and_then(|s| times[i].iter().find(|t| t.0 == s));
            rows.push(Row {
                method: name.clone(),
                regime,
                secs,
                all_secs: times[i].iter().map(|t| t.0).collect(),
                gb_per_s: secs.map(|s| size as f64 / s / 1e9),
                vs_wc: secs.zip(wc_s).map(|(s, w)| w / s),
                vs_fio: secs.zip(fio_s).map(|(s, f)| f / s),
                cpu_secs: at.map(|t| t.1),
                reads: at.and_then(|t| t.2),
                note: notes[i].clone(),
            });
        }
        if selected.iter().any(|(n, _)| n == "mmap + AVX2") {
            rows.push(Row {
                method: "mmap + AVX-512".into(),
                regime,
                secs: None,
                all_secs: vec![],
                gb_per_s: None,
                vs_wc: None,
                vs_fio: None,
                cpu_secs: None,
                reads: None,
                note: Some(if avx512 {
                    "n/a: not implemented (the bench's MSRV 1.85 predates stable AVX-512 intrinsics)".into()
                } else {
                    "n/a: this CPU has no AVX-512".into()
                }),
            });
        }
    }
    drop(huge);
    let lost = HUGE_PAGES_LOST.load(std::sync::atomic::Ordering::Relaxed);
    let fio_buffers = if lost > 0 {
        format!(
            "{fio_buffers} In {lost} round(s) another process had taken them and fio read into 4 KiB pages."
        )
    } else {
        fio_buffers
    };
    let notes = match &hot_state {
        Some(h) => format!("{fio_buffers} {h}"),
        None => fio_buffers.clone(),
    };
    let table = render(&rows, &path, size, lines, &notes);
    println!("{table}");
    let (_, stamp) = crate::machine::utc_now();
    let dir = a.output_dir.join(format!("lines-{stamp}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let json = serde_json::json!({
        "file": path, "size": size, "lines": lines, "repeat": a.repeat,
        "cpu": crate::machine::cpu_model(), "kernel": crate::machine::kernel(), "commit": crate::machine::git_commit(),
        "loadavg": crate::machine::loadavg(), "fio_buffers": fio_buffers, "hot_cache": hot_state,
        "rows": rows,
    });
    std::fs::write(
        dir.join("lines.json"),
        serde_json::to_string_pretty(&json).expect("json"),
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(dir.join("lines.md"), &table).map_err(|e| e.to_string())?;
    if !a.no_charts {
        for regime in &a.regimes {
            let name = format!("lines-{}.svg", regime.name());
            crate::charts::bars(
                &rows_for(&rows, regime.name()),
                &dir.join(&name),
                regime.name(),
            )?;
        }
    }
    println!("results in {}", dir.display());
    Ok(ok)
}

fn rows_for(rows: &[Row], regime: &str) -> Vec<(String, f64)> {
    rows.iter()
        .filter(|r| r.regime == regime)
        .filter_map(|r| r.gb_per_s.map(|g| (r.method.clone(), g)))
        .collect()
}

fn render(rows: &[Row], path: &Path, size: u64, lines: u64, fio_buffers: &str) -> String {
    let mut s = format!(
        "Counting the lines of {} ({:.2} GiB, {lines} lines); {}; kernel {}\n\
         × fio: against the faster of fio's two sequential reads in the same regime. {fio_buffers}\n",
        path.display(),
        crate::dataset::gib(size),
        crate::machine::cpu_model(),
        crate::machine::kernel()
    );
    let f = |v: Option<f64>, p: usize| v.map_or("-".into(), |v| format!("{v:.p$}"));
    let mut regime = "";
    for r in rows {
        if r.regime != regime {
            regime = r.regime;
            s += &format!(
                "\n#### {regime}\n\n| Method | Time (seconds) | GB/s | × wc -l | × fio | CPU s | reads |\n|---|---:|---:|---:|---:|---:|---:|\n"
            );
        }
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.method,
            r.secs
                .map_or_else(|| r.note.clone().unwrap_or_default(), |v| format!("{v:.3}")),
            f(r.gb_per_s, 2),
            f(r.vs_wc, 2),
            f(r.vs_fio, 2),
            f(r.cpu_secs, 2),
            r.reads.map_or("-".into(), |n| n.to_string()),
        );
    }
    s
}
