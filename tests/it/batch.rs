//! `UringContext::read_batch`: many owned reads submitted together.

use crate::common;

use std::time::{Duration, Instant};

use common::{Flavor, Rng};
use uring_positioned_io::{BackendChoice, BackendKind};

/// Every read of a batch returns what `pread` would, in the order given,
/// across files, lengths and the end of file.
fn batch_matches_pread(choice: BackendChoice) {
    let set = common::FileSet::new(0xba7c, &[1 << 20, 100_000]);
    let files = set.files.clone();
    let opened = set.open_all();
    common::run(
        "batch_matches_pread",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b);
            let mut rng = Rng::new(0xba7c);
            for round in 0..20 {
                if round % 5 == 0 {
                    files[0].drop_cache();
                }
                let want: Vec<(u32, u64, usize)> = (0..rng.range(1, 64))
                    .map(|_| {
                        let fid = rng.below(2) as u32;
                        let off = rng.below(files[fid as usize].len + 5000);
                        (fid, off, rng.range(1, 20_000) as usize)
                    })
                    .collect();
                let got = ctx
                    .read_batch(want.iter().map(|&(f, o, n)| (f, o, Vec::with_capacity(n))))
                    .await;
                assert_eq!(got.len(), want.len());
                for ((res, buf), &(f, o, n)) in got.iter().zip(&want) {
                    let what = format!("round {round}: file {f} @ {o}+{n}");
                    let k = *res.as_ref().unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(k, buf.len(), "{what}");
                    assert_eq!(&buf[..], &files[f as usize].expected(o, n)[..], "{what}");
                }
            }
            // An empty batch and a batch with a bad fid.
            assert!(ctx
                .read_batch(Vec::<(u32, u64, Vec<u8>)>::new())
                .await
                .is_empty());
            let got = ctx
                .read_batch([
                    (0u32, 0, Vec::with_capacity(10)),
                    (9, 0, Vec::with_capacity(10)),
                ])
                .await;
            assert_eq!(got[0].0.as_ref().ok(), Some(&10));
            let e = got[1].0.as_ref().expect_err("fid 9 does not exist");
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            drop(set);
        },
    );
}

/// Sixteen reads the page cache cannot serve reach the kernel in one
/// `io_uring_enter`.
#[test]
fn sixteen_cold_reads_are_one_enter() {
    let _shared = common::shared();
    let set = common::FileSet::new(0xba7d, &[16 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("batch_one_enter", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
            b.rings(1).inline_nowait(false)
        });
        assert_eq!(ctx.backend().kind, BackendKind::IoUring);
        for round in 0..5u64 {
            file.drop_cache();
            // Let the driver go idle.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let before = ctx.stats();
            let reads =
                (0..16u64).map(|i| (0u32, (round * 16 + i) * 65_536, Vec::with_capacity(4096)));
            let got = ctx.read_batch(reads).await;
            let after = ctx.stats();
            for (i, (res, buf)) in got.iter().enumerate() {
                let off = (round * 16 + i as u64) * 65_536;
                assert_eq!(res.as_ref().ok(), Some(&4096));
                assert_eq!(&buf[..], &file.expected(off, 4096)[..]);
            }
            let enters = after.enters - before.enters;
            eprintln!(
                "round {round}: 16 reads, {} submitted, {enters} enter(s)",
                after.submitted - before.submitted
            );
            assert_eq!(after.submitted - before.submitted, 16);
            assert!(enters <= 1, "a batch of 16 took {enters} enters");
        }
        drop(set);
    });
}

backend_tests!(batch_matches_pread);

/// User code run while a batch queues its reads (a waker's `clone`) that
/// issues a read on *another* context: that read is submitted as usual, not
/// left queued behind the batch's deferral (which covers only the batch's
/// own rings).
#[test]
fn a_read_of_another_context_during_a_batch_is_submitted() {
    let _shared = common::shared();
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, RawWaker, RawWakerVTable, Waker};
    use uring_positioned_io::UringContext;

    type Side = Arc<Mutex<Option<Pin<Box<dyn Future<Output = std::io::Result<usize>> + Send>>>>>;

    let set = common::FileSet::new(0xba7e, &[4 << 20, 4 << 20]);
    let (a, b) = (set.files[0].clone(), set.files[1].clone());
    common::run("batch_other_ctx", Flavor::Multi, 60, move || async move {
        let quiet = |bld: uring_positioned_io::Builder| bld.rings(1).inline_nowait(false);
        let ctx_a = common::build_ctx(BackendChoice::IoUring, vec![a.open()], quiet);
        let ctx_b: &'static UringContext = Box::leak(Box::new(common::build_ctx(
            BackendChoice::IoUring,
            vec![b.open()],
            quiet,
        )));
        a.drop_cache();
        b.drop_cache();
        tokio::time::sleep(Duration::from_millis(20)).await;

        // A waker whose clone starts a read on ctx_b (once) and polls it.
        struct State {
            side: Side,
            ctx_b: &'static UringContext,
        }
        static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
        unsafe fn clone(p: *const ()) -> RawWaker {
            // SAFETY: `p` is the leaked `State` below, alive for the whole test.
            let st = unsafe { &*p.cast::<State>() };
            let mut side = st.side.lock().unwrap();
            if side.is_none() {
                let mut fut: Pin<Box<dyn Future<Output = _> + Send>> =
                    Box::pin(st.ctx_b.read_owned(0u32, 8192, Vec::with_capacity(4096)))
                        .map_result();
                let mut cx = Context::from_waker(futures::task::noop_waker_ref());
                // It may complete at once (the other worker's driver can
                // reap its CQE before this poll looks): keep the result.
                if let std::task::Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                    fut = Box::pin(std::future::ready(r));
                }
                *side = Some(fut);
            }
            RawWaker::new(p, &VTABLE)
        }
        unsafe fn noop(_: *const ()) {}
        trait MapResult {
            fn map_result(self) -> Pin<Box<dyn Future<Output = std::io::Result<usize>> + Send>>;
        }
        impl<F: Future<Output = (std::io::Result<usize>, Vec<u8>)> + Send + 'static> MapResult
            for Pin<Box<F>>
        {
            fn map_result(self) -> Pin<Box<dyn Future<Output = std::io::Result<usize>> + Send>> {
                Box::pin(async move { self.await.0 })
            }
        }

        let side: Side = Arc::new(Mutex::new(None));
        let state: &'static State = Box::leak(Box::new(State {
            side: side.clone(),
            ctx_b,
        }));
        let raw = RawWaker::new(std::ptr::from_ref(state).cast(), &VTABLE);
        // SAFETY: the vtable's functions take this pointer (a leaked
        // `State`, never freed) and uphold RawWaker's contract: clone gives
        // a waker for the same data, wake and drop do nothing.
        let waker = unsafe { Waker::from_raw(raw) };
        let mut batch = Box::pin(
            ctx_a.read_batch((0..4u64).map(|i| (0u32, i * 65_536, Vec::with_capacity(4096)))),
        );
        let mut cx = Context::from_waker(&waker);
        // The first poll queues the batch's reads; registering them clones
        // the waker, which starts the read on ctx_b.
        let _ = batch.as_mut().poll(&mut cx);
        let mut other = side.lock().unwrap().take().expect("the waker's clone ran");
        let n = tokio::time::timeout(
            Duration::from_secs(10),
            std::future::poll_fn(|cx| other.as_mut().poll(cx)),
        )
        .await
        .expect("the other context's read was never submitted")
        .expect("read on ctx_b");
        assert_eq!(n, 4096);
        let got = tokio::time::timeout(Duration::from_secs(10), batch)
            .await
            .expect("batch");
        assert!(got.iter().all(|(r, _)| r.as_ref().ok() == Some(&4096)));
        drop(set);
    });
}

/// Dropping a batch with its reads in the kernel is as safe as dropping each
/// read: every read is cancelled or completes into buffers the context
/// keeps, the context keeps working, and shutdown is prompt.
fn dropped_batch(choice: BackendChoice) {
    let set = common::FileSet::new(0xba7f, &[16 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("dropped_batch", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
        for round in 0..10u64 {
            file.drop_cache();
            let reads = (0..64u64).map(|i| {
                (
                    0u32,
                    (round * 64 + i) * 65_536 % (15 << 20),
                    Vec::with_capacity(65_536),
                )
            });
            let mut batch = Box::pin(ctx.read_batch(reads));
            let _ = common::poll_once(batch.as_mut()).await;
            drop(batch);
        }
        // Still correct afterwards.
        let got = ctx
            .read_batch((0..8u64).map(|i| (0u32, i * 4096, Vec::with_capacity(4096))))
            .await;
        for (i, (r, buf)) in got.iter().enumerate() {
            assert_eq!(r.as_ref().ok(), Some(&4096));
            assert_eq!(&buf[..], &file.expected(i as u64 * 4096, 4096)[..]);
        }
        tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
            .await
            .expect("shutdown after dropped batches");
        assert_eq!(ctx.stats().in_flight, 0, "{:?}", ctx.stats());
        drop(set);
    });
}

backend_tests!(dropped_batch);

/// The reads of a random batch, merged with a random gap and bound, return
/// exactly what the same batch unmerged returns and what pread says: the
/// same counts (at and across the end of the file too), the same bytes,
/// the same errors — for overlapping, adjacent and distant ranges, bad
/// file ids, full and empty buffers, buffers holding bytes already.
fn merged_batches_match_unmerged(choice: BackendChoice) {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};

    let set = common::FileSet::new(0xba80, &[200_000, 70_001]);
    let files = set.files.clone();
    let (opened_a, opened_b) = (set.open_all(), set.open_all());
    common::run("merged_batches", Flavor::Multi, 180, move || async move {
        let inline = common::build_ctx(choice, opened_a, |b| b);
        let ring = common::build_ctx(choice, opened_b, |b| b.inline_nowait(false));
        let mut runner = TestRunner::new(Config {
            failure_persistence: None,
            ..Config::default()
        });
        let read = (
            prop_oneof![8 => 0u32..2, 1 => Just(7u32)],
            prop_oneof![0u64..210_000, 60_000u64..75_000],
            0usize..20_000,
            prop_oneof![4 => Just(0usize), 1 => 0usize..100],
        );
        let strategy = (
            prop::collection::vec(read, 0..40),
            prop_oneof![Just(0u64), 0u64..5000, Just(u64::MAX)],
            prop_oneof![Just(128 * 1024usize), 1usize..40_000],
            any::<bool>(),
        );
        let cases: Vec<_> = (0..120)
            .map(|_| strategy.new_tree(&mut runner).unwrap().current())
            .collect();
        let make = |reads: &[(u32, u64, usize, usize)]| {
            reads
                .iter()
                .map(|&(f, o, room, init)| {
                    let mut v = Vec::with_capacity(room + init);
                    v.extend((0..init).map(|i| i as u8));
                    (f, o, v)
                })
                .collect::<Vec<_>>()
        };
        for (case, (reads, gap, max, cold)) in cases.into_iter().enumerate() {
            if cold && case % 3 == 0 {
                files[0].drop_cache();
            }
            for (name, ctx) in [("inline", &inline), ("ring", &ring)] {
                let what = format!("{name} case {case}: gap {gap} max {max}, reads {reads:?}");
                let plain = ctx.read_batch(make(&reads)).await;
                let merged = ctx
                    .read_batch(make(&reads))
                    .merge_gap(gap)
                    .max_merged_len(max)
                    .await;
                assert_eq!(merged.len(), reads.len());
                for (i, ((m, p), &(f, o, room, init))) in
                    merged.iter().zip(&plain).zip(&reads).enumerate()
                {
                    let what = format!("{what}: read {i}");
                    match (&m.0, &p.0) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}: counts"),
                        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind(), "{what}: {a} vs {b}"),
                        (a, b) => panic!("{what}: merged {a:?}, unmerged {b:?}"),
                    }
                    assert_eq!(m.1, p.1, "{what}: buffers differ");
                    if let (Ok(n), Some(file)) = (&m.0, files.get(f as usize)) {
                        // From the buffer's start, up to its capacity.
                        let cap = m.1.capacity();
                        assert_eq!(cap, room + init, "{what}: capacity");
                        let want = file.pread(o, cap);
                        assert_eq!(*n, want.len(), "{what}: pread count");
                        assert_eq!(m.1.len(), init.max(*n), "{what}: len");
                        assert_eq!(&m.1[..*n], &want[..], "{what}: data");
                        assert!(
                            m.1[*n..]
                                .iter()
                                .enumerate()
                                .all(|(i, &x)| x == (*n + i) as u8),
                            "{what}: bytes past the read"
                        );
                    }
                }
            }
        }
        drop(set);
    });
}

backend_tests!(merged_batches_match_unmerged);

/// Merging really merges: sixteen adjacent cold reads become one read on the
/// ring (one SQE), and a bound splits them; a gap larger than allowed keeps
/// reads apart.
#[test]
fn adjacent_reads_become_one() {
    let _shared = common::shared();
    let set = common::FileSet::new(0xba81, &[8 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("merge_counts", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
            b.rings(1).inline_nowait(false)
        });
        for (gap, max, spacing, want_sqes) in [
            (0, 128 * 1024, 4096, 1),
            (0, 32 * 1024, 4096, 2),
            (4096, 128 * 1024, 8192, 1),
            (4095, 128 * 1024, 8192, 16),
        ] {
            file.drop_cache();
            let before = ctx.stats();
            let reads = (0..16u64).map(|i| (0u32, 4096 + i * spacing, Vec::with_capacity(4096)));
            let got = ctx
                .read_batch(reads)
                .merge_gap(gap)
                .max_merged_len(max)
                .await;
            let sqes = ctx.stats().submitted - before.submitted;
            for (i, (r, buf)) in got.iter().enumerate() {
                let off = 4096 + i as u64 * spacing;
                assert_eq!(r.as_ref().ok(), Some(&4096));
                assert_eq!(&buf[..], &file.expected(off, 4096)[..]);
            }
            assert_eq!(sqes, want_sqes, "gap {gap}, max {max}, spacing {spacing}");
        }
        drop(set);
    });
}

/// O_DIRECT: aligned reads are merged into one aligned read; an unaligned
/// read in the middle is not merged and fails as it would on its own.
#[test]
fn o_direct_merging_keeps_alignment() {
    let _shared = common::shared();
    use std::os::unix::fs::OpenOptionsExt;
    use uring_positioned_io::AlignedBuf;
    let set = common::FileSet::new(0xba82, &[1 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let Ok(direct) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file.path)
    else {
        return eprintln!("skipped: O_DIRECT refused here");
    };
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let (direct, file) = (direct.try_clone().unwrap(), file.clone());
        common::run("merge_direct", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![direct], |b| b);
            let before = ctx.stats();
            let reads = vec![
                (0u32, 0u64, AlignedBuf::with_capacity(4096, 4096)),
                (0, 8192, AlignedBuf::with_capacity(8192, 4096)),
                (0, 4096 + 512, AlignedBuf::with_capacity(512, 4096)),
                (0, (1 << 20) - 4096, AlignedBuf::with_capacity(8192, 4096)),
            ];
            let plain = ctx
                .read_batch(
                    reads
                        .iter()
                        .map(|(f, o, b)| (*f, *o, AlignedBuf::with_capacity(b.capacity(), 4096))),
                )
                .await;
            let got = ctx.read_batch(reads).merge_gap(8192).await;
            for (i, ((m, p), want)) in got
                .iter()
                .zip(&plain)
                .zip([
                    Some(file.pread(0, 4096)),
                    Some(file.pread(8192, 8192)),
                    None,
                    Some(file.pread((1 << 20) - 4096, 8192)),
                ])
                .enumerate()
            {
                match want {
                    Some(want) => {
                        assert_eq!(m.0.as_ref().ok(), Some(&want.len()), "read {i}");
                        assert_eq!(m.1.as_slice(), &want[..], "read {i}");
                    }
                    None => {
                        // Not aligned to the device: EINVAL, merged or not
                        // (a 512-byte-sector device may accept it: then the
                        // merged result must equal the unmerged one).
                        match (&m.0, &p.0) {
                            (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind()),
                            (Ok(a), Ok(b)) => assert_eq!(a, b),
                            (a, b) => panic!("read {i}: merged {a:?} unmerged {b:?}"),
                        }
                    }
                }
            }
            let _ = before;
        });
    }
    drop(set);
}

/// The completion-order stream yields every read once, with its index and
/// the bytes pread gives, merged or not, on both backends; sixteen cold
/// reads through it are still one enter.
fn stream_yields_each_read_once(choice: BackendChoice) {
    use futures::StreamExt;
    let set = common::FileSet::new(0xba83, &[4 << 20, 10_000]);
    let files = set.files.clone();
    let opened = set.open_all();
    common::run("batch_stream", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.rings(1).inline_nowait(false));
        let mut rng = Rng::new(0xba83);
        for round in 0..12 {
            files[0].drop_cache();
            tokio::time::sleep(Duration::from_millis(5)).await;
            let want: Vec<(u32, u64, usize)> = (0..16)
                .map(|_| {
                    let f = rng.below(2) as u32;
                    (
                        f,
                        rng.below(files[f as usize].len + 100),
                        rng.range(1, 9000) as usize,
                    )
                })
                .collect();
            let before = ctx.stats();
            let batch = ctx.read_batch(want.iter().map(|&(f, o, n)| (f, o, Vec::with_capacity(n))));
            let batch = if round % 2 == 1 {
                batch.merge_gap(65_536)
            } else {
                batch
            };
            let mut stream = batch.unordered();
            assert_eq!(futures::Stream::size_hint(&stream), (16, Some(16)));
            let mut seen = vec![false; want.len()];
            while let Some((i, res, buf)) = stream.next().await {
                let (f, o, n) = want[i];
                assert!(!seen[i], "read {i} yielded twice");
                seen[i] = true;
                assert_eq!(res.unwrap(), buf.len(), "read {i}");
                assert_eq!(buf, files[f as usize].pread(o, n), "round {round} read {i}");
            }
            assert!(seen.iter().all(|&s| s), "round {round}: {seen:?}");
            assert!(stream.next().await.is_none());
            if choice == BackendChoice::IoUring {
                let enters = ctx.stats().enters - before.enters;
                assert!(enters <= 3, "round {round}: {enters} enters for one batch");
            }
        }
        drop(set);
    });
}

backend_tests!(stream_yields_each_read_once);

/// Streams dropped part-way (with reads in the kernel and results not yet
/// taken) are as safe as dropped batches: the context stays correct and
/// shuts down promptly with nothing in flight.
fn dropped_stream(choice: BackendChoice) {
    use futures::StreamExt;
    let set = common::FileSet::new(0xba84, &[16 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("dropped_stream", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
        for round in 0..10u64 {
            file.drop_cache();
            let reads = (0..64u64).map(|i| {
                (
                    0u32,
                    (round * 64 + i) * 65_536 % (15 << 20),
                    Vec::with_capacity(65_536),
                )
            });
            let batch = ctx.read_batch(reads);
            let batch = if round % 2 == 0 {
                batch.merge_gap(1 << 20).max_merged_len(1 << 20)
            } else {
                batch
            };
            let mut stream = batch.unordered();
            if round % 3 == 0 {
                let _ = stream.next().await;
            } else {
                let _ = common::poll_once(std::pin::Pin::new(&mut stream.next())).await;
            }
            drop(stream);
        }
        let got = ctx
            .read_batch((0..8u64).map(|i| (0u32, i * 4096, Vec::with_capacity(4096))))
            .merge_gap(0)
            .await;
        for (i, (r, buf)) in got.iter().enumerate() {
            assert_eq!(r.as_ref().ok(), Some(&4096));
            assert_eq!(&buf[..], &file.expected(i as u64 * 4096, 4096)[..]);
        }
        tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
            .await
            .expect("shutdown after dropped streams");
        assert_eq!(ctx.stats().in_flight, 0, "{:?}", ctx.stats());
        drop(set);
    });
}

backend_tests!(dropped_stream);

/// A loop device backed by `path`, read-only; detached on drop. `None` if
/// loop devices cannot be set up here.
struct LoopDev(String);

impl LoopDev {
    fn attach(path: &std::path::Path) -> Option<LoopDev> {
        let out = std::process::Command::new("losetup")
            .args(["-r", "-f", "--show"])
            .arg(path)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!("SKIPPED: losetup: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Some(LoopDev(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

/// A merged read that fails (EIO from storage on one block of its range)
/// is split: each read gets the result it would have had alone — the reads
/// away from the bad block succeed, the one on it fails. The storage is a
/// block device (a loop device over a FUSE file with one bad block: a local
/// file as far as routing goes, so its reads merge); reads of the FUSE file
/// itself are never merged (its server may answer short) and get the same
/// results. FUSE files go to the blocking pool; vectored reads of them too,
/// with pread's short count.
#[test]
fn failing_merged_read_is_split() {
    let _shared = common::shared();
    use common::fuse::{Fault, FaultFs, FileSpec};
    use std::io::IoSliceMut;
    let spec = FileSpec::new("bad", 4 << 20, 0xba85);
    let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), true) else {
        return;
    };
    fs.set_fault("bad", 65_536..69_632, Fault::Errno(libc::EIO));
    fs.set_fault("bad", 1 << 20..2 << 20, Fault::Short(1000));
    let path = fs.path("bad");
    let Some(dev) = LoopDev::attach(&path) else {
        return;
    };
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let (path, dev, spec) = (path.clone(), dev.0.clone(), spec.clone());
        common::run("merge_split", Flavor::Multi, 60, move || async move {
            let files = vec![
                std::fs::File::open(&path).unwrap(),
                std::fs::File::open(&dev).unwrap(),
            ];
            let ctx = common::build_ctx(choice, files, |b| b);
            let offs = [0u64, 8192, 65_536, 73_728];
            for fid in [0u32, 1] {
                let before = ctx.stats();
                let got = ctx
                    .read_batch(offs.iter().map(|&o| (fid, o, Vec::with_capacity(4096))))
                    .merge_gap(65_536)
                    .await;
                let after = ctx.stats();
                for (&o, (r, buf)) in offs.iter().zip(&got) {
                    if o == 65_536 {
                        let e = r.as_ref().expect_err("the bad block");
                        assert_eq!(e.raw_os_error(), Some(libc::EIO), "file {fid}: {e}");
                    } else {
                        assert_eq!(r.as_ref().ok(), Some(&4096), "file {fid} @{o}");
                        assert_eq!(buf, &common::expected(spec.seed, spec.len, o, 4096));
                    }
                }
                // The device's four reads were merged into one that failed,
                // then issued one by one; the FUSE file's were never merged.
                let ops = after.submitted + after.inline_completed
                    - before.submitted
                    - before.inline_completed;
                let want = if fid == 1 { 5 } else { 4 };
                assert!(
                    ops >= want,
                    "{choice:?}: file {fid}: {ops} reads for the batch"
                );
            }
            // Vectored, routed to the blocking pool: pread's short count.
            let (mut a, mut b) = ([0u8; 600], [0u8; 3000]);
            let mut s = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
            let n = ctx.read_vectored(0u32, 1 << 20, &mut s).await.unwrap();
            assert_eq!(n, 1000);
            let want = common::expected(spec.seed, spec.len, 1 << 20, 1000);
            assert!(a[..] == want[..600] && b[..400] == want[600..]);
            let (r, bufs) = ctx
                .read_vectored_owned(
                    0u32,
                    0,
                    vec![Vec::with_capacity(100), Vec::with_capacity(5000)],
                )
                .await;
            assert_eq!(r.unwrap(), 5100);
            assert_eq!(
                [&bufs[0][..], &bufs[1][..]].concat(),
                common::expected(spec.seed, spec.len, 0, 5100)
            );
        });
    }
    drop(dev);
    drop(fs);
}

/// With the page-cache fast path on, a cold batch is still one enter: its
/// reads try `preadv2(RWF_NOWAIT)` first, and the fast path's per-read
/// fairness yield must not push the rest of the batch to a later poll (and
/// a second enter). 1.6 enters per batch before reads in a batch skipped it.
#[test]
fn cold_batch_with_the_inline_path_is_one_enter() {
    let _shared = common::shared();
    let set = common::FileSet::new(0xba86, &[64 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "batch_inline_one_enter",
        Flavor::Current,
        60,
        move || async move {
            let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
                b.rings(1).inline_stretch(Duration::ZERO)
            });
            let mut enters = Vec::new();
            for round in 0..8u64 {
                file.drop_cache();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let before = ctx.stats();
                let reads = (0..16u64)
                    .map(|i| (0u32, (round * 16 + i) * 262_144, Vec::with_capacity(4096)));
                for (i, (r, buf)) in ctx.read_batch(reads).await.iter().enumerate() {
                    let off = (round * 16 + i as u64) * 262_144;
                    assert_eq!(r.as_ref().ok(), Some(&4096));
                    assert_eq!(&buf[..], &file.expected(off, 4096)[..]);
                }
                enters.push(ctx.stats().enters - before.enters);
            }
            assert!(
                enters.iter().all(|&e| e <= 1),
                "enters per batch: {enters:?}"
            );
            drop(set);
        },
    );
}

/// A batch of many cached reads costs about what the same reads cost one
/// by one. A batch whose every poll polled every unfinished read, while
/// tokio's coop budget lets ~128 of them finish per poll, would take
/// O(n² / 128) read polls for n reads. The bound below is loose (a
/// factor 5) against that growth, which is an order of magnitude at this
/// size and grows with it.
#[test]
fn huge_batches_stay_linear() {
    let _shared = common::shared();
    let set = common::FileSet::new(0xba7d, &[1 << 20]);
    let file = set.files[0].clone();
    // The fallback's reads cost ~20 µs each (a blocking-pool hop): fewer.
    for (choice, n) in [
        (BackendChoice::IoUring, 200_000u64),
        (BackendChoice::Fallback, 20_000),
    ] {
        let (opened, file) = (set.open_all(), file.clone());
        common::run("huge_batch", Flavor::Multi, 300, move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b);
            let off = |i: u64| (i * 4093) % (file.len - 16);
            let _ = file.pread(0, file.len as usize); // cached

            // Measured up to three times: the other tests of this binary
            // load the machine unevenly, and one slow moment during the
            // batch is not the quadratic growth this looks for (which
            // fails every attempt).
            for attempt in 1..=3 {
                let t = Instant::now();
                for i in 0..n {
                    let (r, _) = ctx.read_owned(0u32, off(i), Vec::with_capacity(16)).await;
                    r.unwrap();
                }
                let one_by_one = t.elapsed();
                let t = Instant::now();
                let out = ctx
                    .read_batch((0..n).map(|i| (0u32, off(i), Vec::with_capacity(16))))
                    .await;
                let batch = t.elapsed();
                for (i, (r, buf)) in out.iter().enumerate() {
                    assert_eq!(r.as_ref().ok(), Some(&16), "read {i}");
                    assert_eq!(&buf[..], &file.expected(off(i as u64), 16)[..], "read {i}");
                }
                eprintln!(
                    "{choice:?}: {n} cached reads one by one {one_by_one:?}, as one batch {batch:?}"
                );
                let linear = batch < one_by_one * 5 + Duration::from_millis(500);
                assert!(
                    linear || attempt < 3,
                    "{choice:?}: a batch of {n} took {batch:?}, the same reads one by one {one_by_one:?}"
                );
                if linear {
                    break;
                }
            }
        });
    }
    drop(set);
}

/// On storage that may answer any request short (a FUSE `direct_io` file
/// whose server replies with fewer bytes than asked), a read merged with its
/// neighbours returns what it returns alone: merging must not read on past
/// a short reply that a read alone would have returned. Reads of a local
/// file in the same batch still merge. Both backends.
#[test]
fn merging_keeps_short_replies_of_fuse_files() {
    let _shared = common::shared();
    use common::fuse::{Fault, FaultFs, FileSpec};
    let spec = FileSpec::new("short", 4 << 20, 0xba87);
    let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), true) else {
        return;
    };
    fs.set_fault("short", 1 << 20..2 << 20, Fault::Short(1000));
    let path = fs.path("short");
    let set = common::FileSet::new(0xba88, &[1 << 20]);
    let local = set.files[0].clone();
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let (path, spec, local) = (path.clone(), spec.clone(), local.clone());
        common::run("merge_short", Flavor::Multi, 60, move || async move {
            let files = vec![std::fs::File::open(&path).unwrap(), local.open()];
            let ctx = common::build_ctx(choice, files, |b| b);
            // Four reads on the short range, one before it whose merged
            // range would run into it, and four of the local file.
            let mut reads: Vec<(u32, u64)> = (0..4u64).map(|i| (0, (1 << 20) + i * 8192)).collect();
            reads.push((0, (1 << 20) - 4096));
            reads.extend((0..4u64).map(|i| (1, i * 4096)));
            let before = ctx.stats();
            let got = ctx
                .read_batch(reads.iter().map(|&(f, o)| (f, o, Vec::with_capacity(4096))))
                .merge_gap(65_536)
                .await;
            let after = ctx.stats();
            let ops = after.submitted + after.inline_completed
                - before.submitted
                - before.inline_completed;
            for (&(f, o), (r, buf)) in reads.iter().zip(&got) {
                let what = format!("{choice:?}: file {f} @ {o}");
                let (alone, alone_buf) = ctx.read_owned(f, o, Vec::with_capacity(4096)).await;
                let alone = alone.unwrap_or_else(|e| panic!("{what}: alone: {e}"));
                assert_eq!(r.as_ref().ok(), Some(&alone), "{what}: merged vs alone");
                assert_eq!(buf, &alone_buf, "{what}: bytes");
                let want = if f == 0 && o >= 1 << 20 { 1000 } else { 4096 };
                assert_eq!(alone, want, "{what}");
                let expected = if f == 0 {
                    common::expected(spec.seed, spec.len, o, want)
                } else {
                    local.expected(o, want)
                };
                assert_eq!(buf, &expected, "{what}: content");
            }
            // Five reads of the FUSE file, each on its own, and one for the
            // four of the local file, merged.
            assert_eq!(ops, 6, "{choice:?}: reads issued for the batch");
        });
    }
    drop(fs);
    drop(set);
}

/// A batch's fairness yield (before its first read, once the task has used
/// up its stretch of inline reads; here a stretch of zero, so every batch
/// after the first yields), used as a hostile caller would: a task alone on
/// the runtime still finishes its batches; an empty batch never yields; a
/// batch dropped after its yield leaves nothing behind; the reads of a
/// batch that yielded are bound to their files at that first poll, as a
/// single read is (a file unregistered before the next poll is still the
/// one read); an unknown file id fails at once.
#[test]
fn a_batch_that_yields_first() {
    let _shared = common::shared();
    let set = common::FileSet::new(0xba89, &[1 << 20, 1 << 20]);
    let (a, b) = (set.files[0].clone(), set.files[1].clone());
    let opened = set.open_all();
    common::run("batch_yields", Flavor::Current, 60, move || async move {
        use std::future::Future;
        use std::pin::pin;
        use std::task::Poll;
        let ctx = common::build_ctx(BackendChoice::IoUring, opened, |bld| {
            bld.inline_stretch(Duration::ZERO)
        });
        common::verify_whole_file(&ctx, 0, &a, 1 << 20).await;
        common::verify_whole_file(&ctx, 1, &b, 1 << 20).await;
        let reads = |fid: u32, n: u64| {
            (0..n).map(move |i| (fid, (i * 7 % 256) * 4096, Vec::with_capacity(4096)))
        };
        // Alone on the runtime: every batch but the first yields once, and
        // all finish.
        let mut polls = Vec::new();
        for round in 0..400u64 {
            let mut batch = pin!(ctx.read_batch(reads(0, 8)).merge_gap(if round % 2 == 0 {
                0
            } else {
                u64::MAX
            }));
            let mut n = 0;
            let got = std::future::poll_fn(|cx| {
                n += 1;
                batch.as_mut().poll(cx)
            })
            .await;
            for (i, (r, buf)) in got.iter().enumerate() {
                let o = (i as u64 * 7 % 256) * 4096;
                assert_eq!(r.as_ref().ok(), Some(&4096));
                assert_eq!(&buf[..], &a.expected(o, 4096)[..]);
            }
            polls.push(n);
        }
        assert!(
            polls[1..].iter().all(|&n| n >= 2),
            "polls per batch: {polls:?}"
        );
        // An empty batch has nothing to yield for.
        let mut empty = pin!(ctx.read_batch(Vec::<(u32, u64, Vec<u8>)>::new()));
        assert!(matches!(common::poll_once(empty.as_mut()).await, Poll::Ready(v) if v.is_empty()));
        // Dropped after its yield: nothing was submitted or left in flight.
        let before = ctx.stats();
        {
            let mut batch = pin!(ctx.read_batch(reads(0, 8)));
            assert!(common::poll_once(batch.as_mut()).await.is_pending());
        }
        let after = ctx.stats();
        assert_eq!(
            (after.submitted, after.inline_completed, after.in_flight),
            (before.submitted, before.inline_completed, 0)
        );
        // (A batch that does not yield, as the stretch restarts after a
        // yield, so that the next one does.)
        let got = ctx.read_batch(reads(0, 1)).await;
        assert_eq!(got[0].0.as_ref().ok(), Some(&4096));
        // Bound at the poll that yielded: file 1 unregistered before the
        // next poll is still read, and an unknown id fails right away.
        let fid = ctx.file_id(1u32).unwrap();
        let mut batch = pin!(
            ctx.read_batch(reads(1, 4).map(|(_, o, v)| (fid, o, v)).chain([(
                9u32.into(),
                0,
                Vec::with_capacity(16)
            )]))
        );
        assert!(common::poll_once(batch.as_mut()).await.is_pending());
        ctx.unregister_file(fid).unwrap();
        let got = batch.await;
        for (i, (r, buf)) in got[..4].iter().enumerate() {
            let o = (i as u64 * 7 % 256) * 4096;
            assert_eq!(r.as_ref().ok(), Some(&4096), "read {i}");
            assert_eq!(&buf[..], &b.expected(o, 4096)[..]);
        }
        let e = got[4].0.as_ref().expect_err("fid 9 does not exist");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        // Afterwards the id is an error, as for any read.
        let (r, _) = ctx.read_owned(fid, 0, Vec::with_capacity(16)).await;
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
        drop(set);
    });
}

/// A batch that waited for its reads (cold, `Pending` until the kernel
/// answered) ended the task's stretch of inline reads there, as any wait
/// does: the next batch does not make a fairness yield before its first
/// read, it submits its reads at its first poll. With a stretch of zero, a
/// stretch the batch started before waiting made every cold batch after
/// the first yield once, an extra trip through the run queue.
#[test]
fn a_cold_batch_ends_the_stretch() {
    let _shared = common::shared();
    let set = common::FileSet::new(0xba8a, &[16 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let opened = set.open_all();
    // Each read caches its own page only: with readahead (up to
    // `read_ahead_kb`, megabytes on some devices) one round's reads would
    // bring in the next round's.
    opened.iter().for_each(common::no_readahead);
    common::run(
        "cold_ends_stretch",
        Flavor::Current,
        60,
        move || async move {
            let ctx = common::build_ctx(BackendChoice::IoUring, opened, |b| {
                b.rings(1).inline_stretch(Duration::ZERO)
            });
            let reads = |round: u64| {
                (0..16u64).map(move |i| (0u32, (round * 16 + i) * 65_536, Vec::with_capacity(4096)))
            };
            let mut yielded = Vec::new();
            let evictor = file.open();
            // Rounds whose reads were pending at the first poll and that
            // followed such a round (a batch served wholly inline leaves its
            // stretch spent, so the next one rightly yields first).
            let (mut cold, mut after_inline) = (0, false);
            for round in 0..16u64 {
                // This round's megabyte is evicted; still, a fast device
                // (here a virtio disk over the host's cache) can answer the
                // `RWF_NOWAIT` probe's own readahead within the call, so a
                // round may be served inline after all.
                common::drop_cache_until_gone(&evictor, round << 20, 1 << 20);
                let mut batch = std::pin::pin!(ctx.read_batch(reads(round)));
                let before = ctx.stats();
                let first = common::poll_once(batch.as_mut()).await;
                // Whatever the first poll queued reaches the kernel meanwhile
                // (the driver may take a while on a loaded machine; a batch
                // that yielded first queued nothing, and nothing arrives
                // however long this waits: it is not polled meanwhile).
                let mut after = ctx.stats();
                for _ in 0..40 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    after = ctx.stats();
                    if after.submitted != before.submitted {
                        break;
                    }
                }
                let inline = first.is_ready();
                if !inline && !after_inline {
                    cold += 1;
                    if after.submitted == before.submitted {
                        yielded.push(round);
                    }
                }
                after_inline = inline;
                let results = match first {
                    std::task::Poll::Ready(r) => r,
                    std::task::Poll::Pending => batch.await,
                };
                for (i, (r, buf)) in results.iter().enumerate() {
                    let off = (round * 16 + i as u64) * 65_536;
                    assert_eq!(r.as_ref().ok(), Some(&4096));
                    assert_eq!(&buf[..], &file.expected(off, 4096)[..]);
                }
            }
            assert!(
                cold >= 4,
                "only {cold} of 16 rounds waited for their reads: the device answered within RWF_NOWAIT"
            );
            assert!(
                yielded.is_empty(),
                "batches that yielded first: {yielded:?}"
            );
            drop(set);
        },
    );
}
