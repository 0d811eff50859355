//! The background driver: it batches queued reads into few `io_uring_enter`
//! calls, and it sleeps (no spinning) when there is nothing to do.

mod common;

use std::time::Duration;

use common::{Flavor, Rng};
use uring_positioned_io::{BackendChoice, BackendKind, UringContext};

/// With 512 reads queued at once, the driver submits several per enter.
#[test]
fn reads_are_batched_per_enter() {
    let _serial = common::serial();
    let set = common::FileSet::new(0xba7c, &[4 << 20]);
    let file = set.files[0].clone();
    for flavor in [Flavor::Current, Flavor::Multi] {
        let (opened, file) = (set.open_all(), file.clone());
        common::run(
            "reads_are_batched_per_enter",
            flavor,
            60,
            move || async move {
                // The ring path only: page-cache hits would otherwise be served
                // inline without any enter.
                let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
                    b.rings(1).inline_nowait(false)
                });
                let tasks: Vec<_> = (0..512u64)
                    .map(|t| {
                        let (ctx, file) = (ctx.clone(), file.clone());
                        tokio::spawn(async move {
                            let mut rng = Rng::new(t);
                            let mut buf = vec![0u8; 4096];
                            for _ in 0..20 {
                                let off = rng.below(file.len / 4096) * 4096;
                                let n = ctx.read(0u32, off, &mut buf).await.expect("read");
                                assert_eq!(&buf[..n], &file.expected(off, 4096)[..]);
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("reader");
                }
                let s = ctx.stats();
                eprintln!(
                    "{flavor:?}: {s:?}, {:.1} reads per enter",
                    s.reads_per_enter()
                );
                assert_eq!(s.submitted, 512 * 20);
                assert!(s.enters > 0);
                // One enter per read would mean no batching at all.
                assert!(
                    s.reads_per_enter() >= 2.0,
                    "{flavor:?}: only {:.2} reads per io_uring_enter with 512 readers",
                    s.reads_per_enter()
                );
            },
        );
    }
}

/// A shallow ring (at most 64 reads in the kernel) gets its SQEs in enters
/// of at most 8, so the disk sees the first ones without waiting for the
/// whole batch to be issued; a deep one keeps one enter for everything
/// queued; an explicit batch is one enter either way.
#[test]
fn shallow_rings_submit_in_small_enters() {
    let _serial = common::serial();
    let set = common::FileSet::new(0x5a11, &[4 << 20]);
    let file = set.files[0].clone();
    for flavor in [Flavor::Current, Flavor::Multi] {
        let (opened, file) = (set.open_all(), file.clone());
        common::run(
            "shallow_rings_submit_in_small_enters",
            flavor,
            60,
            move || async move {
                let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
                    b.rings(1).inline_nowait(false).max_in_flight(512)
                });
                // `n` reads queued at once from one task, on the ring path
                // only; returns (enters, submitted).
                let burst = |n: u64| {
                    let (ctx, file) = (ctx.clone(), file.clone());
                    async move {
                        let before = ctx.stats();
                        let reads = (0..n).map(|i| {
                            let ctx = ctx.clone();
                            async move {
                                let mut buf = vec![0u8; 4096];
                                let off = (i * 7919 % (file.len / 4096)) * 4096;
                                let got = ctx.read(0u32, off, &mut buf).await.expect("read");
                                (off, got, buf)
                            }
                        });
                        for (off, got, buf) in futures::future::join_all(reads).await {
                            assert_eq!(&buf[..got], &file.expected(off, 4096)[..]);
                        }
                        let after = ctx.stats();
                        (
                            after.enters - before.enters,
                            after.submitted - before.submitted,
                        )
                    }
                };
                let (enters, submitted) = burst(40).await;
                eprintln!("{flavor:?}: 40 reads, {enters} enters");
                assert_eq!(submitted, 40);
                // 40 SQEs in enters of at most 8: at least 5.
                assert!(
                    enters >= 5,
                    "{flavor:?}: 40 shallow reads in {enters} enters"
                );
                let (enters, submitted) = burst(400).await;
                eprintln!("{flavor:?}: 400 reads, {enters} enters");
                assert_eq!(submitted, 400);
                // Past 64 in the kernel the rest go in one enter: far fewer
                // than 400 / 8 = 50. Checked where the burst is queued whole
                // before the driver runs (one thread); on two workers the
                // driver submits while the reads are still being queued, and
                // cached reads complete inside the enter, so the ring may
                // never be deep.
                if flavor == Flavor::Current {
                    assert!(
                        enters <= 20,
                        "{flavor:?}: 400 deep reads in {enters} enters"
                    );
                }
                // An explicit batch of 40 is one enter, shallow or not.
                // Let the driver go idle.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let before = ctx.stats();
                let reads = (0..40u64).map(|i| (0u32, i * 65_536, Vec::with_capacity(4096)));
                for (i, (res, buf)) in ctx.read_batch(reads).await.into_iter().enumerate() {
                    assert_eq!(res.expect("batch read"), 4096);
                    assert_eq!(&buf[..], &file.expected(i as u64 * 65_536, 4096)[..]);
                }
                let enters = ctx.stats().enters - before.enters;
                eprintln!("{flavor:?}: a batch of 40, {enters} enter(s)");
                assert!(
                    enters <= 1,
                    "{flavor:?}: a batch of 40 took {enters} enters"
                );
            },
        );
    }
}

/// `Builder::shallow_batch` sets how many SQEs an enter hands a shallow
/// ring: 40 reads queued at once from one task (a `current_thread` runtime,
/// so the burst is queued whole before the driver runs) take about 40 / n
/// enters.
#[test]
fn shallow_batch_sets_the_sqes_per_enter() {
    let _serial = common::serial();
    let set = common::FileSet::new(0x5b2, &[4 << 20]);
    let file = set.files[0].clone();
    let mut enters_by_batch = Vec::new();
    for batch in [2u32, 40] {
        let (opened, file) = (set.open_all(), file.clone());
        let enters = common::run(
            "shallow_batch_sets_the_sqes_per_enter",
            Flavor::Current,
            60,
            move || async move {
                let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
                    b.rings(1).inline_nowait(false).shallow_batch(batch)
                });
                let before = ctx.stats();
                let reads = (0..40u64).map(|i| {
                    let (ctx, file) = (ctx.clone(), file.clone());
                    async move {
                        let mut buf = vec![0u8; 4096];
                        let off = (i * 7919 % (file.len / 4096)) * 4096;
                        let got = ctx.read(0u32, off, &mut buf).await.expect("read");
                        assert_eq!(&buf[..got], &file.expected(off, 4096)[..]);
                    }
                });
                futures::future::join_all(reads).await;
                let after = ctx.stats();
                assert_eq!(after.submitted - before.submitted, 40);
                after.enters - before.enters
            },
        );
        eprintln!("shallow_batch({batch}): 40 reads in {enters} enters");
        enters_by_batch.push(enters);
    }
    // 2 per enter: at least 20 enters; 40 per enter: a handful at most (the
    // first reader may submit its own read before the rest are queued).
    assert!(enters_by_batch[0] >= 20, "{enters_by_batch:?}");
    assert!(enters_by_batch[1] <= 4, "{enters_by_batch:?}");
}

/// An idle context does not spin: over a second of idleness the whole
/// process uses a small fraction of one CPU (a polling driver would use
/// all of it).
#[test]
fn idle_context_uses_no_cpu() {
    let _serial = common::serial();
    let set = common::FileSet::new(0x1d1e, &[64 << 10]);
    for flavor in [Flavor::Multi, Flavor::Current] {
        let opened = set.open_all();
        common::run("idle_context_uses_no_cpu", flavor, 30, move || async move {
            let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| b.inline_nowait(false));
            assert_eq!(ctx.backend().kind, BackendKind::IoUring);
            let mut buf = vec![0u8; 4096];
            ctx.read(0u32, 0, &mut buf).await.expect("read");
            let before = common::process_cpu();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let used = common::process_cpu().checked_sub(before).unwrap();
            eprintln!("{flavor:?}: {used:?} of CPU in 1 s idle; {:?}", ctx.stats());
            assert!(
                used < Duration::from_millis(200),
                "{flavor:?}: an idle context used {used:?} of CPU in 1 s"
            );
            assert_eq!(ctx.stats().enters, 1, "no enters while idle");
        });
    }
}

/// A future that submits its read at the first poll and then ignores every
/// wake-up without polling the read again (a task stuck elsewhere, a
/// hand-written combinator that drops wake-ups).
struct Stuck<F: std::future::Future> {
    read: std::pin::Pin<Box<F>>,
    polled: bool,
}

impl<F: std::future::Future> std::future::Future for Stuck<F> {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if !self.polled {
            self.polled = true;
            let _ = self.read.as_mut().poll(cx);
        }
        std::task::Poll::Pending
    }
}

/// Runs `body` on both runtime flavours, with a context that reads a 1 MiB
/// file of `seed` through the ring only (cached reads would otherwise
/// complete inline, without a CQE to relay).
fn on_the_ring_path<F, Fut>(name: &'static str, seed: u64, body: F)
where
    F: FnOnce(UringContext, common::TestFile) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let _serial = common::serial();
    let set = common::FileSet::new(seed, &[1 << 20]);
    for flavor in [Flavor::Current, Flavor::Multi] {
        let (opened, file, body) = (set.open_all(), set.files[0].clone(), body.clone());
        common::run(name, flavor, 60, move || async move {
            let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
                b.rings(1).inline_nowait(false)
            });
            body(ctx, file).await;
        });
    }
}

/// A reader task that checks the 4 KiB at `off`, `reads` times.
fn reader(
    ctx: &UringContext,
    file: &common::TestFile,
    off: u64,
    reads: usize,
) -> tokio::task::JoinHandle<()> {
    let (ctx, want) = (ctx.clone(), file.expected(off, 4096));
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        for _ in 0..reads {
            let n = ctx.read(0u32, off, &mut buf).await.expect("read");
            assert_eq!(&buf[..n], &want[..]);
        }
    })
}

/// Awaits `task`, which must finish within 5 s.
async fn finishes(task: tokio::task::JoinHandle<()>, what: std::fmt::Arguments<'_>) {
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap();
}

/// The driver wakes a small round of completed reads one after another
/// (each reader wakes the next: the relay), so a reader that is woken but
/// never polls must not hold up the others: they complete within a driver
/// round. Rounds of three reads submitted in one enter, one of them stuck;
/// the CQE order decides where in the relay the stuck one lands, so many
/// rounds are run. (Fails without the driver's flush of the relay.)
#[test]
fn a_reader_that_never_polls_does_not_hold_up_the_others() {
    on_the_ring_path(
        "a_reader_that_never_polls",
        0x5e1a,
        |ctx, file| async move {
            let mut rng = Rng::new(7);
            for round in 0..200 {
                let stuck_at = round % 3;
                let (mut stuck, mut normal) = (None, Vec::new());
                for i in 0..3 {
                    let off = rng.below(256) * 4096;
                    if i != stuck_at {
                        normal.push(reader(&ctx, &file, off, 1));
                        continue;
                    }
                    let ctx = ctx.clone();
                    stuck = Some(tokio::spawn(Stuck {
                        read: Box::pin(async move {
                            let mut buf = vec![0u8; 4096];
                            let _ = ctx.read(0u32, off, &mut buf).await;
                        }),
                        polled: false,
                    }));
                }
                for t in normal {
                    finishes(
                        t,
                        format_args!("round {round}: a read waited for a stuck reader"),
                    )
                    .await;
                }
                // dropping the stuck read hands its turn on too
                let stuck = stuck.unwrap();
                stuck.abort();
                let _ = stuck.await;
            }
        },
    );
}

/// Readers aborted at random points while rounds of completions are being
/// relayed (before their read is submitted, while it is in the kernel,
/// while it waits in the relay) must not strand the others: every reader
/// that is not aborted completes with the right bytes. (A dropped future
/// passes its turn on, and the driver's next poll wakes whoever is left:
/// with both taken out this test strands readers.)
#[test]
fn aborts_during_relayed_rounds_strand_nobody() {
    on_the_ring_path(
        "aborts_during_relayed_rounds",
        0xab07,
        |ctx, file| async move {
            let mut rng = Rng::new(11);
            for round in 0..200u64 {
                let n = 2 + round % 15;
                let tasks: Vec<_> = (0..n)
                    .map(|_| reader(&ctx, &file, rng.below(256) * 4096, 4))
                    .collect();
                // abort about a third, some at once, some after a yield
                let mut keep = Vec::new();
                for (i, t) in tasks.into_iter().enumerate() {
                    if rng.below(3) != 0 {
                        keep.push(t);
                        continue;
                    }
                    if i % 2 == 0 {
                        tokio::task::yield_now().await;
                    }
                    t.abort();
                    let _ = t.await;
                }
                for t in keep {
                    finishes(t, format_args!("round {round}: a reader was stranded")).await;
                }
            }
        },
    );
}

/// Wakers that call back into the crate while the relay wakes them: each
/// read's waker drops the next read (its op still in the kernel, or already
/// complete and waiting in the relay). Nothing deadlocks or panics, and
/// every read not dropped completes with the right bytes.
#[test]
fn wakers_that_drop_other_reads_during_the_relay() {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Wake};

    type Read = Pin<Box<dyn Future<Output = (u64, usize, Vec<u8>)> + Send>>;
    struct DropsNext {
        slots: Arc<Mutex<Vec<Option<Read>>>>,
        next: usize,
        dropped: Arc<std::sync::atomic::AtomicUsize>,
    }
    impl Wake for DropsNext {
        fn wake(self: Arc<Self>) {
            // Taken out under the lock, dropped after it: the drop calls
            // into the crate (abandon), which may wake further wakers.
            let victim = self.slots.lock().unwrap()[self.next].take();
            if victim.is_some() {
                self.dropped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            drop(victim);
        }
    }

    on_the_ring_path(
        "wakers_that_drop_other_reads",
        0xd0d0,
        |ctx, file| async move {
            let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for round in 0..100u64 {
                let n = 8;
                let slots: Arc<Mutex<Vec<Option<Read>>>> = Arc::new(Mutex::new(
                    (0..n as u64)
                        .map(|i| {
                            let ctx = ctx.clone();
                            let off = ((round * 31 + i * 7) % 256) * 4096;
                            Some(Box::pin(async move {
                                let mut buf = vec![0u8; 4096];
                                let got = ctx.read(0u32, off, &mut buf).await.expect("read");
                                (off, got, buf)
                            }) as Read)
                        })
                        .collect(),
                ));
                // Odd reads' wakers drop the next (even) read.
                let wakers: Vec<_> = (0..n)
                    .map(|i| {
                        if i % 2 == 1 {
                            std::task::Waker::from(Arc::new(DropsNext {
                                slots: slots.clone(),
                                next: (i + 1) % n,
                                dropped: dropped.clone(),
                            }))
                        } else {
                            futures::task::noop_waker()
                        }
                    })
                    .collect();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                let mut done = vec![false; n];
                loop {
                    for i in 0..n {
                        let Some(mut fut) = slots.lock().unwrap()[i].take() else {
                            continue;
                        };
                        match fut.as_mut().poll(&mut Context::from_waker(&wakers[i])) {
                            Poll::Ready((off, got, buf)) => {
                                assert_eq!(&buf[..got], &file.expected(off, 4096)[..]);
                                done[i] = true;
                            }
                            Poll::Pending => slots.lock().unwrap()[i] = Some(fut),
                        }
                    }
                    if slots.lock().unwrap().iter().all(Option::is_none) {
                        break;
                    }
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "round {round}: reads left pending"
                    );
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                // The odd reads were never dropped: each one completed.
                for i in (1..n).step_by(2) {
                    assert!(done[i], "round {round}: read {i} did not complete");
                }
            }
            // The wakers did call back in: reads were dropped from inside them.
            let dropped = dropped.load(std::sync::atomic::Ordering::Relaxed);
            eprintln!("reads dropped from inside a waker: {dropped}");
            assert!(dropped > 0);
        },
    );
}

/// Readers on threads outside the runtime (a `block_on` on a plain thread,
/// as a scan's consumer often is) queue their SQEs and wake the driver,
/// unless the driver is in the middle of a poll, where it checks for queued
/// SQEs before it sleeps. A read queued just as the driver decides to sleep
/// must still be submitted: each read here is the only one its thread has
/// out, so one missed wake-up strands it (and the test times out). With the
/// driver's check after it clears its polling flag taken out, this hangs.
#[test]
fn reads_queued_from_outside_the_runtime_as_the_driver_sleeps_are_submitted() {
    on_the_ring_path(
        "reads_queued_from_outside_the_runtime",
        0x0b1d,
        |ctx, file| async move {
            let rt = tokio::runtime::Handle::current();
            let threads: Vec<_> = (0..3u64)
                .map(|t| {
                    let (ctx, file, rt) = (ctx.clone(), file.clone(), rt.clone());
                    std::thread::spawn(move || {
                        let mut rng = Rng::new(t);
                        let mut buf = vec![0u8; 4096];
                        for _ in 0..20_000 {
                            let off = rng.below(256) * 4096;
                            let n = rt.block_on(ctx.read(0u32, off, &mut buf)).expect("read");
                            assert_eq!(&buf[..n], &file.expected(off, 4096)[..]);
                        }
                    })
                })
                .collect();
            // The runtime keeps running (and driving) while the threads read.
            while !threads.iter().all(std::thread::JoinHandle::is_finished) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            for t in threads {
                t.join().expect("reader thread");
            }
        },
    );
}
