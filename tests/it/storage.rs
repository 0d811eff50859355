//! Storage that fails, lies or blocks, on a FUSE
//! file system started by the test (`tests/common/fuse.rs`). Each test
//! prints `skipped: <reason>` and passes where FUSE is unavailable.

use crate::common;

use std::fs::File;
use std::io;
use std::time::{Duration, Instant};

use crate::driver::Reentrant;
use common::fuse::{Fault, FaultFs, FileSpec};
use common::Flavor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use uring_positioned_io::{BackendChoice, UringContext};

const MIB: u64 = 1 << 20;

/// Storage that returns fewer bytes than asked: the read returns a short
/// count with the right bytes (as pread does), or the right bytes in full —
/// never wrong bytes as `Ok`. `read_exact` returns the right bytes or an
/// error.
#[test]
fn short_reads_never_return_wrong_bytes() {
    let _shared = common::shared();
    for direct in [true, false] {
        let spec = FileSpec::new("lies", 8 * MIB, 0x7001);
        let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), direct) else {
            return;
        };
        // Faults on 128 KiB boundaries (see the harness on readahead).
        fs.set_fault("lies", MIB..2 * MIB, Fault::Short(1000));
        let path = fs.path("lies");
        // Not `Route::Ring`: there io_uring returns wrong bytes as `Ok`, with
        // `IOSQE_ASYNC` too (why FUSE is on the blocking pool by default).
        for route in [Route::Pool, Route::Fallback] {
            let path = path.clone();
            let spec = spec.clone();
            common::run("short_reads", Flavor::Multi, 60, move || async move {
                let ctx = route.ctx(vec![File::open(&path).unwrap()], |b| b);
                for off in [MIB, MIB + 4096, MIB + 100_000] {
                    let mut buf = vec![0u8; 4096];
                    match ctx.read(0u32, off, &mut buf).await {
                        Ok(n) => {
                            let want = common::expected(spec.seed, spec.len, off, n);
                            assert!(
                                buf[..n] == want[..],
                                "{route:?} direct={direct}: Ok({n}) with wrong bytes at {off}: {}",
                                common::check_pattern(spec.seed, off, &buf[..n]).unwrap_err()
                            );
                            eprintln!("{route:?} direct={direct}: read @ {off} -> Ok({n})");
                        }
                        Err(e) => eprintln!("{route:?} direct={direct}: read @ {off} -> {e}"),
                    }
                    let mut buf = vec![0u8; 4096];
                    if ctx.read_exact(0u32, off, &mut buf).await.is_ok() {
                        assert!(
                            buf[..] == common::expected(spec.seed, spec.len, off, 4096)[..],
                            "{route:?} direct={direct}: read_exact returned wrong bytes at {off}"
                        );
                    }
                }
            });
        }
        drop(fs);
    }
}

/// A healthy-file workload for `secs`: reads done, and the worst lateness of
/// a 1 ms interval on the same runtime.
async fn healthy_load(
    ctx: &UringContext,
    fid: u32,
    file: &common::TestFile,
    secs: f64,
) -> (u64, Duration) {
    let stop = Instant::now() + Duration::from_secs_f64(secs);
    let ticker = ticker(stop);
    let readers: Vec<_> = (0..32u64)
        .map(|r| {
            let (ctx, file) = (ctx.clone(), file.clone());
            tokio::spawn(async move {
                let mut rng = common::Rng::new(r);
                let mut n = 0u64;
                let mut buf = vec![0u8; 4096];
                while Instant::now() < stop {
                    let off = rng.below(file.len / 4096) * 4096;
                    let got = ctx.read(fid, off, &mut buf).await.expect("healthy read");
                    assert_eq!(&buf[..got], &file.expected(off, 4096)[..]);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut reads = 0;
    for r in readers {
        reads += r.await.unwrap();
    }
    (reads, ticker.await.unwrap())
}

/// How a test reaches a FUSE file: the default route (the blocking pool),
/// the rings (`fuse_via_blocking_pool(false)`: `IOSQE_ASYNC`, io-wq), or the
/// fallback backend. Also used by `sched`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route {
    Pool,
    Ring,
    Fallback,
}

pub(crate) const ROUTES: [Route; 3] = [Route::Pool, Route::Ring, Route::Fallback];

impl Route {
    pub(crate) fn ctx(
        self,
        files: Vec<File>,
        tweak: impl FnOnce(uring_positioned_io::Builder) -> uring_positioned_io::Builder,
    ) -> UringContext {
        let (choice, on_pool) = match self {
            Route::Pool => (BackendChoice::IoUring, true),
            Route::Ring => (BackendChoice::IoUring, false),
            Route::Fallback => (BackendChoice::Fallback, true),
        };
        common::build_ctx(choice, files, |b| tweak(b.fuse_via_blocking_pool(on_pool)))
    }
}

/// Storage that fails: the errno reaches the caller as is, on every route,
/// by every read call; reads outside the failing range are right.
#[test]
fn errors_reach_the_caller() {
    let _shared = common::shared();
    for direct in [true, false] {
        let spec = FileSpec::new("errs", 8 * MIB, 0x7020);
        let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), direct) else {
            return;
        };
        // Faults on 128 KiB boundaries (see the harness on readahead).
        fs.set_fault("errs", MIB..MIB + 128 * 1024, Fault::Errno(libc::EIO));
        fs.set_fault(
            "errs",
            2 * MIB..2 * MIB + 128 * 1024,
            Fault::Errno(libc::ETIMEDOUT),
        );
        fs.set_fault(
            "errs",
            3 * MIB..3 * MIB + 128 * 1024,
            Fault::Errno(libc::ENOSPC),
        );
        let path = fs.path("errs");
        for route in ROUTES {
            let (path, spec) = (path.clone(), spec.clone());
            common::run("errors", Flavor::Multi, 60, move || async move {
                let ctx = route.ctx(vec![File::open(&path).unwrap()], |b| b);
                let cases = [
                    (MIB + 4096, libc::EIO),
                    (2 * MIB, libc::ETIMEDOUT),
                    (3 * MIB + 8192, libc::ENOSPC),
                ];
                for (off, errno) in cases {
                    let what = format!("{route:?} direct={direct} @ {off}");
                    let mut buf = vec![0u8; 4096];
                    let e = ctx.read(0u32, off, &mut buf).await.unwrap_err();
                    assert_eq!(e.raw_os_error(), Some(errno), "{what}: read gave {e}");
                    let e = ctx.read_exact(0u32, off, &mut buf).await.unwrap_err();
                    assert_eq!(e.raw_os_error(), Some(errno), "{what}: read_exact gave {e}");
                    let (res, _) = ctx.read_owned(0u32, off, Vec::with_capacity(4096)).await;
                    let e = res.unwrap_err();
                    assert_eq!(e.raw_os_error(), Some(errno), "{what}: read_owned gave {e}");
                }
                // Healthy ranges read right, before and after the errors.
                for off in [0, MIB - 4096, MIB + 256 * 1024, 4 * MIB] {
                    let mut buf = vec![0u8; 4096];
                    ctx.read_exact(0u32, off, &mut buf).await.unwrap();
                    assert!(
                        buf == common::expected(spec.seed, spec.len, off, 4096),
                        "{route:?} direct={direct}: wrong bytes at {off}"
                    );
                }
                eprintln!("{route:?} direct={direct}: EIO, ETIMEDOUT, ENOSPC reached the caller");
            });
        }
        drop(fs);
    }
}

/// Reads that never return on one file: the runtime keeps running (no
/// `io_uring_enter` blocks a worker), reads of a healthy file go on, a 1 ms
/// timer keeps firing, with 1, 8 and 64 reads hung, on every route; shutdown
/// is bounded. The figures are printed; the bounds only catch a freeze.
#[test]
fn hung_storage_does_not_freeze_the_runtime() {
    let _shared = common::shared();
    for direct in [true, false] {
        let spec = FileSpec::new("hung", 64 * MIB, 0x7002);
        let Some(fs) = FaultFs::mount_or_skip(&[spec], direct) else {
            return;
        };
        let fs = std::sync::Arc::new(fs);
        let path = fs.path("hung");
        let set = common::FileSet::new(0x7003, &[32 * MIB]);
        let healthy = set.files[0].clone();
        for (r, route) in ROUTES.into_iter().enumerate() {
            let (path, healthy, fs) = (path.clone(), healthy.clone(), fs.clone());
            // Each route hangs its own 16 MiB of the file: a page-cache
            // route leaves the pages of released reads cached.
            let base_off = r as u64 * 16 * MIB;
            fs.set_fault("hung", 0..64 * MIB, Fault::Hang);
            common::run("hung_storage", Flavor::Multi, 90, move || async move {
                let ctx = route.ctx(vec![healthy.open(), File::open(&path).unwrap()], |b| {
                    b.shutdown_timeout(Duration::from_secs(1))
                });
                let r = ctx.file_route(1u32).unwrap();
                eprintln!("{route:?} direct={direct}: FUSE file route {r:?}");
                assert_eq!(
                    matches!(r, uring_positioned_io::FileRoute::RingAsync(_)),
                    matches!(route, Route::Ring),
                    "{r:?}"
                );
                let (base, base_late) = healthy_load(&ctx, 0, &healthy, 0.5).await;
                let mut hung = Vec::new();
                for n in [1u64, 8, 64] {
                    // More reads hung on the FUSE file, each at its own 256 KiB.
                    while (hung.len() as u64) < n {
                        let (ctx, i) = (ctx.clone(), hung.len() as u64);
                        hung.push(tokio::spawn(async move {
                            let mut buf = vec![0u8; 4096];
                            ctx.read(1u32, base_off + i * 256 * 1024, &mut buf).await
                        }));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let (with, late) = healthy_load(&ctx, 0, &healthy, 0.5).await;
                    let ratio = with as f64 / base.max(1) as f64;
                    eprintln!(
                        "{route:?} direct={direct}: healthy reads {base} -> {with} with {n} hung ({ratio:.2}x); \
                         1 ms timer worst gap {base_late:?} -> {late:?}; {} requests hung in the server",
                        fs.reads_hung_now()
                    );
                    assert!(with > 0, "healthy reads stalled behind {n} hung ones");
                    assert!(
                        late < Duration::from_millis(500),
                        "runtime froze for {late:?}"
                    );
                }
                for h in &hung {
                    assert!(!h.is_finished(), "a read of hung storage finished");
                }
                // The context's dump shows where the reads are: on the
                // rings route in the kernel (`live`), on the others started
                // on the blocking pool and not ended; their slots held.
                let dump = format!("{ctx:#?}");
                let field = |name: &str| -> usize {
                    dump.lines()
                        .filter_map(|l| l.trim().strip_prefix(name))
                        .filter_map(|v| v.trim_end_matches(',').parse::<usize>().ok())
                        .sum()
                };
                if matches!(route, Route::Ring) {
                    assert!(field("live: ") >= 1, "no live op in the dump:\n{dump}");
                    assert!(field("free: ") < field("limit: "), "no slot held:\n{dump}");
                } else {
                    assert_eq!(field("live: "), 0, "{dump}");
                    assert!(field("started: ") > field("ended: "), "{dump}");
                    assert!(field("free: ") < field("limit: "), "no slot held:\n{dump}");
                }
                // shutdown() returns within its timeout even so.
                let t = Instant::now();
                tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                    .await
                    .expect("shutdown hung on storage that never answers");
                eprintln!("{route:?} direct={direct}: shutdown took {:?}", t.elapsed());
                // The borrowed reads it gave up on fail with TimedOut (their
                // buffers stay with the kernel or the pool thread); those
                // still waiting for a slot never started and fail as shut
                // down.
                for h in &mut hung {
                    let res = tokio::time::timeout(Duration::from_secs(5), h)
                        .await
                        .expect("a hung read still waits after shutdown gave up")
                        .unwrap();
                    let e = res.expect_err("a hung read succeeded");
                    assert!(
                        matches!(
                            e.kind(),
                            io::ErrorKind::TimedOut | io::ErrorKind::BrokenPipe
                        ),
                        "{route:?}: {e}"
                    );
                }
                // Answer the hung reads (EIO; the fault cleared first, as the
                // kernel retries a failed cached read once) so that io-wq
                // workers and pool threads finish before the runtime shuts
                // down.
                fs.clear_faults();
                fs.release_hangs();
            });
        }
        fs.release_hangs();
        drop(fs);
        drop(set);
    }
}

/// Reads stuck on one file cannot take every in-flight slot: with
/// `max_in_flight = 64` and 64 reads hung on one file, the file alone takes
/// every slot but the last `64 / 32 = 2` (the reserve its default share
/// keeps while it is over the share: the share itself binds only once
/// another file's op waits), and a read of another file gets a reserved
/// slot, on the rings and on the blocking pool; without the share
/// (`max_in_flight_per_file(64)`: no reserve) the other file's read waits.
/// How the hung file's 62 slots split with a neighbour is `sched`'s.
#[test]
fn a_hung_file_cannot_take_every_slot() {
    let _shared = common::shared();
    const STUCK: u64 = 64;
    let specs = [
        FileSpec::new("stuck", 256 * MIB, 0x7030),
        FileSpec::new("fine", 4 * MIB, 0x7031),
    ];
    // Page cache on: on the rings, hung reads wait in io-wq workers.
    let Some(fs) = FaultFs::mount_or_skip(&specs, false) else {
        return;
    };
    let fs = std::sync::Arc::new(fs);
    for (k, (route, shared)) in [
        (Route::Ring, true),
        (Route::Pool, true),
        (Route::Fallback, true),
        (Route::Ring, false),
    ]
    .into_iter()
    .enumerate()
    {
        // Each round hangs its own 64 MiB (released pages stay cached).
        let base_off = k as u64 * 64 * MIB;
        let fs2 = fs.clone();
        let (stuck, fine) = (fs.path("stuck"), fs.path("fine"));
        let fine_spec = specs[1].clone();
        fs.set_fault("stuck", 0..256 * MIB, Fault::Hang);
        common::run("hung_file_share", Flavor::Multi, 60, move || async move {
            let fs = fs2;
            let ctx = route.ctx(
                vec![File::open(&stuck).unwrap(), File::open(&fine).unwrap()],
                |b| {
                    let b = b
                        .rings(1)
                        .max_in_flight(STUCK as usize)
                        .inline_nowait(false)
                        .shutdown_timeout(Duration::from_millis(500));
                    if shared {
                        b
                    } else {
                        b.max_in_flight_per_file(STUCK as usize)
                    }
                },
            );
            let before = fs.reads_hung_now();
            let hung: Vec<_> = (0..STUCK)
                .map(|i| {
                    let ctx = ctx.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 4096];
                        ctx.read(0u32, base_off + i * MIB, &mut buf).await
                    })
                })
                .collect();
            let fs2 = fs.clone();
            tokio::task::spawn_blocking(move || fs2.wait_hung(before + 8, Duration::from_secs(10)))
                .await
                .unwrap();
            // Alone, the file holds every slot but the reserve (more than its
            // share of 48); with the share off, every slot.
            let want = if shared { STUCK - 2 } else { STUCK };
            let t = Instant::now();
            while ctx.stats().latency.in_flight < want && t.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(
                ctx.stats().latency.in_flight,
                want,
                "{route:?}: slots held by {STUCK} reads of one hung file"
            );
            let probe = {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    ctx.read_exact(1u32, 8192, &mut buf).await.map(|()| buf)
                })
            };
            let got = tokio::time::timeout(Duration::from_millis(1500), probe).await;
            let what = format!(
                "{route:?}, share {}",
                if shared { "default" } else { "off" }
            );
            eprintln!(
                "{what}: {} reads hung in the server; healthy read {}",
                fs.reads_hung_now(),
                if got.is_ok() { "done" } else { "waiting" }
            );
            if shared {
                let buf = got
                    .unwrap_or_else(|_| panic!("{what}: {STUCK} hung reads starved another file"))
                    .unwrap()
                    .expect("healthy read");
                assert!(buf == common::expected(fine_spec.seed, fine_spec.len, 8192, 4096));
            } else {
                assert!(
                    got.is_err(),
                    "{what}: a read ran while {STUCK} hung reads held every slot"
                );
            }
            fs.clear_faults();
            fs.release_hangs();
            for h in hung {
                h.abort();
            }
            tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                .await
                .expect("shutdown");
        });
        fs.release_hangs();
    }
}

/// FUSE files go to the blocking pool; local files to the rings.
#[test]
fn routes_are_reported() {
    let _shared = common::shared();
    let Some(fs) = FaultFs::mount_or_skip(&[FileSpec::new("f", MIB, 1)], true) else {
        return;
    };
    let set = common::FileSet::new(0x7004, &[4096]);
    let (path, local) = (fs.path("f"), set.files[0].clone());
    common::run("routes", Flavor::Current, 30, move || async move {
        let ctx = common::build_ctx(BackendChoice::IoUring, vec![local.open()], |b| b);
        let fid = ctx.register_file(File::open(&path).unwrap()).unwrap();
        assert_eq!(
            ctx.file_route(0u32).unwrap(),
            uring_positioned_io::FileRoute::Ring
        );
        match ctx.file_route(fid).unwrap() {
            uring_positioned_io::FileRoute::BlockingPool(why) => {
                assert!(why.contains("FUSE"), "{why}");
            }
            other => panic!("a FUSE file on {other:?}"),
        }
        let mut buf = vec![0u8; 4096];
        let n = ctx.read(fid, 0, &mut buf).await.unwrap();
        assert_eq!(n, 4096);
        assert_eq!(
            ctx.file_route(99u32).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    });
    drop(fs);
}

/// The worst gap between ticks of a 1 ms interval on this runtime, until
/// `stop`.
fn ticker(stop: Instant) -> tokio::task::JoinHandle<Duration> {
    tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        let mut last = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        while Instant::now() < stop {
            tick.tick().await;
            let now = Instant::now();
            worst = worst.max(now - last);
            last = now;
        }
        worst
    })
}

/// Slow storage (each read takes 1 to 20 ms, by the MiB it is in), 512
/// reads in flight on one file: the crate, on its default route and on the
/// rings, against `spawn_blocking` + `pread`, the baseline a user would
/// otherwise pick, in the same run; with the worst gap of a 1 ms timer on
/// the same runtime. A file alone may use nearly every slot (the share is
/// work-conserving), so the crate keeps up with the baseline. Printed, not
/// asserted (the bound only catches a freeze).
#[test]
fn slow_storage_keeps_up_with_spawn_blocking() {
    let _shared = common::shared();
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    const IN_FLIGHT: u64 = 512;
    const SECS: f64 = 1.0;
    const LEN: u64 = 1 << 40;
    /// MiBs with their own delay (the runs read about 600); past them, 10 ms.
    const VARIED: u64 = 1024;
    for direct in [true, false] {
        let spec = FileSpec::new("slow", LEN, 0x7005);
        let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), direct) else {
            return;
        };
        fs.set_fault("slow", 0..LEN, Fault::Delay(Duration::from_millis(10)));
        for mib in 0..VARIED {
            // 1..=20 ms, each once in every 20 MiB.
            let ms = 1 + (mib * 7) % 20;
            fs.set_fault(
                "slow",
                mib * MIB..(mib + 1) * MIB,
                Fault::Delay(Duration::from_millis(ms)),
            );
        }
        let path = fs.path("slow");
        // Distinct 4 KiB blocks over the whole run, so no read is served
        // from the cache.
        let next = Arc::new(AtomicU64::new(0));
        let mut line = format!(
            "slow storage (1-20 ms/read, {IN_FLIGHT} in flight, direct={direct}, ideal {}):",
            (IN_FLIGHT as f64 * SECS / 0.0105) as u64
        );
        for who in [Some(Route::Pool), Some(Route::Ring), None] {
            let (path, next) = (path.clone(), next.clone());
            let (reads, late) =
                common::run("slow_storage", Flavor::Multi, 60, move || async move {
                    let ctx = who.map(|r| r.ctx(vec![File::open(&path).unwrap()], |b| b));
                    let file = Arc::new(File::open(&path).unwrap());
                    let stop = Instant::now() + Duration::from_secs_f64(SECS);
                    let tick = ticker(stop);
                    let tasks: Vec<_> = (0..IN_FLIGHT)
                        .map(|_| {
                            let (ctx, file, next) = (ctx.clone(), file.clone(), next.clone());
                            tokio::spawn(async move {
                                let mut n = 0u64;
                                let mut buf = vec![0u8; 4096];
                                while Instant::now() < stop {
                                    let off = next.fetch_add(1, Relaxed) * 4096;
                                    let got = if let Some(ctx) = &ctx {
                                        ctx.read(0u32, off, &mut buf).await.unwrap()
                                    } else {
                                        let file = file.clone();
                                        tokio::task::spawn_blocking(move || {
                                            let mut buf = vec![0u8; 4096];
                                            file.read_at(&mut buf, off).unwrap()
                                        })
                                        .await
                                        .unwrap()
                                    };
                                    assert_eq!(got, 4096);
                                    n += 1;
                                }
                                n
                            })
                        })
                        .collect();
                    let mut reads = 0;
                    for t in tasks {
                        reads += t.await.unwrap();
                    }
                    (reads, tick.await.unwrap())
                });
            let name = who.map_or_else(|| "spawn_blocking".to_string(), |r| format!("{r:?}"));
            line += &format!(" {name} {reads} reads, timer worst gap {late:.1?};");
            // Throughput is printed, not asserted (a busy machine would make
            // any bound flaky); the figures are in docs/BENCHMARKS.md.
            assert!(reads > 0);
            assert!(
                late < Duration::from_millis(1000),
                "{name}: runtime froze {late:?}"
            );
        }
        eprintln!("{line}");
        drop(fs);
    }
}

/// Reads stuck on storage that never answers fill `max_in_flight` (the
/// per-file share turned off); dropping their futures asks the kernel to
/// cancel them (`IORING_OP_ASYNC_CANCEL`), and their slots come back as soon
/// as the kernel lets go of them. Reads an io-wq worker is already blocked
/// in cannot be stopped (FUSE waits for the server after an interrupt), and
/// since io-wq may run as many workers as reads in flight, all 64 usually
/// are: their slots come back when the storage answers. (Before the io-wq
/// limit was raised, 8 workers took 8 reads and the cancels freed the other
/// 56 at once; the slots the per-file share reserves, not cancellation, are
/// what keeps healthy files going while reads hang, see
/// `a_hung_file_cannot_take_every_slot`.)
#[test]
fn dropped_reads_give_their_slots_back() {
    let _shared = common::shared();
    const STUCK: u64 = 64;
    let spec = FileSpec::new("stuck", 64 * MIB, 0x7010);
    // Page cache on: the reads go to io-wq workers (with FOPEN_DIRECT_IO a
    // hung FUSE read blocks io_uring_enter itself).
    let Some(fs) = FaultFs::mount_or_skip(&[spec], false) else {
        return;
    };
    fs.set_fault("stuck", 0..64 * MIB, Fault::Hang);
    let path = fs.path("stuck");
    let set = common::FileSet::new(0x7011, &[8 * MIB]);
    let healthy = set.files[0].clone();
    let fs = std::sync::Arc::new(fs);
    let fs2 = fs.clone();
    common::run("dropped_reads", Flavor::Multi, 90, move || async move {
        let ctx = common::build_ctx(
            BackendChoice::IoUring,
            vec![healthy.open(), File::open(&path).unwrap()],
            |b| {
                b.fuse_via_blocking_pool(false)
                    .rings(1)
                    .max_in_flight(STUCK as usize)
                    // One file may take every slot here: the point is that
                    // dropping its reads gives them back.
                    .max_in_flight_per_file(STUCK as usize)
                    .inline_nowait(false)
                    .shutdown_timeout(Duration::from_secs(1))
            },
        );
        let stuck: Vec<_> = (0..STUCK)
            .map(|i| {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    ctx.read(1u32, i * MIB, &mut buf).await
                })
            })
            .collect();
        let fs3 = fs2.clone();
        let hung = tokio::task::spawn_blocking(move || fs3.wait_hung(1, Duration::from_secs(10)))
            .await
            .unwrap();
        assert!(hung >= 1, "no read reached the FUSE server");
        // Every slot is taken: a healthy read cannot start.
        healthy.drop_cache();
        let probe = {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                ctx.read(0u32, 4096, &mut buf)
                    .await
                    .map(|n| buf[..n].to_vec())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !probe.is_finished(),
            "a read ran while {STUCK} reads held every slot: {:?}",
            ctx.stats()
        );
        // Drop the stuck reads: cancels go to the kernel for each of them.
        for s in &stuck {
            s.abort();
        }
        let t = Instant::now();
        while ctx.stats().cancels < STUCK && t.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        eprintln!(
            "dropped {STUCK} stuck reads: {:?}; {} blocked in the FUSE server; healthy read {}",
            ctx.stats(),
            fs2.reads_hung_now(),
            if probe.is_finished() {
                "done"
            } else {
                "waiting"
            }
        );
        assert_eq!(ctx.stats().cancels, STUCK, "a cancel was not sent");
        // The storage answers (EIO): every slot comes back.
        fs2.clear_faults();
        fs2.release_hangs();
        let got = tokio::time::timeout(Duration::from_secs(20), probe)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{STUCK} dropped reads kept their slots after the storage answered: {:?}",
                    ctx.stats()
                )
            })
            .unwrap()
            .expect("healthy read");
        assert_eq!(got, healthy.expected(4096, 4096));
        let stats = ctx.stats();
        eprintln!(
            "after dropping {STUCK} stuck reads: {stats:?}; {} still blocked in the FUSE server",
            fs2.reads_hung_now()
        );
        // New healthy reads keep flowing, and nothing is left in flight.
        common::verify_whole_file(&ctx, 0, &healthy, 64 * 1024).await;
        assert_eq!(ctx.stats().in_flight, 0, "{:?}", ctx.stats());
        tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
            .await
            .expect("shutdown");
    });
    fs.release_hangs();
    drop(set);
}

/// A loop device over a FUSE file: a *block device* (routed to the rings,
/// like a local disk) whose storage fails or stalls where the test says.
struct LoopDev {
    dev: String,
}

impl LoopDev {
    fn attach(backing: &std::path::Path) -> Option<LoopDev> {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", "--read-only"])
            .arg(backing)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(LoopDev {
                dev: String::from_utf8_lossy(&o.stdout).trim().to_string(),
            }),
            Ok(o) => {
                eprintln!(
                    "skipped: losetup failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: no losetup ({e})");
                None
            }
        }
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["--detach", &self.dev])
            .status();
    }
}

/// A local disk that fails or stops answering, as a block device on the
/// rings (a loop device over the FUSE file system): an I/O error reaches
/// the caller as EIO; reads hung on the device do not freeze the runtime,
/// reads of a healthy file go on, a 1 ms timer keeps firing, and shutdown
/// returns at its timeout — buffered and `O_DIRECT`.
#[test]
fn a_failing_or_stalled_block_device() {
    let _shared = common::shared();
    use std::os::unix::fs::OpenOptionsExt;
    let spec = FileSpec::new("disk", 64 * MIB, 0x7040);
    let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), true) else {
        return;
    };
    let Some(dev) = LoopDev::attach(&fs.path("disk")) else {
        return;
    };
    let fs = std::sync::Arc::new(fs);
    let set = common::FileSet::new(0x7041, &[32 * MIB]);
    let healthy = set.files[0].clone();
    for (k, direct) in [false, true].into_iter().enumerate() {
        let base = k as u64 * 32 * MIB;
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true);
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let disk = opts.open(&dev.dev).unwrap();
        fs.set_fault(
            "disk",
            base + 4 * MIB..base + 5 * MIB,
            Fault::Errno(libc::EIO),
        );
        fs.set_fault("disk", base + 16 * MIB..base + 32 * MIB, Fault::Hang);
        let (fs2, healthy, spec) = (fs.clone(), healthy.clone(), spec.clone());
        common::run(
            "stalled_block_device",
            Flavor::Multi,
            90,
            move || async move {
                let ctx =
                    common::build_ctx(BackendChoice::IoUring, vec![healthy.open(), disk], |b| {
                        b.shutdown_timeout(Duration::from_secs(1))
                    });
                assert_eq!(
                    ctx.file_route(1u32).unwrap(),
                    uring_positioned_io::FileRoute::Ring
                );
                let mut buf = uring_positioned_io::AlignedBuf::new(4096, 4096);
                // Healthy blocks of the device read right.
                let n = ctx.read(1u32, base, &mut buf).await.unwrap();
                assert_eq!(n, 4096);
                assert!(buf[..] == common::expected(spec.seed, spec.len, base, 4096)[..]);
                // A failing range: EIO.
                let e = ctx.read(1u32, base + 4 * MIB, &mut buf).await.unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "direct={direct}: {e}");
                // The healthy file is read from the device too (evicted first).
                healthy.drop_cache();
                let (base_reads, base_late) = healthy_load(&ctx, 0, &healthy, 0.5).await;
                // 64 reads hung on the device.
                let hung: Vec<_> = (0..64u64)
                    .map(|i| {
                        let ctx = ctx.clone();
                        tokio::spawn(async move {
                            let mut buf = uring_positioned_io::AlignedBuf::new(4096, 4096);
                            ctx.read(1u32, base + 16 * MIB + i * 256 * 1024, &mut buf)
                                .await
                                .map(|_| ())
                        })
                    })
                    .collect();
                tokio::time::sleep(Duration::from_millis(100)).await;
                healthy.drop_cache();
                let (with, late) = healthy_load(&ctx, 0, &healthy, 0.5).await;
                eprintln!(
                "block device, direct={direct}: healthy reads {base_reads} -> {with} with 64 hung ({:.2}x); \
                 1 ms timer worst gap {base_late:?} -> {late:?}; {} requests hung in the server; {:?}",
                with as f64 / base_reads.max(1) as f64,
                fs2.reads_hung_now(),
                ctx.stats()
            );
                assert!(with > 0, "healthy reads stalled behind a hung device");
                assert!(
                    late < Duration::from_millis(500),
                    "runtime froze for {late:?}"
                );
                let t = Instant::now();
                tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                    .await
                    .expect("shutdown hung on a device that never answers");
                eprintln!(
                    "block device, direct={direct}: shutdown took {:?}",
                    t.elapsed()
                );
                for h in hung {
                    let res = tokio::time::timeout(Duration::from_secs(5), h)
                        .await
                        .expect("a hung read still waits after shutdown gave up")
                        .unwrap();
                    assert!(res.is_err(), "a read of a hung device succeeded");
                }
                fs2.clear_faults();
                fs2.release_hangs();
            },
        );
        fs.clear_faults();
        fs.release_hangs();
    }
    drop(dev);
    drop(set);
}

/// The write path on FUSE: a FUSE file's writes, syncs and
/// `statx` go where its reads go (the blocking pool), and give clear
/// answers — the size, `PermissionDenied` for a read-only file, the file
/// system's word on `fsync` — never a hang; `open` through the context
/// routes the file the same way and reads it correctly.
#[test]
fn fuse_files_take_writes_and_syncs_to_the_blocking_pool() {
    let _shared = common::shared();
    let spec = FileSpec::new("ro", 2 * MIB, 0x7011);
    let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), false) else {
        return;
    };
    let path = fs.path("ro");
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let (path, spec) = (path.clone(), spec.clone());
        common::run("fuse_writes", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![File::open(&path).unwrap()], |b| b);
            assert!(
                matches!(
                    ctx.file_route(0u32).unwrap(),
                    uring_positioned_io::FileRoute::BlockingPool(_)
                ),
                "{choice:?}: FUSE goes to the blocking pool"
            );
            assert_eq!(ctx.file_size(0u32).await.unwrap(), spec.len);
            let e = ctx.write(0u32, 0, b"nope").await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{choice:?}: {e}");
            match ctx.fdatasync(0u32).await {
                Ok(()) => {}
                Err(e) => assert!(e.raw_os_error().is_some(), "{choice:?}: {e}"),
            }
            let opts = uring_positioned_io::OpenOptions::new().read(true).clone();
            let fid = ctx.open(&path, &opts).await.unwrap();
            assert!(matches!(
                ctx.file_route(fid).unwrap(),
                uring_positioned_io::FileRoute::BlockingPool(_)
            ));
            let mut buf = vec![0u8; 4096];
            assert_eq!(ctx.read(fid, 8192, &mut buf).await.unwrap(), 4096);
            assert_eq!(buf, common::expected(spec.seed, spec.len, 8192, 4096));
            let rw = uring_positioned_io::OpenOptions::new()
                .read(true)
                .write(true)
                .clone();
            let e = ctx.open(&path, &rw).await.unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{choice:?}: {e}");
            eprintln!("{choice:?}: FUSE statx, write, fdatasync and open answered");
        });
    }
}

/// Writes and syncs on storage that fails, lies or never answers, on every
/// route, with and
/// without the page cache, against a writable FUSE file whose server-side
/// content is the oracle:
/// - a failing write or sync returns the file system's errno and the
///   server's bytes are unchanged;
/// - a short write returns the count the server took, and those bytes are
///   right; `write_all` goes on until every byte is written; a server that
///   takes nothing makes `write_all` fail with `WriteZero`, never loop;
/// - a write or sync that never answers holds its caller only: a write to a
///   healthy file goes on, dropping the hung one is sound, and `shutdown`
///   returns within its timeout.
#[test]
fn fuse_writes_that_fail_lie_or_hang() {
    let _shared = common::shared();
    const K: u64 = 128 * 1024;
    for direct in [true, false] {
        let spec = FileSpec::new("w", 4 * MIB, 0x7030);
        let Some(fs) = FaultFs::mount_writable_or_skip(std::slice::from_ref(&spec), direct) else {
            return;
        };
        let fs = std::sync::Arc::new(fs);
        let path = fs.path("w");
        let set = common::FileSet::new(0x7031, &[MIB]);
        let healthy = set.files[0].path.clone();
        for (r, route) in ROUTES.into_iter().enumerate() {
            let (path, healthy, fs) = (path.clone(), healthy.clone(), fs.clone());
            // Each route writes its own MiB of the file.
            let base = r as u64 * MIB;
            let label = format!("{route:?} direct={direct}");
            common::run("fuse_write_faults", Flavor::Multi, 90, move || async move {
                let ctx = route.ctx(
                    vec![common::open_rw(&path), common::open_rw(&healthy)],
                    |b| b.shutdown_timeout(Duration::from_secs(1)),
                );
                let data = |seed: u8, len: usize| -> Vec<u8> {
                    (0..len)
                        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                        .collect()
                };

                // 1. A failing write: the errno, nothing written.
                fs.set_write_fault("w", base..base + K, Fault::Errno(libc::EIO));
                let before = fs.content("w");
                let e = ctx.write(0u32, base, &data(1, 4096)).await.unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{label}: {e}");
                let e = ctx
                    .write_all(0u32, base + 8192, &data(2, 10_000))
                    .await
                    .unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{label}: {e}");
                let (res, buf) = ctx.write_all_owned(0u32, base, data(3, 4096)).await;
                assert_eq!(res.unwrap_err().raw_os_error(), Some(libc::EIO), "{label}");
                assert_eq!(buf, data(3, 4096), "{label}: the owned buffer comes back");
                assert!(
                    fs.content("w") == before,
                    "{label}: a failed write changed the file"
                );

                // 2. A short write: the count the server took, right bytes;
                // `write_all` finishes the job.
                let off = base + K;
                fs.set_write_fault("w", off..off + K, Fault::Short(1000));
                let d = data(4, 4096);
                let n = ctx.write(0u32, off, &d).await.unwrap();
                assert!(n > 0 && n <= 4096, "{label}: short write returned {n}");
                let now = fs.content("w");
                assert!(
                    now[off as usize..off as usize + n] == d[..n],
                    "{label}: write returned Ok({n}) but the server holds other bytes"
                );
                eprintln!("{label}: a 4096-byte write on storage taking 1000 -> Ok({n})");
                let d = data(5, 10_000);
                ctx.write_all(0u32, off + 8192, &d).await.unwrap();
                let (res, _) = ctx.write_all_owned(0u32, off + 32_768, data(6, 9000)).await;
                res.unwrap();
                let now = fs.content("w");
                let at = |o: u64, len: usize| &now[o as usize..o as usize + len];
                assert!(
                    at(off + 8192, 10_000) == &d[..],
                    "{label}: write_all lost bytes"
                );
                assert!(
                    at(off + 32_768, 9000) == &data(6, 9000)[..],
                    "{label}: write_all_owned"
                );
                let pieces = fs
                    .write_log()
                    .iter()
                    .filter(|w| w.fault == Some(Fault::Short(1000)))
                    .count();
                assert!(pieces >= 10, "{label}: only {pieces} short replies seen");

                // 3. A server that takes nothing: `write` says 0 (or fails),
                // `write_all` fails with WriteZero; no loop.
                let off = base + 2 * K;
                fs.set_write_fault("w", off..off + K, Fault::Short(0));
                let before = fs.content("w");
                // Without the page cache the kernel passes the 0 on (as
                // pwrite does; io_uring says EAGAIN, which the crate maps
                // back); with it, the kernel fails the write with EIO.
                match ctx.write(0u32, off, &data(7, 4096)).await {
                    Ok(n) => assert_eq!(n, 0, "{label}: wrote {n} bytes to storage taking none"),
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{label}: {e}");
                        assert!(!direct, "{label}: {e}");
                    }
                }
                let e = ctx.write_all(0u32, off, &data(7, 4096)).await.unwrap_err();
                if direct {
                    assert_eq!(e.kind(), io::ErrorKind::WriteZero, "{label}: {e}");
                } else {
                    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{label}: {e}");
                }
                eprintln!("{label}: write_all to storage taking nothing: {e}");
                assert!(
                    fs.content("w") == before,
                    "{label}: storage taking nothing changed"
                );

                // 4. A failing sync: the errno, for both calls.
                fs.set_sync_fault("w", Fault::Errno(libc::EIO));
                for e in [
                    ctx.fdatasync(0u32).await.unwrap_err(),
                    ctx.fsync(0u32).await.unwrap_err(),
                ] {
                    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{label}: {e}");
                }
                // A durable write (`RWF_DSYNC`) syncs its range: through
                // the page cache FUSE sends a sync, whose error is the
                // write's (without it, the flag goes to the server in the
                // write request, which this one ignores); a plain write
                // beside it does not sync, and succeeds.
                let off = base + 4 * K;
                ctx.write(0u32, off, &data(10, 4096)).await.unwrap();
                let res = ctx.write(0u32, off, &data(11, 4096)).durable().await;
                let (owned, _) = ctx
                    .write_all_owned(0u32, off, data(12, 4096))
                    .durable()
                    .await;
                if direct {
                    assert_eq!(res.unwrap(), 4096, "{label}");
                    owned.unwrap();
                } else {
                    for e in [res.unwrap_err(), owned.unwrap_err()] {
                        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{label}: {e}");
                    }
                }
                fs.clear_faults();
                ctx.fdatasync(0u32).await.unwrap();
                let d = data(13, 4096);
                ctx.write_all(0u32, off, &d).durable().await.unwrap();
                assert!(
                    fs.content("w")[off as usize..off as usize + 4096] == d[..],
                    "{label}: a durable write's bytes"
                );

                // 5. A write and a sync that never answer.
                let off = base + 3 * K;
                fs.set_write_fault("w", off..off + K, Fault::Hang);
                fs.set_sync_fault("w", Fault::Hang);
                let hung_write = {
                    let ctx = ctx.clone();
                    tokio::spawn(async move { ctx.write_all(0u32, off, &[9u8; 4096]).await })
                };
                let n = fs.writes_hung("w", 1, Duration::from_secs(10)).await;
                assert_eq!(n, 1, "{label}: the write did not reach the server");
                let hung_sync = {
                    let ctx = ctx.clone();
                    tokio::spawn(async move { ctx.fdatasync(0u32).await })
                };
                let n = fs.writes_hung("w", 2, Duration::from_millis(300)).await;
                // Seen on kernel 6.18: the sync waits in the kernel behind
                // the hung write (FUSE takes the inode lock for both), so
                // the server sees only the write.
                eprintln!("{label}: {n} write/sync requests hung in the server");
                // The healthy file takes writes and syncs meanwhile.
                let t = Instant::now();
                for i in 0..64u64 {
                    ctx.write_all(1u32, i * 4096, &data(i as u8, 4096))
                        .await
                        .unwrap();
                }
                ctx.fdatasync(1u32).await.unwrap();
                eprintln!(
                    "{label}: 64 healthy writes + fdatasync beside them: {:?}",
                    t.elapsed()
                );
                // A borrowed write dropped while hung: sound (its bytes were
                // copied out of the caller's buffer), and the caller is free.
                {
                    let mut mine = vec![8u8; 4096];
                    let r = tokio::time::timeout(
                        Duration::from_millis(200),
                        ctx.write(0u32, off + 8192, &mine),
                    )
                    .await;
                    assert!(
                        r.is_err(),
                        "{label}: a write to hung storage finished: {r:?}"
                    );
                    mine.fill(0xEE);
                    drop(mine);
                }
                assert!(
                    !hung_write.is_finished() && !hung_sync.is_finished(),
                    "{label}"
                );
                let t = Instant::now();
                tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                    .await
                    .expect("shutdown hung on storage that never answers");
                eprintln!("{label}: shutdown took {:?}", t.elapsed());
                for (what, h) in [("write", hung_write), ("sync", hung_sync)] {
                    // Failed by shutdown (given up, or never started), or
                    // answered EIO once the test releases the hang below.
                    let fs2 = fs.clone();
                    let release = tokio::task::spawn_blocking(move || {
                        std::thread::sleep(Duration::from_millis(500));
                        fs2.clear_faults();
                        fs2.release_hangs();
                    });
                    let res = tokio::time::timeout(Duration::from_secs(10), h)
                        .await
                        .unwrap_or_else(|_| panic!("{label}: a hung {what} still waits"))
                        .unwrap();
                    match (what, res) {
                        (_, Err(e)) => eprintln!("{label}: hung {what} ended: {e}"),
                        // A sync the kernel held back behind the hung write
                        // (FUSE takes the inode lock for both) reaches the
                        // server only after the release, when the fault is
                        // cleared.
                        ("sync", Ok(())) => eprintln!("{label}: the sync ran after the release"),
                        (_, Ok(())) => panic!("{label}: a hung {what} succeeded"),
                    }
                    release.await.unwrap();
                }
                fs.clear_faults();
                fs.release_hangs();
            });
        }
        fs.release_hangs();
        drop(fs);
        drop(set);
    }
}

/// An open whose FUSE server never answers `OPEN` waits on the blocking
/// pool, never in a runtime worker: a 1 ms timer keeps firing and a 2 s
/// timeout around the open fires, on both runtime flavours and backends.
/// The path's lookup is cached first, so that a ring's `OPENAT` would run
/// inside `io_uring_enter` on the worker; the server answers the hung
/// opens (EIO) 4 s in, so a freeze ends and fails the bounds instead of
/// hanging the suite. The bounds only catch a freeze.
#[test]
fn an_open_that_never_returns_does_not_freeze_the_runtime() {
    let _shared = common::shared();
    use uring_positioned_io::OpenOptions;
    let spec = FileSpec::new("slow-open", MIB, 0x7100);
    let Some(fs) = FaultFs::mount_or_skip(&[spec], false) else {
        return;
    };
    let fs = std::sync::Arc::new(fs);
    let path = fs.path("slow-open");
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        for flavor in [Flavor::Current, Flavor::Multi] {
            std::fs::metadata(&path).expect("lookup of the FUSE file");
            fs.set_open_fault("slow-open", Fault::Hang);
            let releaser = {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(4));
                    fs.release_hangs();
                })
            };
            let (path, fs2) = (path.clone(), fs.clone());
            common::run("hung_open", flavor, 60, move || async move {
                let ctx = common::build_ctx(choice, vec![], |b| {
                    b.shutdown_timeout(Duration::from_secs(1))
                });
                let tick = ticker(Instant::now() + Duration::from_millis(2500));
                let t = Instant::now();
                let opts = OpenOptions::new().read(true).clone();
                let res =
                    tokio::time::timeout(Duration::from_secs(2), ctx.open(&path, &opts)).await;
                let took = t.elapsed();
                let late = tick.await.unwrap();
                eprintln!(
                    "{choice:?} {flavor:?}: open timed out after {took:?} ({res:?}); 1 ms timer \
                     worst gap {late:?}; {} requests hung in the server",
                    fs2.writes_hung_now("slow-open")
                );
                assert!(
                    res.is_err(),
                    "an open the server never answers returned {res:?}"
                );
                assert!(
                    took < Duration::from_millis(3500),
                    "the 2 s timeout fired after {took:?}"
                );
                assert!(
                    late < Duration::from_millis(1500),
                    "runtime froze for {late:?}"
                );
                // The hung open is answered with EIO at 4 s; the context
                // then opens the file as usual.
                fs2.clear_faults();
                tokio::time::timeout(Duration::from_secs(10), async {
                    while fs2.writes_hung_now("slow-open") > 0 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .expect("the hung open was never released");
                let fid = ctx.open(&path, &opts).await.expect("open once answered");
                let mut buf = vec![0u8; 4096];
                ctx.read_exact(fid, 0, &mut buf).await.unwrap();
                common::check_pattern(0x7100, 0, &buf).unwrap();
                tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                    .await
                    .expect("shutdown hung");
            });
            releaser.join().unwrap();
        }
    }
    drop(fs);
}

/// io-wq runs the writes (and `fallocate`s) of files whose inodes hash
/// alike (64 buckets per ring) one at a time. On a FUSE file opted onto
/// the rings they go to the blocking pool, so a write hung there holds up
/// no other file's writes; were it in io-wq, about one file in 64 would
/// wait behind it for as long as it hung (with the writes put back on the
/// rings, 3–7 of these 299 files did). 299 other files, each written once
/// with a 2 s limit (a healthy write takes milliseconds).
#[test]
fn a_hung_write_on_the_rings_holds_up_no_other_file() {
    let _shared = common::shared();
    let names: Vec<String> = (0..300).map(|i| format!("f{i}")).collect();
    let specs: Vec<FileSpec> = names
        .iter()
        .enumerate()
        .map(|(i, n)| FileSpec::new(n, 64 * 1024, 0x7200 + i as u64))
        .collect();
    let Some(fs) = FaultFs::mount_writable_or_skip(&specs, false) else {
        return;
    };
    let fs = std::sync::Arc::new(fs);
    let paths: Vec<_> = names.iter().map(|n| fs.path(n)).collect();
    let fs2 = fs.clone();
    common::run(
        "hung_write_neighbours",
        Flavor::Multi,
        120,
        move || async move {
            let fs = fs2;
            let ctx = Route::Ring.ctx(paths.iter().map(|p| common::open_rw(p)).collect(), |b| {
                b.shutdown_timeout(Duration::from_secs(1))
            });
            assert!(
                matches!(
                    ctx.file_route(0u32).unwrap(),
                    uring_positioned_io::FileRoute::RingAsync(_)
                ),
                "the FUSE files are on the rings"
            );
            fs.set_write_fault("f0", 0..64 * 1024, Fault::Hang);
            let hung = {
                let ctx = ctx.clone();
                tokio::spawn(async move { ctx.write_all(0u32, 4096, &[9u8; 4096]).await })
            };
            let n = fs.writes_hung("f0", 1, Duration::from_secs(10)).await;
            assert_eq!(n, 1, "the write did not reach the server");
            let mut waited = Vec::new();
            for i in 1..paths.len() as u32 {
                let w =
                    tokio::time::timeout(Duration::from_secs(2), ctx.write_all(i, 0, &[1u8; 4096]));
                match w.await {
                    Ok(r) => r.unwrap(),
                    Err(_) => waited.push(i),
                }
            }
            assert!(
            waited.is_empty(),
            "the writes of {} of {} files ({waited:?}) waited behind a write hung on another file",
            waited.len(),
            paths.len() - 1
        );
            assert!(!hung.is_finished());
            fs.release_hangs();
            let _ = tokio::time::timeout(Duration::from_secs(10), hung).await;
            tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
                .await
                .expect("shutdown");
        },
    );
    fs.release_hangs();
}

/// An owned read whose buffer holds a handle of the context, given up
/// while the kernel has it, then its runtime shut down: once the storage
/// answers, the op is reaped and the buffer dropped — and with it the
/// context, its rings and its files. Nothing else would reap it (the
/// driver went with the runtime), and the buffer's handle would keep the
/// ring that keeps the buffer alive for ever.
#[test]
fn a_buffer_holding_the_context_is_released_after_its_runtime_dies() {
    let _shared = common::shared();
    let spec = FileSpec::new("hung", MIB, 0x7011);
    let Some(fs) = FaultFs::mount_or_skip(&[spec], true) else {
        return;
    };
    let fs = Arc::new(fs);
    fs.set_fault("hung", 0..MIB, Fault::Hang);
    let drops = Arc::new(AtomicUsize::new(0));
    let dropped = {
        let drops = drops.clone();
        move || drops.load(Ordering::SeqCst) > 0
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = Route::Ring.ctx(vec![File::open(fs.path("hung")).unwrap()], |b| b);
        // Its `Drop` also calls back into the context it holds.
        let buf = Reentrant {
            data: vec![0u8; 4096],
            ctx: Arc::new(Mutex::new(Some(ctx.clone()))),
            drops: drops.clone(),
        };
        let read = tokio::time::timeout(Duration::from_secs(1), ctx.read_owned(0u32, 0, buf)).await;
        assert!(read.is_err(), "a read of hung storage finished");
    });
    assert_eq!(
        fs.wait_hung(1, Duration::from_secs(5)),
        1,
        "no read hung in the server"
    );
    // The runtime's shutdown drops the driver, then waits for its worker
    // threads, whose exit waits in the kernel for the io-wq request they
    // submitted: the storage answers (EIO) from another thread meanwhile.
    let answer = {
        let (fs, dropped) = (fs.clone(), dropped.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            let early = dropped();
            fs.release_hangs();
            early
        })
    };
    drop(rt);
    assert!(
        !answer.join().unwrap(),
        "the buffer was dropped while the kernel had it"
    );
    let t = Instant::now();
    while !dropped() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the buffer (and the context it holds) never released after the storage answered"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
