//! Cancellation storm: 100 000 reads on a 2-worker multi_thread runtime where
//! a random share of the read futures is dropped at every possible point
//! (never polled, polled once with a real or a no-op waker, polled a few
//! times, raced against a short timer) while the page cache of the files is
//! dropped periodically so many reads really are in flight at the device.
//!
//! Afterwards: every completed read returned the right bytes, no buffer of a
//! dropped read was written after the drop, `stats().in_flight` returns to 0,
//! the context still serves a full verification pass, register/unregister
//! churn leaks no fds, and dropping the context gives back every fd.
//! A smaller storm runs on a current_thread runtime; owned buffers of
//! abandoned reads are tracked and must be dropped exactly once. The storms
//! and the fd checks run alone (`common::serial()`).
//!
//! Also, for both backends: read futures dropped before ever being polled,
//! or polled exactly once (real waker, no-op waker, `now_or_never`) and then
//! dropped.

use crate::common;

use futures::FutureExt;

use std::collections::VecDeque;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::{Flavor, Rng, TestFile};
use uring_positioned_io::{BackendChoice, IoBufMut, UringContext};

const TOTAL_READS: u64 = 100_000;
const WORKERS: u64 = 64;
const SENTINEL: u8 = 0xA5;
const GRAVEYARD: usize = 48;

#[derive(Default, Debug)]
struct Counters {
    completed: AtomicU64,
    dropped_pending: AtomicU64,
    dropped_unpolled: AtomicU64,
}

fn verify(
    file: &TestFile,
    fid: usize,
    off: u64,
    len: usize,
    r: io::Result<usize>,
    buf: &[u8],
    what: &str,
) {
    let n = r.unwrap_or_else(|e| panic!("{what}: fid {fid} @ {off}+{len}: unexpected error {e}"));
    let want = file.expected(off, len);
    assert_eq!(n, want.len(), "{what}: fid {fid} @ {off}+{len}: length");
    if buf[..n] != want[..] {
        panic!(
            "{what}: {}",
            common::check_pattern(file.seed, off, &buf[..n]).unwrap_err()
        );
    }
}

/// What became of a borrowed read that was raced, polled once, or polled a
/// few times: finished (`Some`, checked) or dropped pending (buried).
fn settle(
    outcome: Option<io::Result<usize>>,
    file: &TestFile,
    (fid, off, len): (usize, u64, usize),
    buf: Vec<u8>,
    counters: &Counters,
    graveyard: &mut VecDeque<Vec<u8>>,
    what: &str,
) {
    match outcome {
        Some(r) => {
            verify(file, fid, off, len, r, &buf, what);
            counters.completed.fetch_add(1, Relaxed);
        }
        None => {
            counters.dropped_pending.fetch_add(1, Relaxed);
            bury(graveyard, buf, what);
        }
    }
}

/// Keep the buffer of a dropped read: it must never be written again.
fn bury(graveyard: &mut VecDeque<Vec<u8>>, mut buf: Vec<u8>, what: &str) {
    buf.fill(SENTINEL);
    graveyard.push_back(buf);
    if graveyard.len() > GRAVEYARD {
        check_grave(&graveyard.pop_front().unwrap(), what);
    }
}

fn check_grave(buf: &[u8], what: &str) {
    if let Some(i) = buf.iter().position(|&b| b != SENTINEL) {
        panic!("{what}: buffer of a dropped read was written after the future was dropped (byte {i} of {})", buf.len());
    }
}

async fn worker(
    ctx: UringContext,
    files: Arc<Vec<TestFile>>,
    w: u64,
    iters: u64,
    counters: Arc<Counters>,
) -> VecDeque<Vec<u8>> {
    let mut rng = Rng::new(0xca9ce1 ^ w);
    let mut graveyard = VecDeque::new();
    for i in 0..iters {
        let fid = rng.below(files.len() as u64) as usize;
        let file = &files[fid];
        let len = if rng.chance(80) {
            4096
        } else {
            rng.range(1, 65536) as usize
        };
        let off = if rng.chance(70) {
            rng.below(file.len / 4096) * 4096
        } else {
            rng.below(file.len + 4096)
        };
        let what = format!("worker {w} iter {i}");
        let f32 = fid as u32;
        let pick = rng.below(100);
        match pick {
            // Plain awaited reads through the three entry points.
            0..=29 => {
                let mut buf = vec![0u8; len];
                match rng.below(3) {
                    0 => {
                        let r = ctx.read(f32, off, &mut buf).await;
                        verify(file, fid, off, len, r, &buf, &what);
                    }
                    1 => {
                        let (r, b) = ctx.read_owned(f32, off, buf.slice(..)).await;
                        verify(file, fid, off, len, r, &b, &what);
                    }
                    _ => {
                        let avail = file.len.saturating_sub(off) as usize;
                        let r = ctx.read_exact(f32, off, &mut buf).await;
                        if avail >= len {
                            r.unwrap_or_else(|e| panic!("{what}: read_exact: {e}"));
                            verify(file, fid, off, len, Ok(len), &buf, &what);
                        } else {
                            assert_eq!(
                                r.unwrap_err().kind(),
                                io::ErrorKind::UnexpectedEof,
                                "{what}"
                            );
                        }
                    }
                }
                counters.completed.fetch_add(1, Relaxed);
            }
            // Race a borrowed read against a short timer.
            30..=54 => {
                let mut buf = vec![0u8; len];
                let delay = Duration::from_micros(rng.below(1500));
                let res = {
                    let fut = ctx.read(f32, off, &mut buf);
                    tokio::select! {
                        r = fut => Some(r),
                        () = tokio::time::sleep(delay) => None,
                    }
                };
                settle(
                    res,
                    file,
                    (fid, off, len),
                    buf,
                    &counters,
                    &mut graveyard,
                    &what,
                );
            }
            // Poll once, with the real waker (55..=69) or a no-op one
            // (70..=77), then drop.
            55..=77 => {
                let mut buf = vec![0u8; len];
                let first = {
                    let fut = pin!(ctx.read(f32, off, &mut buf));
                    if pick <= 69 {
                        common::poll_once(fut).await
                    } else {
                        common::poll_once_noop(fut)
                    }
                };
                let first = match first {
                    Poll::Ready(r) => Some(r),
                    Poll::Pending => None,
                };
                settle(
                    first,
                    file,
                    (fid, off, len),
                    buf,
                    &counters,
                    &mut graveyard,
                    &what,
                );
            }
            // Created and dropped without ever being polled.
            78..=84 => {
                let mut buf = vec![0u8; len];
                drop(ctx.read(f32, off, &mut buf));
                assert!(
                    buf.iter().all(|&b| b == 0),
                    "{what}: unpolled read wrote into the buffer"
                );
                counters.dropped_unpolled.fetch_add(1, Relaxed);
                bury(&mut graveyard, buf, &what);
            }
            // Owned read raced against a timer: the buffer is parked in the
            // context until the kernel is done with it.
            85..=93 => {
                let delay = Duration::from_micros(rng.below(1500));
                let res = {
                    let fut = ctx.read_owned(f32, off, Vec::with_capacity(len));
                    tokio::select! {
                        r = fut => Some(r),
                        () = tokio::time::sleep(delay) => None,
                    }
                };
                match res {
                    Some((r, b)) => {
                        verify(file, fid, off, len, r, &b, &what);
                        counters.completed.fetch_add(1, Relaxed);
                    }
                    None => {
                        counters.dropped_pending.fetch_add(1, Relaxed);
                    }
                }
            }
            // Polled a few times (yielding in between), then dropped.
            _ => {
                let mut buf = vec![0u8; len];
                let polls = rng.range(1, 5);
                let mut done = None;
                {
                    let mut fut = pin!(ctx.read(f32, off, &mut buf));
                    for _ in 0..polls {
                        if let Poll::Ready(r) = common::poll_once(fut.as_mut()).await {
                            done = Some(r);
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                }
                settle(
                    done,
                    file,
                    (fid, off, len),
                    buf,
                    &counters,
                    &mut graveyard,
                    &what,
                );
            }
        }
    }
    graveyard
}

fn cancellation_storm(choice: BackendChoice) {
    storm(choice, Flavor::Multi, TOTAL_READS, 128);
}

/// The same storm, smaller, on a current_thread runtime.
fn cancellation_storm_current_thread(choice: BackendChoice) {
    storm(choice, Flavor::Current, TOTAL_READS / 5, 128);
}

/// The same storm, smaller, with 4 slots for the 64 workers: most reads
/// wait for a slot when they are dropped or complete (on the blocking
/// pool, their jobs wait in the slots' queue and run on the thread that
/// frees a slot).
fn cancellation_storm_few_slots(choice: BackendChoice) {
    storm(choice, Flavor::Multi, TOTAL_READS / 5, 4);
}

fn storm(choice: BackendChoice, flavor: Flavor, total_reads: u64, max_in_flight: usize) {
    let _serial = common::serial();
    let (fds_before, fd_names_before) = common::fd_baseline();
    let set = common::FileSet::new(
        0xca4ce1,
        &[8 << 20, (4 << 20) + 5, 1 << 20, (3 << 20) + 4097],
    );
    set.sync_all();
    let files = Arc::new(set.files.clone());
    let opened = set.open_all();
    common::run("cancellation_storm", flavor, 150, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| {
            b.ring_entries(32).max_in_flight(max_in_flight)
        });
        let stop = Arc::new(AtomicBool::new(false));
        // Periodically evict the files from the page cache so that reads go
        // to the device and are really in flight when their futures drop.
        let dropper = {
            let stop = stop.clone();
            let handles: Vec<_> = files.iter().map(TestFile::open).collect();
            tokio::spawn(async move {
                let mut rounds = 0u64;
                while !stop.load(Relaxed) {
                    for h in &handles {
                        common::drop_cache(h);
                    }
                    rounds += 1;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                rounds
            })
        };
        let counters = Arc::new(Counters::default());
        let t0 = Instant::now();
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                tokio::spawn(worker(
                    ctx.clone(),
                    files.clone(),
                    w,
                    total_reads / WORKERS,
                    counters.clone(),
                ))
            })
            .collect();
        let mut graves = Vec::new();
        for h in workers {
            graves.push(h.await.expect("worker panicked"));
        }
        stop.store(true, Relaxed);
        let drop_rounds = dropper.await.unwrap();
        let storm = t0.elapsed();

        let left = common::wait_in_flight_zero(&ctx, Duration::from_secs(20)).await;
        assert_eq!(
            left,
            0,
            "in_flight did not return to 0 after the storm: {:?}",
            ctx.stats()
        );
        // Give a straggling kernel write (if any) a moment to show up.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for g in graves.iter().flatten() {
            check_grave(g, "final graveyard check");
        }
        eprintln!(
            "{choice:?}: storm took {storm:?}, {counters:?}, cache drops {drop_rounds}, stats {:?}",
            ctx.stats()
        );
        assert!(
            counters.dropped_pending.load(Relaxed) > 0,
            "no future was dropped while pending: the test did not exercise cancellation"
        );

        // The context keeps serving: full verification pass (cold and warm).
        set.drop_caches();
        for (fid, file) in files.iter().enumerate() {
            common::verify_whole_file(&ctx, fid as u32, file, 256 * 1024).await;
        }
        let mut rng = Rng::new(7);
        for _ in 0..2000 {
            let fid = rng.below(files.len() as u64) as usize;
            let off = rng.below(files[fid].len + 100);
            let len = rng.range(1, 9000) as usize;
            let mut buf = vec![0u8; len];
            let r = ctx.read(fid as u32, off, &mut buf).await;
            verify(&files[fid], fid, off, len, r, &buf, "post-storm");
        }

        // register/unregister churn leaks nothing.
        let fds_mid = common::fd_count();
        let fd_names_mid = common::fd_list();
        let extra = files[2].clone();
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..300u64 {
            let fid = ctx.register_file(extra.open()).expect("register_file");
            seen.insert(fid.index());
            let off = (i * 4093) % extra.len;
            let mut buf = vec![0u8; 5000];
            let r = ctx.read(fid, off, &mut buf).await;
            verify(&extra, fid.index() as usize, off, 5000, r, &buf, "churn");
            ctx.unregister_file(fid).expect("unregister_file");
        }
        let fds_after_churn =
            common::wait_fd_count_at_most_async(fds_mid, Duration::from_secs(5)).await;
        assert!(
            fds_after_churn <= fds_mid,
            "fd leak from register/unregister churn: {fds_mid} -> {fds_after_churn}\nbefore: {fd_names_mid:?}\nafter: {:?}",
            common::fd_list()
        );
        eprintln!("{choice:?}: churn used {} distinct fids", seen.len());
        assert_eq!(
            common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await,
            0
        );
        ctx.shutdown().await;
        drop(ctx);
        drop(set);
    });
    let fds_after = common::wait_fd_count_at_most(fds_before, Duration::from_secs(5));
    assert!(
        fds_after <= fds_before,
        "fd leak: {fds_before} fds before the test, {fds_after} after dropping context and runtime\nbefore: {fd_names_before:?}\nafter: {:?}",
        common::fd_list()
    );
}

/// Create and drop many contexts (with reads dropped mid-flight) and check
/// the process gets every fd back.
fn contexts_create_drop_no_leak(choice: BackendChoice) {
    let _serial = common::serial();
    let set = common::FileSet::new(0xfdfd, &[2 << 20, 12345]);
    set.sync_all();
    let files = set.files.clone();
    let (fds_before, fd_names_before) = common::fd_baseline();
    common::run(
        "contexts_create_drop_no_leak",
        Flavor::Multi,
        60,
        move || async move {
            let fds_in_rt = common::fd_count();
            let fd_names_in_rt = common::fd_list();
            for round in 0..50u64 {
                set.drop_caches();
                let ctx = common::build_ctx(choice, set.open_all(), |b| b.ring_entries(8));
                let mut rng = Rng::new(round);
                let mut tasks = Vec::new();
                for _ in 0..16 {
                    let ctx = ctx.clone();
                    let file = files[0].clone();
                    let off = rng.below(file.len);
                    tasks.push(tokio::spawn(async move {
                        let mut buf = vec![0u8; 4096];
                        let fut = pin!(ctx.read(0u32, off, &mut buf));
                        let _ = common::poll_once(fut).await;
                    }));
                }
                // Owned reads submitted, then dropped in flight just before the
                // context itself is dropped.
                let mut owned = Vec::new();
                for _ in 0..8 {
                    let off = rng.below(files[0].len);
                    let mut fut = Box::pin(ctx.read_owned(0u32, off, Vec::with_capacity(8192)));
                    let _ = common::poll_once(fut.as_mut()).await;
                    owned.push(fut);
                }
                for t in tasks {
                    t.await.unwrap();
                }
                drop(owned);
                if round % 2 == 0 {
                    ctx.shutdown().await;
                }
                drop(ctx);
            }
            let fds = common::wait_fd_count_at_most_async(fds_in_rt, Duration::from_secs(5)).await;
            assert!(
                fds <= fds_in_rt,
                "fd leak while runtime alive: {fds_in_rt} -> {fds}\nbefore: {fd_names_in_rt:?}\nafter: {:?}",
                common::fd_list()
            );
        },
    );
    let fds_after = common::wait_fd_count_at_most(fds_before, Duration::from_secs(5));
    assert!(
        fds_after <= fds_before,
        "fd leak: {fds_before} -> {fds_after}\nbefore: {fd_names_before:?}\nafter: {:?}",
        common::fd_list()
    );
}

/// An owned buffer that counts how many of its kind are alive, so buffers
/// parked inside the context for abandoned reads can be shown to be freed
/// (exactly once) after the kernel is done with them.
struct Tracked {
    data: Vec<u8>,
    live: Arc<std::sync::atomic::AtomicI64>,
    double_drop: Arc<AtomicBool>,
}

impl Tracked {
    fn new(len: usize, live: &Arc<std::sync::atomic::AtomicI64>, dd: &Arc<AtomicBool>) -> Tracked {
        live.fetch_add(1, Relaxed);
        Tracked {
            data: vec![0u8; len],
            live: live.clone(),
            double_drop: dd.clone(),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if self.live.fetch_sub(1, Relaxed) <= 0 {
            self.double_drop.store(true, Relaxed);
        }
    }
}

// SAFETY: the bytes live in the Vec's heap allocation, which does not move
// when `Tracked` moves and lives until `Tracked` is dropped.
// All of its bytes are initialised (zeroed), as a `Box<[u8]>`'s, so
// set_init has nothing to record.
unsafe impl uring_positioned_io::IoBufMut for Tracked {
    fn stable_ptr(&self) -> *const u8 {
        self.data.as_ptr()
    }
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.data.as_mut_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.data.len()
    }
    fn bytes_total(&self) -> usize {
        self.data.len()
    }
    unsafe fn set_init(&mut self, _pos: usize) {}
}

fn parked_owned_buffers_are_released(choice: BackendChoice) {
    // Alone (`serial()`), like the storms: the fd-leak checks count
    // the whole process's fds, and a runtime built by a parallel test adds four.
    let _serial = common::serial();
    let set = common::FileSet::new(0xb0f, &[8 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let live = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let dd = Arc::new(AtomicBool::new(false));
    for round in 0..2 {
        let (live2, dd2, file) = (live.clone(), dd.clone(), file.clone());
        let opened = vec![file.open()];
        common::run(
            "parked_owned_buffers_are_released",
            Flavor::Multi,
            60,
            move || async move {
                let (live, dd) = (live2, dd2);
                let ctx = common::build_ctx(choice, opened, |b| b.ring_entries(16));
                let mut rng = Rng::new(round);
                let mut abandoned = 0;
                for i in 0..3000u64 {
                    if i % 200 == 0 {
                        file.drop_cache();
                    }
                    let off = rng.below(file.len);
                    let len = rng.range(1, 65536) as usize;
                    let mut fut =
                        Box::pin(ctx.read_owned(0u32, off, Tracked::new(len, &live, &dd)));
                    let first = match i % 3 {
                        0 => common::poll_once(fut.as_mut()).await,
                        1 => common::poll_once_noop(fut.as_mut()),
                        _ => {
                            // Give the driver a chance to enter the kernel
                            // before the future is abandoned.
                            match common::poll_once(fut.as_mut()).await {
                                Poll::Pending => {
                                    tokio::time::sleep(Duration::from_micros(300)).await;
                                    common::poll_once(fut.as_mut()).await
                                }
                                ready => ready,
                            }
                        }
                    };
                    match first {
                        Poll::Ready((r, b)) => {
                            let n = r.expect("read_owned");
                            assert_eq!(&b.data[..n], &file.expected(off, len)[..]);
                        }
                        Poll::Pending => abandoned += 1,
                    }
                }
                eprintln!(
                    "{choice:?} round {round}: {abandoned} reads abandoned in flight, {} buffers alive, {:?}",
                    live.load(Relaxed),
                    ctx.stats()
                );
                if round == 0 {
                    // Let everything complete while the context lives.
                    let left = common::wait_in_flight_zero(&ctx, Duration::from_secs(20)).await;
                    assert_eq!(left, 0, "in_flight stuck: {:?}", ctx.stats());
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while live.load(Relaxed) != 0 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    assert_eq!(
                    live.load(Relaxed),
                    0,
                    "{choice:?}: owned buffers of abandoned reads still alive after every read completed"
                );
                }
                // round 1: the context (and then the runtime) goes away with
                // abandoned reads still in flight.
                drop(ctx);
            },
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while live.load(Relaxed) != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            live.load(Relaxed),
            0,
            "{choice:?} round {round}: owned buffers leaked after the context and runtime were dropped"
        );
        assert!(
            !dd.load(Relaxed),
            "{choice:?}: an owned buffer was dropped twice"
        );
    }
    drop(set);
}

backend_tests!(
    cancellation_storm,
    cancellation_storm_current_thread,
    cancellation_storm_few_slots,
    contexts_create_drop_no_leak,
    parked_owned_buffers_are_released
);

fn unpolled_futures_dropped(choice: BackendChoice) {
    let set = common::FileSet::new(0xed1, &[1 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "unpolled_futures_dropped",
        Flavor::Multi,
        30,
        move || async move {
            let ctx = common::default_ctx(choice, opened);
            let before = ctx.stats();
            for i in 0..2000u64 {
                let mut buf = vec![0x11u8; 4096];
                let fut = ctx.read(0u32, (i * 4096) % file.len, &mut buf);
                drop(fut);
                assert!(
                    buf.iter().all(|&b| b == 0x11),
                    "never-polled read wrote into the buffer"
                );
                let fut = ctx.read_owned(0u32, 0, Vec::with_capacity(4096));
                drop(fut);
            }
            let after = ctx.stats();
            assert_eq!(
                after.in_flight, 0,
                "never-polled futures left reads in flight: {after:?}"
            );
            assert_eq!(
                after.submitted, before.submitted,
                "never-polled futures submitted reads: {before:?} -> {after:?}"
            );
            common::verify_whole_file(&ctx, 0, &file, 65536).await;
            drop(set);
        },
    );
}

fn polled_once_then_dropped(choice: BackendChoice) {
    let set = common::FileSet::new(0xed2, &[4 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "polled_once_then_dropped",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b.ring_entries(8));
            let mut rng = Rng::new(5);
            let mut pending = 0;
            for i in 0..1500u64 {
                if i % 100 == 0 {
                    file.drop_cache();
                }
                let off = rng.below(file.len);
                let len = rng.range(1, 128 * 1024) as usize;
                let mut buf = vec![0u8; len];
                let polled = match i % 4 {
                    0 => {
                        let fut = pin!(ctx.read(0u32, off, &mut buf));
                        common::poll_once(fut).await
                    }
                    1 => match ctx.read(0u32, off, &mut buf).now_or_never() {
                        Some(r) => Poll::Ready(r),
                        None => Poll::Pending,
                    },
                    2 => {
                        let fut = pin!(ctx.read(0u32, off, &mut buf));
                        common::poll_once_noop(fut)
                    }
                    _ => {
                        let fut = pin!(ctx.read_owned(0u32, off, Vec::with_capacity(len)));
                        match common::poll_once_noop(fut) {
                            Poll::Ready((r, b)) => {
                                buf = b;
                                Poll::Ready(r)
                            }
                            Poll::Pending => Poll::Pending,
                        }
                    }
                };
                match polled {
                    Poll::Ready(r) => {
                        let n = r.expect("read");
                        assert_eq!(
                            &buf[..n],
                            &file.expected(off, len)[..],
                            "read @ {off}+{len}"
                        );
                    }
                    Poll::Pending => pending += 1,
                }
            }
            eprintln!("{choice:?}: {pending} of 1500 futures dropped while pending");
            let left = common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await;
            assert_eq!(
                left,
                0,
                "in_flight stuck after dropped futures: {:?}",
                ctx.stats()
            );
            common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
            drop(set);
        },
    );
}

backend_tests!(unpolled_futures_dropped, polled_once_then_dropped);
