//! Many more concurrent reads than ring entries: 512 spawned tasks reading
//! through a ring of 8 entries, on a 2-worker multi_thread runtime and on a
//! current_thread runtime, for both backends. Backpressure must only make
//! reads wait: every read succeeds and returns the right bytes. Also: several
//! rings with a small `max_in_flight`, and `stats()` sampled from other OS
//! threads under load stays consistent and never panics.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Flavor, Rng, TestFile};
use uring_positioned_io::{BackendChoice, BackendKind, UringContext};

const TASKS: u64 = 512;
const READS_PER_TASK: u64 = 8;

async fn reader(ctx: UringContext, files: Arc<Vec<TestFile>>, task: u64) {
    let mut rng = Rng::new(task);
    for i in 0..READS_PER_TASK {
        let fid = rng.below(files.len() as u64) as usize;
        let file = &files[fid];
        let len = match rng.below(4) {
            0 => 4096,
            1 => rng.range(1, 256) as usize,
            2 => rng.range(1, 64 * 1024) as usize,
            _ => rng.range(4096, 200 * 1024) as usize,
        };
        let off = rng.below(file.len + 100);
        let want = file.expected(off, len);
        if (task + i) % 2 == 0 {
            let mut buf = vec![0u8; len];
            let n = ctx
                .read(fid as u32, off, &mut buf)
                .await
                .unwrap_or_else(|e| panic!("task {task}: read fid {fid} @ {off}+{len}: {e}"));
            assert_eq!(
                n,
                want.len(),
                "task {task}: read fid {fid} @ {off}+{len}: short read"
            );
            if buf[..n] != want[..] {
                panic!(
                    "task {task}: {}",
                    common::check_pattern(file.seed, off, &buf[..n]).unwrap_err()
                );
            }
        } else {
            let (r, buf) = ctx
                .read_owned(fid as u32, off, Vec::with_capacity(len))
                .await;
            let n = r
                .unwrap_or_else(|e| panic!("task {task}: read_owned fid {fid} @ {off}+{len}: {e}"));
            assert_eq!(
                n,
                want.len(),
                "task {task}: read_owned fid {fid} @ {off}+{len}: short read"
            );
            if buf[..n] != want[..] {
                panic!(
                    "task {task}: {}",
                    common::check_pattern(file.seed, off, &buf[..n]).unwrap_err()
                );
            }
        }
    }
}

fn many_tasks_small_ring(choice: BackendChoice, flavor: Flavor) {
    let set = common::FileSet::new(
        0xc0c0 ^ flavor as u64,
        &[1 << 20, 300 * 1024 + 17, 4096, 2 << 20],
    );
    let files = Arc::new(set.files.clone());
    let opened = set.open_all();
    common::run("many_tasks_small_ring", flavor, 90, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.ring_entries(8));
        let handles: Vec<_> = (0..TASKS)
            .map(|t| tokio::spawn(reader(ctx.clone(), files.clone(), t)))
            .collect();
        for h in handles {
            h.await.expect("reader task panicked");
        }
        let left = common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await;
        let stats = ctx.stats();
        assert_eq!(left, 0, "in_flight did not return to 0: {stats:?}");
        if ctx.backend().kind == BackendKind::IoUring {
            assert!(
                stats.submitted + stats.inline_completed >= TASKS * READS_PER_TASK,
                "fewer reads accounted than performed: {stats:?}"
            );
            assert!(
                stats.completed <= stats.submitted,
                "completed > submitted: {stats:?}"
            );
        }
        eprintln!(
            "{choice:?}/{flavor:?}: {stats:?}, reads/enter {:.2}",
            stats.reads_per_enter()
        );
        drop(set);
    });
}

fn concurrent_multi_thread(choice: BackendChoice) {
    many_tasks_small_ring(choice, Flavor::Multi);
}

fn concurrent_current_thread(choice: BackendChoice) {
    many_tasks_small_ring(choice, Flavor::Current);
}

/// Several rings, handles cloned across tasks, reads all in one task via
/// join (not spawned) as well.
fn joined_reads_multi_ring(choice: BackendChoice) {
    let set = common::FileSet::new(0x5eed, &[777_777, 4097]);
    let files = set.files.clone();
    let opened = set.open_all();
    common::run(
        "joined_reads_multi_ring",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::build_ctx(choice, opened, |b| {
                b.rings(2).ring_entries(8).max_in_flight(16)
            });
            let mut rng = Rng::new(99);
            let reqs: Vec<(usize, u64, usize)> = (0..512)
                .map(|_| {
                    let fid = rng.below(2) as usize;
                    (
                        fid,
                        rng.below(files[fid].len + 10),
                        rng.range(1, 20_000) as usize,
                    )
                })
                .collect();
            let futs = reqs.iter().map(|&(fid, off, len)| {
                let ctx = &ctx;
                let file = &files[fid];
                async move {
                    let mut buf = vec![0u8; len];
                    let n = ctx.read(fid as u32, off, &mut buf).await.expect("read");
                    assert_eq!(
                        &buf[..n],
                        &file.expected(off, len)[..],
                        "fid {fid} @ {off}+{len}"
                    );
                }
            });
            futures::future::join_all(futs).await;
            assert_eq!(
                common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await,
                0
            );
            drop(set);
        },
    );
}

/// `stats()` called from another OS thread while reads complete must never
/// panic and must stay self-consistent (`completed <= submitted`,
/// `in_flight` bounded by what was ever submitted).
fn stats_consistent_under_load(choice: BackendChoice) {
    let set = common::FileSet::new(0x57a7, &[1 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "stats_consistent_under_load",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let samplers: Vec<_> = (0..2)
                .map(|_| {
                    let (ctx, stop) = (ctx.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut samples = 0u64;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            let s = ctx.stats();
                            assert!(s.completed <= s.submitted, "completed > submitted: {s:?}");
                            assert!(s.in_flight <= s.submitted, "in_flight > submitted: {s:?}");
                            samples += 1;
                        }
                        samples
                    })
                })
                .collect();
            let tasks: Vec<_> = (0..64u64)
                .map(|t| {
                    let (ctx, file) = (ctx.clone(), file.clone());
                    tokio::spawn(async move {
                        let mut rng = Rng::new(t);
                        for _ in 0..300 {
                            let off = rng.below(file.len);
                            let (r, b) = ctx.read_owned(0u32, off, Vec::with_capacity(4096)).await;
                            let n = r.expect("read");
                            assert_eq!(&b[..n], &file.expected(off, 4096)[..]);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("reader panicked");
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for s in samplers {
                match s.join() {
                    Ok(n) => assert!(n > 0),
                    Err(e) => panic!(
                        "{choice:?}: stats() on another thread panicked / was inconsistent: {}",
                        common::panic_message(&*e)
                    ),
                }
            }
            drop(set);
        },
    );
}

backend_tests!(
    concurrent_multi_thread,
    concurrent_current_thread,
    joined_reads_multi_ring,
    stats_consistent_under_load
);
