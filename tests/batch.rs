//! `UringContext::read_batch`: many owned reads submitted together.

mod common;

use std::time::Duration;

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
                let _ = fut.as_mut().poll(&mut cx);
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
