//! Builder options, for both backends: options that change the submission
//! path (SQPOLL, COOP_TASKRUN, several rings, small rings) still read
//! correctly; invalid or out-of-range values, and settings the kernel
//! rejects, are an `Err` from `build` naming the setting — never a panic, an
//! overflow, a silent fallback or a context whose reads hang.

use crate::common;

use common::Flavor;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uring_positioned_io::{BackendChoice, BackendKind, UringContext};

use common::BOTH;

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

/// Size arithmetic on user settings is checked.
#[test]
fn buffer_pool_sizes_are_checked() {
    let _shared = common::shared();
    let set = common::FileSet::new(0x601, &[100_000]);
    let file = set.files[0].clone();
    let opened: Vec<Vec<File>> = (0..18).map(|_| set.open_all()).collect();
    common::run(
        "buffer_pool_sizes_are_checked",
        Flavor::Multi,
        60,
        move || async move {
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
        },
    );
}

/// Settings the kernel rejects are errors, not a silent fallback.
#[test]
fn bad_settings_are_errors() {
    let _shared = common::shared();
    let set = common::FileSet::new(0x610, &[10_000, 20_000]);
    let files = set.files.clone();
    let opened: Vec<Vec<File>> = (0..8).map(|_| set.open_all()).collect();
    common::run(
        "bad_settings_are_errors",
        Flavor::Multi,
        60,
        move || async move {
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
        },
    );
}

/// Ring options that change the submission path must not change results.
#[test]
fn ring_options_smoke() {
    let _shared = common::shared();
    type Tweak = fn(uring_positioned_io::Builder) -> uring_positioned_io::Builder;
    let configs: [(&str, Flavor, Tweak); 7] = [
        ("sqpoll", Flavor::Multi, |b| {
            b.sqpoll(Some(Duration::from_millis(50)))
        }),
        ("sqpoll_ct", Flavor::Current, |b| {
            b.sqpoll(Some(Duration::from_millis(50)))
        }),
        // COOP_TASKRUN is documented as current_thread only.
        ("coop_taskrun", Flavor::Current, |b| b.coop_taskrun(true)),
        ("inline_nowait", Flavor::Multi, |b| b.inline_nowait(true)),
        ("no_inline", Flavor::Multi, |b| b.inline_nowait(false)),
        ("no_inline_ct", Flavor::Current, |b| {
            b.inline_nowait(false).ring_entries(4)
        }),
        ("rings4", Flavor::Multi, |b| b.rings(4).ring_entries(16)),
    ];
    for (name, flavor, tweak) in configs {
        let set = common::FileSet::new(0xed6, &[2 << 20]);
        // Cold data, so reads really go through the ring.
        set.sync_all();
        set.drop_caches();
        let file = set.files[0].clone();
        let opened = set.open_all();
        common::run(name, flavor, 30, move || async move {
            let ctx = match tweak(UringContext::builder().backend(BackendChoice::IoUring))
                .build(opened)
            {
                Ok(ctx) => ctx,
                Err(e) => panic!("{name}: build failed: {e}"),
            };
            assert_eq!(ctx.backend().kind, BackendKind::IoUring);
            let futs = (0..64u64).map(|i| {
                let ctx = ctx.clone();
                let file = file.clone();
                tokio::spawn(async move {
                    let off = (i * 33_331) % file.len;
                    let mut buf = vec![0u8; 20_000];
                    let n = ctx.read(0u32, off, &mut buf).await.expect("read");
                    assert_eq!(&buf[..n], &file.expected(off, 20_000)[..], "{name} @ {off}");
                })
            });
            for r in futures::future::join_all(futs).await {
                r.expect("reader panicked");
            }
            common::verify_whole_file(&ctx, 0, &file, 300_000).await;
            assert_eq!(
                common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await,
                0
            );
            eprintln!("{name}: {:?}", ctx.stats());
            ctx.shutdown().await;
            drop(set);
        });
    }
}

/// Invalid or degenerate options give an error at `build` or a context that
/// works; never a panic, never a context that hangs every read.
#[test]
fn invalid_options_are_errors() {
    let _shared = common::shared();
    type Tweak = fn(uring_positioned_io::Builder) -> uring_positioned_io::Builder;
    let configs: [(&str, Flavor, Tweak); 10] = [
        ("coop_taskrun_multi_thread", Flavor::Multi, |b| {
            b.coop_taskrun(true)
        }),
        ("coop_taskrun_sqpoll", Flavor::Current, |b| {
            b.coop_taskrun(true).sqpoll(Some(Duration::from_millis(10)))
        }),
        ("ring_entries_0", Flavor::Multi, |b| b.ring_entries(0)),
        ("ring_entries_huge", Flavor::Multi, |b| {
            b.ring_entries(1 << 20)
        }),
        ("rings_0", Flavor::Multi, |b| b.rings(0)),
        ("max_in_flight_0", Flavor::Multi, |b| b.max_in_flight(0)),
        ("buffer_pool_0", Flavor::Multi, |b| b.buffer_pool(0, 0)),
        ("buffer_pool_0_count", Flavor::Current, |b| {
            b.buffer_pool(0, 4096)
        }),
        ("shallow_batch_0", Flavor::Multi, |b| b.shallow_batch(0)),
        ("shallow_batch_huge", Flavor::Current, |b| {
            b.shallow_batch(u32::MAX)
        }),
    ];
    let set = common::FileSet::new(0xed7, &[100_000]);
    let file = set.files[0].clone();
    for (name, flavor, tweak) in configs {
        for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
            let opened = set.open_all();
            let file = file.clone();
            common::run(name, flavor, 30, move || async move {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tweak(UringContext::builder().backend(choice)).build(opened)
                }));
                let ctx = match r {
                    Err(_) => panic!("{name}/{choice:?}: build panicked instead of returning Err"),
                    Ok(Err(e)) => {
                        eprintln!("{name}/{choice:?}: rejected: {e}");
                        return;
                    }
                    Ok(Ok(ctx)) => ctx,
                };
                let mut buf = vec![0u8; 70_000];
                let r =
                    tokio::time::timeout(Duration::from_secs(5), ctx.read(0u32, 1000, &mut buf))
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{name}/{choice:?}: accepted, but a read hangs")
                        });
                let n = r.unwrap_or_else(|e| {
                    panic!("{name}/{choice:?}: accepted, but a read fails: {e}")
                });
                assert_eq!(
                    &buf[..n],
                    &file.expected(1000, 70_000)[..],
                    "{name}/{choice:?}"
                );
                eprintln!("{name}/{choice:?}: accepted and works");
            });
        }
    }
}

/// `shallow_batch` outside 1..=32768 is refused at `build`, by name, on
/// either backend.
#[test]
fn shallow_batch_out_of_range_is_refused() {
    let _shared = common::shared();
    let set = common::FileSet::new(0x5ba7, &[4096]);
    for n in [0, 32_769, u32::MAX] {
        for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
            let opened = set.open_all();
            let e = common::run(
                "shallow_batch_out_of_range",
                Flavor::Current,
                30,
                move || async move {
                    UringContext::builder()
                        .backend(choice)
                        .shallow_batch(n)
                        .build(opened)
                        .map(|_| ())
                },
            )
            .expect_err("accepted an out-of-range shallow_batch");
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::InvalidInput,
                "{n}/{choice:?}: {e}"
            );
            assert!(
                e.to_string().contains("shallow_batch"),
                "{n}/{choice:?}: {e}"
            );
        }
    }
}

/// `latency_histograms(true)` counts every op once, in its class and kind,
/// on both backends and runtime flavours; off (the default), there are none.
fn latency_histograms_count_each_op(choice: BackendChoice) {
    use uring_positioned_io::{Priority, SyncRange};
    for flavor in [Flavor::Current, Flavor::Multi] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![5u8; 64 << 10]).unwrap();
        common::run("latency_histograms", flavor, 60, move || async move {
            let rw = || {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap()
            };
            let off = UringContext::builder()
                .backend(choice)
                .build(vec![rw()])
                .unwrap();
            let mut buf = vec![0u8; 4096];
            off.read(0, 0, &mut buf).await.unwrap();
            assert!(off.latencies().is_none());

            let ctx = UringContext::builder()
                .backend(choice)
                .latency_histograms(true)
                .build(vec![rw()])
                .unwrap();
            let before = ctx.latencies().unwrap();
            assert_eq!(before.latency.reads.count(), 0);
            for i in 0..10u64 {
                ctx.read(0, i * 4096, &mut buf).await.unwrap();
            }
            let bg = ctx.with_priority(Priority::Background);
            for i in 0..4u64 {
                bg.read(0, i * 4096, &mut buf).await.unwrap();
            }
            let file = ctx.file(0).unwrap();
            for i in 0..3u64 {
                file.write_all_at(&buf[..512], i * 512).await.unwrap();
            }
            file.sync_data().await.unwrap();
            file.sync_range(0, 4096, SyncRange::WRITE).await.unwrap();
            file.metadata().await.unwrap();
            // A failed op counts too.
            assert!(ctx.read(9, 0, &mut buf).await.is_err());
            let l = ctx.latencies().unwrap().since(&before);
            let counts = [
                l.latency.reads.count(),
                l.latency.writes.count(),
                l.latency.syncs.count(),
                l.latency.other.count(),
                l.background.reads.count(),
                l.background.writes.count(),
            ];
            assert_eq!(counts, [11, 3, 2, 1, 4, 0], "{choice:?}/{flavor:?}: {l:#?}");
            let reads = &l.latency.reads;
            let (p50, p99) = (reads.quantile(0.5).unwrap(), reads.quantile(0.99).unwrap());
            assert!(p50 <= p99 && p99 <= reads.max(), "{reads:?}");
            assert_eq!(reads.buckets().map(|(_, _, c)| c).sum::<u64>(), 11);
        });
    }
}

backend_tests!(latency_histograms_count_each_op);
