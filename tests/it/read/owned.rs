//! Owned buffers, on both backends, with `std` (`pread`) as the
//! oracle: reads write from the buffer's start, at most `bytes_total()`
//! bytes, and raise the initialised length to the count (never lower it);
//! windows (`slice`) are filled from their start; `read_exact_owned` fills
//! everything or says `UnexpectedEof`; the `'static` futures can be spawned
//! and dropped. Includes the read cases of tokio-uring's and
//! tokio-epoll-uring's suites (read into a `Vec`'s capacity, read at EOF,
//! read_exact, sub-slice reads) and the peers' meaning of the buffer
//! methods (`peers_*`).

use crate::common;

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::task::Poll;

use common::{Flavor, TestFile};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use uring_positioned_io::{AlignedBuf, BackendChoice, IoBufMut, UringContext};

const HELLO: &[u8] = b"hello world...";

/// A context over `files`, built on a runtime of `flavor`; runs `f`.
fn with_files<F, Fut>(name: &str, choice: BackendChoice, files: Vec<std::fs::File>, f: F)
where
    F: FnOnce(UringContext) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    common::run(name, Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, files, |b| b);
        f(ctx).await;
    });
}

fn hello_file() -> std::fs::File {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(HELLO).unwrap();
    f
}

/// tokio-uring `basic_read`: a `Vec::with_capacity(1024)` gets the file,
/// and its `len()` says how much.
fn read_into_capacity(choice: BackendChoice) {
    with_files("capacity", choice, vec![hello_file()], |ctx| async move {
        let (r, buf) = ctx.read_owned(0u32, 0, Vec::with_capacity(1024)).await;
        assert_eq!(r.unwrap(), HELLO.len());
        assert_eq!(buf, HELLO);
        // Existing bytes are overwritten from the start.
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(b">>");
        let (r, buf) = ctx.read_owned(0u32, 6, buf).await;
        assert_eq!(r.unwrap(), HELLO.len() - 6);
        assert_eq!(buf, b"world...");
        // An AlignedBuf the same way.
        let (r, buf) = ctx
            .read_owned(0u32, 0, AlignedBuf::with_capacity(4096, 4096))
            .await;
        assert_eq!((r.unwrap(), buf.as_slice()), (HELLO.len(), HELLO));
        // The capacity bounds the read, whatever the len().
        let mut buf = Vec::with_capacity(8);
        buf.extend_from_slice(b"abcde");
        let cap = buf.capacity();
        let (r, buf) = ctx.read_owned(0u32, 0, buf).await;
        assert_eq!(r.unwrap(), cap);
        assert_eq!(buf, &HELLO[..cap]);
    });
}

/// tokio-epoll-uring's "read at EOF": `Ok(0)`, the buffer unchanged.
fn read_at_eof_leaves_the_buffer(choice: BackendChoice) {
    with_files("eof", choice, vec![hello_file()], |ctx| async move {
        for off in [HELLO.len() as u64, HELLO.len() as u64 + 1, 1 << 40] {
            let mut buf = Vec::with_capacity(32);
            buf.extend_from_slice(b"kept");
            let (r, buf) = ctx.read_owned(0u32, off, buf).await;
            assert_eq!(r.unwrap(), 0, "read_owned @ {off}");
            assert_eq!(buf, b"kept", "read_owned @ {off} changed the buffer");
            let (r, s) = ctx
                .read_owned(0u32, off, b"window".to_vec().slice(1..4))
                .await;
            assert_eq!(r.unwrap(), 0);
            assert_eq!(s.into_inner(), b"window");
        }
    });
}

/// A buffer of 0 bytes: an error naming the fix, never an `Ok(0)` that
/// looks like the end of the file. The buffer comes back.
fn empty_buffers_are_refused(choice: BackendChoice) {
    with_files("empty", choice, vec![hello_file()], |ctx| async move {
        let (r, b) = ctx.read_owned(0u32, 0, Vec::new()).await;
        let e = r.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("Vec::with_capacity"), "{e}");
        assert!(b.is_empty());
        let (r, b) = ctx
            .read_exact_owned(0u32, 0, AlignedBuf::with_capacity(0, 512))
            .await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(b.capacity(), 0);
        let (r, _) = ctx
            .read_owned_static(0u32, 0, Vec::<u8>::new().into_boxed_slice())
            .await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        // Full buffers are read (from their start).
        let (r, b) = ctx.read_exact_owned(0u32, 0, AlignedBuf::new(8, 512)).await;
        r.unwrap();
        assert_eq!(b.as_slice(), &HELLO[..8]);
    });
}

/// tokio-uring `basic_read_exact`, plus the end of the file.
fn read_exact_owned_fills_or_says_eof(choice: BackendChoice) {
    let set = common::FileSet::new(0x0e1, &[3 * 65536 + 1234]);
    let file = set.files[0].clone();
    with_files(
        "read_exact_owned",
        choice,
        set.open_all(),
        move |ctx| async move {
            let len = file.len as usize;
            let (r, buf) = ctx.read_exact_owned(0u32, 0, Vec::with_capacity(len)).await;
            r.unwrap();
            assert_eq!(buf, file.pread(0, len));
            // Overwrites what is there, exactly up to the capacity.
            let mut buf = Vec::with_capacity(10_000);
            buf.extend_from_slice(b"xy");
            let cap = buf.capacity();
            let (r, buf) = ctx.read_exact_owned(0u32, 777, buf).await;
            r.unwrap();
            assert_eq!(buf, file.pread(777, cap));
            // Across the end of the file: UnexpectedEof, every byte kept.
            for off in [file.len - 10, file.len, file.len + 5] {
                let (r, buf) = ctx
                    .read_exact_owned(0u32, off, Vec::with_capacity(100))
                    .await;
                let e = r.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
                assert!(e.to_string().contains("file #0 ends before"), "{e}");
                assert_eq!(buf, file.pread(off, 100), "bytes up to EOF @ {off}");
            }
            // A window, exactly.
            let (r, s) = ctx
                .read_exact_owned(0u32, 5, vec![0u8; 64].slice(8..40))
                .await;
            r.unwrap();
            let v = s.into_inner();
            assert_eq!(&v[8..40], &file.pread(5, 32)[..]);
            assert!(v[..8].iter().chain(&v[40..]).all(|&b| b == 0));
            // Larger than a borrowed piece (1 MiB) works the same: one owned read.
            let (r, buf) = ctx
                .read_exact_owned(0u32, 0, AlignedBuf::with_capacity(len, 4096))
                .await;
            r.unwrap();
            assert_eq!(buf.as_slice(), &file.pread(0, len)[..]);
        },
    );
}

/// tokio-uring `test_subslice_read` and friends: a window is written from
/// its start, bytes outside it are kept, and the whole buffer comes back.
fn windows_target_part_of_a_buffer(choice: BackendChoice) {
    let set = common::FileSet::new(0x511c, &[100]);
    let file = set.files[0].clone();
    with_files("windows", choice, set.open_all(), move |ctx| async move {
        let data = file.pread(0, 100);
        for (begin, end) in [(0usize, 30usize), (10, 30), (5, 15), (0, 15), (29, 30)] {
            let buf = vec![b'.'; 30];
            let (r, s) = ctx.read_owned(0u32, 40, buf.slice(begin..end)).await;
            let n = r.unwrap();
            assert_eq!(n, end - begin);
            assert_eq!(&s[..n], &data[40..40 + n]);
            let v = s.into_inner();
            assert_eq!(&v[begin..end], &data[40..40 + n]);
            assert!(v[..begin].iter().chain(&v[end..]).all(|&b| b == b'.'));
        }
        // Re-slicing is relative to the window.
        let s = vec![0u8; 30].slice(5..25).slice(5..10);
        assert_eq!((s.begin(), s.end()), (10, 15));
        let (r, s) = ctx.read_owned(0u32, 0, s).await;
        assert_eq!(r.unwrap(), 5);
        assert_eq!(&s.into_inner()[10..15], &data[..5]);
        // A window of an empty Vec grows its len to the bytes read.
        let (r, s) = ctx
            .read_owned(0u32, 95, Vec::with_capacity(64).slice(..20))
            .await;
        assert_eq!(r.unwrap(), 5);
        assert_eq!(s.into_inner(), &data[95..]);
        // A window starting right after the initialised bytes extends them.
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(b"head");
        let (r, s) = ctx.read_owned(0u32, 0, v.slice(4..14)).await;
        assert_eq!(r.unwrap(), 10);
        let v = s.into_inner();
        assert_eq!((&v[..4], &v[4..]), (&b"head"[..], &data[..10]));
        // Windows that cannot be: an error with the buffer handed back.
        let e = Vec::<u8>::with_capacity(8).try_slice(1..4).unwrap_err();
        assert!(e.to_string().contains("initialised"), "{e}");
        let e = vec![0u8; 8].try_slice(4..20).unwrap_err();
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidInput);
    });
}

/// Files opened with O_DIRECT: aligned buffers with spare capacity, and
/// windows of them at aligned offsets.
fn o_direct_owned(choice: BackendChoice) {
    let set = common::FileSet::new(0xd1, &[(1 << 20) + 4096]);
    set.sync_all();
    let file: TestFile = set.files[0].clone();
    let direct = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file.path)
    {
        Ok(f) => f,
        Err(e) => return eprintln!("skipped: O_DIRECT refused here: {e}"),
    };
    with_files(
        "o_direct_owned",
        choice,
        vec![direct],
        move |ctx| async move {
            let (r, buf) = ctx
                .read_exact_owned(0u32, 8192, AlignedBuf::with_capacity(65536, 4096))
                .await;
            r.unwrap();
            assert_eq!(buf.as_slice(), &file.pread(8192, 65536)[..]);
            let mut buf = buf;
            buf.clear();
            let (r, buf) = ctx.read_owned(0u32, 1 << 20, buf).await;
            assert_eq!(r.unwrap(), 4096, "to the end of the file");
            assert_eq!(buf.as_slice(), &file.pread(1 << 20, 4096)[..]);
            // Block 1 of a zeroed two-block buffer.
            let (r, s) = ctx
                .read_owned(0u32, 4096, AlignedBuf::new(8192, 4096).slice(4096..))
                .await;
            assert_eq!(r.unwrap(), 4096);
            let b = s.into_inner();
            assert!(b[..4096].iter().all(|&x| x == 0));
            assert_eq!(&b[4096..], &file.pread(4096, 4096)[..]);
        },
    );
}

/// `BytesMut` (feature `bytes`): reads fill it from the start of its view
/// up to its capacity, as a `Vec`.
#[cfg(feature = "bytes")]
fn bytes_mut(choice: BackendChoice) {
    let set = common::FileSet::new(0xb7e, &[50_000]);
    let file = set.files[0].clone();
    with_files("bytes_mut", choice, set.open_all(), move |ctx| async move {
        let (r, b) = ctx
            .read_owned(0u32, 100, bytes::BytesMut::with_capacity(4096))
            .await;
        assert_eq!(r.unwrap(), 4096);
        assert_eq!(&b[..], &file.pread(100, 4096)[..]);
        // Bytes already there are overwritten; after a split, a read
        // fills the rest of the storage from its own start.
        let mut b = bytes::BytesMut::with_capacity(8192);
        b.extend_from_slice(b"hdr");
        let (r, mut b) = ctx.read_exact_owned(0u32, 0, b).await;
        r.unwrap();
        assert_eq!(&b[..], &file.pread(0, b.len())[..]);
        let head = b.split_to(3);
        assert_eq!(&head[..], &file.pread(0, 3)[..]);
        let (r, b) = ctx.read_owned(0u32, 49_990, b).await;
        assert_eq!(r.unwrap(), 10);
        assert_eq!(&b[..10], &file.pread(49_990, 10)[..]);
        assert_eq!(
            &head[..],
            &file.pread(0, 3)[..],
            "the split-off head is untouched"
        );
    });
}

/// The `'static` futures go to `tokio::spawn` as they are, outlive every
/// other handle, and are sound to drop (or abort) in flight.
fn static_futures_spawn_and_drop(choice: BackendChoice) {
    let set = common::FileSet::new(0x57a7, &[4 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run("static_futures", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
        let reads: Vec<_> = (0..64u64)
            .map(|i| {
                let off = i * 65_000;
                let fut = ctx.read_owned_static(0u32, off, Vec::with_capacity(4096));
                (off, tokio::spawn(fut))
            })
            .collect();
        let exact = tokio::spawn(ctx.read_exact_owned_static(
            0u32,
            7,
            AlignedBuf::with_capacity(1 << 20, 4096),
        ));
        drop(ctx); // the spawned reads hold the context
        for (off, h) in reads {
            let (r, b) = h.await.unwrap();
            assert_eq!(r.unwrap(), 4096);
            assert_eq!(b, file.pread(off, 4096), "@ {off}");
        }
        let (r, b) = exact.await.unwrap();
        r.unwrap();
        assert_eq!(b.as_slice(), &file.pread(7, 1 << 20)[..]);

        // Dropped in flight — the last handle going with them — and aborted.
        for round in 0..4u64 {
            file.drop_cache();
            let ctx = common::build_ctx(choice, vec![file.open()], |b| b.inline_nowait(false));
            let mut futs: Vec<_> = (0..32u64)
                .map(|i| {
                    let off = (round * 32 + i) * 100_003 % file.len;
                    Box::pin(ctx.read_owned_static(0u32, off, Vec::with_capacity(65536)))
                })
                .collect();
            for f in &mut futs {
                if let Poll::Ready((r, _)) = common::poll_once(f.as_mut()).await {
                    r.unwrap();
                }
            }
            let aborted: Vec<_> = (0..8u64)
                .map(|i| {
                    tokio::spawn(ctx.read_owned_static(0u32, i * 4096, Vec::with_capacity(1 << 20)))
                })
                .collect();
            drop(ctx);
            tokio::task::yield_now().await;
            aborted.iter().for_each(tokio::task::JoinHandle::abort);
            drop(futs);
            for h in aborted {
                let _ = h.await;
            }
        }
    });
}

/// Random windows and prefixes against pread: a read writes exactly
/// `begin..begin + n` of the buffer with the file's bytes, keeps everything
/// else, and leaves `len() == max(old len, begin + n)`.
fn proptest_windows_against_pread(choice: BackendChoice) {
    let set = common::FileSet::new(0x9a9, &[70_000, 0, 4097]);
    let files = set.files.clone();
    let opened = set.open_all();
    common::run("proptest_windows", Flavor::Multi, 120, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b);
        let mut runner = TestRunner::new(Config {
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (
            0usize..3,
            0u64..80_000,
            0usize..9000,
            prop_oneof![Just(0usize), 0usize..9000],
            any::<u64>(),
            0u8..3,
        );
        let cases: Vec<_> = (0..256)
            .map(|_| strategy.new_tree(&mut runner).unwrap().current())
            .collect();
        for (fi, off, init, cap_extra, pick, kind) in cases {
            let file = &files[fi];
            let cap = init + cap_extra;
            let mut buf = Vec::with_capacity(cap);
            buf.extend((0..init).map(|i| (i % 251) as u8));
            let cap = buf.capacity();
            let begin = if init == 0 {
                0
            } else {
                (pick as usize) % (init + 1)
            };
            let end = begin + ((pick >> 32) as usize) % (cap - begin + 1);
            let what = format!(
                "fid {fi} @ {off}, init {init} cap {cap}, window {begin}..{end}, kind {kind}"
            );
            let before = buf.clone();
            if kind < 2 && begin == end {
                // An empty window: nothing to read into, refused.
                let (r, b) = if kind == 0 {
                    let (r, s) = ctx.read_owned(fi as u32, off, buf.slice(begin..end)).await;
                    (r.map(drop), s.into_inner())
                } else {
                    let (r, s) = ctx
                        .read_exact_owned(fi as u32, off, buf.slice(begin..end))
                        .await;
                    (r, s.into_inner())
                };
                let e = r.expect_err(&what);
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}");
                assert_eq!(b, before, "{what}");
                continue;
            }
            let (n, after) = match kind {
                0 => {
                    let (r, s) = ctx.read_owned(fi as u32, off, buf.slice(begin..end)).await;
                    (r.unwrap_or_else(|e| panic!("{what}: {e}")), s.into_inner())
                }
                1 => {
                    let (r, s) = ctx
                        .read_exact_owned(fi as u32, off, buf.slice(begin..end))
                        .await;
                    let want = file.pread(off, end - begin).len();
                    match r {
                        Ok(()) => assert_eq!(want, end - begin, "{what}"),
                        Err(e) => assert!(
                            e.kind() == io::ErrorKind::UnexpectedEof && want < end - begin,
                            "{what}: {e}"
                        ),
                    }
                    (want, s.into_inner())
                }
                _ => {
                    // The whole buffer (no window): from 0 up to the capacity.
                    let (r, b) = ctx.read_owned(fi as u32, off, buf).await;
                    if cap == 0 {
                        // Nothing to read into: refused, the buffer unchanged.
                        let e = r.expect_err(&what);
                        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}");
                        assert_eq!(b, before, "{what}");
                        continue;
                    }
                    let n = r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(n, file.pread(off, cap).len(), "{what}");
                    assert_eq!(b.len(), init.max(n), "{what}");
                    assert_eq!(&b[..n], &file.pread(off, n)[..], "{what}");
                    assert_eq!(&b[n..], &before[n.min(init)..], "{what}");
                    continue;
                }
            };
            let want = file.pread(off, end - begin);
            assert_eq!(n, want.len(), "{what}: count differs from pread");
            assert_eq!(&after[begin..begin + n], &want[..], "{what}: data");
            assert_eq!(after.len(), init.max(begin + n), "{what}: len");
            let kept = init.min(after.len());
            for i in (0..begin.min(kept)).chain((begin + n).min(kept)..kept) {
                assert_eq!(
                    after[i], before[i],
                    "{what}: byte {i} outside the read changed"
                );
            }
        }
    });
}

/// The peers' meaning (tokio-uring, monoio, compio), with std's
/// `FileExt::read_at` as the oracle: an owned read writes at the buffer's
/// start, at most `bytes_total()` bytes (a `Vec`'s capacity), and raises
/// its `len()` to the count, never lowering it. `vec![0u8; 4096]` works
/// (alone, in a batch, merged, through a handle) and keeps `len() == 4096`.
fn peers_full_vec_is_read_from_its_start(choice: BackendChoice) {
    let set = common::FileSet::new(0x9ee5, &[10_000]);
    let file = set.files[0].clone();
    let path = file.path.clone();
    with_files(
        "peers_full_vec",
        choice,
        set.open_all(),
        move |ctx| async move {
            for off in [0u64, 100, 8192, 9_999] {
                let want = file.pread(off, 4096);
                let (r, b) = ctx.read_owned(0u32, off, vec![0u8; 4096]).await;
                let n = r.unwrap_or_else(|e| panic!("read_owned @ {off}: {e}"));
                assert_eq!(n, want.len(), "count @ {off}");
                assert_eq!(b.len(), 4096, "len stays @ {off}");
                assert_eq!(&b[..n], &want[..], "bytes 0..n @ {off}");
                assert!(b[n..].iter().all(|&x| x == 0), "bytes after n kept @ {off}");
                // The same through the handle.
                let handle = ctx.file(0u32).unwrap();
                let (r, b) = handle.read_at_owned(vec![0u8; 4096], off).await;
                assert_eq!((r.unwrap(), b.len()), (want.len(), 4096), "handle @ {off}");
                assert_eq!(&b[..want.len()], &want[..]);
            }
            // In a batch, alone and merged.
            for merge in [false, true] {
                let reads = (0..3u64).map(|i| (0u32, i * 4096, vec![0u8; 4096]));
                let batch = ctx.read_batch(reads);
                let batch = if merge { batch.merge_gap(0) } else { batch };
                for (i, (r, b)) in batch.await.into_iter().enumerate() {
                    let want = file.pread(i as u64 * 4096, 4096);
                    let n = r.unwrap_or_else(|e| panic!("batch read {i} (merge {merge}): {e}"));
                    assert_eq!(
                        (n, b.len()),
                        (want.len(), 4096),
                        "batch read {i} (merge {merge})"
                    );
                    assert_eq!(&b[..n], &want[..], "batch read {i} (merge {merge})");
                }
            }
            // A Box<[u8]> and a zeroed AlignedBuf are read whole, from the start.
            let (r, b) = ctx
                .read_owned(0u32, 5, vec![9u8; 64].into_boxed_slice())
                .await;
            assert_eq!((r.unwrap(), &b[..]), (64, &file.pread(5, 64)[..]));
            let (r, b) = ctx
                .read_owned(0u32, 4096, AlignedBuf::new(4096, 4096))
                .await;
            assert_eq!(
                (r.unwrap(), b.as_slice()),
                (4096, &file.pread(4096, 4096)[..])
            );
            // std on the same file says the same (the oracle, spelled out).
            use std::os::unix::fs::FileExt;
            let mut std_buf = vec![0u8; 4096];
            let n = std::fs::File::open(&path)
                .unwrap()
                .read_at(&mut std_buf, 9_000)
                .unwrap();
            let (r, b) = ctx.read_owned(0u32, 9_000, vec![0u8; 4096]).await;
            assert_eq!((r.unwrap(), b), (n, std_buf));
        },
    );
}

/// `Vec::with_capacity(n)` comes back with `len()` the count; a partly
/// filled `Vec` has its first bytes overwritten (not kept, not appended
/// to), reads up to its capacity, and keeps a `len()` longer than the count.
fn peers_capacity_and_partly_filled(choice: BackendChoice) {
    let set = common::FileSet::new(0x9ee6, &[5_000]);
    let file = set.files[0].clone();
    with_files(
        "peers_partly",
        choice,
        set.open_all(),
        move |ctx| async move {
            let (r, b) = ctx.read_owned(0u32, 0, Vec::with_capacity(1000)).await;
            let cap = b.capacity();
            assert_eq!((r.unwrap(), b.len()), (cap, cap));
            assert_eq!(b, file.pread(0, cap));
            let (r, b) = ctx.read_owned(0u32, 4_990, Vec::with_capacity(1000)).await;
            assert_eq!((r.unwrap(), b), (10, file.pread(4_990, 10)));
            // Partly filled: the read starts at 0, goes up to the capacity.
            let mut buf = Vec::with_capacity(64);
            buf.extend_from_slice(b"previous contents");
            let cap = buf.capacity();
            let (r, b) = ctx.read_owned(0u32, 100, buf).await;
            assert_eq!(r.unwrap(), cap, "reads the whole capacity");
            assert_eq!(b, file.pread(100, cap), "first bytes overwritten");
            // Longer than the count: len() is kept, bytes past n unchanged.
            let mut buf = Vec::with_capacity(64);
            buf.extend_from_slice(&[7u8; 40]);
            let (r, b) = ctx.read_owned(0u32, 4_990, buf).await;
            assert_eq!((r.unwrap(), b.len()), (10, 40));
            assert_eq!(&b[..10], &file.pread(4_990, 10)[..]);
            assert!(b[10..].iter().all(|&x| x == 7));
            // A reused buffer reads into the same place each time.
            let mut b = vec![0u8; 256];
            for off in [0u64, 1000, 2000] {
                let (r, back) = ctx.read_owned(0u32, off, b).await;
                assert_eq!(r.unwrap(), 256);
                assert_eq!(back, file.pread(off, 256), "reuse @ {off}");
                b = back;
            }
        },
    );
}

/// At the end of the file: `Ok(0)`, the buffer unchanged in length and
/// contents; `read_exact_owned` into a full `Vec` past the end is
/// `UnexpectedEof`, with the bytes up to the end at its start.
fn peers_eof_and_read_exact(choice: BackendChoice) {
    let set = common::FileSet::new(0x9ee7, &[3_000]);
    let file = set.files[0].clone();
    with_files("peers_eof", choice, set.open_all(), move |ctx| async move {
        for off in [3_000u64, 3_001, 1 << 40] {
            let (r, b) = ctx.read_owned(0u32, off, vec![5u8; 16]).await;
            assert_eq!((r.unwrap(), b), (0, vec![5u8; 16]), "@ {off}");
        }
        let (r, b) = ctx.read_exact_owned(0u32, 1_000, vec![0u8; 2_000]).await;
        r.unwrap();
        assert_eq!(b, file.pread(1_000, 2_000));
        let (r, b) = ctx.read_exact_owned(0u32, 2_500, vec![1u8; 1_000]).await;
        let e = r.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        assert_eq!(b.len(), 1_000);
        assert_eq!(&b[..500], &file.pread(2_500, 500)[..]);
        assert!(b[500..].iter().all(|&x| x == 1));
        let (r, b) = ctx
            .read_exact_owned(0u32, 2_990, Vec::with_capacity(100))
            .await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(b, file.pread(2_990, 10));
    });
}

/// Nothing to read into (`bytes_total() == 0`): `InvalidInput` naming the
/// op, never an `Ok(0)` that looks like the end of the file.
fn peers_zero_capacity_is_refused(choice: BackendChoice) {
    fn refused<T: std::fmt::Debug>(what: &str, r: &io::Result<T>) {
        let e = r.as_ref().expect_err(what);
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}");
        assert!(e.to_string().contains(what), "{what}: {e}");
        assert!(e.to_string().contains("0 bytes"), "{what}: {e}");
    }
    with_files("peers_zero", choice, vec![hello_file()], |ctx| async move {
        let (r, _) = ctx.read_owned(0u32, 0, Vec::new()).await;
        refused("read_owned", &r);
        let (r, _) = ctx.read_exact_owned(0u32, 0, Vec::new()).await;
        refused("read_exact_owned", &r);
        let (r, b) = ctx.read_owned(0u32, 0, vec![0u8; 8].slice(3..3)).await;
        refused("read_owned", &r);
        assert_eq!(b.into_inner(), vec![0u8; 8]);
        let (r, _) = ctx
            .read_vectored_owned(0u32, 0, vec![Vec::<u8>::new(), Vec::new()])
            .await;
        refused("read_vectored_owned", &r);
        let (r, _) = ctx
            .read_vectored_owned(0u32, 0, Vec::<Vec<u8>>::new())
            .await;
        refused("read_vectored_owned", &r);
        let res = ctx
            .read_batch([(0u32, 0, Vec::new()), (0u32, 0, Vec::with_capacity(4))])
            .await;
        refused("read_batch", &res[0].0);
        assert_eq!(*res[1].0.as_ref().unwrap(), res[1].1.capacity());
        let handle = ctx.file(0u32).unwrap();
        // The handle's read is the context's, named so.
        let (r, _) = handle.read_at_owned(Vec::new(), 0).await;
        refused("read_owned", &r);
    });
}

/// Vectored owned reads: each buffer filled from its start up to its
/// capacity, in turn, whatever its `len()`.
fn peers_vectored_mixed(choice: BackendChoice) {
    let set = common::FileSet::new(0x9ee8, &[1_000]);
    let file = set.files[0].clone();
    with_files(
        "peers_vectored",
        choice,
        set.open_all(),
        move |ctx| async move {
            let mut partly = Vec::with_capacity(8);
            partly.extend_from_slice(b"abc");
            let p_cap = partly.capacity();
            let bufs = vec![vec![0u8; 3], Vec::with_capacity(0), partly, vec![4u8; 10]];
            let total = 3 + p_cap + 10;
            let (r, b) = ctx.read_vectored_owned(0u32, 10, bufs).await;
            assert_eq!(r.unwrap(), total);
            let want = file.pread(10, total);
            assert_eq!(b[0], &want[..3]);
            assert!(b[1].is_empty());
            assert_eq!(b[2], &want[3..3 + p_cap]);
            assert_eq!(b[3], &want[3 + p_cap..]);
            // Short at the end of the file: later buffers keep their bytes.
            let bufs = vec![vec![1u8; 4], vec![2u8; 4], vec![3u8; 4]];
            let (r, b) = ctx.read_vectored_owned(0u32, 994, bufs).await;
            assert_eq!(r.unwrap(), 6);
            let want = file.pread(994, 6);
            assert_eq!(b[0], &want[..4]);
            assert_eq!((&b[1][..2], &b[1][2..]), (&want[4..], &[2u8, 2][..]));
            assert_eq!(b[2], vec![3u8; 4]);
            // Through the handle, with `Vec::with_capacity` buffers.
            let handle = ctx.file(0u32).unwrap();
            let (r, b) = handle
                .read_vectored_at_owned(vec![Vec::with_capacity(5), Vec::with_capacity(7)], 0)
                .await;
            let (c0, c1) = (b[0].capacity(), b[1].capacity());
            assert_eq!(r.unwrap(), c0 + c1);
            assert_eq!(
                (b[0].clone(), b[1].clone()),
                (file.pread(0, c0), file.pread(c0 as u64, c1))
            );
        },
    );
}

backend_tests!(
    peers_full_vec_is_read_from_its_start,
    peers_capacity_and_partly_filled,
    peers_eof_and_read_exact,
    peers_zero_capacity_is_refused,
    peers_vectored_mixed,
);

#[cfg(feature = "bytes")]
backend_tests!(bytes_mut);

backend_tests!(
    read_into_capacity,
    read_at_eof_leaves_the_buffer,
    empty_buffers_are_refused,
    read_exact_owned_fills_or_says_eof,
    windows_target_part_of_a_buffer,
    o_direct_owned,
    static_futures_spawn_and_drop,
    proptest_windows_against_pread,
);
