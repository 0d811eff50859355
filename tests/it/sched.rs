//! The in-flight-slot scheduler (`src/permit.rs`) seen from outside: file
//! shares that give way only when another file waits, priority classes,
//! and their counters, on every route to a FUSE file (`storage::Route`).
//!
//! Reads stay in flight because the storage holds them (`Fault::Hang`, or
//! a long `Fault::Delay`), so the tests count slots (`stats()`) and the
//! requests the server holds, never time: a delay only has to outlast the
//! few steps of setup that rely on it. Each test prints `skipped: <reason>`
//! and passes where FUSE is unavailable.
//!
//! The mount keeps the page cache on (with `FOPEN_DIRECT_IO` a hung read
//! blocks `io_uring_enter` itself on the ring route); every read is 4 KiB
//! at its own MiB (an isolated read asks the server for just its page, and
//! none is ever cached), and `inline_nowait(false)` sends each through the
//! slots.

use crate::common;
use crate::storage::{Route, ROUTES};

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fuse::{Fault, FaultFs, FileSpec};
use common::Flavor;
use futures::StreamExt;
use tokio::task::JoinHandle;
use uring_positioned_io::{Builder, ClassStats, Priority, ScanOptions, UringContext};

const MIB: u64 = 1 << 20;
/// The files' length: room for a fresh MiB per read.
const LEN: u64 = 1 << 40;
/// Each route's own part of each file (read pages stay cached).
const REGION: u64 = 1 << 30;

/// Poll `cond` until it holds or `within` passes; whether it held.
async fn until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A 4 KiB read of `fid` at `off` on its own task, which bumps `started`
/// just before the read's first poll (which queues it for a slot).
fn read_task(
    ctx: &UringContext,
    fid: u32,
    off: u64,
    started: &Arc<AtomicUsize>,
) -> JoinHandle<io::Result<usize>> {
    let (ctx, started) = (ctx.clone(), started.clone());
    tokio::spawn(async move {
        started.fetch_add(1, SeqCst);
        let mut buf = vec![0u8; 4096];
        ctx.read(fid, off, &mut buf).await
    })
}

/// Waits until `n` tasks started, then lets them reach their slot's queue.
async fn all_queued(started: &AtomicUsize, n: usize) {
    assert!(
        until(Duration::from_secs(10), || started.load(SeqCst) >= n).await,
        "only {} of {n} tasks started",
        started.load(SeqCst)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Read requests of `name` the server received with `Fault::Hang` since the
/// log was last cleared: while no hang is released, the reads of it that
/// hold a slot (an op holds its slot until the kernel is done with it).
fn hung_of(fs: &FaultFs, name: &str) -> usize {
    fs.read_log()
        .iter()
        .filter(|r| r.name == name && r.fault == Some(Fault::Hang))
        .count()
}

/// Answers every hung read when dropped, also when a check fails: a pool
/// thread blocked in a hung read would hold up the runtime's shutdown.
struct Release(Arc<FaultFs>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.clear_faults();
        self.0.release_hangs();
    }
}

/// A context on `route` with one ring (or pool) of `slots` slots, no
/// inline path and a short shutdown timeout, and `more` settings.
fn small_ctx(
    route: Route,
    files: Vec<File>,
    slots: usize,
    more: impl FnOnce(Builder) -> Builder,
) -> UringContext {
    route.ctx(files, |b| {
        more(
            b.rings(1)
                .max_in_flight(slots)
                .inline_nowait(false)
                .shutdown_timeout(Duration::from_millis(500)),
        )
    })
}

fn classes(ctx: &UringContext) -> (ClassStats, ClassStats) {
    let s = ctx.stats();
    (s.latency, s.background)
}

/// Mounts `names` (each `LEN` bytes) with the page cache on.
fn mount(names: &[&str], seed: u64) -> Option<Arc<FaultFs>> {
    let specs: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| FileSpec::new(n, LEN, seed + i as u64))
        .collect();
    FaultFs::mount_or_skip(&specs, false).map(Arc::new)
}

fn open_all(fs: &FaultFs, names: &[&str]) -> Vec<File> {
    names
        .iter()
        .map(|n| File::open(fs.path(n)).unwrap())
        .collect()
}

/// Answers every hung read, waits for `tasks` (reads that end once the
/// storage answers, with data or EIO), and shuts the context down.
async fn finish(fs: &FaultFs, ctx: &UringContext, tasks: Vec<JoinHandle<io::Result<usize>>>) {
    fs.clear_faults();
    fs.release_hangs();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a read still waits once the storage answered")
            .unwrap()
            .ok();
    }
    tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
        .await
        .expect("shutdown");
}

/// Work-conserving file shares, with 64 slots (share 48, reserve 2):
///
/// 1. File A alone takes 62 slots, more than its share: 62 reads that the
///    storage answers after `DELAY`, then 70 reads that hang; those 70
///    wait, and A never takes the reserve.
/// 2. A read of file C gets a reserved slot at once (without the reserve
///    it would wait behind A's 70 hung reads for good), and A still does
///    not take the reserve once C's read is over.
/// 3. File B queues 20 reads that hang: 2 get the reserve at once, 18
///    wait. As A's 62 delayed reads end, every slot they free goes to B
///    while A is at or over its share, and to A's next read only when A
///    is under it: A ends with exactly its share (48 hung reads) and B
///    with the other 16, while 4 of B's reads still wait. A scheduler
///    that handed slots out in arrival order would give A's waiting reads
///    (queued first) every slot: A 62, B 2.
///
/// The delay must only outlast the setup of steps 1 to 3 (a fraction of a
/// second), not any measurement.
#[test]
fn a_file_over_its_share_gives_way_only_when_another_file_waits() {
    const DELAY: Duration = Duration::from_secs(5);
    let _shared = common::shared();
    let names = ["a", "b", "c"];
    let Some(fs) = mount(&names, 0x7300) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        // A: delayed reads in the first half of its region, hung ones in
        // the second half; B: hung; C: healthy.
        fs.clear_faults();
        fs.set_fault("a", base..base + REGION / 2, Fault::Delay(DELAY));
        fs.set_fault("a", base + REGION / 2..base + REGION, Fault::Hang);
        fs.set_fault("b", base..base + REGION, Fault::Hang);
        fs.clear_read_log();
        let (fsc, files) = (fs.clone(), open_all(&fs, &names));
        common::run("share_gives_way", Flavor::Multi, 60, move || async move {
            let fs = fsc;
            let _release = Release(fs.clone());
            let ctx = small_ctx(route, files, 64, |b| b);
            let lat = |ctx: &UringContext| ctx.stats().latency;
            let mut tasks = Vec::new();
            // 1. A alone.
            let started = Arc::new(AtomicUsize::new(0));
            let delayed: Vec<_> = (0..62)
                .map(|i| read_task(&ctx, 0, base + (i + 1) * MIB, &started))
                .collect();
            assert!(
                until(Duration::from_secs(10), || lat(&ctx).in_flight == 62).await,
                "{route:?}: 62 reads of one file did not all get a slot: {:?}",
                lat(&ctx)
            );
            for i in 0..70 {
                tasks.push(read_task(&ctx, 0, base + REGION / 2 + i * MIB, &started));
            }
            all_queued(&started, 132).await;
            let s = lat(&ctx);
            assert_eq!(
                (s.in_flight, s.ops),
                (62, 62),
                "{route:?}: file A alone should hold every slot but the reserve of 2"
            );
            // 2. C's read takes a reserved slot at once.
            let mut buf = vec![0u8; 4096];
            tokio::time::timeout(
                Duration::from_secs(10),
                ctx.read_exact(2u32, base, &mut buf),
            )
            .await
            .unwrap_or_else(|_| panic!("{route:?}: file C's read got no slot beside A's 62"))
            .unwrap();
            assert!(buf == common::expected(0x7302, LEN, base, 4096));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let s = lat(&ctx);
            assert_eq!(
                (s.in_flight, s.ops),
                (62, 63),
                "{route:?}: A took a reserved slot back"
            );
            // 3. B's reads: 2 at once, then the slots A frees.
            for i in 0..20 {
                tasks.push(read_task(&ctx, 1, base + (i + 1) * MIB, &started));
            }
            all_queued(&started, 152).await;
            let s = lat(&ctx);
            let early = delayed.iter().filter(|t| t.is_finished()).count();
            assert_eq!(early, 0, "{route:?}: A's reads ended before the setup did");
            assert_eq!(
                (s.in_flight, s.ops),
                (64, 65),
                "{route:?}: B's reads did not get the 2 reserved slots"
            );
            for t in delayed {
                let n = tokio::time::timeout(Duration::from_secs(30), t)
                    .await
                    .expect("a delayed read never ended")
                    .unwrap()
                    .expect("a delayed read failed");
                assert_eq!(n, 4096);
            }
            // Every slot is now held by a hung read; the server sees them
            // all (on the ring route, once io-wq has a worker for each).
            let all = until(Duration::from_secs(20), || {
                hung_of(&fs, "a") + hung_of(&fs, "b") == 64
            })
            .await;
            let (a, b) = (hung_of(&fs, "a"), hung_of(&fs, "b"));
            let s = lat(&ctx);
            let b_waiting = tasks[70..].iter().filter(|t| !t.is_finished()).count();
            eprintln!(
                "{route:?}: after A's delayed reads: A {a} hung, B {b} hung ({b_waiting} of B's \
                 reads unfinished), {s:?}"
            );
            assert!(all, "{route:?}: the server holds {a} + {b} reads, not 64");
            assert_eq!(s.in_flight, 64, "{route:?}");
            assert_eq!(
                (a, b),
                (48, 16),
                "{route:?}: with B waiting, A should end at its share (48) and B with the rest"
            );
            assert_eq!(
                b_waiting, 20,
                "{route:?}: B's reads are all hung or waiting"
            );
            finish(&fs, &ctx, tasks).await;
        });
        fs.release_hangs();
    }
}

/// Priority classes with 8 slots, `background_share(1)`, the file share
/// off: 8 latency reads hang on file A; 6 background reads of file B
/// queue, then 6 latency reads of B; the hang is released. The first slot
/// freed goes to a background read (background goes first while under its
/// share, so it never starves), every other one to the latency reads:
/// when the last latency read ends, exactly one background read has had a
/// slot. B's background reads take 2 s in the storage, so that the one
/// with a slot keeps it while the latency reads run (one that ended would
/// let the next go first, being under its share again); the check allows
/// a second. Arrival order would give the background reads (queued first)
/// 6 slots; strict priority, none.
#[test]
fn latency_reads_go_first_but_background_keeps_its_share() {
    let _shared = common::shared();
    let names = ["a", "b"];
    let Some(fs) = mount(&names, 0x7310) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        fs.clear_faults();
        fs.set_fault("a", base..base + REGION, Fault::Hang);
        // B: background reads slow in the first half; latency reads in
        // the second, healthy.
        fs.set_fault(
            "b",
            base..base + REGION / 2,
            Fault::Delay(Duration::from_secs(2)),
        );
        let (fsc, files) = (fs.clone(), open_all(&fs, &names));
        common::run("class_order", Flavor::Multi, 60, move || async move {
            let fs = fsc;
            let _release = Release(fs.clone());
            let ctx = small_ctx(route, files, 8, |b| {
                b.max_in_flight_per_file(8).background_share(1)
            });
            let bg_ctx = ctx.with_priority(Priority::Background);
            let started = Arc::new(AtomicUsize::new(0));
            let hung: Vec<_> = (0..8)
                .map(|i| read_task(&ctx, 0, base + (i + 1) * MIB, &started))
                .collect();
            assert!(
                until(Duration::from_secs(10), || ctx.stats().latency.in_flight
                    == 8)
                .await,
                "{route:?}: {:?}",
                ctx.stats().latency
            );
            // Completion order, and background slots granted when each
            // latency read ended.
            let seq = Arc::new(AtomicU64::new(0));
            let spawn = |ctx: &UringContext, off: u64| {
                let (ctx, seq, started) = (ctx.clone(), seq.clone(), started.clone());
                tokio::spawn(async move {
                    started.fetch_add(1, SeqCst);
                    let mut buf = vec![0u8; 4096];
                    let n = ctx.read(1u32, off, &mut buf).await.expect("read of B");
                    assert_eq!(n, 4096);
                    let bg_granted = ctx.stats().background.ops;
                    (seq.fetch_add(1, SeqCst), bg_granted)
                })
            };
            let bg: Vec<_> = (0..6)
                .map(|i| spawn(&bg_ctx, base + (i + 1) * MIB))
                .collect();
            all_queued(&started, 14).await;
            let lat: Vec<_> = (0..6)
                .map(|i| spawn(&ctx, base + REGION / 2 + (i + 1) * MIB))
                .collect();
            all_queued(&started, 20).await;
            let (l, b) = classes(&ctx);
            assert_eq!((l.in_flight, b.in_flight, b.ops), (8, 0, 0), "{route:?}");
            fs.release_hangs();
            let mut last_lat = 0;
            let mut bg_at_last = 0;
            for t in lat {
                let (s, g) = tokio::time::timeout(Duration::from_secs(20), t)
                    .await
                    .expect("a latency read never ended")
                    .unwrap();
                if s >= last_lat {
                    (last_lat, bg_at_last) = (s, g);
                }
            }
            let mut bg_before = 0;
            for t in bg {
                let (s, _) = tokio::time::timeout(Duration::from_secs(30), t)
                    .await
                    .expect("a background read never ended")
                    .unwrap();
                bg_before += usize::from(s < last_lat);
            }
            eprintln!(
                "{route:?}: when the last latency read ended, {bg_at_last} background reads \
                 had a slot and {bg_before} had ended; {:?}",
                classes(&ctx)
            );
            assert!(
                (1..=2).contains(&bg_at_last),
                "{route:?}: {bg_at_last} background reads had a slot before the last latency \
                 read ended (background share 1)"
            );
            assert!(bg_before <= 1, "{route:?}: {bg_before}");
            finish(&fs, &ctx, hung).await;
        });
        fs.release_hangs();
    }
}

/// No starvation: 32 tasks keep 8 slots busy with latency reads that take
/// 5 ms in the storage (so latency reads always wait), and one task loops
/// background reads for half a second: they still get slots, on every
/// route. Strict priority would give them none.
#[test]
fn background_reads_progress_under_saturating_latency_load() {
    let _shared = common::shared();
    let names = ["a", "b"];
    let Some(fs) = mount(&names, 0x7320) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        fs.clear_faults();
        fs.set_fault(
            "a",
            base..base + REGION,
            Fault::Delay(Duration::from_millis(5)),
        );
        let files = open_all(&fs, &names);
        common::run("no_starvation", Flavor::Multi, 60, move || async move {
            let ctx = small_ctx(route, files, 8, |b| b);
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let next = Arc::new(AtomicU64::new(1));
            let looper = |ctx: UringContext, fid: u32| {
                let (stop, next) = (stop.clone(), next.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    let mut buf = vec![0u8; 4096];
                    while !stop.load(SeqCst) {
                        let off = base + next.fetch_add(1, SeqCst) * MIB;
                        let got = ctx.read(fid, off, &mut buf).await.expect("read");
                        assert_eq!(got, 4096);
                        n += 1;
                    }
                    n
                })
            };
            let lat: Vec<_> = (0..32).map(|_| looper(ctx.clone(), 0)).collect();
            assert!(
                until(Duration::from_secs(10), || ctx.stats().latency.waited > 0).await,
                "{route:?}: 32 latency tasks never filled 8 slots"
            );
            let bg = looper(ctx.with_priority(Priority::Background), 1);
            tokio::time::sleep(Duration::from_millis(500)).await;
            stop.store(true, SeqCst);
            let bg_reads = bg.await.unwrap();
            let mut lat_reads = 0;
            for t in lat {
                lat_reads += t.await.unwrap();
            }
            let (l, b) = classes(&ctx);
            eprintln!(
                "{route:?}: {bg_reads} background reads beside {lat_reads} latency reads \
                 ({} of which waited); {b:?}",
                l.waited
            );
            assert!(bg_reads >= 1, "{route:?}: background starved: {b:?}");
            assert_eq!(b.ops, bg_reads, "{route:?}");
            ctx.shutdown().await;
        });
    }
}

/// With no latency op active, background reads use every slot (the
/// background share binds only beside latency ops): 8 background reads
/// hang and hold all 8 slots; a latency read then waits (no op in flight
/// is taken back) until the storage answers.
#[test]
fn background_alone_uses_every_slot() {
    let _shared = common::shared();
    let names = ["a", "b"];
    let Some(fs) = mount(&names, 0x7370) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        fs.clear_faults();
        fs.set_fault("a", base..base + REGION, Fault::Hang);
        let (fsc, files) = (fs.clone(), open_all(&fs, &names));
        common::run("bg_alone", Flavor::Multi, 60, move || async move {
            let fs = fsc;
            let _release = Release(fs.clone());
            let ctx = small_ctx(route, files, 8, |b| {
                b.max_in_flight_per_file(8).background_share(2)
            });
            let bg_ctx = ctx.with_priority(Priority::Background);
            let started = Arc::new(AtomicUsize::new(0));
            let mut tasks: Vec<_> = (0..8)
                .map(|i| read_task(&bg_ctx, 0, base + (i + 1) * MIB, &started))
                .collect();
            assert!(
                until(Duration::from_secs(10), || ctx.stats().background.in_flight
                    == 8)
                .await,
                "{route:?}: background alone holds {:?}",
                ctx.stats().background
            );
            tasks.push(read_task(&ctx, 1, base + MIB, &started));
            all_queued(&started, 9).await;
            let (l, b) = classes(&ctx);
            eprintln!("{route:?}: latency {l:?}; background {b:?}");
            assert_eq!((b.in_flight, l.in_flight, l.ops), (8, 0, 0), "{route:?}");
            let lookup = tasks.pop().unwrap();
            fs.release_hangs();
            let n = tokio::time::timeout(Duration::from_secs(20), lookup)
                .await
                .expect("the latency read never got a slot")
                .unwrap()
                .unwrap();
            assert_eq!(n, 4096);
            assert_eq!(ctx.stats().latency.waited, 1, "{route:?}");
            finish(&fs, &ctx, tasks).await;
        });
        fs.release_hangs();
    }
}

/// Counters per class: each class's ops, the slots each holds while reads
/// hang (2 background, 6 latency of 8), and the ops that waited for a slot
/// (2 of each class) with a wait time above zero. (Bytes:
/// `class_counters_count_bytes`.)
#[test]
fn class_counters_count_ops_slots_and_waits() {
    let _shared = common::shared();
    let names = ["a", "b"];
    let Some(fs) = mount(&names, 0x7330) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        fs.clear_faults();
        fs.set_fault("a", base..base + REGION, Fault::Hang);
        fs.clear_read_log();
        let (fsc, files) = (fs.clone(), open_all(&fs, &names));
        common::run("class_counters", Flavor::Multi, 60, move || async move {
            let fs = fsc;
            let _release = Release(fs.clone());
            let ctx = small_ctx(route, files, 8, |b| {
                b.max_in_flight_per_file(8).background_share(2)
            });
            let bg_ctx = ctx.with_priority(Priority::Background);
            let zero = ClassStats::default();
            assert_eq!(classes(&ctx), (zero, zero), "{route:?}: a new context");
            // Reads one at a time: nobody waits.
            let mut buf = vec![0u8; 8192];
            for i in 0..3 {
                let n = ctx.read(1u32, base + (i + 1) * MIB, &mut buf[..4096]).await;
                assert_eq!(n.unwrap(), 4096);
            }
            for i in 3..5 {
                let n = bg_ctx.read(1u32, base + (i + 1) * MIB, &mut buf).await;
                assert_eq!(n.unwrap(), 8192);
            }
            let (l, b) = classes(&ctx);
            assert_eq!(
                (l.ops, l.waited, l.wait_time, l.in_flight),
                (3, 0, Duration::ZERO, 0),
                "{route:?}: latency {l:?}"
            );
            assert_eq!(
                (b.ops, b.waited, b.wait_time, b.in_flight),
                (2, 0, Duration::ZERO, 0),
                "{route:?}: background {b:?}"
            );
            // 2 background and 6 latency reads hang on A.
            let started = Arc::new(AtomicUsize::new(0));
            let mut tasks: Vec<_> = (0..2)
                .map(|i| read_task(&bg_ctx, 0, base + (i + 1) * MIB, &started))
                .collect();
            assert!(
                until(Duration::from_secs(10), || ctx.stats().background.in_flight
                    == 2)
                .await,
                "{route:?}"
            );
            tasks.extend((2..8).map(|i| read_task(&ctx, 0, base + (i + 1) * MIB, &started)));
            assert!(
                until(Duration::from_secs(10), || ctx.stats().latency.in_flight
                    == 6)
                .await,
                "{route:?}: {:?}",
                classes(&ctx)
            );
            // Every slot held: 2 reads of each class wait (on B, healthy).
            tasks.extend((8..10).map(|i| read_task(&bg_ctx, 1, base + (i + 1) * MIB, &started)));
            tasks.extend((10..12).map(|i| read_task(&ctx, 1, base + (i + 1) * MIB, &started)));
            all_queued(&started, 12).await;
            let (l, b) = classes(&ctx);
            assert_eq!(
                (l.in_flight, l.ops, l.waited),
                (6, 9, 0),
                "{route:?}: {l:?}"
            );
            assert_eq!(
                (b.in_flight, b.ops, b.waited),
                (2, 4, 0),
                "{route:?}: {b:?}"
            );
            let server = until(Duration::from_secs(20), || hung_of(&fs, "a") == 8).await;
            assert!(
                server,
                "{route:?}: the server holds {} reads",
                hung_of(&fs, "a")
            );
            fs.release_hangs();
            for t in tasks.drain(..) {
                tokio::time::timeout(Duration::from_secs(20), t)
                    .await
                    .expect("a read still waits once the storage answered")
                    .unwrap()
                    .ok();
            }
            assert!(
                until(Duration::from_secs(10), || {
                    let (l, b) = classes(&ctx);
                    l.in_flight == 0 && b.in_flight == 0
                })
                .await,
                "{route:?}: slots still held: {:?}",
                classes(&ctx)
            );
            let (l, b) = classes(&ctx);
            eprintln!("{route:?}: latency {l:?}; background {b:?}");
            assert_eq!((l.ops, l.waited), (11, 2), "{route:?}");
            assert_eq!((b.ops, b.waited), (6, 2), "{route:?}");
            assert!(l.wait_time > Duration::ZERO && b.wait_time > Duration::ZERO);
            finish(&fs, &ctx, tasks).await;
        });
        fs.release_hangs();
    }
}

/// `ClassStats::bytes` counts the bytes each class's ops asked for: 3
/// latency reads of 4 KiB and 2 background reads of 8 KiB, one piece each,
/// on every route.
#[test]
fn class_counters_count_bytes() {
    let _shared = common::shared();
    let names = ["b"];
    let Some(fs) = mount(&names, 0x7360) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        let files = open_all(&fs, &names);
        common::run("class_bytes", Flavor::Multi, 60, move || async move {
            let ctx = route.ctx(files, |b| b.rings(1).inline_nowait(false));
            let bg_ctx = ctx.with_priority(Priority::Background);
            let mut buf = vec![0u8; 8192];
            for i in 0..3 {
                let n = ctx.read(0u32, base + (i + 1) * MIB, &mut buf[..4096]).await;
                assert_eq!(n.unwrap(), 4096);
            }
            for i in 3..5 {
                let n = bg_ctx.read(0u32, base + (i + 1) * MIB, &mut buf).await;
                assert_eq!(n.unwrap(), 8192);
            }
            let (l, b) = classes(&ctx);
            eprintln!("{route:?}: latency {l:?}; background {b:?}");
            assert_eq!((l.ops, l.bytes), (3, 3 * 4096), "{route:?}: latency");
            assert_eq!((b.ops, b.bytes), (2, 2 * 8192), "{route:?}: background");
            ctx.shutdown().await;
        });
    }
}

/// Scans are background work unless told otherwise: a scan's reads count
/// in `stats().background`, with `ScanOptions::priority(Latency)` in
/// `stats().latency`, whatever the handle's own priority.
#[test]
fn scans_default_to_background() {
    let _shared = common::shared();
    const SPAN: u64 = 4 * MIB;
    let names = ["s"];
    let Some(fs) = mount(&names, 0x7340) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        let files = open_all(&fs, &names);
        common::run("scan_priority", Flavor::Multi, 60, move || async move {
            let ctx = route.ctx(files, |b: Builder| b.inline_nowait(false));
            let scan = |ctx: UringContext, opts: ScanOptions, from: u64| async move {
                let mut s = opts.scan(&ctx, 0u32, from..from + SPAN).unwrap();
                let mut at = from;
                while let Some(chunk) = s.next().await {
                    let chunk = chunk.unwrap();
                    common::check_pattern(0x7340, at, &chunk).unwrap();
                    at += chunk.len() as u64;
                }
                assert_eq!(at, from + SPAN);
            };
            scan(ctx.clone(), ScanOptions::new(), base).await;
            let (l, b) = classes(&ctx);
            eprintln!("{route:?}: a default scan: latency {l:?}; background {b:?}");
            assert_eq!(l.ops, 0, "{route:?}: a default scan took latency slots");
            assert!(b.ops > 0, "{route:?}: {b:?}");
            // Latency, from a background handle too.
            let bg_ctx = ctx.with_priority(Priority::Background);
            let opts = ScanOptions::new().priority(Priority::Latency);
            scan(bg_ctx, opts, base + 8 * MIB).await;
            let (l2, b2) = classes(&ctx);
            assert_eq!(
                b2.ops, b.ops,
                "{route:?}: a latency scan took background slots"
            );
            assert!(l2.ops > 0, "{route:?}: {l2:?}");
            ctx.shutdown().await;
        });
    }
}

/// Background reads that waited for their share while latency reads were
/// active get free slots once latency activity has been over for its
/// window, without waiting for some other op to end: here the only other
/// op is a background read that never ends. Setup (8 slots, background
/// share 1): a background read hangs on A; a latency read of B takes 2 s
/// in the storage; a second background read (of B, healthy) queues behind
/// the share. Once the latency read is over, 7 slots are free and no
/// latency op is active, so the queued read must run.
#[test]
fn background_waiters_run_once_latency_activity_is_over() {
    let _shared = common::shared();
    let names = ["a", "b"];
    let Some(fs) = mount(&names, 0x7350) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        fs.clear_faults();
        fs.set_fault("a", base..base + REGION, Fault::Hang);
        fs.set_fault(
            "b",
            base..base + REGION / 2,
            Fault::Delay(Duration::from_secs(2)),
        );
        let (fsc, files) = (fs.clone(), open_all(&fs, &names));
        common::run("bg_after_window", Flavor::Multi, 60, move || async move {
            let fs = fsc;
            let _release = Release(fs.clone());
            let ctx = small_ctx(route, files, 8, |b| b.background_share(1));
            let bg_ctx = ctx.with_priority(Priority::Background);
            let started = Arc::new(AtomicUsize::new(0));
            let stuck = read_task(&bg_ctx, 0, base + MIB, &started);
            assert!(
                until(Duration::from_secs(10), || ctx.stats().background.in_flight
                    == 1)
                .await,
                "{route:?}"
            );
            let lookup = read_task(&ctx, 1, base + MIB, &started);
            assert!(
                until(Duration::from_secs(10), || ctx.stats().latency.in_flight
                    == 1)
                .await,
                "{route:?}"
            );
            let queued = read_task(&bg_ctx, 1, base + REGION / 2 + MIB, &started);
            all_queued(&started, 3).await;
            if !lookup.is_finished() {
                assert!(
                    !queued.is_finished(),
                    "{route:?}: a second background read ran beside a latency read (share 1)"
                );
            }
            let n = tokio::time::timeout(Duration::from_secs(20), lookup)
                .await
                .expect("the latency read never ended")
                .unwrap()
                .unwrap();
            assert_eq!(n, 4096);
            let done = tokio::time::timeout(Duration::from_secs(5), queued).await;
            eprintln!(
                "{route:?}: queued background read {} after the latency read; {:?}",
                if done.is_ok() { "ran" } else { "still waits" },
                classes(&ctx)
            );
            let done = done.unwrap_or_else(|_| {
                panic!(
                    "{route:?}: a background read still waits with 7 of 8 slots free and no \
                     latency op for 5 s"
                )
            });
            assert_eq!(done.unwrap().unwrap(), 4096);
            finish(&fs, &ctx, vec![stuck]).await;
        });
        fs.release_hangs();
    }
}

/// While a latency read is active, a background read longer than
/// `background_piece` goes in pieces of that size, one slot each, and
/// returns the right bytes; with no latency op active it goes in one piece.
#[test]
fn background_reads_go_in_pieces_while_latency_reads_are_active() {
    let _shared = common::shared();
    const PIECE: usize = 64 << 10;
    const LEN_READ: usize = 4 * PIECE;
    let names = ["a", "b"];
    let seed = 0x7370;
    let Some(fs) = mount(&names, seed) else {
        return;
    };
    for (k, route) in ROUTES.into_iter().enumerate() {
        let base = (k as u64 + 1) * REGION;
        fs.clear_faults();
        fs.set_fault("a", base..base + REGION, Fault::Hang);
        let (fsc, files) = (fs.clone(), open_all(&fs, &names));
        common::run("background_pieces", Flavor::Multi, 60, move || async move {
            let fs = fsc;
            let _release = Release(fs.clone());
            let ctx = small_ctx(route, files, 8, |b| b.background_piece(PIECE));
            let bg = ctx.with_priority(Priority::Background);
            let check = |buf: &[u8], off: u64| {
                assert!(
                    buf == common::expected(seed + 1, LEN, off, LEN_READ).as_slice(),
                    "{route:?}: wrong bytes at {off}"
                );
            };
            // Alone: one piece.
            let mut buf = vec![0u8; LEN_READ];
            let off = base + MIB;
            bg.read_exact(1u32, off, &mut buf).await.unwrap();
            check(&buf, off);
            let (_, b) = classes(&ctx);
            assert_eq!((b.ops, b.bytes), (1, LEN_READ as u64), "{route:?}: {b:?}");
            // A latency read hangs on A: the same read goes in four pieces.
            let started = Arc::new(AtomicUsize::new(0));
            let hung = read_task(&ctx, 0, base + MIB, &started);
            assert!(
                until(Duration::from_secs(10), || ctx.stats().latency.in_flight
                    == 1)
                .await,
                "{route:?}"
            );
            let off = base + 2 * MIB;
            bg.read_exact(1u32, off, &mut buf).await.unwrap();
            check(&buf, off);
            let (_, b) = classes(&ctx);
            assert_eq!(
                (b.ops, b.bytes),
                (5, 2 * LEN_READ as u64),
                "{route:?}: {b:?}"
            );
            finish(&fs, &ctx, vec![hung]).await;
        });
        fs.release_hangs();
    }
}

/// `ioprio_honoured` reads the I/O scheduler of a file's block device:
/// `None` for a file on no block device (tmpfs), the same answer as `/sys`
/// for a file on one, and `InvalidInput` for an unknown id.
#[test]
fn ioprio_honoured_says_what_sys_says() {
    let _shared = common::shared();
    common::run("ioprio_honoured", Flavor::Multi, 30, || async {
        let disk = tempfile::tempfile_in(std::env::temp_dir()).unwrap();
        let mut files = vec![disk];
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            files.push(tempfile::tempfile_in(shm).unwrap());
        }
        let n = files.len();
        let ctx = UringContext::new(files).unwrap();
        let on_disk = ctx.ioprio_honoured(0u32).unwrap();
        eprintln!("temp dir file: {on_disk:?}");
        if let Some(honoured) = on_disk {
            // Some block device's scheduler was read: bfq or not.
            let any_bfq = std::fs::read_dir("/sys/block").unwrap().flatten().any(|d| {
                std::fs::read_to_string(d.path().join("queue/scheduler"))
                    .is_ok_and(|s| s.contains("[bfq]"))
            });
            assert!(!honoured || any_bfq, "honoured, but no device uses bfq");
        }
        if n == 2 {
            assert_eq!(ctx.ioprio_honoured(1u32).unwrap(), None, "tmpfs");
        }
        let e = ctx.ioprio_honoured(9u32).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        ctx.shutdown().await;
    });
}
