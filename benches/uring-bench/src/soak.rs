//! `uring-bench soak`: the block cache and the context under hostile use,
//! in rounds of random settings, every byte checked, with a watchdog.
//!
//! Each round builds a context and a `BlockCache` with settings drawn from
//! the round's seed (backend, runtime workers, rings, ring size, in-flight
//! slots, the inline path, block size, a cache of 1 to 7 blocks or of 64,
//! read-only files `O_DIRECT` or buffered) and runs 2 to 6 tasks for a few
//! milliseconds. Each task loops on random operations:
//! - `get`, `read`, `get_many` and `prefetch` of fixed read-only files
//!   (sizes not a multiple of the block, one empty), of files the first
//!   task registers and unregisters meanwhile, and of a file on a FUSE
//!   file system the soak mounts when it may (`flaky_fs`: a read touching
//!   a flaky sector fails with `EIO` one time in two); every byte is
//!   checked against the file's pattern. A stale id's error
//!   (`InvalidInput`, or `EBADF` for a read that had not reached the
//!   kernel) is accepted only from the files being unregistered, an `EIO`
//!   only where the read touched a flaky sector;
//! - `invalidate` of random ranges;
//! - writes and hole punches through the context in the task's own range
//!   of a writable file, and reads of that range through the cache, which
//!   must return what the last completed write or punch left (no stale
//!   byte), through the file's registration or through a second,
//!   read-only registration of the same file (`O_DIRECT` in a direct
//!   round); other tasks read any range of that file meanwhile, unchecked,
//!   to race their misses with the writes;
//! - reads of the same files through the context itself: borrowed,
//!   owned (`read_owned`, `read_owned_static`) and batched (`read_batch`),
//!   into buffers whose `Drop` calls back into the crate (the context's
//!   stats and `{:#?}`, an invalidation of the cache), wherever they are
//!   dropped: by the task, or by a ring's driver or a pool thread after
//!   their future was given up, perhaps holding the last context handle;
//! - a quarter of the reads given up after 0 to 200 µs (their futures
//!   dropped mid-flight, some after their first poll);
//! - blocks handed to a holder thread that keeps them for a while, checks
//!   them again and drops them there, outliving the round's cache, context
//!   and runtime.
//!
//! A round ends by stopping its tasks, or (one in eight) by dropping the
//! runtime under them; then the cache and the context are dropped in a
//! random order. After a round that ended normally, once the holder has let
//! go of its blocks, the cache must pin nothing, and its in-flight bytes and
//! the context's ops in flight must reach zero within seconds; after the
//! last round, no file of the soak may be open in the process.
//!
//! A task that completes no operation for `--stall-secs` is a hang: the
//! soak prints the round's settings, each task's current operation, the
//! cache's counters and the context's `{:#?}` (every ring's queues, driver
//! flags and in-flight slots) and fails. A thread stuck outside the runtime
//! (a deadlock, a drop that never returns) is caught by a second watchdog,
//! a plain thread, which prints what it can and exits with status 3.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use uring_positioned_io::{
    os_error, AlignedBuf, BackendChoice, BlockCache, BlockRef, CacheOptions, FallocateMode, FileId,
    IoBufMut, UringContext,
};

use crate::cli::SoakArgs;
use crate::flaky_fs;

/// The fixed read-only files: (salt, size). Sizes that are not a multiple
/// of any block size, one empty file, one of exactly 4 blocks of 4 KiB.
const FIXED: [(u64, u64); 4] = [(1, 70_001), (2, 16_384), (3, 0), (4, 9_000)];
/// The files the first task registers and unregisters.
const CHURN: [(u64, u64); 4] = [(11, 5_000), (12, 40_960), (13, 123_457), (14, 512)];
/// The flaky FUSE file (`flaky_fs`): its salt and size.
const FLAKY_SALT: u64 = 21;
const FLAKY_SIZE: u64 = 100_003;

fn flaky_content(offset: u64) -> u8 {
    pattern(FLAKY_SALT, offset)
}

/// The log: a file that grows by appends while the tasks read its end
/// through the cache. Its salt, and the size past which it stops growing.
const LOG_SALT: u64 = 31;
const LOG_MAX: u64 = 1 << 20;

/// Bytes of the writable file each task owns (not a multiple of a block,
/// so a block spans two tasks' ranges).
const OWN: u64 = 10_000;

/// The byte at `offset` of the file with `salt`: every byte depends on
/// every bit of its offset, so a block served for another, or another
/// file's block, shows.
fn pattern(salt: u64, offset: u64) -> u8 {
    let x = (offset ^ (salt << 48)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8
}

/// The first byte of `data` (the file's bytes from `offset`) that is not
/// the pattern's.
fn check(salt: u64, offset: u64, data: &[u8]) -> Result<(), String> {
    match (0u64..)
        .zip(data)
        .find(|&(i, &b)| b != pattern(salt, offset + i))
    {
        None => Ok(()),
        Some((i, &b)) => Err(format!(
            "byte at offset {} of the file with salt {salt} is {b:#04x}, not {:#04x} \
             ({} bytes read from offset {offset})",
            offset + i,
            pattern(salt, offset + i),
            data.len()
        )),
    }
}

/// splitmix64: the soak's own reproducible draws.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// What `O_DIRECT` reads of the soak's directory accept.
#[derive(Debug, Clone, Copy)]
enum Direct {
    /// Not at all (the file system refuses `O_DIRECT`).
    No,
    /// Blocks of this size and up.
    From(usize),
}

/// One round's settings, drawn from its seed.
#[derive(Debug, Clone)]
struct Settings {
    seed: u64,
    /// Runtime workers; 0: a `current_thread` runtime.
    workers: usize,
    backend: BackendChoice,
    rings: usize,
    ring_entries: u32,
    max_in_flight: usize,
    inline_nowait: bool,
    block: usize,
    capacity_blocks: u64,
    direct: bool,
    /// With `direct`: the size and alignment `O_DIRECT` accepts (the log
    /// is then `O_DIRECT` too, appended in multiples of it).
    direct_unit: usize,
    tasks: usize,
    millis: u64,
    /// The round ends by dropping the runtime under its tasks.
    drop_runtime: bool,
    /// The cache is dropped before the context at the end.
    cache_first: bool,
}

impl Settings {
    fn draw(seed: u64, direct: Direct, uring: bool) -> Settings {
        let mut r = Rng(seed);
        let block = r.pick(&[512, 4096]);
        let workers = r.pick(&[0, 1, 2, 2, 3]);
        let rings = r.pick(&[1, 1, 2]);
        Settings {
            seed,
            workers,
            backend: if uring && !r.one_in(4) {
                BackendChoice::IoUring
            } else {
                BackendChoice::Fallback
            },
            rings,
            ring_entries: r.pick(&[4, 8, 256]),
            max_in_flight: r.pick(&[1, 2, 8, 512]).max(rings),
            inline_nowait: r.one_in(2),
            block,
            capacity_blocks: if r.one_in(4) { 64 } else { 1 + r.below(7) },
            direct: match direct {
                Direct::From(b) => b <= block && r.one_in(2),
                Direct::No => false,
            },
            direct_unit: match direct {
                Direct::From(b) => b,
                Direct::No => block,
            },
            tasks: 2 + r.below(5) as usize,
            millis: 5 + r.below(46),
            drop_runtime: r.one_in(8),
            cache_first: r.one_in(2),
        }
    }
}

/// Operations a task draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Read,
    GetMany,
    Prefetch,
    Invalidate,
    Write,
    Punch,
    ReadOwn,
    ReadOther,
    Churn,
    CtxRead,
    ReadOwned,
    ReadBatch,
    Append,
    ReadLog,
}

const OPS: [Op; 15] = [
    Op::Get,
    Op::Read,
    Op::GetMany,
    Op::Prefetch,
    Op::Invalidate,
    Op::Write,
    Op::Punch,
    Op::ReadOwn,
    Op::ReadOther,
    Op::Churn,
    Op::CtxRead,
    Op::ReadOwned,
    Op::ReadBatch,
    Op::Append,
    Op::ReadLog,
];

/// A read-only file a round reads: fixed, or registered by the churn.
#[derive(Debug, Clone, Copy)]
struct Ro {
    fid: FileId,
    salt: u64,
    size: u64,
    churned: bool,
    /// The flaky FUSE file (`flaky_fs`).
    flaky: bool,
}

/// Where the log's bytes are not the pattern's: gaps an append left
/// before it (a hole: zeros), and appends given up (zeros, or the pattern
/// if the write landed after all); and where the next append may start.
#[derive(Default)]
struct LogHoles {
    next: u64,
    /// (start, end, given up), in order, not overlapping.
    holes: Vec<(u64, u64, bool)>,
}

impl LogHoles {
    /// The first byte of `data` (the log's bytes from `offset`) that the
    /// log cannot hold there.
    fn check(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        let mut h = self.holes.partition_point(|&(_, end, _)| end <= offset);
        for (o, &b) in (offset..).zip(data) {
            while self.holes.get(h).is_some_and(|&(_, end, _)| end <= o) {
                h += 1;
            }
            let hole = self.holes.get(h).filter(|&&(start, _, _)| start <= o);
            let ok = match hole {
                None => b == pattern(LOG_SALT, o),
                Some(&(_, _, false)) => b == 0,
                Some(&(_, _, true)) => b == 0 || b == pattern(LOG_SALT, o),
            };
            if !ok {
                return Err(format!(
                    "byte at offset {o} of the log is {b:#04x}, not {} ({} bytes read \
                     from offset {offset})",
                    match hole {
                        None => format!("{:#04x}", pattern(LOG_SALT, o)),
                        Some(&(_, _, false)) => "0 (a gap before an append)".into(),
                        Some(_) =>
                            format!("0 or {:#04x} (an append given up)", pattern(LOG_SALT, o)),
                    },
                    data.len()
                ));
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counters over the whole soak.
#[derive(Default)]
struct Totals {
    ops: [AtomicU64; OPS.len()],
    gave_up: AtomicU64,
    stale: AtomicU64,
    eio: AtomicU64,
    bytes_checked: AtomicU64,
    held: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    evictions: AtomicU64,
}

/// A task's progress, for the watchdogs.
struct TaskState {
    /// Milliseconds since the soak started when the task last finished an
    /// operation.
    last: AtomicU64,
    active: AtomicBool,
    op: Mutex<String>,
}

/// What a round's tasks share.
struct Round {
    settings: Settings,
    stop: AtomicBool,
    /// The runtime is being dropped under the tasks: the context's
    /// "shut down" errors are expected from here on.
    dying: AtomicBool,
    tasks: Vec<TaskState>,
    fixed: Vec<Ro>,
    churn: Mutex<Vec<Ro>>,
    writable: FileId,
    /// A second registration of the writable file, read-only.
    writable_alias: FileId,
    /// The log (`LOG_SALT`), appended to by one task at a time
    /// (`log_busy`): its length is at least `log_end` (the end of the last
    /// completed append), its bytes are the pattern's but in `log_holes`.
    log: FileId,
    log_end: AtomicU64,
    log_busy: AtomicBool,
    log_holes: Mutex<LogHoles>,
    /// The churn's files (paths, salts, sizes).
    churn_files: Vec<(PathBuf, u64, u64)>,
}

impl Round {
    fn writable_size(&self) -> u64 {
        OWN * self.settings.tasks as u64
    }
}

/// The soak's shared state across rounds.
struct Soak {
    start: Instant,
    failure: Mutex<Option<String>>,
    totals: Totals,
    /// The watchdog thread's view: what the main thread is doing, until
    /// when, and the round's tasks.
    phase: Mutex<(String, Instant, Option<Arc<Round>>)>,
}

impl Soak {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn fail(&self, why: String) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some(why);
        }
    }

    fn failed(&self) -> bool {
        lock(&self.failure).is_some()
    }

    fn set_phase(&self, what: String, within: Duration, round: Option<Arc<Round>>) {
        *lock(&self.phase) = (what, Instant::now() + within, round);
    }
}

/// A block the holder thread keeps, and the bytes it must still hold.
struct Held {
    block: BlockRef,
    expect: Vec<u8>,
    until: Instant,
}

enum ToHolder {
    Hold(Held),
    /// Check and drop every block held, then answer.
    Flush(mpsc::Sender<()>),
}

fn holder(rx: &mpsc::Receiver<ToHolder>, soak: &Soak) {
    let mut held: Vec<Held> = Vec::new();
    let let_go = |h: Held, soak: &Soak| {
        if *h.block != h.expect[..] {
            soak.fail(format!(
                "a held block changed: {} bytes, {} differ from what it held when read",
                h.expect.len(),
                h.block
                    .iter()
                    .zip(&h.expect)
                    .filter(|(a, b)| a != b)
                    .count()
                    + h.block.len().abs_diff(h.expect.len())
            ));
        }
    };
    loop {
        match rx.recv_timeout(Duration::from_millis(1)) {
            Ok(ToHolder::Hold(h)) => held.push(h),
            Ok(ToHolder::Flush(done)) => {
                held.drain(..).for_each(|h| let_go(h, soak));
                let _ = done.send(());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                held.drain(..).for_each(|h| let_go(h, soak));
                return;
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < held.len() {
            if held[i].until <= now {
                let_go(held.swap_remove(i), soak);
            } else {
                i += 1;
            }
        }
    }
}

/// Which `O_DIRECT` reads the directory's file system accepts: a read of
/// 512 aligned bytes, else of 4096.
fn probe_direct(path: &Path) -> Direct {
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    else {
        return Direct::No;
    };
    let mut space = vec![0u8; 3 * 4096];
    let at = space.as_ptr().align_offset(4096);
    for size in [512, 4096] {
        if f.read_at(&mut space[at..at + size], 4096).is_ok() {
            return Direct::From(size);
        }
    }
    Direct::No
}

/// Turns `O_DIRECT` on for `f`.
fn set_direct(f: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL and F_SETFL on a descriptor `f` owns; no memory is
    // passed.
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags | libc::O_DIRECT) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn make_file(dir: &Path, name: &str, salt: u64, size: u64) -> io::Result<PathBuf> {
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..size).map(|o| pattern(salt, o)).collect();
    std::fs::write(&path, bytes)?;
    Ok(path)
}

fn open_ro(path: &Path, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

pub fn run(a: &SoakArgs) -> Result<bool, String> {
    let dir = tempfile::Builder::new()
        .prefix("uring-bench-soak-")
        .tempdir_in(&a.dir)
        .map_err(|e| format!("soak: a directory in {}: {e}", a.dir.display()))?;
    let mut fixed_paths = Vec::new();
    for (i, &(salt, size)) in FIXED.iter().enumerate() {
        fixed_paths.push(
            make_file(dir.path(), &format!("fixed-{i}"), salt, size)
                .map_err(|e| format!("soak: writing its files: {e}"))?,
        );
    }
    let mut churn_files = Vec::new();
    for (i, &(salt, size)) in CHURN.iter().enumerate() {
        let p = make_file(dir.path(), &format!("churn-{i}"), salt, size)
            .map_err(|e| format!("soak: writing its files: {e}"))?;
        churn_files.push((p, salt, size));
    }
    let direct = probe_direct(&fixed_paths[0]);
    let mounted = if a.no_fuse {
        None
    } else {
        match flaky_fs::mount(FLAKY_SIZE, flaky_content) {
            Ok(m) => Some(m),
            Err(e) => {
                println!("soak: no flaky FUSE file: {e}");
                None
            }
        }
    };
    let uring = io_uring::IoUring::new(4).is_ok();
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!(
        "soak: {} s of rounds, seed {seed:#x}{}; files in {}; O_DIRECT: {direct:?}; io_uring: {}; \
         flaky FUSE file: {}",
        a.secs,
        a.round_seed
            .map_or(String::new(), |s| format!(", every round with seed {s:#x}")),
        dir.path().display(),
        if uring {
            "yes"
        } else {
            "no (fallback rounds only)"
        },
        mounted
            .as_ref()
            .map_or("no".into(), |m| m.path.display().to_string())
    );

    let soak = Arc::new(Soak {
        start: Instant::now(),
        failure: Mutex::new(None),
        totals: Totals::default(),
        phase: Mutex::new((
            "starting".into(),
            Instant::now() + Duration::from_secs(60),
            None,
        )),
    });
    let (to_holder, rx) = mpsc::channel::<ToHolder>();
    let holder_thread = {
        let soak = soak.clone();
        std::thread::Builder::new()
            .name("soak-holder".into())
            .spawn(move || holder(&rx, &soak))
            .map_err(|e| format!("soak: holder thread: {e}"))?
    };
    let watchdog_done = Arc::new(AtomicBool::new(false));
    {
        let soak = soak.clone();
        let done = watchdog_done.clone();
        std::thread::Builder::new()
            .name("soak-watchdog".into())
            .spawn(move || watchdog(&soak, &done))
            .map_err(|e| format!("soak: watchdog thread: {e}"))?;
    }

    let stall = Duration::from_secs_f64(a.stall_secs);
    let end = Instant::now() + Duration::from_secs_f64(a.secs);
    let mut seeds = Rng(seed);
    let mut rounds = 0u64;
    let mut by_backend = [0u64; 2];
    let mut last_report = Instant::now();
    while Instant::now() < end && !soak.failed() {
        let round_seed = a.round_seed.unwrap_or_else(|| seeds.next());
        let settings = Settings::draw(round_seed, direct, uring);
        by_backend[usize::from(settings.backend == BackendChoice::Fallback)] += 1;
        if let Err(e) = round(
            &soak,
            &settings,
            &Files {
                dir: dir.path(),
                fixed: &fixed_paths,
                churn: &churn_files,
                flaky: mounted.as_ref().map(|m| m.path.as_path()),
            },
            &to_holder,
            stall,
        ) {
            soak.fail(e);
        }
        rounds += 1;
        if let Some(why) = lock(&soak.failure).as_ref() {
            println!("soak: FAILED in round {rounds} ({settings:?}):\n{why}");
            println!(
                "reproduce with: uring-bench soak --round-seed {:#x} (the same settings each round)",
                settings.seed
            );
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            println!(
                "soak: {:.0} s, {rounds} rounds, {}",
                soak.start.elapsed().as_secs_f64(),
                summary(&soak.totals)
            );
        }
    }
    drop(to_holder);
    soak.set_phase(
        "joining the holder thread".into(),
        Duration::from_secs(30),
        None,
    );
    let _ = holder_thread.join();
    watchdog_done.store(true, Ordering::Release);
    // Every round's context, cache and runtime are gone: so are their
    // files (a context closes each once no op needs it), within the
    // seconds it takes to reap the reads given up when a runtime died.
    let mut roots = vec![dir.path().to_path_buf()];
    roots.extend(mounted.as_ref().map(|m| m.path.clone()));
    let until = Instant::now() + Duration::from_secs(10);
    let mut open = open_files_under(&roots);
    while !open.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
        open = open_files_under(&roots);
    }
    if !open.is_empty() {
        soak.fail(format!(
            "10 s after the last round, {} of the soak's files still open in this process: {}",
            open.len(),
            open.join(", ")
        ));
    }
    let failed = soak.failed();
    if failed {
        // Already reported (or found by the holder after the last round).
        if let Some(why) = lock(&soak.failure).as_ref() {
            println!("soak: FAILED: {why}");
        }
    }
    println!(
        "soak: {} after {:.1} s: {rounds} rounds ({} io_uring, {} fallback), {}",
        if failed { "FAILED" } else { "passed" },
        soak.start.elapsed().as_secs_f64(),
        by_backend[0],
        by_backend[1],
        summary(&soak.totals)
    );
    Ok(!failed)
}

/// The files under `roots` this process has open (from `/proc/self/fd`).
fn open_files_under(roots: &[PathBuf]) -> Vec<String> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| roots.iter().any(|r| target.starts_with(r)))
        .map(|target| target.display().to_string())
        .collect()
}

fn summary(t: &Totals) -> String {
    let mut s = String::new();
    let ops: u64 = t.ops.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let _ = write!(s, "{ops} ops (");
    for (i, op) in OPS.iter().enumerate() {
        let _ = write!(
            s,
            "{}{op:?} {}",
            if i == 0 { "" } else { ", " },
            t.ops[i].load(Ordering::Relaxed)
        );
    }
    let _ = write!(
        s,
        "), {} given up mid-flight, {} stale-id errors, {} EIO from the flaky file, {} blocks held across threads, {:.1} MiB checked; cache hits {}, misses {}, coalesced {}, evictions {}",
        t.gave_up.load(Ordering::Relaxed),
        t.stale.load(Ordering::Relaxed),
        t.eio.load(Ordering::Relaxed),
        t.held.load(Ordering::Relaxed),
        t.bytes_checked.load(Ordering::Relaxed) as f64 / f64::from(1 << 20),
        t.hits.load(Ordering::Relaxed),
        t.misses.load(Ordering::Relaxed),
        t.coalesced.load(Ordering::Relaxed),
        t.evictions.load(Ordering::Relaxed),
    );
    s
}

/// The second watchdog: a main thread that does not come back from a step
/// in time (a deadlock, a drop or a runtime that never returns) cannot dump
/// the context; this prints what the tasks were doing and exits.
fn watchdog(soak: &Soak, done: &AtomicBool) {
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(200));
        let (what, until, round) = lock(&soak.phase).clone();
        if Instant::now() > until && !done.load(Ordering::Acquire) {
            eprintln!("soak: STUCK: the main thread did not finish {what} in time");
            if let Some(r) = round {
                eprintln!("round settings: {:?}", r.settings);
                eprintln!("{}", tasks_report(soak, &r));
            }
            std::process::exit(3);
        }
    }
}

fn tasks_report(soak: &Soak, r: &Round) -> String {
    let now = soak.now_ms();
    let mut s = String::from("tasks:");
    for (i, t) in r.tasks.iter().enumerate() {
        let _ = write!(
            s,
            "\n  task {i}: {}, last op finished {} ms ago, now in: {}",
            if t.active.load(Ordering::Acquire) {
                "running"
            } else {
                "done"
            },
            now.saturating_sub(t.last.load(Ordering::Acquire)),
            lock(&t.op)
        );
    }
    s
}

fn dump(soak: &Soak, r: &Round, ctx: &UringContext, cache: &BlockCache) -> String {
    format!(
        "round settings: {:?}\n{}\ncache: {cache:?}\ncontext: {ctx:#?}",
        r.settings,
        tasks_report(soak, r)
    )
}

/// The soak's files, which every round opens anew.
struct Files<'a> {
    dir: &'a Path,
    fixed: &'a [PathBuf],
    /// Path, salt, size.
    churn: &'a [(PathBuf, u64, u64)],
    flaky: Option<&'a Path>,
}

/// One round: build, run, end, check, drop.
fn round(
    soak: &Arc<Soak>,
    s: &Settings,
    paths: &Files<'_>,
    to_holder: &mpsc::Sender<ToHolder>,
    stall: Duration,
) -> Result<(), String> {
    let setup = |e: io::Error| format!("round with settings {s:?}: setting up: {e}");
    let flaky = paths.flaky;
    let mut files = Vec::new();
    for p in paths.fixed {
        files.push(open_ro(p, s.direct).map_err(setup)?);
    }
    let writable = tempfile::tempfile_in(paths.dir).map_err(setup)?;
    writable.set_len(OWN * s.tasks as u64).map_err(setup)?;
    // The same file opened again, read-only (`O_DIRECT` in a direct
    // round): a second registration, which must see every write through
    // the first.
    let alias = {
        use std::os::fd::AsRawFd;
        open_ro(
            Path::new(&format!("/proc/self/fd/{}", writable.as_raw_fd())),
            s.direct,
        )
        .map_err(setup)?
    };
    files.push(writable);
    if let Some(path) = flaky {
        files.push(File::open(path).map_err(setup)?);
    }
    let log_index = files.len();
    let log = tempfile::tempfile_in(paths.dir).map_err(setup)?;
    if s.direct {
        set_direct(&log).map_err(setup)?;
    }
    files.push(log);
    files.push(alias);
    let rt = if s.workers == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(s.workers)
            .enable_all()
            .build()
    }
    .map_err(setup)?;
    soak.set_phase(
        format!("round {:#x}: setting up", s.seed),
        Duration::from_secs(30),
        None,
    );
    let built = rt.block_on(async {
        let ctx = UringContext::builder()
            .backend(s.backend)
            .rings(s.rings)
            .ring_entries(s.ring_entries)
            .max_in_flight(s.max_in_flight)
            .inline_nowait(s.inline_nowait)
            .build(files)?;
        let cache = BlockCache::new(
            &ctx,
            CacheOptions {
                capacity_bytes: s.capacity_blocks * s.block as u64,
                block_size: s.block,
            },
        )?;
        Ok::<_, io::Error>((ctx, Arc::new(cache)))
    });
    let (ctx, cache) = built.map_err(setup)?;
    let ids = ctx.file_ids();
    let round = Arc::new(Round {
        settings: s.clone(),
        stop: AtomicBool::new(false),
        dying: AtomicBool::new(false),
        tasks: (0..s.tasks)
            .map(|_| TaskState {
                last: AtomicU64::new(soak.now_ms()),
                active: AtomicBool::new(true),
                op: Mutex::new("starting".into()),
            })
            .collect(),
        fixed: FIXED
            .iter()
            .zip(&ids)
            .map(|(&(salt, size), &fid)| Ro {
                fid,
                salt,
                size,
                churned: false,
                flaky: false,
            })
            .chain(flaky.map(|_| Ro {
                fid: ids[FIXED.len() + 1],
                salt: FLAKY_SALT,
                size: FLAKY_SIZE,
                churned: false,
                flaky: true,
            }))
            .collect(),
        churn: Mutex::new(Vec::new()),
        writable: ids[FIXED.len()],
        writable_alias: ids[log_index + 1],
        log: ids[log_index],
        log_end: AtomicU64::new(0),
        log_busy: AtomicBool::new(false),
        log_holes: Mutex::new(LogHoles::default()),
        churn_files: paths.churn.to_vec(),
    });
    soak.set_phase(
        format!("round {:#x}: running", s.seed),
        Duration::from_millis(s.millis) + stall * 2 + Duration::from_secs(10),
        Some(round.clone()),
    );
    // Whether the tasks were joined (else the runtime is dropped under them).
    let joined = rt.block_on(async {
        let handles: Vec<_> = (0..s.tasks)
            .map(|t| {
                tokio::spawn(
                    Worker {
                        t,
                        round: round.clone(),
                        soak: soak.clone(),
                        ctx: ctx.clone(),
                        cache: cache.clone(),
                        to_holder: to_holder.clone(),
                        r: Rng(s.seed ^ (t as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F)),
                        bs: s.block as u64,
                        own: t as u64 * OWN,
                        model: vec![0u8; OWN as usize],
                    }
                    .run(),
                )
            })
            .collect();
        let deadline = Instant::now() + Duration::from_millis(s.millis);
        loop {
            tokio::time::sleep(Duration::from_millis(2)).await;
            if soak.failed() {
                round.stop.store(true, Ordering::Release);
            }
            if Instant::now() >= deadline {
                if s.drop_runtime {
                    round.dying.store(true, Ordering::Release);
                    return Ok(false);
                }
                round.stop.store(true, Ordering::Release);
            }
            if round.stop.load(Ordering::Acquire)
                && handles.iter().all(tokio::task::JoinHandle::is_finished)
            {
                for h in handles {
                    if let Err(e) = h.await {
                        return Err(format!("a task panicked: {e}"));
                    }
                }
                return Ok(true);
            }
            let now = soak.now_ms();
            if round.tasks.iter().any(|t| {
                t.active.load(Ordering::Acquire)
                    && now.saturating_sub(t.last.load(Ordering::Acquire))
                        > u64::try_from(stall.as_millis()).unwrap_or(u64::MAX)
            }) {
                return Err(format!(
                    "HANG: a task finished no operation for {:.1} s\n{}",
                    stall.as_secs_f64(),
                    dump(soak, &round, &ctx, &cache)
                ));
            }
        }
    })?;
    if joined {
        // Every block back from the holder: nothing pinned, and every read
        // (given up or not) leaves the kernel and the cache's buffers.
        soak.set_phase(
            format!("round {:#x}: draining", s.seed),
            Duration::from_secs(30),
            Some(round.clone()),
        );
        let (tx, rx) = mpsc::channel();
        let _ = to_holder.send(ToHolder::Flush(tx));
        let _ = rx.recv_timeout(Duration::from_secs(20));
        let drained = rt.block_on(async {
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let (st, cs) = (ctx.stats(), cache.stats());
                if cs.pinned_bytes == 0 && cs.in_flight_bytes == 0 && st.in_flight == 0 {
                    return Ok(());
                }
                if Instant::now() > until {
                    return Err(format!(
                        "after the round (every task done, every block let go), still: \
                         {} bytes pinned, {} bytes in flight in the cache, {} ops in flight \
                         in the context, after 10 s\n{}",
                        cs.pinned_bytes,
                        cs.in_flight_bytes,
                        st.in_flight,
                        dump(soak, &round, &ctx, &cache)
                    ));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        drained?;
    }
    let cs = cache.stats();
    if cs.resident_bytes > s.capacity_blocks * s.block as u64 {
        return Err(format!(
            "{} bytes resident in a cache of {} blocks of {}",
            cs.resident_bytes, s.capacity_blocks, s.block
        ));
    }
    let t = &soak.totals;
    t.hits.fetch_add(cs.hits, Ordering::Relaxed);
    t.misses.fetch_add(cs.misses, Ordering::Relaxed);
    t.coalesced.fetch_add(cs.coalesced, Ordering::Relaxed);
    t.evictions.fetch_add(cs.evictions, Ordering::Relaxed);
    soak.set_phase(
        format!(
            "round {:#x}: dropping the {}",
            s.seed,
            if joined {
                "cache, the context and the runtime"
            } else {
                "runtime under its tasks, then the cache and the context"
            }
        ),
        Duration::from_secs(30),
        Some(round.clone()),
    );
    if !joined {
        drop(rt);
        drop_pair(s.cache_first, ctx, cache);
    } else {
        drop_pair(s.cache_first, ctx, cache);
        drop(rt);
    }
    Ok(())
}

fn drop_pair(cache_first: bool, ctx: UringContext, cache: Arc<BlockCache>) {
    if cache_first {
        drop(cache);
        drop(ctx);
    } else {
        drop(ctx);
        drop(cache);
    }
}

/// Gives the read up after 0 to 200 µs one time in four: `None` then.
async fn maybe_give_up<F: std::future::Future>(
    r: &mut Rng,
    soak: &Soak,
    f: F,
) -> Option<F::Output> {
    if r.one_in(4) {
        // Polled once and dropped (0), or given up a little later.
        let after = Duration::from_micros(r.pick(&[0, 0, 1, 5, 20, 50, 100, 200]));
        match tokio::time::timeout(after, f).await {
            Ok(v) => Some(v),
            Err(_) => {
                soak.totals.gave_up.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    } else {
        Some(f.await)
    }
}

/// Whether `e`, from an operation whose reads of `f` covered `range`, is
/// one the file may give (counted): a stale id's error from a file being
/// unregistered (`InvalidInput`, or `EBADF` for a read that had not
/// reached the kernel), or `EIO` from the flaky file where the range
/// touches a flaky sector.
fn expected_err(soak: &Soak, f: &Ro, range: Range<u64>, e: &io::Error) -> Result<(), String> {
    if f.churned && (e.kind() == io::ErrorKind::InvalidInput || os_error(e) == Some(libc::EBADF)) {
        soak.totals.stale.fetch_add(1, Ordering::Relaxed);
        Ok(())
    } else if f.flaky
        && os_error(e) == Some(libc::EIO)
        && flaky_fs::touches_flaky(range.start, range.end.min(f.size))
    {
        soak.totals.eio.fetch_add(1, Ordering::Relaxed);
        Ok(())
    } else {
        Err(format!(
            "{e} (kind {:?}) from {f:?}, bytes {range:?}",
            e.kind()
        ))
    }
}

/// The bytes block `b` of `f` holds.
fn block_len(f: &Ro, b: u64, bs: u64) -> u64 {
    f.size.saturating_sub(b * bs).min(bs)
}

/// A buffer for owned reads whose `Drop` calls back into the crate: the
/// context's stats and its `{:#?}` dump, and an invalidation of the cache.
/// Dropped by the task, or by a ring's driver or a blocking-pool thread
/// when the read's future was dropped first (it may then hold the last
/// handle of the context). Page-aligned, for `O_DIRECT` files.
struct CallbackBuf {
    buf: AlignedBuf,
    back: Option<(UringContext, Arc<BlockCache>, FileId)>,
}

// SAFETY: every method is the inner `AlignedBuf`'s, whose implementation
// upholds the trait's contract; the wrapper adds only a `Drop`.
unsafe impl IoBufMut for CallbackBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.buf.stable_ptr()
    }

    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.buf.stable_mut_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.buf.bytes_init()
    }

    fn bytes_total(&self) -> usize {
        self.buf.bytes_total()
    }

    unsafe fn set_init(&mut self, pos: usize) {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.buf.set_init(pos) };
    }
}

impl Drop for CallbackBuf {
    fn drop(&mut self) {
        if let Some((ctx, cache, fid)) = self.back.take() {
            let _ = ctx.stats();
            let dump = format!("{ctx:#?}");
            assert!(dump.contains("stats"), "{dump}");
            let _ = cache.invalidate(fid, 0..4096);
            let _ = cache.stats();
        }
    }
}

/// One task of a round: its draws, its range of the writable file and
/// what that range holds.
struct Worker {
    t: usize,
    round: Arc<Round>,
    soak: Arc<Soak>,
    ctx: UringContext,
    cache: Arc<BlockCache>,
    to_holder: mpsc::Sender<ToHolder>,
    r: Rng,
    bs: u64,
    /// Where the task's range of the writable file starts.
    own: u64,
    /// What the last completed write or punch left in that range.
    model: Vec<u8>,
}

type Outcome = Result<(), String>;

impl Worker {
    fn me(&self) -> &TaskState {
        &self.round.tasks[self.t]
    }

    fn set_op(&self, what: impl FnOnce() -> String) {
        *lock(&self.me().op) = what();
    }

    fn checked(&self, bytes: u64) {
        self.soak
            .totals
            .bytes_checked
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// A read-only file: a churned one (one time in four, if any), else a
    /// fixed one.
    fn pick_ro(&mut self) -> Ro {
        let churn = lock(&self.round.churn);
        if !churn.is_empty() && self.r.one_in(4) {
            churn[self.r.below(churn.len() as u64) as usize]
        } else {
            self.round.fixed[self.r.below(self.round.fixed.len() as u64) as usize]
        }
    }

    /// Hands `block` to the holder thread for 0 to 20 ms.
    fn hold(&mut self, block: BlockRef) {
        self.soak.totals.held.fetch_add(1, Ordering::Relaxed);
        let expect = block.to_vec();
        let _ = self.to_holder.send(ToHolder::Hold(Held {
            block,
            expect,
            until: Instant::now() + Duration::from_micros(self.r.below(20_000)),
        }));
    }

    /// A block of `ro` checked: its length and every byte.
    fn check_block(&self, what: &str, ro: &Ro, b: u64, block: &BlockRef) -> Outcome {
        let want = block_len(ro, b, self.bs);
        if block.len() as u64 != want {
            return Err(format!(
                "{what}: block {b} of {ro:?}: {} bytes, not {want}",
                block.len()
            ));
        }
        check(ro.salt, b * self.bs, block)?;
        self.checked(want);
        Ok(())
    }

    /// A positioned read of `ro` checked: `exact` if only the end of the
    /// file may make it short (the cache's reads), else any prefix.
    fn check_read(
        &self,
        what: &str,
        ro: &Ro,
        off: u64,
        buf: &[u8],
        n: usize,
        exact: bool,
    ) -> Outcome {
        let want = (buf.len() as u64).min(ro.size.saturating_sub(off));
        if n as u64 > want || (exact && n as u64 != want) || (n == 0 && want > 0) {
            return Err(format!(
                "{what} of {} bytes at {off} of {ro:?}: {n} bytes, not {}{want}",
                buf.len(),
                if exact { "" } else { "1 to " }
            ));
        }
        check(ro.salt, off, &buf[..n])?;
        self.checked(n as u64);
        Ok(())
    }

    async fn run(mut self) {
        while !self.round.stop.load(Ordering::Acquire) {
            let op = self.r.pick(&OPS);
            let res = self.step(op).await;
            self.soak.totals.ops[op as usize].fetch_add(1, Ordering::Relaxed);
            self.me().last.store(self.soak.now_ms(), Ordering::Release);
            if self.round.dying.load(Ordering::Acquire) {
                break;
            }
            if let Err(why) = res {
                self.soak.fail(format!("task {}, {op:?}: {why}", self.t));
                break;
            }
            if self.soak.failed() {
                break;
            }
        }
        self.set_op(|| "done".into());
        self.me().active.store(false, Ordering::Release);
    }

    async fn step(&mut self, op: Op) -> Outcome {
        match op {
            Op::Get => self.get().await,
            Op::Read => self.read().await,
            Op::GetMany => self.get_many().await,
            Op::Prefetch => self.range_op(false, 3),
            Op::Invalidate => self.range_op(true, 2),
            Op::Write => self.write().await,
            Op::Punch => self.punch().await,
            Op::ReadOwn => self.read_own().await,
            Op::ReadOther => self.read_other().await,
            Op::Churn => self.churn(),
            Op::CtxRead => self.ctx_read().await,
            Op::ReadOwned => self.read_owned().await,
            Op::ReadBatch => self.read_batch().await,
            Op::Append => self.append().await,
            Op::ReadLog => self.read_log().await,
        }
    }

    async fn get(&mut self) -> Outcome {
        let ro = self.pick_ro();
        let b = self.r.below(ro.size.div_ceil(self.bs) + 2);
        self.set_op(|| format!("get of block {b} of {ro:?}"));
        let cache = self.cache.clone();
        let Some(res) = maybe_give_up(&mut self.r, &self.soak, cache.get(ro.fid, b)).await else {
            return Ok(());
        };
        match res {
            Ok(block) => {
                self.check_block("get", &ro, b, &block)?;
                if self.r.one_in(6) {
                    self.hold(block.clone());
                }
                Ok(())
            }
            Err(e) => expected_err(&self.soak, &ro, self.blocks(b, b), &e),
        }
    }

    /// The bytes of blocks `first..=last`: what the cache reads for them.
    fn blocks(&self, first: u64, last: u64) -> Range<u64> {
        first * self.bs..(last + 1) * self.bs
    }

    async fn read(&mut self) -> Outcome {
        let ro = self.pick_ro();
        let off = self.r.below(ro.size + self.bs);
        let len = self.r.below(3 * self.bs + 1) as usize;
        self.set_op(|| format!("read of {len} bytes at {off} of {ro:?}"));
        let mut buf = vec![0xA5u8; len];
        let cache = self.cache.clone();
        let read = cache.read(ro.fid, off, &mut buf);
        let Some(res) = maybe_give_up(&mut self.r, &self.soak, read).await else {
            return Ok(());
        };
        match res {
            Ok(n) => self.check_read("read", &ro, off, &buf, n, true),
            Err(e) => {
                let last = (off + len.max(1) as u64 - 1) / self.bs;
                expected_err(&self.soak, &ro, self.blocks(off / self.bs, last), &e)
            }
        }
    }

    async fn get_many(&mut self) -> Outcome {
        let ro = self.pick_ro();
        let blocks = ro.size.div_ceil(self.bs);
        let want: Vec<u64> = (0..1 + self.r.below(8))
            .map(|_| self.r.below(blocks + 1))
            .collect();
        self.set_op(|| format!("get_many of blocks {want:?} of {ro:?}"));
        let cache = self.cache.clone();
        let many = cache.get_many(ro.fid, want.clone());
        let Some(got) = maybe_give_up(&mut self.r, &self.soak, many).await else {
            return Ok(());
        };
        if got.len() != want.len() {
            return Err(format!(
                "get_many of {} blocks gave {}",
                want.len(),
                got.len()
            ));
        }
        for (&b, res) in want.iter().zip(got) {
            match res {
                Ok(block) => {
                    self.check_block("get_many", &ro, b, &block)?;
                    if self.r.one_in(12) {
                        self.hold(block);
                    }
                }
                Err(e) => expected_err(&self.soak, &ro, self.blocks(b, b), &e)?,
            }
        }
        Ok(())
    }

    /// `prefetch` (`invalidate` if `drop`) of a random range of the
    /// writable file (one time in `writable_one_in`) or of a read-only one.
    fn range_op(&mut self, drop: bool, writable_one_in: u64) -> Outcome {
        let writable = self.r.one_in(writable_one_in);
        let ro = self.pick_ro();
        let (fid, size) = if writable {
            (self.round.writable, self.round.writable_size())
        } else {
            (ro.fid, ro.size)
        };
        let a = self.r.below(size + 1);
        let b = a + self.r.below(4 * self.bs);
        let what = if drop { "invalidate" } else { "prefetch" };
        self.set_op(|| format!("{what} of {a}..{b} of {fid:?}"));
        let res = if drop {
            self.cache.invalidate(fid, a..b)
        } else {
            self.cache.prefetch(fid, a..b)
        };
        match res {
            Ok(()) => Ok(()),
            Err(e) if !writable => expected_err(&self.soak, &ro, 0..0, &e),
            Err(e) => Err(format!("{what} of the writable file: {e}")),
        }
    }

    /// A random range of the task's own part of the writable file: its
    /// offset in that part and its length (1 to 3 blocks).
    fn own_range(&mut self) -> (u64, u64) {
        let at = self.r.below(OWN);
        (at, 1 + self.r.below((OWN - at).min(3 * self.bs)))
    }

    async fn write(&mut self) -> Outcome {
        let (at, len) = self.own_range();
        let data: Vec<u8> = (0..len).map(|_| self.r.next() as u8).collect();
        let pos = self.own + at;
        self.set_op(|| format!("write of {len} bytes at {pos} of the writable file"));
        self.ctx
            .write_all(self.round.writable, pos, &data)
            .await
            .map_err(|e| format!("write of {len} bytes at {pos}: {e}"))?;
        self.model[at as usize..(at + len) as usize].copy_from_slice(&data);
        Ok(())
    }

    async fn punch(&mut self) -> Outcome {
        let (at, len) = self.own_range();
        let pos = self.own + at;
        self.set_op(|| format!("punch of {len} bytes at {pos} of the writable file"));
        self.ctx
            .fallocate(
                self.round.writable,
                FallocateMode::PUNCH_HOLE | FallocateMode::KEEP_SIZE,
                pos,
                len,
            )
            .await
            .map_err(|e| format!("punch of {len} bytes at {pos}: {e}"))?;
        self.model[at as usize..(at + len) as usize].fill(0);
        Ok(())
    }

    /// The task's own range read back through the cache: exactly what the
    /// last completed write or punch left.
    async fn read_own(&mut self) -> Outcome {
        let (fid, through) = if self.r.one_in(2) {
            (
                self.round.writable_alias,
                " through its second registration",
            )
        } else {
            (self.round.writable, "")
        };
        if self.r.one_in(2) {
            let (at, len) = self.own_range();
            let pos = self.own + at;
            self.set_op(|| {
                format!("read of {len} bytes at {pos} of the writable file (own){through}")
            });
            let mut buf = vec![0xA5u8; len as usize];
            let cache = self.cache.clone();
            let read = cache.read(fid, pos, &mut buf);
            let Some(res) = maybe_give_up(&mut self.r, &self.soak, read).await else {
                return Ok(());
            };
            let n = res.map_err(|e| format!("read of the writable file: {e}"))?;
            let want = &self.model[at as usize..(at + len) as usize];
            if n != buf.len() || buf != want {
                return Err(format!(
                    "stale or wrong bytes: read of {len} bytes at {pos} of the writable \
                     file{through} gave {n} bytes, {} differ from what the last completed \
                     write or punch left",
                    buf.iter().zip(want).filter(|(a, b)| a != b).count()
                ));
            }
            self.checked(len);
            return Ok(());
        }
        // A block overlapping the task's range: the overlap.
        let (bs, own) = (self.bs, self.own);
        let b = (own + self.r.below(OWN)) / bs;
        self.set_op(|| format!("get of block {b} of the writable file (own){through}"));
        let cache = self.cache.clone();
        let get = cache.get(fid, b);
        let Some(res) = maybe_give_up(&mut self.r, &self.soak, get).await else {
            return Ok(());
        };
        let block = res.map_err(|e| format!("get of the writable file: {e}"))?;
        let (from, to) = ((b * bs).max(own), ((b + 1) * bs).min(own + OWN));
        if (block.len() as u64) < to - b * bs {
            return Err(format!(
                "get of block {b} of the writable file: {} bytes",
                block.len()
            ));
        }
        let got = &block[(from - b * bs) as usize..(to - b * bs) as usize];
        let want = &self.model[(from - own) as usize..(to - own) as usize];
        if got != want {
            return Err(format!(
                "stale or wrong bytes: block {b} of the writable file{through}, bytes \
                 {from}..{to} (this task's), {} differ from what the last completed write or \
                 punch left",
                got.iter().zip(want).filter(|(a, b)| a != b).count()
            ));
        }
        self.checked(to - from);
        if self.r.one_in(6) {
            self.hold(block);
        }
        Ok(())
    }

    /// Appends to the log (if no other task is appending and it is not
    /// full; else reads its end): the pattern's bytes, written through
    /// the context, now and then after a gap (a hole: the write grows
    /// the file past the block that held its end, not writing it), given
    /// up now and then (its bytes may land later, or not at all); or grows
    /// it with `fallocate` (zeros, allocated or not). On an
    /// `O_DIRECT` log, owned aligned buffers at aligned offsets.
    async fn append(&mut self) -> Outcome {
        let round = self.round.clone();
        if round.log_busy.swap(true, Ordering::AcqRel) {
            return self.read_log().await;
        }
        // Read once this task is the appender: read before, it may be
        // where an append that ran meanwhile started, not where it ended.
        let next = lock(&round.log_holes).next;
        if next >= LOG_MAX {
            round.log_busy.store(false, Ordering::Release);
            return self.read_log().await;
        }
        let s = &round.settings;
        // Lengths in units: bytes, or what `O_DIRECT` accepts.
        let unit = if s.direct { s.direct_unit as u64 } else { 1 };
        let gap = if self.r.one_in(3) {
            unit * (1 + self.r.below(2 * self.bs / unit))
        } else {
            0
        };
        // Mostly small appends: the end stays in one block for a while,
        // which the readers keep missing on as it grows.
        let most = if self.r.one_in(4) { 2 * self.bs } else { 64 };
        let len = unit * (1 + self.r.below(most.div_ceil(unit)));
        let at = next + gap;
        // One in six grows the file by `fallocate` (zeros) instead.
        let zeros = self.r.one_in(6);
        {
            let mut log = lock(&round.log_holes);
            if zeros {
                log.holes.push((next, at + len, false));
            } else if gap > 0 {
                log.holes.push((next, at, false));
            }
            log.next = at + len;
        }
        self.set_op(|| format!("append of {len} bytes at {at} of the log (zeros: {zeros})"));
        let data = || (at..at + len).map(|o| pattern(LOG_SALT, o));
        let res = if zeros {
            let mode = if self.r.one_in(2) {
                FallocateMode::ALLOCATE
            } else {
                FallocateMode::ZERO_RANGE
            };
            let grow = self.ctx.fallocate(round.log, mode, at, len);
            maybe_give_up(&mut self.r, &self.soak, grow).await
        } else if s.direct {
            let mut buf = AlignedBuf::new(len as usize, s.direct_unit);
            buf.iter_mut().zip(data()).for_each(|(b, p)| *b = p);
            let write = self.ctx.write_owned(round.log, at, buf);
            maybe_give_up(&mut self.r, &self.soak, write)
                .await
                .map(|(res, _)| match res {
                    Ok(n) if n as u64 == len => Ok(()),
                    Ok(n) => Err(io::Error::other(format!("{n} bytes written"))),
                    Err(e) => Err(e),
                })
        } else {
            let data: Vec<u8> = data().collect();
            let write = self.ctx.write_all(round.log, at, &data);
            maybe_give_up(&mut self.r, &self.soak, write).await
        };
        match &res {
            Some(Ok(())) => round.log_end.store(at + len, Ordering::Release),
            // Zeros either way.
            _ if zeros => {}
            Some(Err(_)) | None => lock(&round.log_holes).holes.push((at, at + len, true)),
        }
        round.log_busy.store(false, Ordering::Release);
        match res {
            // A file system without `ZERO_RANGE` (tmpfs).
            Some(Err(e)) if zeros && os_error(&e) == Some(libc::EOPNOTSUPP) => Ok(()),
            Some(Err(e)) => Err(format!("append of {len} bytes at {at} of the log: {e}")),
            _ => Ok(()),
        }
    }

    /// The end of the log read through the cache, a block (`get`) or a
    /// range (`read`), while appends grow it: every byte is one the log
    /// can hold there (`LogHoles::check`), and none of what the appends
    /// completed before the read started is missing (a block cached or
    /// read short before an append, then served after it, shows here).
    async fn read_log(&mut self) -> Outcome {
        let (bs, log) = (self.bs, self.round.log);
        let end = self.round.log_end.load(Ordering::Acquire);
        let cache = self.cache.clone();
        if self.r.one_in(2) {
            // The block holding the end, or the one before it or after.
            let b = match self.r.below(6) {
                0 => (end / bs).saturating_sub(1),
                1 => end / bs + 1,
                _ => end / bs,
            };
            self.set_op(|| format!("get of block {b} of the log (end {end})"));
            let res = if self.r.one_in(2) {
                // A lazy leader: it starts the read, then does something
                // else before it waits (as a `join` of several futures
                // does), so the read may end in the kernel well before its
                // flight lands, and other tasks' appends and gets run
                // meanwhile.
                let mut get = std::pin::pin!(cache.get(log, b));
                let first = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(std::future::Future::poll(get.as_mut(), cx))
                })
                .await;
                match first {
                    std::task::Poll::Ready(res) => res,
                    std::task::Poll::Pending => {
                        let idle = Duration::from_micros(self.r.below(300));
                        tokio::time::sleep(idle).await;
                        get.await
                    }
                }
            } else {
                let Some(res) = maybe_give_up(&mut self.r, &self.soak, cache.get(log, b)).await
                else {
                    return Ok(());
                };
                res
            };
            let block = res.map_err(|e| format!("get of block {b} of the log: {e}"))?;
            let want = end.saturating_sub(b * bs).min(bs);
            if (block.len() as u64) < want {
                return Err(format!(
                    "stale end of the log: block {b} has {} bytes; the appends completed \
                     before the get started end at {end}, {want} bytes into it",
                    block.len()
                ));
            }
            lock(&self.round.log_holes).check(b * bs, &block)?;
            self.checked(block.len() as u64);
            return Ok(());
        }
        let at = end.saturating_sub(self.r.below(2 * bs));
        let mut buf = vec![0u8; 1 + self.r.below(2 * bs) as usize];
        let len = buf.len() as u64;
        self.set_op(|| format!("read of {len} bytes at {at} of the log (end {end})"));
        let read = cache.read(log, at, &mut buf);
        let Some(res) = maybe_give_up(&mut self.r, &self.soak, read).await else {
            return Ok(());
        };
        let n = res.map_err(|e| format!("read of {len} bytes at {at} of the log: {e}"))?;
        let want = end.saturating_sub(at).min(len);
        if (n as u64) < want {
            return Err(format!(
                "stale end of the log: read of {len} bytes at {at} gave {n}; the appends \
                 completed before the read started end at {end}"
            ));
        }
        lock(&self.round.log_holes).check(at, &buf[..n])?;
        self.checked(n as u64);
        Ok(())
    }

    /// Any range of the writable file, unchecked (other tasks write it):
    /// misses that race with the writes.
    async fn read_other(&mut self) -> Outcome {
        let at = self.r.below(self.round.writable_size());
        let mut buf = vec![0u8; 1 + self.r.below(2 * self.bs) as usize];
        self.set_op(|| format!("read of {} bytes at {at} of the writable file", buf.len()));
        let cache = self.cache.clone();
        let read = cache.read(self.round.writable, at, &mut buf);
        match maybe_give_up(&mut self.r, &self.soak, read).await {
            Some(Err(e)) => Err(format!("read of the writable file: {e}")),
            _ => Ok(()),
        }
    }

    /// The first task registers a churn file (up to 3 at once) or
    /// unregisters one, while the others read them.
    fn churn(&mut self) -> Outcome {
        if self.t != 0 {
            return Ok(());
        }
        let round = self.round.clone();
        let mut churn = lock(&round.churn);
        if churn.len() < 3 && (churn.is_empty() || self.r.one_in(2)) {
            let i = self.r.below(round.churn_files.len() as u64) as usize;
            let (path, salt, size) = &round.churn_files[i];
            self.set_op(|| format!("register_file of {}", path.display()));
            let file = open_ro(path, round.settings.direct)
                .map_err(|e| format!("opening {}: {e}", path.display()))?;
            let fid = self
                .ctx
                .register_file(file)
                .map_err(|e| format!("register_file: {e}"))?;
            churn.push(Ro {
                fid,
                salt: *salt,
                size: *size,
                churned: true,
                flaky: false,
            });
        } else if !churn.is_empty() {
            let i = self.r.below(churn.len() as u64) as usize;
            let f = churn.swap_remove(i);
            drop(churn);
            self.set_op(|| format!("unregister_file of {f:?}"));
            self.ctx
                .unregister_file(f.fid)
                .map_err(|e| format!("unregister_file of {f:?}: {e}"))?;
        }
        Ok(())
    }

    /// A read through the context itself (no cache) into a borrowed
    /// buffer (page-aligned, as `O_DIRECT` rounds need).
    async fn ctx_read(&mut self) -> Outcome {
        let ro = self.pick_ro();
        let (off, len) = self.owned_range(&ro);
        self.set_op(|| format!("ctx.read of {len} bytes at {off} of {ro:?}"));
        let mut buf = AlignedBuf::new(len, 4096);
        let ctx = self.ctx.clone();
        let read = ctx.read(ro.fid, off, &mut buf);
        let Some(res) = maybe_give_up(&mut self.r, &self.soak, read).await else {
            return Ok(());
        };
        match res {
            Ok(n) => self.check_read("ctx.read", &ro, off, &buf, n, false),
            Err(e) => expected_err(&self.soak, &ro, off..off + len as u64, &e),
        }
    }

    fn callback_buf(&mut self, len: usize) -> CallbackBuf {
        CallbackBuf {
            buf: AlignedBuf::with_capacity(len, 4096),
            back: self.r.one_in(2).then(|| {
                (
                    self.ctx.clone(),
                    self.cache.clone(),
                    self.round.fixed[0].fid,
                )
            }),
        }
    }

    /// An offset and a length for a read of `ro` through the context:
    /// aligned to the block on `O_DIRECT` rounds (the kernel refuses others
    /// there).
    fn owned_range(&mut self, ro: &Ro) -> (u64, usize) {
        let off = self.r.below(ro.size + self.bs);
        let len = 1 + self.r.below(2 * self.bs);
        if self.round.settings.direct {
            (
                off / self.bs * self.bs,
                len.div_ceil(self.bs) as usize * self.bs as usize,
            )
        } else {
            (off, len as usize)
        }
    }

    /// An owned read through the context into a buffer whose `Drop` calls
    /// back into the crate; half of them `'static` (holding the context).
    async fn read_owned(&mut self) -> Outcome {
        let ro = self.pick_ro();
        let (off, len) = self.owned_range(&ro);
        self.set_op(|| format!("ctx.read_owned of {len} bytes at {off} of {ro:?}"));
        let buf = self.callback_buf(len);
        let ctx = self.ctx.clone();
        let got = if self.r.one_in(2) {
            maybe_give_up(
                &mut self.r,
                &self.soak,
                ctx.read_owned_static(ro.fid, off, buf),
            )
            .await
        } else {
            maybe_give_up(&mut self.r, &self.soak, ctx.read_owned(ro.fid, off, buf)).await
        };
        let Some((res, buf)) = got else {
            return Ok(());
        };
        match res {
            Ok(n) => {
                let mut full = buf.buf.to_vec();
                full.resize(len, 0);
                self.check_read("ctx.read_owned", &ro, off, &full, n, false)
            }
            Err(e) => expected_err(&self.soak, &ro, off..off + len as u64, &e),
        }
    }

    /// A batch of owned reads of one file, each checked.
    async fn read_batch(&mut self) -> Outcome {
        let ro = self.pick_ro();
        let reads: Vec<(FileId, u64, CallbackBuf)> = (0..1 + self.r.below(6))
            .map(|_| {
                let (off, len) = self.owned_range(&ro);
                (ro.fid, off, self.callback_buf(len))
            })
            .collect();
        let asked: Vec<(u64, usize)> = reads
            .iter()
            .map(|(_, o, b)| (*o, b.buf.capacity()))
            .collect();
        self.set_op(|| format!("ctx.read_batch of {asked:?} of {ro:?}"));
        let ctx = self.ctx.clone();
        let Some(got) = maybe_give_up(&mut self.r, &self.soak, ctx.read_batch(reads)).await else {
            return Ok(());
        };
        if got.len() != asked.len() {
            return Err(format!(
                "read_batch of {} reads gave {}",
                asked.len(),
                got.len()
            ));
        }
        for ((off, len), (res, buf)) in asked.into_iter().zip(got) {
            match res {
                Ok(n) => {
                    let mut full = buf.buf.to_vec();
                    full.resize(len, 0);
                    self.check_read("ctx.read_batch", &ro, off, &full, n, false)?;
                }
                Err(e) => expected_err(&self.soak, &ro, off..off + len as u64, &e)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_tells_another_offset_or_file() {
        let bytes: Vec<u8> = (0..4096).map(|o| pattern(1, 8192 + o)).collect();
        assert!(check(1, 8192, &bytes).is_ok());
        assert!(check(1, 4096, &bytes).is_err(), "another block of the file");
        assert!(check(2, 8192, &bytes).is_err(), "the block of another file");
        let mut one_off = bytes.clone();
        one_off[4000] ^= 1;
        let e = check(1, 8192, &one_off).unwrap_err();
        assert!(e.contains("offset 12192"), "{e}");
    }

    /// A few seconds of the soak: every kind of operation ran, and passed.
    #[test]
    fn a_short_soak_passes() {
        let args = SoakArgs {
            secs: 3.0,
            seed: Some(5),
            round_seed: None,
            stall_secs: 20.0,
            dir: std::env::temp_dir(),
            no_fuse: false,
        };
        assert_eq!(run(&args), Ok(true));
    }
}
