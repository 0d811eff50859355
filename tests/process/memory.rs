//! Memory bounds: a borrowed read allocates at most a
//! bounded bounce buffer however large it is (the old code allocated one as
//! large as the read: a 2.5 GiB read peaked at 4.2 GB RSS). A global
//! allocator that records the largest single allocation makes this exact.
//!
//! The fallback under blocking-thread churn: the bytes the crate keeps
//! allocated do not grow with the threads the blocking pool creates and
//! retires, and a runtime whose `max_blocking_threads` is at least
//! `max_in_flight` still has every permitted read in the storage at once.
//! RSS over a long soak is measured by `examples/fallback_rss.rs`.

use crate::common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Flavor;
use uring_positioned_io::{BackendChoice, UringContext, BORROWED_CHUNK};

struct Recording;

static RECORDING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated and not yet freed, process-wide (always counted).
static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only
// records sizes on the side.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if RECORDING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if RECORDING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if RECORDING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Recording = Recording;

#[test]
fn borrowed_reads_allocate_bounded_bounce_buffers() {
    // The recording allocator is process-wide: the other test's 48 MiB
    // buffers must not be allocated while this one records.
    let _serial = common::serial();
    const READ: usize = 48 << 20;
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        // Sparse: a hole reads as zeros; the last bytes are real data.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(READ as u64 + 4096).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"tail", READ as u64 - 4).unwrap();
        drop(f);
        let opened = vec![std::fs::File::open(&path).unwrap()];
        common::run("memory", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
            let mut buf = vec![1u8; READ];
            LARGEST.store(0, Ordering::Relaxed);
            RECORDING.store(true, Ordering::Relaxed);
            let n = ctx.read(0u32, 0, &mut buf).await.expect("large read");
            RECORDING.store(false, Ordering::Relaxed);
            let largest = LARGEST.load(Ordering::Relaxed);
            assert_eq!(n, READ, "{choice:?}: the caller sees one read");
            assert!(buf[..READ - 4].iter().all(|&b| b == 0), "{choice:?}: hole");
            assert_eq!(&buf[READ - 4..], b"tail", "{choice:?}: data after the hole");
            eprintln!(
                "{choice:?}: a {READ}-byte borrowed read allocated at most {largest} bytes at once"
            );
            assert!(
                largest <= BORROWED_CHUNK + 4096,
                "{choice:?}: a {READ}-byte borrowed read allocated {largest} bytes at once"
            );
            drop(dir);
        });
    }
}

/// The write side: a borrowed write of 48 MiB copies at most
/// one `BORROWED_CHUNK` at a time into its bounce buffer, on both backends,
/// and lands whole.
#[test]
fn borrowed_writes_allocate_bounded_bounce_buffers() {
    let _serial = common::serial();
    const WRITE: usize = 48 << 20;
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let opened = vec![std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap()];
        let check = path.clone();
        common::run("memory-write", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b);
            let data: Vec<u8> = (0..WRITE).map(|i| (i % 251) as u8).collect();
            LARGEST.store(0, Ordering::Relaxed);
            RECORDING.store(true, Ordering::Relaxed);
            let n = ctx.write(0u32, 0, &data).await.expect("large write");
            RECORDING.store(false, Ordering::Relaxed);
            let largest = LARGEST.load(Ordering::Relaxed);
            assert_eq!(n, WRITE, "{choice:?}: the caller sees one write");
            eprintln!(
                "{choice:?}: a {WRITE}-byte borrowed write allocated at most {largest} bytes at once"
            );
            assert!(
                largest <= BORROWED_CHUNK + 4096,
                "{choice:?}: a {WRITE}-byte borrowed write allocated {largest} bytes at once"
            );
            let on_disk = std::fs::read(&check).unwrap();
            assert!(on_disk == data, "{choice:?}: the file holds the write");
        });
        drop(dir);
    }
}

/// A field of `/proc/self/status` (`Threads:`, `VmRSS:` in KiB).
fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// A multi-thread runtime whose blocking threads exit after `keep_alive`
/// idle, counting the threads it creates.
fn churning_runtime(
    keep_alive: Duration,
    max_blocking: Option<usize>,
) -> (tokio::runtime::Runtime, Arc<AtomicU64>) {
    let created = Arc::new(AtomicU64::new(0));
    let counter = created.clone();
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.worker_threads(2)
        .enable_all()
        .thread_keep_alive(keep_alive)
        .on_thread_start(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
    if let Some(n) = max_blocking {
        b.max_blocking_threads(n);
    }
    (b.build().expect("runtime"), created)
}

/// One operation of the mixed load: borrowed and owned reads, writes,
/// `fdatasync`, `statx`, batches; 4 KiB to 256 KiB.
async fn mixed_op(ctx: &UringContext, i: u64, buf: &mut Vec<u8>) {
    let len = 4096usize << (common::mix64(i) % 7);
    let off = (common::mix64(i ^ 0x55) % 192) * 4096;
    match i % 6 {
        0 | 1 => {
            buf.resize(len, 0);
            ctx.read(0u32, off, &mut buf[..len]).await.expect("read");
        }
        2 => {
            let (n, b) = ctx.read_owned(0u32, off, Vec::with_capacity(len)).await;
            assert_eq!(n.expect("owned read"), b.len());
        }
        3 => {
            buf.resize(len, 3);
            ctx.write(1u32, off, &buf[..len]).await.expect("write");
        }
        4 => {
            ctx.fdatasync(1u32).await.expect("fdatasync");
            ctx.statx(0u32).await.expect("statx");
        }
        _ => {
            let reads = (0..4u64).map(|k| (0u32, off + k * 8192, Vec::with_capacity(4096)));
            for (res, _) in ctx.read_batch(reads).await {
                res.expect("batch read");
            }
        }
    }
}

/// Waits (on this plain thread) until the process has at most `threads`
/// threads: the blocking pool's idle threads have exited.
fn wait_threads_at_most(threads: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while status("Threads:") > threads {
        assert!(
            Instant::now() < deadline,
            "{what}: {} threads still alive, want at most {threads}",
            status("Threads:")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The fallback under blocking-thread churn: each cycle runs a burst of
/// mixed operations (many blocking threads), then idles until every
/// blocking thread has exited, so the next burst creates new ones. Nothing
/// the crate (or tokio) allocates stays behind per thread or per cycle:
/// the live heap bytes after each cycle are those after the first.
#[test]
fn fallback_thread_churn_keeps_nothing() {
    let _serial = common::serial();
    const CYCLES: usize = 6;
    const TASKS: u64 = 48;
    const OPS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let data = common::make_file(dir.path(), 0x11, 1 << 20);
    let log = dir.path().join("log");
    let files = vec![
        data.open(),
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&log)
            .unwrap(),
    ];
    common::watchdog("fallback-churn", 120, move || {
        let threads_before = status("Threads:");
        let (rt, created) = churning_runtime(Duration::from_millis(50), None);
        let ctx = {
            let _enter = rt.enter();
            Arc::new(common::build_ctx(BackendChoice::Fallback, files, |b| {
                b.max_in_flight(16)
            }))
        };
        // The runtime's two workers (started lazily) stay; the rest go.
        let idle_threads = threads_before + 2;
        let mut live = Vec::new();
        let mut rss = Vec::new();
        let mut new_threads = Vec::new();
        for cycle in 0..CYCLES as u64 {
            let before = created.load(Ordering::Relaxed);
            rt.block_on(async {
                let tasks: Vec<_> = (0..TASKS)
                    .map(|t| {
                        let ctx = ctx.clone();
                        tokio::spawn(async move {
                            let mut buf = Vec::new();
                            for k in 0..OPS {
                                mixed_op(&ctx, (cycle << 32) | (t << 16) | k, &mut buf).await;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("task");
                }
            });
            wait_threads_at_most(idle_threads, "after a burst");
            new_threads.push(created.load(Ordering::Relaxed) - before);
            live.push(LIVE.load(Ordering::Relaxed));
            rss.push(status("VmRSS:"));
        }
        let stats = ctx.stats();
        drop(ctx);
        rt.shutdown_timeout(Duration::from_secs(5));
        drop(dir);
        eprintln!(
            "threads created per cycle {new_threads:?}, live heap bytes {live:?}, RSS KiB {rss:?}, {stats:?}"
        );
        // The load did churn: every cycle created blocking threads anew.
        assert!(
            new_threads.iter().all(|&n| n >= 1),
            "a cycle created no blocking thread: {new_threads:?}"
        );
        // The heap: what the first cycle left allocated (lazily built
        // runtime and context state) is all there is, give or take a few
        // KiB (tokio's bookkeeping of the last exited thread) and the
        // bounce buffers each thread that polls reads keeps for its next
        // ones (at most 64 KiB each: the two workers and this one).
        for (cycle, &l) in live.iter().enumerate().skip(1) {
            assert!(
                l <= live[0] + (64 << 10) + 3 * (64 << 10),
                "cycle {cycle}: {l} live heap bytes, {} after the first cycle: something is kept per cycle",
                live[0]
            );
        }
        // RSS is not asserted: glibc keeps freed memory in the arena of
        // the thread that allocated it (the runtime's workers here) and
        // where it lands varies from run to run; `examples/fallback_rss.rs`
        // shows it levelling off over many cycles.
    });
}

/// Bounding the runtime's blocking threads to `max_in_flight` plus a few
/// keeps the slow-storage ceiling: with `max_blocking_threads` at
/// `max_in_flight + 4`, all `max_in_flight` reads of a FUSE file that never
/// answers are in the storage at once. A cap below `max_in_flight` lowers
/// the ceiling to the cap (what the documentation warns against). On both
/// backends: io_uring routes FUSE files to the blocking pool.
#[test]
fn fallback_reads_in_flight_under_a_blocking_thread_cap() {
    use common::fuse::{Fault, FaultFs, FileSpec};
    let _serial = common::serial();
    const IN_FLIGHT: usize = 24;
    const LEN: u64 = 8 << 20;
    common::watchdog("fallback-cap", 120, move || {
        let rounds = [BackendChoice::Fallback, BackendChoice::IoUring]
            .into_iter()
            .flat_map(|c| {
                [
                    (c, IN_FLIGHT + 4, IN_FLIGHT),
                    (c, IN_FLIGHT / 2, IN_FLIGHT / 2),
                ]
            });
        for (choice, cap, want) in rounds {
            // Made before the file system, so that a failing assertion
            // drops the file system (which answers the hung reads) before
            // the runtime (which waits for its blocking threads).
            let (rt, _) = churning_runtime(Duration::from_secs(10), Some(cap));
            // direct_io: each pread is one FUSE request (no readahead
            // merging). A mount per round: hangs, once released, stay so.
            let Some(fs) = FaultFs::mount_or_skip(&[FileSpec::new("slow", LEN, 0x5107)], true)
            else {
                return;
            };
            fs.set_fault("slow", 0..LEN, Fault::Hang);
            let path = fs.path("slow");
            let (ctx, reads) = rt.block_on(async {
                let ctx = common::build_ctx(
                    choice,
                    vec![File::open(&path).unwrap()],
                    // One file: its share of the slots is all of them.
                    |b| {
                        b.max_in_flight(IN_FLIGHT)
                            .max_in_flight_per_file(IN_FLIGHT)
                            .shutdown_timeout(Duration::from_secs(1))
                    },
                );
                let reads: Vec<_> = (0..IN_FLIGHT as u64 * 2)
                    .map(|i| {
                        let ctx = ctx.clone();
                        tokio::spawn(async move {
                            let mut buf = vec![0u8; 4096];
                            ctx.read(0u32, i * 65536, &mut buf).await
                        })
                    })
                    .collect();
                (ctx, reads)
            });
            let hung = fs.wait_hung(want, Duration::from_secs(20));
            // No more than that either, however long they wait.
            std::thread::sleep(Duration::from_millis(200));
            let later = fs.reads_hung_now();
            eprintln!("{choice:?}, cap {cap}: {hung} reads in the storage, {later} a moment later");
            // Answer them (EIO): every read ends, with an error.
            fs.release_hangs();
            assert_eq!(
                hung, want,
                "{choice:?}, cap {cap}: {hung} of {IN_FLIGHT} permitted reads reached the storage"
            );
            assert_eq!(
                later, want,
                "{choice:?}, cap {cap}: more reads in the storage than threads or permits"
            );
            rt.block_on(async {
                for r in reads {
                    let res = tokio::time::timeout(Duration::from_secs(20), r)
                        .await
                        .expect("a read still waits after the storage answered")
                        .expect("task");
                    assert!(res.is_err(), "{choice:?}, cap {cap}: a hung read succeeded");
                }
                ctx.shutdown().await;
            });
            drop(fs);
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    });
}
