//! `read_vectored` / `read_vectored_owned`: positioned vectored reads,
//! against `pread` through std as the oracle, on both backends, through the
//! page-cache fast path and through the ring (`IORING_OP_READV` for owned
//! buffers).

use crate::common;

use std::io::{self, IoSliceMut};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use common::Flavor;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use uring_positioned_io::{AlignedBuf, BackendChoice, IoBufMut, UringContext};

/// Random slice layouts, offsets (past the end included) and files against
/// pread: the count is what one pread of the total length returns, and the
/// bytes land in the slices in order. Every case is read by a context with
/// the page-cache fast path (inline `preadv2`) and one without it (ring or
/// blocking pool), borrowed and owned (with some bytes already in the
/// buffers, which a read overwrites from each buffer's start).
fn proptest_against_pread(choice: BackendChoice) {
    let set = common::FileSet::new(0x7ec, &[300_000, 0, 4097]);
    let files = set.files.clone();
    let (opened_a, opened_b) = (set.open_all(), set.open_all());
    common::run(
        "vectored_proptest",
        Flavor::Multi,
        180,
        move || async move {
            let inline = common::build_ctx(choice, opened_a, |b| b);
            let ring = common::build_ctx(choice, opened_b, |b| b.inline_nowait(false));
            let mut runner = TestRunner::new(Config {
                failure_persistence: None,
                ..Config::default()
            });
            let strategy = (
                0usize..3,
                prop_oneof![0u64..310_000, Just(4096u64), Just(4000u64)],
                prop::collection::vec((0usize..9000, 0usize..64), 0..9),
                any::<bool>(),
            );
            let cases: Vec<_> = (0..200)
                .map(|_| strategy.new_tree(&mut runner).unwrap().current())
                .collect();
            for (case, (fi, off, lens, cold)) in cases.into_iter().enumerate() {
                let file = &files[fi];
                if cold && case % 4 == 0 {
                    file.drop_cache();
                }
                let total: usize = lens.iter().map(|l| l.0).sum();
                let want = file.pread(off, total);
                for (name, ctx) in [("inline", &inline), ("ring", &ring)] {
                    let what = format!("{name}: fid {fi} @ {off}, slices {lens:?}");
                    // Borrowed.
                    let mut storage: Vec<Vec<u8>> =
                        lens.iter().map(|&(l, _)| vec![0xEE; l]).collect();
                    let mut slices: Vec<IoSliceMut<'_>> =
                        storage.iter_mut().map(|v| IoSliceMut::new(v)).collect();
                    let n = ctx
                        .read_vectored(fi as u32, off, &mut slices)
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    drop(slices);
                    assert_eq!(n, want.len(), "{what}: count differs from pread");
                    let got: Vec<u8> = storage.concat();
                    assert_eq!(&got[..n], &want[..], "{what}: data");
                    assert!(got[n..].iter().all(|&b| b == 0xEE), "{what}: bytes past n");

                    // Owned: Vecs with `init` bytes already there, each
                    // filled from its start up to its capacity.
                    let bufs: Vec<Vec<u8>> = lens
                        .iter()
                        .map(|&(l, init)| {
                            let mut v = Vec::with_capacity(l + init);
                            v.extend((0..init).map(|i| i as u8));
                            v
                        })
                        .collect();
                    let caps: Vec<usize> = bufs.iter().map(Vec::capacity).collect();
                    let room: usize = caps.iter().sum();
                    let want = file.pread(off, room);
                    let (r, bufs) = ctx.read_vectored_owned(fi as u32, off, bufs).await;
                    if room == 0 {
                        // Nothing to read into: refused, as read_owned
                        // refuses it, every buffer unchanged.
                        let e = r.expect_err(&what);
                        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}");
                        for (b, &(_, init)) in bufs.iter().zip(&lens) {
                            assert_eq!(b.len(), init, "{what}");
                        }
                        continue;
                    }
                    let n = r.unwrap_or_else(|e| panic!("{what} (owned): {e}"));
                    assert_eq!(n, want.len(), "{what} (owned): count");
                    let mut at = 0;
                    for ((b, &(_, init)), cap) in bufs.iter().zip(&lens).zip(&caps) {
                        let k = (*cap).min(n - at);
                        assert_eq!(b.len(), init.max(k), "{what} (owned): len");
                        assert_eq!(&b[..k], &want[at..at + k], "{what} (owned): data");
                        assert!(
                            b[k..].iter().enumerate().all(|(i, &x)| x == (k + i) as u8),
                            "{what} (owned): bytes past the read"
                        );
                        at += k;
                    }
                }
            }
            if choice == BackendChoice::IoUring {
                // The context without the fast path really used the ring.
                assert!(ring.stats().submitted >= 200, "{:?}", ring.stats());
            }
            drop(set);
        },
    );
}

/// A borrowed vectored read larger than `BORROWED_CHUNK` goes to the kernel
/// in pieces and still fills every slice, across piece boundaries.
fn large_and_cold(choice: BackendChoice) {
    let set = common::FileSet::new(0x7ed, &[5 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("vectored_large", Flavor::Multi, 120, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
        file.drop_cache();
        let lens = [1 << 20, 3, (1 << 20) + 5, 777, 2 << 20];
        let mut storage: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
        let mut slices: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|v| IoSliceMut::new(v)).collect();
        let total: usize = lens.iter().sum();
        let n = ctx.read_vectored(0u32, 4095, &mut slices).await.unwrap();
        assert_eq!(n, total);
        assert_eq!(storage.concat(), file.pread(4095, total));
        // Owned, across the end of the file.
        file.drop_cache();
        let bufs = vec![Vec::with_capacity(3 << 20), Vec::with_capacity(3 << 20)];
        let (r, bufs) = ctx.read_vectored_owned(0u32, 1 << 20, bufs).await;
        assert_eq!(r.unwrap(), 4 << 20);
        assert_eq!((bufs[0].len(), bufs[1].len()), (3 << 20, 1 << 20));
        assert_eq!(bufs.concat(), file.pread(1 << 20, 4 << 20));
        drop(set);
    });
}

/// The edges `read` has, for vectored reads: offsets at and beyond
/// `i64::MAX`, too many buffers, a full owned buffer, ids of another
/// context or of an unregistered file, nothing to read.
fn edges(choice: BackendChoice) {
    let set = common::FileSet::new(0x7ee, &[10_000]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("vectored_edges", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b);
        let other = common::build_ctx(choice, vec![file.open()], |b| b);
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        let max = i64::MAX as u64;
        for (off, ok) in [
            (max, true),
            (max - 4, true),
            (max + 1, false),
            (u64::MAX, false),
        ] {
            let mut s = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
            let r = ctx.read_vectored(0u32, off, &mut s).await;
            match r {
                Ok(n) => assert!(ok && n == 0, "@{off}: Ok({n})"),
                Err(e) => assert!(
                    !ok && e.kind() == io::ErrorKind::InvalidInput,
                    "@{off}: {e}"
                ),
            }
            let (r, _) = ctx
                .read_vectored_owned(0u32, off, vec![Vec::<u8>::with_capacity(8)])
                .await;
            match r {
                Ok(n) => assert!(ok && n == 0, "owned @{off}: Ok({n})"),
                Err(e) => assert!(
                    !ok && e.kind() == io::ErrorKind::InvalidInput,
                    "owned @{off}: {e}"
                ),
            }
        }
        // Nothing to read into.
        assert_eq!(ctx.read_vectored(0u32, 0, &mut []).await.unwrap(), 0);
        let (r, bufs) = ctx
            .read_vectored_owned(0u32, 0, vec![Vec::<u8>::new(); 3])
            .await;
        assert_eq!(
            (r.unwrap_err().kind(), bufs.len()),
            (io::ErrorKind::InvalidInput, 3)
        );
        // More than IOV_MAX buffers.
        let mut storage = vec![[0u8; 1]; 1025];
        let mut many: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|v| IoSliceMut::new(v)).collect();
        let e = ctx.read_vectored(0u32, 0, &mut many).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let n = ctx.read_vectored(0u32, 0, &mut many[..1024]).await.unwrap();
        assert_eq!(n, 1024);
        drop(many);
        assert!(storage[..1024].concat() == file.pread(0, 1024));
        let (r, bufs) = ctx
            .read_vectored_owned(
                0u32,
                0,
                (0..1025).map(|_| Vec::<u8>::with_capacity(1)).collect(),
            )
            .await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(bufs.len(), 1025, "the buffers come back");
        // A full buffer among the owned ones: read from its start.
        let (r, bufs) = ctx
            .read_vectored_owned(0u32, 0, vec![Vec::with_capacity(4), vec![1u8; 4]])
            .await;
        assert_eq!(r.unwrap(), 8);
        assert_eq!([&bufs[0][..], &bufs[1][..]].concat(), file.pread(0, 8));
        // Checked ids: another context's, and a stale one.
        let fid = other.file_id(0).unwrap();
        let mut s = [IoSliceMut::new(&mut a)];
        let e = ctx.read_vectored(fid, 0, &mut s).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let fid = ctx.register_file(file.open()).unwrap();
        assert_eq!(ctx.read_vectored(fid, 0, &mut s).await.unwrap(), 16);
        ctx.unregister_file(fid).unwrap();
        let e = ctx.read_vectored(fid, 0, &mut s).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let (r, _) = ctx
            .read_vectored_owned(fid, 0, vec![Vec::<u8>::with_capacity(4)])
            .await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        // After shutdown: an error, not a hang.
        ctx.shutdown().await;
        let mut s = [IoSliceMut::new(&mut a)];
        assert!(ctx.read_vectored(0u32, 0, &mut s).await.is_err());
        drop(set);
    });
}

/// Vectored reads dropped while in the kernel (borrowed and owned) are
/// cancelled or complete into memory the context keeps; afterwards the
/// context reads correctly, nothing stays in flight and shutdown is prompt.
fn dropped_in_flight(choice: BackendChoice) {
    let set = common::FileSet::new(0x7ef, &[16 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("vectored_dropped", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
        for round in 0..8u64 {
            file.drop_cache();
            let mut futs = Vec::new();
            for i in 0..16u64 {
                let off = (round * 16 + i) * 65_536 % (15 << 20);
                let bufs = vec![Vec::with_capacity(4096), Vec::with_capacity(60_000)];
                futs.push(Box::pin(ctx.read_vectored_owned(0u32, off, bufs)));
            }
            for f in &mut futs {
                let _ = common::poll_once(f.as_mut()).await;
            }
            let mut storage = [[0u8; 8192]; 4];
            {
                let mut slices: Vec<IoSliceMut<'_>> =
                    storage.iter_mut().map(|v| IoSliceMut::new(v)).collect();
                let mut fut = Box::pin(ctx.read_vectored(0u32, round * 1_000_000, &mut slices));
                let _ = common::poll_once(fut.as_mut()).await;
                drop(fut);
            }
            drop(futs);
        }
        let bufs = vec![
            AlignedBuf::with_capacity(4096, 4096),
            AlignedBuf::with_capacity(4096, 4096),
        ];
        let (r, bufs) = ctx.read_vectored_owned(0u32, 12_288, bufs).await;
        assert_eq!(r.unwrap(), 8192);
        assert_eq!(
            [bufs[0].as_slice(), bufs[1].as_slice()].concat(),
            file.pread(12_288, 8192)
        );
        tokio::time::timeout(Duration::from_secs(10), ctx.shutdown())
            .await
            .expect("shutdown after dropped vectored reads");
        assert_eq!(ctx.stats().in_flight, 0, "{:?}", ctx.stats());
        drop(set);
    });
}

/// `O_DIRECT`: aligned owned buffers are read straight into with one
/// `IORING_OP_READV` (or `preadv`), up to the end of the file.
fn o_direct(choice: BackendChoice) {
    let set = common::FileSet::new(0x7f0, &[(1 << 20) + 4096]);
    set.sync_all();
    let file = set.files[0].clone();
    let direct = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file.path)
    {
        Ok(f) => f,
        Err(e) => return eprintln!("skipped: O_DIRECT refused here: {e}"),
    };
    common::run("vectored_direct", Flavor::Multi, 60, move || async move {
        let ctx: UringContext = common::build_ctx(choice, vec![direct], |b| b);
        let bufs = vec![
            AlignedBuf::with_capacity(4096, 4096),
            AlignedBuf::with_capacity(8192, 4096),
            AlignedBuf::with_capacity(4096, 4096),
        ];
        let (r, bufs) = ctx.read_vectored_owned(0u32, 1 << 20, bufs).await;
        assert_eq!(r.unwrap(), 4096, "to the end of the file");
        assert_eq!(bufs[0].as_slice(), &file.pread(1 << 20, 4096)[..]);
        assert_eq!((bufs[1].len(), bufs[2].len()), (0, 0));
        let bufs: Vec<_> = bufs
            .into_iter()
            .map(|mut b| {
                b.clear();
                b
            })
            .collect();
        let (r, bufs) = ctx.read_vectored_owned(0u32, 8192, bufs).await;
        assert_eq!(r.unwrap(), 16_384);
        let got: Vec<u8> = bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
        assert_eq!(got, file.pread(8192, 16_384));
        // Borrowed slices of any alignment and length: the ring reads into
        // an aligned bounce buffer (the lengths must still add up to whole blocks).
        let (mut x, mut y) = (vec![0u8; 100 + 1], vec![0u8; 8192 - 100]);
        let mut s = [IoSliceMut::new(&mut x[1..]), IoSliceMut::new(&mut y)];
        assert_eq!(ctx.read_vectored(0u32, 4096, &mut s).await.unwrap(), 8192);
        assert!([&x[1..], &y[..]].concat() == file.pread(4096, 8192));
        drop(set);
    });
}

/// A `Slice` window among the buffers is filled from its start.
fn slices_of_buffers(choice: BackendChoice) {
    let set = common::FileSet::new(0x7f1, &[20_000]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("vectored_slices", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
        let bufs = vec![vec![7u8; 10].slice(2..6), Vec::with_capacity(8).slice(..)];
        let (r, bufs) = ctx.read_vectored_owned(0u32, 100, bufs).await;
        assert_eq!(r.unwrap(), 12);
        let want = file.pread(100, 12);
        let mut it = bufs.into_iter();
        let a = it.next().unwrap().into_inner();
        assert_eq!(&a[..2], &[7, 7]);
        assert_eq!(&a[2..6], &want[..4]);
        assert_eq!(&a[6..], &[7; 4]);
        assert_eq!(it.next().unwrap().into_inner(), want[4..].to_vec());
        drop(set);
    });
}

backend_tests!(
    proptest_against_pread,
    large_and_cold,
    edges,
    dropped_in_flight,
    o_direct,
    slices_of_buffers,
);
