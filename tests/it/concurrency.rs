//! Many more concurrent reads than ring entries: 512 spawned tasks reading
//! through a ring of 8 entries, on a 2-worker multi_thread runtime and on a
//! current_thread runtime, for both backends. Backpressure must only make
//! reads wait: every read succeeds and returns the right bytes. Also: several
//! rings with a small `max_in_flight`, and `stats()` sampled from other OS
//! threads under load stays consistent and never panics. Also: a tiny
//! bounce-buffer pool, a tiny ring, far more tasks than `max_in_flight`
//! (never more in flight than that), and a per-file share of one.

use crate::common;

use common::BOTH;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

/// The smallest per-file share: one read of a file in flight at a time.
/// Many concurrent reads of one file (through the kernel: no page-cache
/// fast path, cache dropped) and of a second file all complete, with the
/// right bytes — a read waiting for its file's share never holds a slot
/// another needs.
#[test]
fn a_share_of_one_serialises_without_deadlock() {
    let _shared = common::shared();
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

/// Shared body: `tasks` tasks each doing `reads` verified reads of up to
/// `max_len` bytes, through a context configured by `tweak`. Returns the
/// largest `stats().in_flight` observed by a sampler.
fn many_readers(
    name: &str,
    choice: BackendChoice,
    flavor: Flavor,
    tasks: u64,
    reads: u64,
    max_len: u64,
    tweak: impl FnOnce(uring_positioned_io::Builder) -> uring_positioned_io::Builder + Send + 'static,
) -> Result<u64, String> {
    let set = common::FileSet::new(0xed3, &[3 << 20, 100_001]);
    let files = Arc::new(set.files.clone());
    let opened = set.open_all();
    common::run(name, flavor, 90, move || async move {
        let ctx = common::build_ctx(choice, opened, tweak);
        let max_seen = Arc::new(AtomicU64::new(0));
        // Sample from a plain OS thread, independent of the runtime's scheduling.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (ctx, max_seen, stop) = (ctx.clone(), max_seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    max_seen.fetch_max(ctx.stats().in_flight, Relaxed);
                    std::hint::spin_loop();
                }
            })
        };
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (ctx, files) = (ctx.clone(), files.clone());
                tokio::spawn(async move {
                    let mut rng = Rng::new(t * 31 + 7);
                    for _ in 0..reads {
                        let fid = rng.below(2) as usize;
                        let file: &TestFile = &files[fid];
                        let len = rng.range(1, max_len) as usize;
                        let off = rng.below(file.len + 10);
                        let mut buf = vec![0u8; len];
                        let n = ctx
                            .read(fid as u32, off, &mut buf)
                            .await
                            .unwrap_or_else(|e| panic!("task {t}: fid {fid} @ {off}+{len}: {e}"));
                        assert_eq!(
                            &buf[..n],
                            &file.expected(off, len)[..],
                            "task {t}: fid {fid} @ {off}+{len}"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("reader panicked");
        }
        stop.store(true, Relaxed);
        let sampled = sampler.join().map_err(|e| {
            format!(
                "stats() panicked on a sampler thread: {}",
                common::panic_message(&*e)
            )
        });
        assert_eq!(
            common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await,
            0
        );
        drop(set);
        sampled.map(|()| max_seen.load(Relaxed))
    })
}

fn tiny_buffer_pool(choice: BackendChoice) {
    // Reads up to 1 MiB through two 4 KiB bounce buffers.
    let _ = many_readers(
        "tiny_buffer_pool",
        choice,
        Flavor::Multi,
        64,
        8,
        1 << 20,
        |b| b.buffer_pool(2, 4096),
    );
    let _ = many_readers(
        "tiny_buffer_pool_ct",
        choice,
        Flavor::Current,
        64,
        8,
        64 * 1024,
        |b| b.buffer_pool(2, 4096).ring_entries(4),
    );
}

fn more_tasks_than_max_in_flight(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        // inline_nowait(false): every read really occupies an in-flight slot.
        let max = many_readers(
            "more_tasks_than_max_in_flight",
            choice,
            flavor,
            256,
            8,
            32 * 1024,
            |b| b.rings(1).max_in_flight(4).inline_nowait(false),
        );
        let max = max.unwrap_or_else(|e| panic!("{choice:?}/{flavor:?}: {e}"));
        eprintln!("{choice:?}/{flavor:?}: max in_flight observed with max_in_flight(4): {max}");
        // The documented contract: at most max_in_flight reads at once, the
        // rest wait for a slot (no backend exception is documented).
        assert!(
            max <= 4,
            "{choice:?}/{flavor:?}: stats().in_flight reached {max} with max_in_flight(4) and one ring"
        );
    }
}

fn tiny_ring(choice: BackendChoice) {
    let _ = many_readers("tiny_ring", choice, Flavor::Multi, 256, 8, 16 * 1024, |b| {
        b.ring_entries(2).rings(1)
    });
}

backend_tests!(tiny_buffer_pool, more_tasks_than_max_in_flight, tiny_ring);
