//! Context lifecycle and error semantics, for both backends:
//! - `shutdown()` with reads in flight: every pending read resolves (correct
//!   data or an error), nothing hangs, later reads fail with a clear error;
//! - dropping the last handle (or the whole runtime) while reads that nobody
//!   awaits any more are still in flight;
//! - `register_file` / `unregister_file` racing with reads: removed fids give
//!   `InvalidInput`, and a file that reuses a slot never leaks its bytes into
//!   a read that was issued against the previous file;
//! - `new` / `build` outside a runtime return `Err`;
//! - unknown fid, past-EOF, empty buffers, short reads, kernel errors,
//!   offsets near `i64::MAX` (same result as pread);
//! - a context used from another runtime; its home runtime dying while
//!   reads polled from another runtime are in the kernel;
//! - teardown bounded even when the kernel never returns the reads, and
//!   shutdown timeouts up to `Duration::MAX`.

use crate::common;

use std::fs::File;
use std::time::Instant;

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use common::{Flavor, Rng, TestFile};
use uring_positioned_io::{BackendChoice, UringContext};

fn assert_invalid_input_naming(r: io::Result<usize>, fid: u32, what: &str) {
    match r {
        Err(e) => {
            assert_eq!(
                e.kind(),
                io::ErrorKind::InvalidInput,
                "{what}: wrong error kind: {e:?}"
            );
            assert!(
                e.to_string().contains(&fid.to_string()),
                "{what}: error message does not name fid {fid}: {e}"
            );
        }
        Ok(n) => panic!("{what}: expected InvalidInput naming fid {fid}, got Ok({n})"),
    }
}

// ---------------------------------------------------------------------------
// shutdown
// ---------------------------------------------------------------------------

fn shutdown_with_reads_in_flight(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        let set = common::FileSet::new(0x5d, &[6 << 20, (2 << 20) + 3]);
        set.sync_all();
        set.drop_caches();
        let files = Arc::new(set.files.clone());
        let opened = set.open_all();
        common::run(
            "shutdown_with_reads_in_flight",
            flavor,
            60,
            move || async move {
                let ctx = common::build_ctx(choice, opened, |b| b.ring_entries(16));
                let ok = Arc::new(AtomicU64::new(0));
                let failed = Arc::new(AtomicU64::new(0));
                let short = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for t in 0..256u64 {
                    let ctx = ctx.clone();
                    let files = files.clone();
                    let (ok, failed, short) = (ok.clone(), failed.clone(), short.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut rng = Rng::new(t);
                        // Loop until the context refuses (after shutdown).
                        for _ in 0..100_000 {
                            let fid = rng.below(2) as usize;
                            let off = rng.below(files[fid].len);
                            let len = rng.range(1, 32 * 1024) as usize;
                            let r = if t % 2 == 0 {
                                let mut buf = vec![0u8; len];
                                let r = ctx.read(fid as u32, off, &mut buf).await;
                                r.map(|n| (n, buf))
                            } else {
                                let (r, buf) = ctx
                                    .read_owned(fid as u32, off, Vec::with_capacity(len))
                                    .await;
                                r.map(|n| (n, buf))
                            };
                            match r {
                                Ok((n, buf)) => {
                                    // A read partly served from the page
                                    // cache whose rest is refused by the
                                    // shutdown returns its bytes (short).
                                    let want = files[fid].expected(off, len);
                                    assert!(n <= want.len(), "task {t}: {n} > {}", want.len());
                                    assert!(
                                        buf[..n] == want[..n],
                                        "task {t}: wrong bytes at {off}+{n}"
                                    );
                                    if n < want.len() {
                                        short.fetch_add(1, Relaxed);
                                    }
                                    ok.fetch_add(1, Relaxed);
                                }
                                Err(e) => {
                                    failed.fetch_add(1, Relaxed);
                                    return Some(e);
                                }
                            }
                        }
                        None
                    }));
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                let before = ctx.stats();
                tokio::time::timeout(Duration::from_secs(20), ctx.shutdown())
                    .await
                    .expect("shutdown() hung with reads in flight");
                let mut errors = Vec::new();
                for t in tasks {
                    let e = tokio::time::timeout(Duration::from_secs(20), t)
                        .await
                        .expect("a read pending at shutdown never resolved")
                        .expect("reader task panicked");
                    errors.push(e.expect("reader kept succeeding after shutdown"));
                }
                eprintln!(
                "{choice:?}/{flavor:?}: before shutdown {before:?}; {} ok ({} short), {} failed; first error: {:?}",
                ok.load(Relaxed),
                short.load(Relaxed),
                failed.load(Relaxed),
                errors.first()
            );
                // After shutdown: every entry point fails, clearly and at once.
                let mut buf = vec![0u8; 100];
                let e = tokio::time::timeout(Duration::from_secs(5), ctx.read(0u32, 0, &mut buf))
                    .await
                    .expect("read after shutdown hung")
                    .expect_err("read after shutdown succeeded");
                assert!(!e.to_string().is_empty());
                eprintln!(
                    "{choice:?}/{flavor:?}: read after shutdown -> {:?}: {e}",
                    e.kind()
                );
                let (r, b) = tokio::time::timeout(
                    Duration::from_secs(5),
                    ctx.read_owned(1u32, 0, vec![7u8; 10]),
                )
                .await
                .expect("read_owned after shutdown hung");
                assert!(r.is_err(), "read_owned after shutdown succeeded");
                assert_eq!(
                    b,
                    vec![7u8; 10],
                    "read_owned after shutdown must give the buffer back untouched"
                );
                let r =
                    tokio::time::timeout(Duration::from_secs(5), ctx.read_exact(0u32, 0, &mut buf))
                        .await
                        .expect("read_exact after shutdown hung");
                assert!(r.is_err(), "read_exact after shutdown succeeded");
                // Shutting down again (from a clone) is harmless.
                tokio::time::timeout(Duration::from_secs(5), ctx.clone().shutdown())
                    .await
                    .expect("second shutdown hung");
                assert_eq!(
                    common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await,
                    0
                );
                drop(set);
            },
        );
    }
}

/// A future created (and polled) before shutdown but polled again after it
/// resolves; one created before and first polled after fails.
fn shutdown_between_polls(choice: BackendChoice) {
    let set = common::FileSet::new(0x5e, &[4 << 20]);
    set.sync_all();
    set.drop_caches();
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "shutdown_between_polls",
        Flavor::Multi,
        30,
        move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b);
            let mut a = vec![0u8; 65536];
            let mut b = vec![0u8; 65536];
            let (ra, rb) = {
                let mut fa = pin!(ctx.read(0u32, 1 << 20, &mut a));
                let first = common::poll_once(fa.as_mut()).await;
                let fb = ctx.read(0u32, 2 << 20, &mut b);
                tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                    .await
                    .expect("shutdown hung");
                let ra = match first {
                    Poll::Ready(r) => r,
                    Poll::Pending => tokio::time::timeout(Duration::from_secs(10), fa)
                        .await
                        .expect("read polled before shutdown never resolved"),
                };
                let rb = tokio::time::timeout(Duration::from_secs(10), fb)
                    .await
                    .expect("read created before shutdown, first polled after, hung");
                (ra, rb)
            };
            if let Ok(n) = ra {
                assert_eq!(&a[..n], &file.expected(1 << 20, 65536)[..]);
            }
            if let Ok(n) = rb {
                assert_eq!(&b[..n], &file.expected(2 << 20, 65536)[..]);
            }
            eprintln!("{choice:?}: polled-before -> {ra:?}; created-before/polled-after -> {rb:?}");
            drop(set);
        },
    );
}

/// Focused: after `shutdown()`, reads of data that is in the page cache
/// (eligible for any inline fast path) fail too, from every handle.
fn reads_after_shutdown_fail(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        let set = common::FileSet::new(0x5f, &[64 * 1024]);
        let file = set.files[0].clone();
        let opened = set.open_all();
        common::run(
            "reads_after_shutdown_fail",
            flavor,
            30,
            move || async move {
                let ctx = common::build_ctx(choice, opened, |b| b);
                let clone = ctx.clone();
                // Warm: the data is cached and a read succeeds.
                common::verify_whole_file(&ctx, 0, &file, 4096).await;
                tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                    .await
                    .expect("shutdown hung");
                let mut buf = vec![0u8; 4096];
                for (who, c) in [("same handle", &ctx), ("clone", &clone)] {
                    let r = tokio::time::timeout(Duration::from_secs(5), c.read(0u32, 0, &mut buf))
                        .await
                        .expect("read after shutdown hung");
                    assert!(
                        r.is_err(),
                        "{flavor:?}/{who}: read of cached data after shutdown returned {r:?}"
                    );
                    let (r, _) = tokio::time::timeout(
                        Duration::from_secs(5),
                        c.read_owned(0u32, 4096, Vec::with_capacity(100)),
                    )
                    .await
                    .expect("read_owned after shutdown hung");
                    assert!(
                        r.is_err(),
                        "{flavor:?}/{who}: read_owned of cached data after shutdown returned {r:?}"
                    );
                    let r = tokio::time::timeout(
                        Duration::from_secs(5),
                        c.read_exact(0u32, 0, &mut buf),
                    )
                    .await
                    .expect("read_exact after shutdown hung");
                    assert!(
                        r.is_err(),
                        "{flavor:?}/{who}: read_exact of cached data after shutdown returned {r:?}"
                    );
                }
                let reg = ctx.register_file(file.open());
                eprintln!("{choice:?}/{flavor:?}: register_file after shutdown -> {reg:?}");
                drop(set);
            },
        );
    }
}

// ---------------------------------------------------------------------------
// dropping handles and runtimes with reads in flight
// ---------------------------------------------------------------------------

fn drop_last_handle_with_reads_in_flight(choice: BackendChoice) {
    let set = common::FileSet::new(0xd0, &[8 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let paths = set.open_all();
    common::run(
        "drop_last_handle_with_reads_in_flight",
        Flavor::Multi,
        60,
        move || async move {
            let mut paths = paths.into_iter();
            for round in 0..20u64 {
                file.drop_cache();
                let f = paths.next().unwrap_or_else(|| file.open());
                let ctx = common::build_ctx(choice, vec![f], |b| b.ring_entries(8));
                let mut rng = Rng::new(round);
                // (a) borrowed and owned reads polled once, dropped, then the
                // last handle is dropped right away.
                for _ in 0..32 {
                    let mut buf = vec![0u8; 16384];
                    let fut = pin!(ctx.read(0u32, rng.below(file.len), &mut buf));
                    let _ = common::poll_once(fut).await;
                }
                for _ in 0..32 {
                    let fut =
                        pin!(ctx.read_owned(0u32, rng.below(file.len), Vec::with_capacity(16384)));
                    let _ = common::poll_once_noop(fut);
                }
                // (b) tasks holding clones, aborted mid-read: their clones are
                // the last handles.
                let tasks: Vec<_> = (0..16)
                    .map(|t| {
                        let ctx = ctx.clone();
                        let len = file.len;
                        tokio::spawn(async move {
                            let mut rng = Rng::new(t);
                            loop {
                                let _ = ctx
                                    .read_owned(0u32, rng.below(len), Vec::with_capacity(4096))
                                    .await;
                            }
                        })
                    })
                    .collect();
                drop(ctx);
                tokio::time::sleep(Duration::from_millis(2)).await;
                for t in &tasks {
                    t.abort();
                }
                for t in tasks {
                    let e = t.await.expect_err("reader loop ended by itself");
                    assert!(e.is_cancelled(), "reader task panicked: {e}");
                }
            }
            // The runtime is still healthy and a fresh context works.
            let ctx = common::default_ctx(choice, vec![file.open()]);
            common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
            drop(set);
        },
    );
}

fn drop_runtime_with_reads_in_flight(choice: BackendChoice) {
    let set = common::FileSet::new(0xd1, &[8 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    common::watchdog("drop_runtime_with_reads_in_flight", 60, move || {
        for (round, flavor) in [Flavor::Multi, Flavor::Current]
            .into_iter()
            .cycle()
            .take(10)
            .enumerate()
        {
            file.drop_cache();
            let rt = common::runtime(flavor);
            let ctx = rt.block_on(async { common::default_ctx(choice, vec![file.open()]) });
            for t in 0..64u64 {
                let ctx = ctx.clone();
                let len = file.len;
                rt.spawn(async move {
                    let mut rng = Rng::new(t ^ round as u64);
                    loop {
                        let mut buf = vec![0u8; 8192];
                        let _ = ctx.read(0u32, rng.below(len), &mut buf).await;
                    }
                });
            }
            rt.block_on(async { tokio::time::sleep(Duration::from_millis(5)).await });
            if round % 2 == 0 {
                drop(ctx);
                drop(rt);
            } else {
                // Runtime goes first, the last handle outlives it.
                drop(rt);
                let mut buf = [0u8; 16];
                // Polling a read without a runtime must not hang or crash;
                // an error is the expected outcome.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    futures::FutureExt::now_or_never(ctx.read(0u32, 0, &mut buf))
                }));
                match r {
                    Ok(r) => eprintln!("{choice:?}: read after runtime drop -> {r:?}"),
                    Err(_) => panic!(
                        "{choice:?}: polling a read after the context's runtime was dropped panicked \
                         (expected a clean error, like the shut-down error of the io_uring backend)"
                    ),
                }
                drop(ctx);
            }
        }
    });
}

// ---------------------------------------------------------------------------
// register / unregister racing with reads
// ---------------------------------------------------------------------------

/// Slot table: fid -> (index into the file pool, generation).
type Table = Vec<Option<(usize, u64)>>;

fn register_unregister_during_reads(choice: BackendChoice) {
    // 12 files with distinct content; slots get reused by different files.
    let sizes: Vec<u64> = (0..12).map(|i| 256 * 1024 + i * 4097).collect();
    let set = common::FileSet::new(0x7e6, &sizes);
    set.sync_all();
    let pool = Arc::new(set.files.clone());
    let initial: Vec<std::fs::File> = pool[..4].iter().map(TestFile::open).collect();
    common::run(
        "register_unregister_during_reads",
        Flavor::Multi,
        90,
        move || async move {
            let ctx = common::build_ctx(choice, initial, |b| b.ring_entries(64));
            let table = Arc::new(tokio::sync::Mutex::new(
                (0..4).map(|i| Some((i, i as u64))).collect::<Table>(),
            ));
            let stats = Arc::new([(); 7].map(|()| AtomicU64::new(0)));
            let mut readers = Vec::new();
            for r in 0..16u64 {
                let (ctx, table, pool, stats) =
                    (ctx.clone(), table.clone(), pool.clone(), stats.clone());
                readers.push(tokio::spawn(async move {
                let mut rng = Rng::new(0x4ead ^ r);
                for i in 0..400 {
                    let len = rng.range(1, 16384) as usize;
                    let off = rng.below(256 * 1024);
                    let mut buf = vec![0u8; len];
                    // Pick the slot, create and first-poll the read while the
                    // table is locked: the read is issued against exactly the
                    // file recorded in the table.
                    let guard = table.lock().await;
                    let fid = rng.below(guard.len() as u64 + 2) as u32;
                    let entry = guard.get(fid as usize).copied().flatten();
                    let res = {
                        let mut fut = pin!(ctx.read(fid, off, &mut buf));
                        let first = common::poll_once(fut.as_mut()).await;
                        drop(guard);
                        match first {
                            Poll::Ready(res) => res,
                            Poll::Pending => fut.await,
                        }
                    };
                    let what = format!("reader {r} iter {i}: fid {fid} @ {off}+{len}");
                    match (entry, res) {
                        (None, res) => {
                            assert_invalid_input_naming(res, fid, &what);
                            stats[0].fetch_add(1, Relaxed);
                        }
                        (Some((pi, g)), Ok(n)) => {
                            let file = &pool[pi];
                            if let Err(msg) = common::check_pattern(file.seed, off, &buf[..n]) {
                                let other = pool
                                    .iter()
                                    .position(|f| common::check_pattern(f.seed, off, &buf[..n]).is_ok());
                                panic!("{what}: read issued against pool file {pi} returned the bytes of pool file {other:?}: {msg}");
                            }
                            let want = file.expected(off, len).len();
                            if n != want {
                                // A short count that is not at EOF is only
                                // tolerable if the file went away mid-read
                                // (pread semantics: bytes before the error).
                                let now = table.lock().await.get(fid as usize).copied().flatten();
                                assert!(
                                    now != Some((pi, g)),
                                    "{what}: short read ({n} of {want} bytes, not at EOF) on a file that stayed registered"
                                );
                                eprintln!("QUESTIONABLE {what}: Ok({n}) of {want} bytes (not at EOF) after the file was unregistered mid-read");
                                stats[6].fetch_add(1, Relaxed);
                            }
                            stats[1].fetch_add(1, Relaxed);
                        }
                        (Some((pi, g)), Err(e)) => {
                            // Only acceptable if the slot was unregistered
                            // while the read was in flight.
                            let now = table.lock().await.get(fid as usize).copied().flatten();
                            assert!(
                                now != Some((pi, g)),
                                "{what}: read on a file that stayed registered failed: {e:?}"
                            );
                            if stats[2].fetch_add(1, Relaxed) < 3 {
                                eprintln!("{what}: in flight while unregistered -> {e:?}");
                            }
                            if e.kind() == io::ErrorKind::InvalidInput {
                                stats[3].fetch_add(1, Relaxed);
                            }
                        }
                    }
                }
            }));
            }
            // The mutator: unregister / register, reusing slots with new files.
            let mutator = {
                let (ctx, table, pool, stats) =
                    (ctx.clone(), table.clone(), pool.clone(), stats.clone());
                tokio::spawn(async move {
                    let mut rng = Rng::new(0x3a7);
                    let mut gen = 100u64;
                    let mut reused = 0;
                    for _ in 0..300 {
                        tokio::time::sleep(Duration::from_micros(rng.below(800))).await;
                        if rng.chance(30) {
                            for f in pool.iter() {
                                f.drop_cache();
                            }
                        }
                        let mut t = table.lock().await;
                        let live: Vec<usize> = (0..t.len()).filter(|&i| t[i].is_some()).collect();
                        if live.len() > 1 && rng.chance(60) {
                            let fid = live[rng.below(live.len() as u64) as usize];
                            ctx.unregister_file(fid as u32)
                                .unwrap_or_else(|e| panic!("unregister live fid {fid}: {e}"));
                            t[fid] = None;
                            // Unregistering it again fails cleanly.
                            let e = ctx
                                .unregister_file(fid as u32)
                                .expect_err("double unregister succeeded");
                            assert_eq!(
                                e.kind(),
                                io::ErrorKind::InvalidInput,
                                "double unregister: {e}"
                            );
                        }
                        if live.len() < 8 && rng.chance(70) {
                            let pi = rng.below(pool.len() as u64) as usize;
                            let fid = ctx
                                .register_file(pool[pi].open())
                                .expect("register_file")
                                .index() as usize;
                            if fid < t.len() {
                                assert!(t[fid].is_none(), "register_file returned live fid {fid}");
                                reused += 1;
                            } else {
                                t.resize(fid + 1, None);
                            }
                            gen += 1;
                            t[fid] = Some((pi, gen));
                            stats[4].fetch_add(1, Relaxed);
                        }
                        stats[5].store(t.len() as u64, Relaxed);
                    }
                    reused
                })
            };
            for r in readers {
                r.await.expect("reader panicked");
            }
            let reused = mutator.await.expect("mutator panicked");
            eprintln!(
            "{choice:?}: unknown-fid errors {}, ok reads {} ({} short after unregister), errors on removed files {} ({} InvalidInput), registrations {} (slot reuses {reused}), table len {}",
            stats[0].load(Relaxed),
            stats[1].load(Relaxed),
            stats[6].load(Relaxed),
            stats[2].load(Relaxed),
            stats[3].load(Relaxed),
            stats[4].load(Relaxed),
            stats[5].load(Relaxed),
        );
            assert_eq!(
                common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await,
                0
            );
            // Final check of every live slot.
            let t = table.lock().await.clone();
            for (fid, e) in t.iter().enumerate() {
                if let Some((pi, _)) = e {
                    common::verify_whole_file(&ctx, fid as u32, &pool[*pi], 64 * 1024).await;
                }
            }
            drop(set);
        },
    );
}

// ---------------------------------------------------------------------------
// construction outside a runtime
// ---------------------------------------------------------------------------

fn new_outside_runtime_is_err(choice: BackendChoice) {
    let set = common::FileSet::new(0x0, &[4096]);
    common::watchdog("new_outside_runtime_is_err", 20, move || {
        assert!(tokio::runtime::Handle::try_current().is_err());
        let r = std::panic::catch_unwind(|| {
            UringContext::builder()
                .backend(choice)
                .build(set.open_all())
        });
        match r {
            Ok(Err(e)) => eprintln!("{choice:?}: build outside runtime -> {e}"),
            Ok(Ok(_)) => panic!("build() outside a tokio runtime succeeded"),
            Err(_) => panic!("build() outside a tokio runtime panicked instead of returning Err"),
        }
        if choice == BackendChoice::IoUring {
            let r = std::panic::catch_unwind(|| UringContext::new(set.open_all()));
            match r {
                Ok(Err(e)) => eprintln!("new outside runtime -> {e}"),
                Ok(Ok(_)) => panic!("new() outside a tokio runtime succeeded"),
                Err(_) => panic!("new() outside a tokio runtime panicked instead of returning Err"),
            }
        }
        // Inside a runtime the same call works.
        let rt = common::runtime(Flavor::Current);
        let ctx = rt.block_on(async { common::default_ctx(choice, set.open_all()) });
        drop(ctx);
        drop(rt);
    });
}

// ---------------------------------------------------------------------------
// error and edge semantics
// ---------------------------------------------------------------------------

fn error_semantics(choice: BackendChoice) {
    let set = common::FileSet::new(0xe7, &[10_000, 0]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    let dir = set.dir.path().to_path_buf();
    common::run("error_semantics", Flavor::Multi, 30, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b);
        let mut buf = vec![0u8; 4096];

        // Unknown fids.
        for fid in [2u32, 9999, u32::MAX] {
            assert_invalid_input_naming(ctx.read(fid, 0, &mut buf).await, fid, "read unknown fid");
            let (r, b) = ctx.read_owned(fid, 0, vec![1u8; 8]).await;
            assert_invalid_input_naming(r, fid, "read_owned unknown fid");
            assert_eq!(
                b,
                vec![1u8; 8],
                "read_owned must give the buffer back on error"
            );
            let e = ctx
                .read_exact(fid, 0, &mut buf)
                .await
                .expect_err("read_exact unknown fid");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            let e = ctx
                .unregister_file(fid)
                .expect_err("unregister unknown fid");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }

        // Past EOF, at EOF, empty files.
        assert_eq!(
            ctx.read(0u32, 10_000, &mut buf).await.unwrap(),
            0,
            "read at EOF"
        );
        assert_eq!(
            ctx.read(0u32, 10_001, &mut buf).await.unwrap(),
            0,
            "read past EOF"
        );
        assert_eq!(
            ctx.read(0u32, 1 << 40, &mut buf).await.unwrap(),
            0,
            "read far past EOF"
        );
        assert_eq!(
            ctx.read(1u32, 0, &mut buf).await.unwrap(),
            0,
            "read of empty file"
        );
        let (r, b) = ctx.read_owned(0u32, 20_000, Vec::with_capacity(10)).await;
        assert_eq!((r.unwrap(), b.len()), (0, 0), "read_owned past EOF");

        // Empty buffers.
        for off in [0u64, 5, 10_000, 1 << 40] {
            assert_eq!(
                ctx.read(0u32, off, &mut []).await.unwrap(),
                0,
                "empty read @ {off}"
            );
            let (r, b) = ctx.read_owned(0u32, off, Vec::new()).await;
            assert_eq!(
                (r.unwrap_err().kind(), b.len()),
                (io::ErrorKind::InvalidInput, 0),
                "empty read_owned @ {off}"
            );
            ctx.read_exact(0u32, off, &mut [])
                .await
                .expect("empty read_exact");
        }

        // Short read at EOF returns exactly the available bytes.
        buf.fill(0xEE);
        let n = ctx.read(0u32, 10_000 - 100, &mut buf).await.unwrap();
        assert_eq!(n, 100);
        assert_eq!(&buf[..100], &file.expected(9_900, 100)[..]);
        assert!(
            buf[100..].iter().all(|&b| b == 0xEE),
            "bytes past a short read were modified"
        );

        // read_exact: EOF inside the range -> UnexpectedEof; exact fit -> Ok.
        let e = ctx
            .read_exact(0u32, 9_000, &mut buf)
            .await
            .expect_err("read_exact across EOF");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        let e = ctx
            .read_exact(0u32, 50_000, &mut buf)
            .await
            .expect_err("read_exact past EOF");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        let mut exact = vec![0u8; 1000];
        ctx.read_exact(0u32, 9_000, &mut exact)
            .await
            .expect("read_exact up to EOF");
        assert_eq!(exact, file.expected(9_000, 1000));

        // Offsets that are not valid file positions (>= 2^63) must never
        // return data (io_uring treats offset -1 as "current position").
        for off in [u64::MAX, i64::MAX as u64 + 1, u64::MAX - 4095] {
            buf.fill(0xEE);
            let r = ctx.read(0u32, off, &mut buf).await;
            match r {
                Ok(0) => {}
                Err(ref e) => eprintln!("{choice:?}: read @ {off:#x} -> {e}"),
                Ok(n) => panic!(
                    "read at invalid offset {off:#x} returned {n} bytes (first: {:?}); pread gives EINVAL",
                    &buf[..n.min(8)]
                ),
            }
        }

        // Offsets near the top of the valid range behave like pread(2),
        // except where offset + len passes i64::MAX: pread then fails with
        // EINVAL, while the library clamps the read to end at i64::MAX (no
        // file extends that far) and returns Ok(0) as for any offset past
        // the end of file — the same on every path (see `UringContext::read`).
        for off in [
            i64::MAX as u64 - 10,
            i64::MAX as u64,
            1u64 << 62,
            (1u64 << 62) - 1,
        ] {
            use std::os::unix::fs::FileExt as _;
            let reference = file
                .open()
                .read_at(&mut buf, off)
                .map_err(|e| e.raw_os_error());
            let got = ctx
                .read(0u32, off, &mut buf)
                .await
                .map_err(|e| e.raw_os_error());
            eprintln!("{choice:?}: read @ {off:#x}: pread {reference:?}, library {got:?}");
            match (reference, got) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b, "read @ {off:#x}: pread returned {a}, library {b}");
                }
                (Err(_), Err(_)) => {}
                (Err(Some(libc::EINVAL)), Ok(0))
                    if off
                        .checked_add(buf.len() as u64)
                        .is_none_or(|end| end > i64::MAX as u64) => {}
                (a, b) => panic!("read @ {off:#x}: pread gave {a:?} but the library {b:?}"),
            }
        }

        // Removed fid.
        let fid = ctx.register_file(file.open()).unwrap();
        assert_eq!(ctx.read(fid, 0, &mut buf).await.unwrap(), 4096);
        ctx.unregister_file(fid).unwrap();
        assert_invalid_input_naming(
            ctx.read(fid, 0, &mut buf).await,
            fid.index(),
            "read removed fid",
        );

        // A read of a write-only descriptor: named, with the kernel's EBADF
        // kept (`os_error`).
        let wo_path = dir.join("write-only");
        std::fs::write(&wo_path, b"secret").unwrap();
        let wo = std::fs::OpenOptions::new()
            .write(true)
            .open(&wo_path)
            .unwrap();
        let fid = ctx.register_file(wo).unwrap();
        let denied = |e: io::Error, what: &str| {
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{what}: {e:?}");
            assert_eq!(
                uring_positioned_io::os_error(&e),
                Some(libc::EBADF),
                "{what}: {e:?}"
            );
        };
        let e = ctx
            .read(fid, 0, &mut buf)
            .await
            .expect_err("read of a write-only fd succeeded");
        denied(e, "read");
        let (r, _) = ctx.read_owned(fid, 0, Vec::with_capacity(16)).await;
        denied(r.expect_err("read_owned of write-only fd"), "read_owned");
        let e = ctx
            .read_exact(fid, 0, &mut buf)
            .await
            .expect_err("read_exact write-only");
        denied(e, "read_exact");
        ctx.unregister_file(fid).unwrap();

        // A directory cannot do positioned reads: refused when registered.
        let e = ctx
            .register_file(std::fs::File::open(&dir).unwrap())
            .expect_err("a directory was registered");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("directory"), "{e}");
        eprintln!("{choice:?}: registering a directory -> {e}");

        // Still serving.
        assert_eq!(ctx.read(0u32, 0, &mut buf).await.unwrap(), 4096);
        assert_eq!(&buf[..], &file.expected(0, 4096)[..]);
        assert_eq!(
            common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await,
            0
        );
        drop(set);
    });
}

/// FileId conversions and handle properties the API promises.
#[test]
fn api_properties() {
    let _shared = common::shared();
    fn assert_send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync_clone::<UringContext>();
    let f = uring_positioned_io::FileId::from(7u32);
    let g = f;
    assert_eq!(f.index(), 7);
    assert_eq!(f, g);
}

/// A context created on one (multi_thread) runtime is used from tasks of
/// another runtime, and from a plain thread blocking on a third one.
fn used_from_another_runtime(choice: BackendChoice) {
    let set = common::FileSet::new(0x3a4, &[1 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::watchdog("used_from_another_runtime", 60, move || {
        let home = common::runtime(Flavor::Multi);
        let ctx =
            home.block_on(async { common::build_ctx(choice, opened, |b| b.inline_nowait(false)) });
        for flavor in [Flavor::Current, Flavor::Multi] {
            let other = common::runtime(flavor);
            let (ctx, file) = (ctx.clone(), file.clone());
            other.block_on(async move {
                let tasks: Vec<_> = (0..32u64)
                    .map(|t| {
                        let (ctx, file) = (ctx.clone(), file.clone());
                        tokio::spawn(async move {
                            let off = t * 30_011;
                            let mut buf = vec![0u8; 20_000];
                            let n = ctx.read(0u32, off, &mut buf).await.expect("read");
                            assert_eq!(&buf[..n], &file.expected(off, 20_000)[..]);
                        })
                    })
                    .collect();
                for t in tasks {
                    tokio::time::timeout(Duration::from_secs(20), t)
                        .await
                        .expect("read from another runtime hung")
                        .expect("reader panicked");
                }
            });
        }
        drop(ctx);
        drop(home);
        drop(set);
    });
}

/// A read whose first poll finds the task's coop budget spent, on a fid that
/// is not registered, fails with the unknown-fid error — even if a file is
/// registered under that index before it is polled again (it used to read
/// the new file; seen once in `register_unregister_during_reads`).
fn coop_spent_read_of_unknown_fid_fails(choice: BackendChoice) {
    let set = common::FileSet::new(0x1c00, &[8192, 8192]);
    let (a, b) = (set.files[0].clone(), set.files[1].clone());
    common::run(
        "coop_spent_unknown_fid",
        Flavor::Multi,
        30,
        move || async move {
            let ctx = common::build_ctx(choice, vec![a.open()], |b| b);
            let mut buf = vec![0u8; 100];
            let mut fut = pin!(ctx.read(1u32, 0, &mut buf));
            let first = std::future::poll_fn(|cx| {
                // Spend the whole budget, then poll the read once.
                while let Poll::Ready(p) = tokio::task::coop::poll_proceed(cx) {
                    p.made_progress();
                }
                Poll::Ready(fut.as_mut().poll(cx))
            })
            .await;
            let fid = ctx.register_file(b.open()).expect("register");
            assert_eq!(fid.index(), 1, "the test needs the next index");
            let res = match first {
                Poll::Ready(r) => r,
                Poll::Pending => fut.await,
            };
            assert_invalid_input_naming(res, 1, "read of fid 1 issued before it was registered");
            drop(set);
        },
    );
}

backend_tests!(
    coop_spent_read_of_unknown_fid_fails,
    shutdown_with_reads_in_flight,
    shutdown_between_polls,
    reads_after_shutdown_fail,
    drop_last_handle_with_reads_in_flight,
    drop_runtime_with_reads_in_flight,
    register_unregister_during_reads,
    new_outside_runtime_is_err,
    error_semantics,
    used_from_another_runtime,
);

/// What a reading task returned, once it ends (in 30 s, or the read hangs).
async fn ended<T>(t: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), t)
        .await
        .expect("a read hangs after its home runtime died")
        .unwrap()
}

/// The home runtime dies while reads polled from another runtime are in the
/// kernel: correct bytes, or an error naming the cause — never a short
/// count in the middle of the file, never EFAULT.
#[test]
fn home_runtime_dies_mid_read() {
    let _shared = common::shared();
    const LEN: u64 = 96 << 20;
    const READ: usize = 256 * 1024;
    let set = common::FileSet::new(0x604, &[LEN]);
    let file = set.files[0].clone();
    common::watchdog("home_runtime_dies_mid_read", 120, move || {
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
                    let (off, r, buf) = ended(t).await;
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

/// The fallback's blocking pool when the runtime it was built on dies
/// while reads polled from another runtime wait for its 4 slots: small
/// reads wait as queued jobs (run by the pool thread that frees a slot),
/// large ones as wakers. Every read ends, with the right bytes or an error
/// naming the cause.
#[test]
fn home_runtime_dies_with_reads_queued_on_the_pool() {
    let _shared = common::shared();
    const LEN: u64 = 16 << 20;
    let set = common::FileSet::new(0x605, &[LEN]);
    let file = set.files[0].clone();
    common::watchdog(
        "home_runtime_dies_with_reads_queued_on_the_pool",
        120,
        move || {
            let mut outcomes = [0usize; 2]; // ok, error naming the cause
            for round in 0..6u64 {
                let home = common::runtime(Flavor::Multi);
                let ctx = home.block_on(async {
                    common::build_ctx(BackendChoice::Fallback, vec![file.open()], |b| {
                        b.max_in_flight(4).shutdown_timeout(Duration::from_secs(5))
                    })
                });
                let other = common::runtime(Flavor::Multi);
                let mut rng = Rng::new(round);
                let tasks: Vec<_> = (0..256)
                    .map(|i| {
                        let ctx = ctx.clone();
                        let len = if i % 4 == 0 { 256 * 1024 } else { 4096 };
                        let off = rng.below(LEN - len as u64);
                        other.spawn(async move {
                            let mut buf = vec![0u8; len];
                            let r = ctx.read(0u32, off, &mut buf).await;
                            (off, r, buf)
                        })
                    })
                    .collect();
                std::thread::sleep(Duration::from_millis(1 + round));
                drop(home);
                other.block_on(async {
                    for t in tasks {
                        let (off, r, buf) = ended(t).await;
                        match r {
                            Ok(n) => {
                                assert_eq!(n, buf.len(), "short read at {off}");
                                assert_eq!(buf, file.expected(off, n), "wrong bytes at {off}");
                                outcomes[0] += 1;
                            }
                            Err(e) => {
                                let msg = e.to_string();
                                assert!(
                                    msg.contains("home runtime") || msg.contains("shut down"),
                                    "the error should name the cause: {msg}"
                                );
                                outcomes[1] += 1;
                            }
                        }
                    }
                    // The context still answers: a new read fails cleanly.
                    let mut buf = vec![0u8; 4096];
                    let r =
                        tokio::time::timeout(Duration::from_secs(30), ctx.read(0u32, 0, &mut buf))
                            .await
                            .expect("a read after the home runtime died hangs");
                    if let Ok(n) = r {
                        assert_eq!(buf[..n], file.expected(0, n)[..]);
                    }
                });
                drop(ctx);
                other.shutdown_timeout(Duration::from_secs(5));
            }
            eprintln!("outcomes (ok, error naming the cause): {outcomes:?}");
        },
    );
    drop(set);
}

/// Teardown is bounded even when the kernel never returns the reads.
#[test]
fn teardown_with_reads_that_never_finish() {
    let _shared = common::shared();
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
    common::watchdog("teardown_with_reads_that_never_finish", 90, move || {
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
                // worker picked it up (by the cancel, or because the thread
                // that submitted it exited with the runtime: an explained
                // ECANCELED).
                assert!(
                    e.kind() == io::ErrorKind::TimedOut
                        || uring_positioned_io::os_error(&e) == Some(libc::ECANCELED),
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

/// `shutdown_timeout(Duration::MAX)` ("as long as it takes"): the driver's
/// deadline and `Ring::drop`'s overflowed `Instant + Duration` — a panic on
/// a worker, then a second one in `Ring::drop` that aborted the process.
#[test]
fn shutdown_timeout_max_is_not_an_overflow() {
    let _shared = common::shared();
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
fn fallback_shutdown_leaves_no_sleeping_thread() {
    let _shared = common::shared();
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
