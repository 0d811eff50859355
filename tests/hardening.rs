//! Hostile input and failing kernel paths: each test is the regression test
//! of one finding of the hardening issue (numbered as there). Every one ends
//! in a clear `io::Error` or correct bytes — no corruption, no hang, no
//! panic — and runs under a watchdog.

mod common;

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::seccomp::{install_errno_filter, is_child, run_child, CHILD_OK, NR_IO_URING_ENTER};
use common::{Flavor, Rng};
use uring_positioned_io::{BackendChoice, BackendKind, IoBufMut, UringContext};

const BOTH: [BackendChoice; 2] = [BackendChoice::IoUring, BackendChoice::Fallback];

fn assert_invalid(r: io::Result<UringContext>, mentions: &str, what: &str) {
    match r {
        Ok(ctx) => panic!("{what}: accepted ({:?})", ctx.backend()),
        Err(e) => {
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}");
            assert!(
                e.to_string().contains(mentions),
                "{what}: the error should name `{mentions}`: {e}"
            );
            eprintln!("{what}: {e}");
        }
    }
}

// ---------------------------------------------------------------------------
// 1. size arithmetic on user settings is checked
// ---------------------------------------------------------------------------

#[test]
fn f01_buffer_pool_sizes_are_checked() {
    let set = common::FileSet::new(0x601, &[100_000]);
    let file = set.files[0].clone();
    let opened: Vec<Vec<File>> = (0..18).map(|_| set.open_all()).collect();
    common::run("f01", Flavor::Multi, 60, move || async move {
        let mut opened = opened.into_iter();
        // count * size wraps around usize (this corrupted the heap), or is
        // merely huge (this panicked or aborted).
        for (count, size) in [
            (4096usize, usize::MAX / 2048),
            (1 << 20, 1 << 50),
            (65_536, 64 << 20),
            (2, usize::MAX),
            (1, (64 << 20) + 1),
            (65_537, 4096),
        ] {
            let r = UringContext::builder()
                .backend(BackendChoice::IoUring)
                .buffer_pool(count, size)
                .build(opened.next().unwrap());
            assert_invalid(r, "buffer_pool", &format!("buffer_pool({count}, {size})"));
        }
        // Other counts that reach allocations or semaphores.
        for choice in BOTH {
            let r = UringContext::builder()
                .backend(choice)
                .max_in_flight(usize::MAX)
                .build(opened.next().unwrap());
            assert_invalid(
                r,
                "max_in_flight",
                &format!("{choice:?} max_in_flight(MAX)"),
            );
        }
        // A stretch of inline reads long enough to hold a worker for seconds.
        for choice in BOTH {
            let r = UringContext::builder()
                .backend(choice)
                .inline_stretch(Duration::from_secs(2))
                .build(opened.next().unwrap());
            assert_invalid(
                r,
                "inline_stretch",
                &format!("{choice:?} inline_stretch(2 s)"),
            );
        }
        // A file share of nothing would let no read start; an absurdly
        // large one just turns the share off.
        for choice in BOTH {
            let r = UringContext::builder()
                .backend(choice)
                .max_in_flight_per_file(0)
                .build(opened.next().unwrap());
            assert_invalid(
                r,
                "max_in_flight_per_file",
                &format!("{choice:?} max_in_flight_per_file(0)"),
            );
            UringContext::builder()
                .backend(choice)
                .max_in_flight_per_file(usize::MAX)
                .build(opened.next().unwrap())
                .expect("max_in_flight_per_file(MAX) is no share");
        }
        // A large but legal pool works, and so do reads through it.
        let ctx = UringContext::builder()
            .backend(BackendChoice::IoUring)
            .buffer_pool(3, 5000)
            .inline_nowait(false)
            .build(opened.next().unwrap())
            .expect("small pool");
        let mut buf = vec![0u8; 30_000];
        let n = ctx.read(0u32, 777, &mut buf).await.unwrap();
        assert_eq!(&buf[..n], &file.expected(777, 30_000)[..]);
        drop(set);
    });
}

// ---------------------------------------------------------------------------
// 2. io_uring_enter failing for good: every read not yet in the kernel
//    fails with the ring's error; shutdown returns; stats stay true. A read
//    partly served from the page cache keeps its bytes (finding 12).
// ---------------------------------------------------------------------------

#[test]
fn child_f02_enter_fails_for_good() {
    if !is_child() {
        return;
    }
    let set = common::FileSet::new(0x602, &[8 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    // Which pages are cached must stay what the test makes it.
    opened.iter().for_each(common::no_readahead);
    common::run("child_f02", Flavor::Multi, 60, move || async move {
        let ctx = UringContext::builder()
            .backend(BackendChoice::IoUring)
            .ring_entries(8)
            .shutdown_timeout(Duration::from_secs(5))
            .build(opened)
            .expect("io_uring context");
        // The ring works before the filter.
        common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
        // Cache only the first page of a range, so a read of the range is a
        // partial fast-path hit whose remainder needs the ring.
        let one_page = file.open();
        common::no_readahead(&one_page);
        // Every page uncached (checked, not hoped: a busy machine can keep
        // a page through one eviction, and a read the test means to miss
        // would then be served inline).
        common::drop_cache_until_gone(&one_page, 0, 8 << 20);
        let mut page = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&one_page, &mut page, 1 << 20).unwrap();

        // From now on io_uring_enter fails with EPERM, in every thread.
        install_errno_filter(NR_IO_URING_ENTER, libc::EPERM, true);

        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let ctx = ctx.clone();
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                // Uncached: the ring path, which cannot submit any more.
                let at = (2 << 20) + i * 65_536;
                (at, ctx.read(0u32, at, &mut buf).await, buf)
            }));
        }
        let mut failed = 0;
        for t in tasks {
            let (at, r, buf) = tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("a read hangs after io_uring_enter broke")
                .unwrap();
            match r {
                // A failed RWF_NOWAIT probe still starts I/O (readahead)
                // for the pages it asked for; under load such pages can be
                // in the page cache when a read looks there, and it is
                // served from it. Right bytes are a right answer then (seen
                // once in CI; which path served it was not traced).
                Ok(n) => assert_eq!(&buf[..n], &file.expected(at, n)[..], "@ {at}"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("io_uring_enter") && common::seccomp::mentions_eperm(&msg),
                        "the error should name the broken enter and its cause: {msg}"
                    );
                    failed += 1;
                }
            }
        }
        assert!(
            failed >= 32,
            "only {failed} of 64 reads that needed the ring failed after io_uring_enter broke"
        );
        // New reads say why, too (not "shut down").
        let mut buf = vec![0u8; 4096];
        // (7 MiB: no read above went there; even a failed RWF_NOWAIT probe
        // starts the I/O for the pages it asked for.)
        let e = ctx
            .read(0u32, 7 << 20, &mut buf)
            .await
            .expect_err("read on a broken ring");
        assert!(e.to_string().contains("io_uring_enter"), "{e}");
        // A partly cached read keeps its cached bytes. After the misses
        // above the fast path only probes now and then: a hit on the cached
        // page first turns it fully back on.
        let mut page = vec![0u8; 4096];
        for _ in 0..64 {
            let inline = ctx.stats().inline_completed;
            let _ = ctx.read(0u32, 1 << 20, &mut page).await;
            if ctx.stats().inline_completed > inline {
                break;
            }
        }
        let mut buf = vec![0u8; 65_536];
        let n = ctx
            .read(0u32, 1 << 20, &mut buf)
            .await
            .expect("the cached part of a read must not be lost");
        assert!(n >= 4096, "got {n} bytes");
        assert_eq!(&buf[..n], &file.expected(1 << 20, n)[..]);
        let stats = ctx.stats();
        println!("stats after the break: {stats:?}");
        assert_eq!(stats.in_flight, 0, "counted reads the kernel never got");
        assert_eq!(stats.submitted, stats.completed);
        tokio::time::timeout(Duration::from_secs(20), ctx.shutdown())
            .await
            .expect("shutdown hangs on a broken ring");
        drop(set);
    });
    println!("{CHILD_OK}");
}

#[test]
fn f02_enter_fails_for_good() {
    if is_child() {
        return;
    }
    run_child("child_f02_enter_fails_for_good", 120);
}

// ---------------------------------------------------------------------------
// 3. no user code under an internal lock
// ---------------------------------------------------------------------------

/// An owned buffer whose `Drop` calls back into the context.
struct Reentrant {
    data: Vec<u8>,
    ctx: Arc<Mutex<Option<UringContext>>>,
    drops: Arc<AtomicUsize>,
}

// SAFETY: the bytes live in `data`'s heap block, which does not move when
// `Reentrant` moves and lives as long as it does.
// It says none of its bytes are initialised (they all are), so a read fills
// it from the start; set_init need not record anything.
unsafe impl IoBufMut for Reentrant {
    fn stable_ptr(&self) -> *const u8 {
        self.data.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.data.as_mut_ptr()
    }
    fn bytes_init(&self) -> usize {
        0
    }
    fn bytes_total(&self) -> usize {
        self.data.len()
    }
    unsafe fn set_init(&mut self, _pos: usize) {}
}

impl Drop for Reentrant {
    fn drop(&mut self) {
        if let Some(ctx) = self.ctx.lock().unwrap().clone() {
            let _ = ctx.stats();
            // Start a read and drop it after one poll.
            let mut buf = [0u8; 16];
            let mut fut = std::pin::pin!(ctx.read(0u32, 0, &mut buf));
            let _ = common::poll_once_noop(fut.as_mut());
        }
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker whose clone, wake and drop call back into the context.
struct ReentrantWaker {
    ctx: Arc<Mutex<Option<UringContext>>>,
    inner: Waker,
}

impl Wake for ReentrantWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(ctx) = self.ctx.lock().unwrap().as_ref() {
            let _ = ctx.stats();
        }
        self.inner.wake_by_ref();
    }
}

impl Drop for ReentrantWaker {
    fn drop(&mut self) {
        if let Some(ctx) = self.ctx.lock().unwrap().as_ref() {
            let _ = ctx.stats();
        }
    }
}

#[test]
fn f03_user_code_calls_back_into_the_context() {
    for flavor in [Flavor::Multi, Flavor::Current] {
        let set = common::FileSet::new(0x603, &[16 << 20]);
        let file = set.files[0].clone();
        let opened = set.open_all();
        common::run("f03", flavor, 60, move || async move {
            let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| b.inline_nowait(false));
            let slot = Arc::new(Mutex::new(Some(ctx.clone())));
            let drops = Arc::new(AtomicUsize::new(0));
            // Owned reads dropped in flight: their buffers are dropped when
            // the CQE comes in.
            file.drop_cache();
            let mut rng = Rng::new(3);
            for _ in 0..64 {
                let buf = Reentrant {
                    data: vec![0u8; 65_536],
                    ctx: slot.clone(),
                    drops: drops.clone(),
                };
                let off = rng.below(file.len - 65_536);
                let mut fut = Box::pin(ctx.read_owned(0u32, off, buf));
                let _ = common::poll_once_noop(fut.as_mut());
                drop(fut);
            }
            // Reads polled by a waker that calls back.
            for i in 0..32u64 {
                let waker = Waker::from(Arc::new(ReentrantWaker {
                    ctx: slot.clone(),
                    inner: futures::task::noop_waker(),
                }));
                let mut cx = Context::from_waker(&waker);
                let mut buf = vec![0u8; 8192];
                let off = i * 300_007 % (file.len - 8192);
                let mut fut = Box::pin(ctx.read(0u32, off, &mut buf));
                let deadline = Instant::now() + Duration::from_secs(20);
                let n = loop {
                    if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                        break r.expect("read");
                    }
                    assert!(Instant::now() < deadline, "read never completed");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                };
                drop(fut);
                assert_eq!(&buf[..n], &file.expected(off, 8192)[..]);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while drops.load(Ordering::SeqCst) < 64 {
                assert!(Instant::now() < deadline, "parked buffers never dropped");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            slot.lock().unwrap().take();
            ctx.shutdown().await;
            drop(set);
        });
    }
}

// ---------------------------------------------------------------------------
// 4. the home runtime dies while reads polled from another runtime are in
//    the kernel: correct bytes, or an error naming the cause — never a short
//    count in the middle of the file, never EFAULT
// ---------------------------------------------------------------------------

#[test]
fn f04_home_runtime_dies_mid_read() {
    const LEN: u64 = 96 << 20;
    const READ: usize = 256 * 1024;
    let set = common::FileSet::new(0x604, &[LEN]);
    let file = set.files[0].clone();
    common::watchdog("f04", 120, move || {
        let mut outcomes = [0usize; 3]; // ok, ok-at-eof, error naming the cause
        for round in 0..6u64 {
            file.drop_cache();
            let home = common::runtime(Flavor::Multi);
            let ctx = home.block_on(async {
                common::build_ctx(BackendChoice::IoUring, vec![file.open()], |b| {
                    b.inline_nowait(false)
                        .shutdown_timeout(Duration::from_secs(5))
                })
            });
            let other = common::runtime(Flavor::Multi);
            let mut rng = Rng::new(round);
            let tasks: Vec<_> = (0..96)
                .map(|_| {
                    let ctx = ctx.clone();
                    let off = rng.below(LEN - 1000);
                    other.spawn(async move {
                        let mut buf = vec![0u8; READ];
                        let r = ctx.read(0u32, off, &mut buf).await;
                        (off, r, buf)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(3 + round * 2));
            drop(home);
            other.block_on(async {
                for t in tasks {
                    let (off, r, buf) = tokio::time::timeout(Duration::from_secs(30), t)
                        .await
                        .expect("a read hangs after its home runtime died")
                        .unwrap();
                    match r {
                        Ok(n) => {
                            let want = file.expected(off, READ);
                            assert!(
                                n == READ || n == want.len(),
                                "short count mid-file: {n} of {READ} at {off} (file len {LEN})"
                            );
                            assert_eq!(&buf[..n], &want[..n], "wrong bytes at {off}");
                            outcomes[usize::from(n != READ)] += 1;
                        }
                        Err(e) => {
                            assert_ne!(e.raw_os_error(), Some(libc::EFAULT), "EFAULT at {off}");
                            let msg = e.to_string();
                            assert!(
                                msg.contains("home runtime"),
                                "the error should name the cause: {msg}"
                            );
                            outcomes[2] += 1;
                        }
                    }
                }
            });
            drop(ctx);
            other.shutdown_timeout(Duration::from_secs(5));
        }
        eprintln!("outcomes (ok, ok at EOF, error naming the cause): {outcomes:?}");
    });
    drop(set);
}

// ---------------------------------------------------------------------------
// 5. only regular files and block devices
// ---------------------------------------------------------------------------

fn pipe_files() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fresh descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are fresh and owned by nothing else.
    unsafe {
        (
            File::from(OwnedFd::from_raw_fd(fds[0])),
            File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    }
}

fn not_seekable(dir: &std::path::Path) -> Vec<(&'static str, File)> {
    let (r, _w) = pipe_files();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let (sock, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    vec![
        ("pipe", r),
        ("pipe", fifo),
        ("socket", File::from(OwnedFd::from(sock))),
        ("directory", File::open(dir).unwrap()),
        ("character device", File::open("/dev/zero").unwrap()),
    ]
}

#[test]
fn f05_non_seekable_files_are_rejected() {
    for choice in BOTH {
        let set = common::FileSet::new(0x605, &[10_000]);
        let file = set.files[0].clone();
        let dir = set.dir.path().join(format!("{choice:?}"));
        std::fs::create_dir(&dir).unwrap();
        let regular = set.open_all();
        common::run("f05", Flavor::Multi, 30, move || async move {
            for (what, f) in not_seekable(&dir) {
                let mut files = vec![file.open()];
                files.push(f);
                let e = UringContext::builder()
                    .backend(choice)
                    .build(files)
                    .expect_err(what);
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                assert!(
                    e.to_string().contains("file #1") && e.to_string().contains(what),
                    "{e}"
                );
            }
            let ctx = common::default_ctx(choice, regular);
            let again = dir.join("again");
            std::fs::create_dir(&again).unwrap();
            for (what, f) in not_seekable(&again) {
                let e = ctx.register_file(f).expect_err(what);
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                assert!(e.to_string().contains(what), "{e}");
            }
            // Nothing was half-registered: the next file gets index 1.
            assert_eq!(ctx.register_file(file.open()).unwrap().index(), 1);
            common::verify_whole_file(&ctx, 1, &file, 4096).await;
            drop(set);
        });
    }
}

// ---------------------------------------------------------------------------
// 7. nothing spins, SQPOLL included
// ---------------------------------------------------------------------------

/// CPU time (user + system) of this process's threads whose name starts
/// with `prefix`, from /proc/self/task/*/stat.
fn threads_cpu(prefix: &str) -> Duration {
    let tick = 1.0 / 100.0; // USER_HZ
    let mut total = 0.0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the ")" that ends the command name: utime is the
        // 12th, stime the 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 12 {
            total +=
                (f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0)) * tick;
        }
    }
    Duration::from_secs_f64(total)
}

#[test]
fn f07_sqpoll_with_a_backlog_does_not_spin() {
    let set = common::FileSet::new(0x607, &[64 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("f07", Flavor::Multi, 90, move || async move {
        file.drop_cache();
        let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
            b.sqpoll(Some(Duration::from_millis(20)))
                .ring_entries(4)
                .inline_nowait(false)
        });
        // Many more reads than the SQ holds, all at once: the backlog stays
        // full for the whole run, while the device sets the pace.
        const READS: u64 = 6000;
        let cpu_before = threads_cpu("tokio-r");
        let t = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..READS {
            let ctx = ctx.clone();
            let file = file.clone();
            tasks.push(tokio::spawn(async move {
                let off = (i * 10_007 * 4096) % (file.len - 4096);
                let mut buf = vec![0u8; 4096];
                let n = ctx.read(0u32, off, &mut buf).await.expect("read");
                assert_eq!(n, 4096);
                // A sample of the bytes: full checks cost more CPU than
                // the reads and would drown the measurement.
                common::check_pattern(file.seed, off + 2000, &buf[2000..2064]).unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let wall = t.elapsed();
        let cpu = threads_cpu("tokio-r").checked_sub(cpu_before).unwrap();
        let stats = ctx.stats();
        eprintln!("{READS} reads in {wall:?}: runtime workers used {cpu:?} of CPU; {stats:?}");
        // A driver that spins while the backlog waits for SQ room goes
        // round (and into the kernel) over and over: the old one made
        // ~630 000 submit rounds for these 6000 reads, with the runtime's
        // workers busy 88 % of the run. (The CPU is only printed: in a debug
        // build the reads' own CPU is too close to tell.)
        assert!(
            stats.driver_polls < 20 * READS && stats.enters < 4 * READS,
            "the driver ran {} times and entered {} times for {READS} reads",
            stats.driver_polls,
            stats.enters
        );
        drop(set);
    });
}

// ---------------------------------------------------------------------------
// 8. offsets near i64::MAX: same answer everywhere, fast path kept
// ---------------------------------------------------------------------------

#[test]
fn f08_offsets_near_i64_max() {
    for choice in BOTH {
        let set = common::FileSet::new(0x608, &[100_000]);
        let file = set.files[0].clone();
        let opened = set.open_all();
        common::run("f08", Flavor::Multi, 30, move || async move {
            let ctx = common::default_ctx(choice, opened);
            // Warm the file so the fast path serves it.
            common::verify_whole_file(&ctx, 0, &file, 65_536).await;
            let max = i64::MAX as u64;
            let mut buf = vec![0u8; 4096];
            for off in [max - 10, max - 4096, max - 4095, max] {
                let n = ctx
                    .read(0u32, off, &mut buf)
                    .await
                    .unwrap_or_else(|e| panic!("{choice:?} read at {off}: {e}"));
                assert_eq!(n, 0, "past the end of file");
                let (r, _) = ctx.read_owned(0u32, off, Vec::with_capacity(4096)).await;
                assert_eq!(r.unwrap(), 0);
            }
            let e = ctx.read(0u32, max + 1, &mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            // The fast path still serves cached reads.
            let before = ctx.stats();
            for i in 0..64u64 {
                let n = ctx.read(0u32, i * 1000, &mut buf).await.unwrap();
                assert_eq!(&buf[..n], &file.expected(i * 1000, 4096)[..]);
            }
            let after = ctx.stats();
            if ctx.backend().kind == BackendKind::IoUring {
                assert_eq!(
                    after.inline_completed - before.inline_completed,
                    64,
                    "the page-cache fast path was switched off by a bad offset"
                );
            }
            drop(set);
        });
    }
}

// ---------------------------------------------------------------------------
// 9. runtime checks without panics: COOP_TASKRUN needs no time driver
// ---------------------------------------------------------------------------

#[test]
fn f09_coop_taskrun_without_time_driver() {
    let set = common::FileSet::new(0x609, &[4 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::watchdog("f09", 60, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            file.drop_cache();
            let ctx = UringContext::builder()
                .backend(BackendChoice::IoUring)
                .coop_taskrun(true)
                .inline_nowait(false)
                .build(opened)
                .expect("coop_taskrun on a current_thread runtime without timers");
            common::verify_whole_file(&ctx, 0, &file, 256 * 1024).await;
            file.drop_cache();
            let (r, b) = ctx.read_owned(0u32, 0, Vec::with_capacity(4 << 20)).await;
            assert_eq!(&b[..r.unwrap()], &file.expected(0, 4 << 20)[..]);
            ctx.shutdown().await;
        });
    });
    drop(set);
}

/// (12.) The re-enters of the COOP tick are counted in `Stats::enters`: a read
/// held in flight for 100 ms (a FUSE file that answers late, opted onto the
/// ring, so the read waits in io-wq and the submitting enter returns at
/// once) sees several. (A slow disk read could not show it: its submitting
/// `io_uring_enter` may itself block until the data is there, as it did
/// once under load, 8.5 ms with 2 enters.)
#[test]
fn f09_coop_tick_enters_are_counted() {
    let spec = common::fuse::FileSpec::new("late", 1 << 20, 0x60a);
    let Some(fs) = common::fuse::FaultFs::mount_or_skip(std::slice::from_ref(&spec), true) else {
        return;
    };
    fs.set_fault(
        "late",
        0..1 << 20,
        common::fuse::Fault::Delay(Duration::from_millis(100)),
    );
    let path = fs.path("late");
    common::watchdog("f09-tick", 60, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let ctx = UringContext::builder()
                .backend(BackendChoice::IoUring)
                .coop_taskrun(true)
                .fuse_via_blocking_pool(false)
                .build(vec![File::open(&path).unwrap()])
                .expect("coop_taskrun on a current_thread runtime without timers");
            assert!(
                matches!(
                    ctx.file_route(0u32).unwrap(),
                    uring_positioned_io::FileRoute::RingAsync(_)
                ),
                "{:?}",
                ctx.file_route(0u32)
            );
            let before = ctx.stats().enters;
            let t = Instant::now();
            let mut buf = vec![0u8; 4096];
            let n = ctx.read(0u32, 8192, &mut buf).await.unwrap();
            let took = t.elapsed();
            assert_eq!(
                &buf[..n],
                &common::expected(spec.seed, spec.len, 8192, 4096)[..]
            );
            let enters = ctx.stats().enters - before;
            eprintln!("a {took:?} read under COOP_TASKRUN: {enters} enters");
            assert!(
                took >= Duration::from_millis(90),
                "the server answered early"
            );
            assert!(
                enters >= 3,
                "the COOP tick's enters are not counted: {enters}"
            );
            ctx.shutdown().await;
        });
    });
    drop(fs);
}

// ---------------------------------------------------------------------------
// 10. settings the kernel rejects are errors, not a silent fallback
// ---------------------------------------------------------------------------

#[test]
fn f10_bad_settings_are_errors() {
    let set = common::FileSet::new(0x610, &[10_000, 20_000]);
    let files = set.files.clone();
    let opened: Vec<Vec<File>> = (0..8).map(|_| set.open_all()).collect();
    common::run("f10", Flavor::Multi, 60, move || async move {
        let mut opened = opened.into_iter();
        let auto = || UringContext::builder().backend(BackendChoice::Auto);
        assert_invalid(
            auto()
                .max_in_flight(2_000_000)
                .build(opened.next().unwrap()),
            "max_in_flight",
            "max_in_flight(2M)",
        );
        assert_invalid(
            auto()
                .max_in_flight(1)
                .rings(2)
                .build(opened.next().unwrap()),
            "rings",
            "max_in_flight(1).rings(2)",
        );
        assert_invalid(
            auto().max_files(1).build(opened.next().unwrap()),
            "max_files",
            "max_files below the files given",
        );
        assert_invalid(
            auto().max_files(u32::MAX).build(opened.next().unwrap()),
            "max_files",
            "max_files(u32::MAX)",
        );
        // Documented clamp: by default no more rings than reads in flight;
        // the limit holds exactly.
        let ctx = auto()
            .max_in_flight(1)
            .inline_nowait(false)
            .build(opened.next().unwrap())
            .expect("max_in_flight(1) with default rings");
        assert_eq!(ctx.backend().kind, BackendKind::IoUring);
        let peak = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (ctx, peak, stop) = (ctx.clone(), peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(ctx.stats().in_flight as usize, Ordering::Relaxed);
                    std::hint::spin_loop();
                }
            })
        };
        let reads: Vec<_> = (0..64u64)
            .map(|i| {
                let (ctx, f) = (ctx.clone(), files[1].clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 999];
                    let n = ctx.read(1u32, i * 97, &mut buf).await.unwrap();
                    assert_eq!(&buf[..n], &f.expected(i * 97, 999)[..]);
                })
            })
            .collect();
        for r in reads {
            r.await.unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        sampler.join().unwrap();
        assert!(
            peak.load(Ordering::Relaxed) <= 1,
            "more than max_in_flight(1)"
        );
        // Uneven splits are exact too: 3 over 2 rings is 2 + 1.
        let ctx = auto()
            .max_in_flight(3)
            .rings(2)
            .build(opened.next().unwrap())
            .expect("3 over 2 rings");
        common::verify_whole_file(&ctx, 0, &files[0], 4096).await;
        drop(set);
    });
}

// ---------------------------------------------------------------------------
// 12. a cached read that straddles the end of file needs no ring trip
// ---------------------------------------------------------------------------

#[test]
fn f12_cached_read_across_eof_stays_inline() {
    let set = common::FileSet::new(0x612, &[10_000]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("f12", Flavor::Multi, 30, move || async move {
        let ctx = common::default_ctx(BackendChoice::IoUring, opened);
        common::verify_whole_file(&ctx, 0, &file, 4096).await;
        let before = ctx.stats();
        for _ in 0..16 {
            let mut buf = vec![0u8; 4096];
            let n = ctx.read(0u32, 8192, &mut buf).await.unwrap();
            assert_eq!(n, 10_000 - 8192);
            assert_eq!(&buf[..n], &file.expected(8192, 4096)[..]);
        }
        let after = ctx.stats();
        assert_eq!(
            after.submitted, before.submitted,
            "a cached read across EOF went to the ring"
        );
        drop(set);
    });
}

// ---------------------------------------------------------------------------
// 6. teardown is bounded even when the kernel never returns the reads
// ---------------------------------------------------------------------------

#[test]
fn f06_teardown_with_reads_that_never_finish() {
    use common::fuse::{Fault, FaultFs, FileSpec};
    const LEN: u64 = 8 << 20;
    // Page cache on: each read is punted to an io-wq worker, which then waits
    // on a FUSE request that neither cancellation nor a signal can end
    // (the server does not support interrupts): only the server can.
    let Some(fs) = FaultFs::mount_or_skip(&[FileSpec::new("hung", LEN, 0x606)], false) else {
        return;
    };
    fs.set_fault("hung", 0..LEN, Fault::Hang);
    let path = fs.path("hung");
    common::watchdog("f06", 90, move || {
        let rt = common::runtime(Flavor::Multi);
        let t = Instant::now();
        let (ctx, owned) = rt.block_on(async {
            let ctx = UringContext::builder()
                .backend(BackendChoice::IoUring)
                .ring_entries(2)
                .inline_nowait(false)
                // Page-cache mode: the reads reach the ring and hang in
                // io-wq (what this test is about), not in io_uring_enter.
                .fuse_via_blocking_pool(false)
                .shutdown_timeout(Duration::from_secs(2))
                .build(vec![File::open(&path).unwrap()])
                .expect("context");
            let mut borrowed = Vec::new();
            let mut owned = Vec::new();
            for i in 0..12u64 {
                let ctx = ctx.clone();
                let off = i * 256 * 1024;
                if i % 2 == 0 {
                    borrowed.push(tokio::spawn(async move {
                        let mut buf = vec![0u8; 4096];
                        ctx.read(0u32, off, &mut buf).await
                    }));
                } else {
                    owned.push(tokio::spawn(async move {
                        ctx.read_owned(0u32, off, Vec::with_capacity(4096)).await.0
                    }));
                }
            }
            // Let every read reach the kernel (and hang there).
            let deadline = Instant::now() + Duration::from_secs(20);
            while ctx.stats().submitted < 12 {
                assert!(
                    Instant::now() < deadline,
                    "reads never submitted: {:?}",
                    ctx.stats()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // shutdown() returns after its timeout; borrowed reads fail with
            // TimedOut; owned reads keep waiting (their buffer is the
            // kernel's until it lets go).
            tokio::time::timeout(Duration::from_secs(20), ctx.shutdown())
                .await
                .expect("shutdown() did not return within its bounded wait");
            for b in borrowed {
                let e = tokio::time::timeout(Duration::from_secs(10), b)
                    .await
                    .expect("a borrowed read still waits after shutdown gave up")
                    .unwrap()
                    .expect_err("a hung read succeeded");
                // Given up by shutdown(), or cancelled before an io-wq
                // worker picked it up.
                assert!(
                    e.kind() == io::ErrorKind::TimedOut
                        || e.raw_os_error() == Some(libc::ECANCELED),
                    "{e}"
                );
            }
            for o in &owned {
                if o.is_finished() {
                    // Only a read cancelled before an io-wq worker took it.
                    continue;
                }
                // Still in the kernel: it cannot have its buffer back.
                assert!(ctx.stats().in_flight > 0);
            }
            (ctx, owned)
        });
        eprintln!("shutdown returned after {:?}", t.elapsed());
        for o in owned {
            o.abort();
        }
        // Dropping the last handle lets the drivers finish and the rings be
        // torn down, bounded, with the buffers the kernel still holds leaked
        // rather than freed under its feet.
        drop(ctx);
        let t = Instant::now();
        while rt.metrics().num_alive_tasks() > 0 {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "the rings' drivers never finished after the last handle was dropped"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!(
            "drivers finished {:?} after the last handle was dropped",
            t.elapsed()
        );
        // The runtime's workers themselves cannot exit yet: the kernel makes
        // a thread that submitted a read it is still running wait for that
        // read when the thread exits. So shut down in the background; the
        // workers exit once the storage answers (when `fs` is dropped).
        rt.shutdown_background();
    });
    // Answer the hung reads now: the kernel writes into the leaked buffers.
    drop(fs);
}

// ---------------------------------------------------------------------------
// A read is bound to the file registered under its id when it is first
// polled, even if that poll returns Pending before the read starts (here:
// tokio's coop budget is spent), so re-registering the id meanwhile never
// makes it read another file.
// ---------------------------------------------------------------------------

#[test]
fn f13_read_bound_at_first_poll() {
    for choice in BOTH {
        let set = common::FileSet::new(0x613, &[64 * 1024, 64 * 1024]);
        let (old, new) = (set.files[0].clone(), set.files[1].clone());
        let opened = vec![old.open()];
        common::run("f13", Flavor::Current, 30, move || async move {
            let ctx = common::default_ctx(choice, opened);
            let mut buf = vec![0u8; 4096];
            let mut fut = Box::pin(ctx.read(0u32, 1000, &mut buf));
            let first = std::future::poll_fn(|cx| {
                // Spend the task's whole budget, then poll the read once.
                while let Poll::Ready(spent) = tokio::task::coop::poll_proceed(cx) {
                    spent.made_progress();
                }
                Poll::Ready(fut.as_mut().poll(cx).is_pending())
            })
            .await;
            assert!(first, "the first poll should be Pending (budget spent)");
            ctx.unregister_file(0u32).unwrap();
            let fid = ctx.register_file(new.open()).unwrap();
            match fut.await {
                Ok(n) => assert_eq!(&buf[..n], &old.expected(1000, 4096)[..], "{choice:?}"),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}"),
            }
            eprintln!("{choice:?}: the new file got {fid}");
            drop(set);
        });
    }
}

// ---------------------------------------------------------------------------
// The smallest per-file share: one read of a file in flight at a time. Many
// concurrent reads of one file (through the kernel: no page-cache fast path,
// cache dropped) and of a second file all complete, with the right bytes —
// a read waiting for its file's share never holds a slot another needs.
// ---------------------------------------------------------------------------

#[test]
fn a_share_of_one_serialises_without_deadlock() {
    let set = common::FileSet::new(0x6a1, &[2 << 20, 2 << 20]);
    for choice in BOTH {
        let (files, opened) = (set.files.clone(), set.open_all());
        common::run("share_of_one", Flavor::Multi, 60, move || async move {
            files.iter().for_each(common::TestFile::drop_cache);
            let ctx = common::build_ctx(choice, opened, |b| {
                b.max_in_flight(2)
                    .max_in_flight_per_file(1)
                    .inline_nowait(false)
            });
            let tasks: Vec<_> = (0..128u64)
                .map(|i| {
                    let (ctx, file) = (ctx.clone(), files[(i % 2) as usize].clone());
                    tokio::spawn(async move {
                        let off = (i * 7919 % 512) * 4096;
                        let mut buf = vec![0u8; 4096];
                        ctx.read_exact((i % 2) as u32, off, &mut buf).await.unwrap();
                        assert!(
                            buf == file.expected(off, 4096),
                            "{choice:?}: wrong bytes at {off}"
                        );
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(ctx.stats().in_flight, 0);
        });
    }
}

// ---------------------------------------------------------------------------
// Found by a hostile-user pass (2026-11-22): each was a panic, an abort or
// a stall.
// ---------------------------------------------------------------------------

/// A buffer whose `Drop` panics, parked with an owned read dropped in
/// flight. The panic used to unwind through the driver task: every later
/// call then failed as if the home runtime had shut down.
struct PanicsOnDrop(Vec<u8>);

/// How many `PanicsOnDrop` were dropped (each exactly once, by someone).
static PANICKING_DROPS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: the bytes live in the Vec's heap block, which does not move when
// `PanicsOnDrop` moves and lives as long as it does; no byte counts as
// initialised, so set_init need not record anything.
unsafe impl IoBufMut for PanicsOnDrop {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn bytes_init(&self) -> usize {
        0
    }
    fn bytes_total(&self) -> usize {
        self.0.len()
    }
    unsafe fn set_init(&mut self, _pos: usize) {}
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        PANICKING_DROPS.fetch_add(1, Ordering::SeqCst);
        if !std::thread::panicking() {
            panic!("PanicsOnDrop::drop (a test's deliberate panic)");
        }
    }
}

#[test]
fn a_panicking_buffer_drop_does_not_kill_the_driver() {
    let set = common::FileSet::new(0x6a1, &[16 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("panicking_drop", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| b.inline_nowait(false));
        let (mut made, mut parked) = (0usize, 0usize);
        for i in 0..64u64 {
            if parked == 8 {
                break;
            }
            file.drop_cache();
            made += 1;
            // A read that finished before its future is dropped hands the
            // buffer back to the caller, whose own drop then panics: that is
            // the caller's panic, not the driver's, and this try does not
            // count. (It used to make the test flaky on a fast device.)
            let caller_dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut fut =
                    Box::pin(ctx.read_owned(0u32, (i % 16) << 20, PanicsOnDrop(vec![0; 65_536])));
                let _ = common::poll_once_noop(fut.as_mut());
                // Dropped in flight: the driver drops the buffer at its CQE.
                drop(fut);
            }))
            .is_err();
            parked += usize::from(!caller_dropped);
        }
        assert!(
            parked > 0,
            "none of {made} reads was still in flight when dropped"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while PANICKING_DROPS.load(Ordering::SeqCst) < made || ctx.stats().in_flight > 0 {
            assert!(
                Instant::now() < deadline,
                "parked buffers never released: {} of {made} dropped, {:?}",
                PANICKING_DROPS.load(Ordering::SeqCst),
                ctx.stats()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            PANICKING_DROPS.load(Ordering::SeqCst),
            made,
            "a buffer dropped twice"
        );
        // The driver lives: reads that go through the ring still complete.
        file.drop_cache();
        for i in 0..16u64 {
            let off = i * 999_983 % (file.len - 4096);
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), ctx.read(0u32, off, &mut buf))
                .await
                .expect("a read hung after a buffer's Drop panicked")
                .expect("a read failed after a buffer's Drop panicked");
            assert_eq!(&buf[..n], &file.expected(off, 4096)[..]);
        }
        ctx.shutdown().await;
        drop(set);
    });
}

/// `shutdown_timeout(Duration::MAX)` ("as long as it takes"): the driver's
/// deadline and `Ring::drop`'s overflowed `Instant + Duration` — a panic on
/// a worker, then a second one in `Ring::drop` that aborted the process.
#[test]
fn f14_shutdown_timeout_max_is_not_an_overflow() {
    let set = common::FileSet::new(0x6a2, &[4 << 20]);
    let file = set.files[0].clone();
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        for flavor in [Flavor::Multi, Flavor::Current] {
            let (opened, file) = (set.open_all(), file.clone());
            common::run("timeout_max", flavor, 60, move || async move {
                let ctx = common::build_ctx(choice, opened, |b| {
                    b.shutdown_timeout(Duration::MAX).inline_nowait(false)
                });
                // A read in the kernel when the last handle goes.
                file.drop_cache();
                let mut fut = Box::pin(ctx.read_owned(0u32, 0, Vec::with_capacity(1 << 20)));
                let _ = common::poll_once_noop(fut.as_mut());
                drop(fut);
                let mut buf = vec![0u8; 4096];
                let n = ctx.read(0u32, 8192, &mut buf).await.unwrap();
                assert_eq!(&buf[..n], &file.expected(8192, 4096)[..]);
                ctx.shutdown().await;
                drop(ctx);
                tokio::time::sleep(Duration::from_millis(100)).await;
                // And with no shutdown() at all.
                let ctx = common::build_ctx(choice, vec![file.open()], |b| {
                    b.shutdown_timeout(Duration::MAX)
                });
                file.drop_cache();
                let mut fut = Box::pin(ctx.read_owned(0u32, 4096, Vec::with_capacity(65_536)));
                let _ = common::poll_once_noop(fut.as_mut());
                drop(fut);
                drop(ctx);
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        }
    }
}

/// After `shutdown()` returned on the fallback, the runtime's drop waited
/// for a blocking-pool thread sleeping through the whole shutdown timeout
/// (10 s by default; forever with `Duration::MAX`): the timer now ends with
/// the reads.
#[test]
fn f15_fallback_shutdown_leaves_no_sleeping_thread() {
    let set = common::FileSet::new(0x6a3, &[8 << 20]);
    for timeout in [None, Some(Duration::MAX)] {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let opened = set.open_all();
        rt.block_on(async move {
            let ctx = common::build_ctx(BackendChoice::Fallback, opened, |b| match timeout {
                Some(t) => b.shutdown_timeout(t),
                None => b,
            });
            let c = ctx.clone();
            let read =
                tokio::spawn(
                    async move { c.read_owned(0u32, 0, Vec::with_capacity(8 << 20)).await.0 },
                );
            tokio::time::sleep(Duration::from_millis(1)).await;
            ctx.shutdown().await;
            let _ = read.await.unwrap();
        });
        let t = Instant::now();
        // A watchdog: the runtime's drop must not wait out the timeout.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(rt);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|_| {
            panic!("{timeout:?}: the runtime's drop waited for the shutdown timeout")
        });
        eprintln!(
            "{timeout:?}: runtime dropped {:?} after shutdown",
            t.elapsed()
        );
    }
    drop(set);
}

/// Errors that named the wrong cause (hostile-user pass, 2026-11-22).
#[test]
fn f16_errors_name_the_right_cause() {
    use std::os::unix::fs::OpenOptionsExt;
    // The documented maximum of reads in flight builds (it was an error
    // about a buffer pool the caller never set).
    for (choice, rings, n) in [
        (BackendChoice::IoUring, 1, 65_536),
        (BackendChoice::Fallback, 1, 65_536),
    ] {
        common::run("max_in_flight", Flavor::Multi, 60, move || async move {
            let mut b = UringContext::builder().backend(choice).max_in_flight(n);
            if choice == BackendChoice::IoUring {
                b = b.rings(rings);
            }
            let ctx = b
                .build(Vec::new())
                .unwrap_or_else(|e| panic!("{choice:?} {n}: {e}"));
            ctx.shutdown().await;
        });
    }
    let set = common::FileSet::new(0x6a4, &[4096]);
    let path = set.files[0].path.clone();
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let path = path.clone();
        common::run("causes", Flavor::Multi, 60, move || async move {
            // An O_PATH descriptor: refused by name on both backends (io_uring
            // said a bare EBADF; the fallback took it, and reads failed).
            let opath = || {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH)
                    .open(&path)
                    .unwrap()
            };
            let ctx = common::build_ctx(choice, Vec::new(), |b| b);
            let e = ctx.register_file(opath()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
            assert!(e.to_string().contains("O_PATH"), "{choice:?}: {e}");
            let e = UringContext::builder()
                .backend(choice)
                .build(vec![opath()])
                .unwrap_err();
            assert!(e.to_string().contains("O_PATH"), "{choice:?}: {e}");
            // `open` of something that is not a file names the path, not
            // register_file.
            let opts = uring_positioned_io::OpenOptions::new().read(true).clone();
            let e = ctx.open("/dev/zero", &opts).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
            assert!(
                e.to_string().contains("/dev/zero") && !e.to_string().contains("register_file"),
                "{choice:?}: {e}"
            );
            ctx.shutdown().await;
        });
    }
    // A runtime without IO: said as such, not as a rejected ring setting.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        for choice in [BackendChoice::Auto, BackendChoice::IoUring] {
            let e = UringContext::builder()
                .backend(choice)
                .build(Vec::new())
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{choice:?}: {e}");
            assert!(
                e.to_string().contains("IO disabled") && !e.to_string().contains("kernel"),
                "{choice:?}: {e}"
            );
        }
    });
    drop(set);
}

// ---------------------------------------------------------------------------
// Round 2: the write path, `open` and errors (numbered as the findings of
// the second hardening round). The hung `open` is in `tests/storage.rs`.
// ---------------------------------------------------------------------------

fn rw_file(path: &std::path::Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

/// R2-1: a registered `O_APPEND` descriptor is never written at the end of
/// the file when an offset was asked for: every write is refused by name
/// and the file is unchanged, on both backends, given to `new` or to
/// `register_file`; its reads work.
#[test]
fn r2_01_o_append_descriptors_are_not_written_elsewhere() {
    for choice in BOTH {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, b"0123456789").unwrap();
        let append = || {
            std::fs::OpenOptions::new()
                .read(true)
                .append(true)
                .open(&path)
                .unwrap()
        };
        let (first, second) = (append(), append());
        let p = path.clone();
        common::run("r2_01", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![first], |b| b);
            let registered = ctx.register_file(second).unwrap();
            for fid in [uring_positioned_io::FileId::from(0u32), registered] {
                let errors = [
                    ctx.write(fid, 0, b"XYZ").await.unwrap_err(),
                    ctx.write_all(fid, 2, b"XYZ").await.unwrap_err(),
                    ctx.write_owned(fid, 0, b"XYZ".to_vec())
                        .await
                        .0
                        .unwrap_err(),
                    ctx.write_all_owned(fid, 0, b"XYZ".to_vec())
                        .await
                        .0
                        .unwrap_err(),
                    ctx.write_all_owned_static(fid, 0, b"XYZ".to_vec())
                        .await
                        .0
                        .unwrap_err(),
                ];
                for e in errors {
                    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
                    assert!(e.to_string().contains("O_APPEND"), "{choice:?}: {e}");
                }
                let mut buf = [0u8; 10];
                ctx.read_exact(fid, 0, &mut buf).await.unwrap();
                assert_eq!(&buf, b"0123456789");
            }
            assert_eq!(std::fs::read(&p).unwrap(), b"0123456789", "{choice:?}");
            drop(dir);
        });
    }
}

/// R2-3: a borrowed `write` cut by `shutdown()` returns the bytes it
/// wrote, as `write(2)` does when a later part fails: `Ok(n)` with exactly
/// its first `n` bytes in the file, or an error with none of them there.
/// A cut `write_all` fails, saying how much it wrote.
#[test]
fn r2_03_a_write_cut_by_shutdown_reports_what_it_wrote() {
    const LEN: usize = 32 << 20;
    for choice in BOTH {
        let (mut short, mut failed, mut whole) = (0, 0, 0);
        for round in 0..12u64 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            let file = rw_file(&path);
            let p = path.clone();
            let outcome = common::run("r2_03", Flavor::Multi, 60, move || async move {
                let data = Arc::new({
                    let mut v = vec![0u8; LEN];
                    common::fill_pattern(round + 1, 0, &mut v);
                    v
                });
                let ctx = common::build_ctx(choice, vec![file], |b| b);
                let (ctx2, data2) = (ctx.clone(), data.clone());
                let exact = round % 4 == 3;
                let writer = tokio::spawn(async move {
                    if exact {
                        ctx2.write_all(0u32, 0, &data2).await.map(|()| LEN)
                    } else {
                        ctx2.write(0u32, 0, &data2).await
                    }
                });
                // Let it write some pieces first (more in later rounds).
                tokio::time::sleep(Duration::from_micros(500 * round)).await;
                ctx.shutdown().await;
                let res = writer.await.unwrap();
                let on_disk = std::fs::read(&p).unwrap();
                match &res {
                    Ok(n) => {
                        assert!(*n > 0 && *n <= LEN, "{choice:?}: Ok({n})");
                        assert!(
                            on_disk.len() >= *n && on_disk[..*n] == data[..*n],
                            "{choice:?}: Ok({n}) but the file holds {} bytes of it",
                            on_disk.len()
                        );
                    }
                    Err(e) if exact => {
                        // write_all: the error says how far it got.
                        if !on_disk.is_empty() {
                            assert!(e.to_string().contains("bytes were written"), "{e}");
                        }
                    }
                    Err(e) => assert!(
                        on_disk.is_empty(),
                        "{choice:?}: {e}, with {} bytes of it in the file",
                        on_disk.len()
                    ),
                }
                drop(dir);
                (res.map_err(|e| e.to_string()), exact)
            });
            match outcome {
                (Ok(n), _) if n < LEN => short += 1,
                (Ok(_), _) => whole += 1,
                (Err(_), _) => failed += 1,
            }
        }
        eprintln!("{choice:?}: {short} short counts, {whole} whole, {failed} errors");
    }
}

/// R2-4: errors on `O_DIRECT` files keep the kernel's errno
/// (`uring_positioned_io::os_error`), blame alignment only for data
/// transfers, and an unaligned read says what must be aligned and to what.
#[test]
fn r2_04_o_direct_errors_keep_the_errno_and_say_what_is_misaligned() {
    use uring_positioned_io::{os_error, AlignedBuf};
    for choice in BOTH {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let Some(direct) = common::open_direct(&path) else {
            return;
        };
        common::run("r2_04", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![direct], |b| b);
            let st = ctx.statx(0u32).await.unwrap();
            let align = st.dio_offset_align.filter(|&a| a > 1).unwrap_or(512);
            // Not data transfers: the errno as on a buffered file.
            for e in [
                ctx.sync_file_range(0u32, 0, 4096, 0xff00)
                    .await
                    .unwrap_err(),
                ctx.fallocate(0u32, 0, 0, 0).await.unwrap_err(),
            ] {
                assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{choice:?}: {e}");
                assert!(!e.to_string().contains("align"), "{choice:?}: {e}");
            }
            // Unaligned reads: borrowed (offset, length) and owned (buffer).
            let mut buf = vec![0u8; 4096];
            let off = ctx.read(0u32, 1, &mut buf).await.unwrap_err();
            let len = ctx.read(0u32, 0, &mut buf[..100]).await.unwrap_err();
            let aligned = AlignedBuf::new(8192, 4096);
            let (r, _) = ctx.read_owned(0u32, 0, aligned.slice(1..4097)).await;
            let addr = r.unwrap_err();
            for (e, what) in [(&off, "offset"), (&len, "length"), (&addr, "address")] {
                eprintln!("{choice:?}: {e}");
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
                assert_eq!(os_error(e), Some(libc::EINVAL), "{choice:?}: {e}");
                let msg = e.to_string();
                assert!(
                    msg.contains("O_DIRECT") && msg.contains(what),
                    "{choice:?}: {e}"
                );
                if st.dio_offset_align.is_some() && what != "address" {
                    assert!(msg.contains(&format!("multiple of {align}")), "{e}");
                }
            }
            // An unaligned write likewise keeps its errno.
            let e = ctx.write_all(0u32, 1, &[1u8; 4096]).await.unwrap_err();
            assert_eq!(os_error(&e), Some(libc::EINVAL), "{choice:?}: {e}");
            assert!(e.to_string().contains("offset"), "{choice:?}: {e}");
            drop(dir);
        });
    }
}

/// R2-7: the messages name the op and the cause: a read of a write-only
/// descriptor and a write of a read-only one are `PermissionDenied` with
/// `EBADF` kept; `open` of a FIFO or a socket for writing is
/// `InvalidInput` naming what the file is; open flags that would change or
/// misuse a file behind the options' back are refused, and the file is
/// unchanged.
#[test]
fn r2_07_messages_name_the_op_and_the_cause() {
    use uring_positioned_io::{os_error, OpenOptions};
    for choice in BOTH {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        let path = base.join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let wo = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let ro = File::open(&path).unwrap();
        common::run("r2_07", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![wo, ro], |b| b);
            let mut buf = [0u8; 4];
            let e = ctx.read(0u32, 0, &mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{choice:?}: {e}");
            assert!(e.to_string().contains("not open for reading"), "{e}");
            assert_eq!(os_error(&e), Some(libc::EBADF), "{e}");
            let (r, _) = ctx.read_owned(0u32, 0, Vec::with_capacity(4)).await;
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
            let e = ctx.write(1u32, 0, b"x").await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{choice:?}: {e}");
            assert!(e.to_string().contains("not open for writing"), "{e}");
            assert_eq!(os_error(&e), Some(libc::EBADF), "{e}");
            // FIFOs and sockets, opened for writing.
            let fifo = base.join("fifo");
            let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let sock = base.join("sock");
            let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
            for (p, what) in [(&fifo, "FIFO"), (&sock, "socket")] {
                for opts in [
                    OpenOptions::new().write(true).clone(),
                    OpenOptions::new().read(true).write(true).clone(),
                    OpenOptions::new().read(true).clone(),
                ] {
                    let e = ctx.open(p, &opts).await.unwrap_err();
                    assert_eq!(
                        e.kind(),
                        io::ErrorKind::InvalidInput,
                        "{what} {opts:?}: {e}"
                    );
                    assert!(e.to_string().contains(what), "{what} {opts:?}: {e}");
                }
            }
            // Flags that bypass the options' checks.
            for (flags, name) in [
                (libc::O_TRUNC, "O_TRUNC"),
                (libc::O_CREAT, "O_CREAT"),
                (libc::O_NONBLOCK, "O_NONBLOCK"),
            ] {
                let opts = OpenOptions::new().read(true).custom_flags(flags).clone();
                let e = ctx.open(&path, &opts).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name}: {e}");
                assert!(e.to_string().contains(name), "{name}: {e}");
            }
            assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
            drop(dir);
        });
    }
}
