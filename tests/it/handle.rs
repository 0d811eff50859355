//! `UringFile`, the file handle: random sequences of its calls against
//! `std::fs::File` + `FileExt` on a copy of the file, EOF and `i64::MAX`
//! edges, a handle outliving its file's registration or its context's
//! shutdown, every op in a `'static` (spawnable) form, `usize` ids, and the
//! typed `fallocate` / `sync_file_range` flags against `libc`.

use crate::common;

use std::fs::File;
use std::future::Future;
use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::Flavor;
use futures::{Stream, StreamExt};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use uring_positioned_io::{
    BackendChoice, FallocateMode, FileId, IoBufMut, OpenOptions, SyncRange, UringContext, UringFile,
};

const MAX: u64 = i64::MAX as u64;

use common::open_rw as rw;

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    common::fill_pattern(seed, 0, &mut v);
    v
}

/// Two copies of a file under `dir`: one registered with a context (the
/// handle's), one for `std` (the oracle).
fn two_copies(dir: &Path, len: usize) -> (File, File) {
    let data = bytes(7, len);
    let (a, b) = (dir.join("handle"), dir.join("oracle"));
    std::fs::write(&a, &data).unwrap();
    std::fs::write(&b, &data).unwrap();
    (rw(&a), rw(&b))
}

/// The same outcome, or both errors of the same kind; `what` names the
/// case. The documented exceptions: a read the crate clamps at `i64::MAX`
/// (`clamped`, `Ok(0)`) where the kernel refuses `offset + len` beyond it
/// (`EINVAL`), an offset beyond `i64::MAX` the crate refuses by name
/// where std skips the syscall (an empty `read_exact_at` or `write_all_at`),
/// and an owned read into 0 bytes, which the crate refuses (it would look
/// like the end of the file) where std reads nothing.
fn same<T: PartialEq + std::fmt::Debug>(
    ours: &io::Result<T>,
    std: &io::Result<T>,
    clamped: Option<T>,
    what: &str,
) {
    match (ours, std) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}"),
        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind(), "{what}: ours {a}, std {b}"),
        (Ok(a), Err(b))
            if clamped.as_ref() == Some(a) && b.raw_os_error() == Some(libc::EINVAL) => {}
        // std makes no syscall for an empty read_exact_at / write_all_at;
        // ours refuses an offset beyond i64::MAX, saying so.
        (Err(a), Ok(_))
            if a.kind() == ErrorKind::InvalidInput && a.to_string().contains("beyond i64::MAX") => {
        }
        (Err(a), Ok(_))
            if a.kind() == ErrorKind::InvalidInput
                && a.to_string().contains("into 0 bytes of buffer") => {}
        (a, b) => panic!("{what}: ours {a:?}, std {b:?}"),
    }
}

/// The whole of both files, compared.
fn assert_same_files(dir: &Path, what: &str) {
    let a = std::fs::read(dir.join("handle")).unwrap();
    let b = std::fs::read(dir.join("oracle")).unwrap();
    assert_eq!(a.len(), b.len(), "file sizes after {what}");
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!("the files differ at byte {i} after {what}");
    }
}

/// An offset for a read: mostly in and around the file, sometimes near or
/// beyond `i64::MAX`.
fn read_offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 0u64..40_000,
        1 => MAX - 20_000..=MAX,
        1 => MAX + 1..=u64::MAX,
    ]
}

/// Random sequences of the handle's calls, each compared with the same
/// call through `std` on a copy of the file; the copies compared whole
/// after every write.
fn proptest_handle_against_std(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        let dir = tempfile::tempdir().unwrap();
        let (ours, oracle) = two_copies(dir.path(), 10_000);
        common::run("handle_vs_std", flavor, 120, move || async move {
            let ctx = common::build_ctx(choice, vec![ours], |b| b);
            let file = ctx.file(0usize).unwrap();
            let mut runner = TestRunner::new(Config {
                failure_persistence: None,
                ..Config::default()
            });
            let strategy = (
                0u8..14,
                read_offset(),
                0u64..40_000,
                prop_oneof![4 => 0usize..9000, 1 => 0usize..3, 1 => 60_000usize..300_000],
                any::<u64>(),
            );
            let cases: Vec<_> = (0..160)
                .map(|_| strategy.new_tree(&mut runner).unwrap().current())
                .collect();
            for (step, (kind, roff, woff, len, seed)) in cases.into_iter().enumerate() {
                let what = format!(
                    "step {step}: kind {kind}, {len} bytes, read at {roff}, write at {woff}"
                );
                match kind {
                    0 => {
                        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                        let ra = file.read_at(&mut a, roff).await;
                        let rb = oracle.read_at(&mut b, roff);
                        same(&ra, &rb, Some(0), &what);
                        if let Ok(n) = ra {
                            assert!(a[..n] == b[..n], "{what}: bytes");
                        }
                    }
                    1 => {
                        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                        let ra = file.read_exact_at(&mut a, roff).await;
                        let rb = oracle.read_exact_at(&mut b, roff);
                        // Clamped at i64::MAX: a non-empty exact read there
                        // is UnexpectedEof where std says EINVAL.
                        match (&ra, &rb) {
                            (Err(x), Err(y))
                                if x.kind() == ErrorKind::UnexpectedEof
                                    && y.raw_os_error() == Some(libc::EINVAL) => {}
                            _ => same(&ra, &rb, None, &what),
                        }
                        if ra.is_ok() {
                            assert!(a == b, "{what}: bytes");
                        }
                    }
                    2 => {
                        let (n, a) = file.read_at_owned(Vec::with_capacity(len), roff).await;
                        let mut b = vec![0u8; len];
                        let rb = oracle.read_at(&mut b, roff);
                        // An empty Vec (capacity 0) reads Ok(0), as std does.
                        same(&n, &rb, Some(0), &what);
                        if let Ok(n) = n {
                            assert!(a[..] == b[..n], "{what}: bytes");
                        }
                    }
                    3 => {
                        let (r, a) = file
                            .read_exact_at_owned(Vec::with_capacity(len), roff)
                            .await;
                        let mut b = vec![0u8; len];
                        let rb = oracle.read_exact_at(&mut b, roff);
                        match (&r, &rb) {
                            (Err(x), Err(y))
                                if x.kind() == ErrorKind::UnexpectedEof
                                    && y.raw_os_error() == Some(libc::EINVAL) => {}
                            _ => same(&r, &rb, None, &what),
                        }
                        if r.is_ok() {
                            assert!(a == b, "{what}: bytes");
                        }
                    }
                    4..=7 => {
                        let data = bytes(seed, len);
                        let ra = match kind {
                            4 => file.write_at(&data, woff).await,
                            5 => file.write_all_at(&data, woff).await.map(|()| len),
                            6 => file.write_at_owned(data.clone(), woff).await.0,
                            _ => file
                                .write_all_at_owned(data.clone(), woff)
                                .await
                                .0
                                .map(|()| len),
                        };
                        let rb = oracle.write_all_at(&data, woff).map(|()| len);
                        same(&ra, &rb, None, &what);
                        assert_same_files(dir.path(), &what);
                    }
                    8 => {
                        same(&file.sync_data().await, &oracle.sync_data(), None, &what);
                        same(&file.sync_all().await, &oracle.sync_all(), None, &what);
                    }
                    9 => {
                        let want = oracle.metadata().map(|m| m.len());
                        same(&file.len().await, &want, None, &what);
                    }
                    10 => {
                        let st = file.metadata().await.unwrap();
                        let md = oracle.metadata().unwrap();
                        assert_eq!(st.size, md.len(), "{what}");
                        assert_eq!(u64::from(st.block_size), md.blksize(), "{what}");
                    }
                    11 => {
                        // allocate: extends to offset + len (std: set_len
                        // when that is longer), contents unchanged.
                        let end = woff + len as u64;
                        let ra = file.allocate(woff, len as u64).await;
                        let rb = if len == 0 {
                            Err(io::Error::from_raw_os_error(libc::EINVAL))
                        } else if end > oracle.metadata().unwrap().len() {
                            oracle.set_len(end)
                        } else {
                            Ok(())
                        };
                        same(&ra, &rb, None, &what);
                        assert_same_files(dir.path(), &what);
                    }
                    12 => {
                        // Writes near and beyond i64::MAX: both refuse.
                        let data = bytes(seed, len.min(100));
                        let at = roff.max(MAX - 200);
                        let ra = file.write_all_at(&data, at).await;
                        let rb = oracle.write_all_at(&data, at);
                        match (&ra, &rb) {
                            (Err(_), Err(_)) => {}
                            (Ok(()), Ok(())) if data.is_empty() => {}
                            // An empty write is Ok(0) without a syscall,
                            // where pwrite checks the offset first.
                            (Ok(()), Err(e))
                                if data.is_empty() && e.raw_os_error() == Some(libc::EINVAL) => {}
                            // std's write_all of nothing makes no syscall;
                            // ours names the offset beyond i64::MAX.
                            (Err(e), Ok(()))
                                if data.is_empty()
                                    && e.kind() == ErrorKind::InvalidInput
                                    && e.to_string().contains("i64::MAX") => {}
                            (a, b) => panic!("{what}: ours {a:?}, std {b:?}"),
                        }
                        assert_same_files(dir.path(), &what);
                    }
                    _ => {
                        // A batch of reads and a scan of the whole file.
                        let reads: Vec<_> = (0..4u64)
                            .map(|i| (Vec::with_capacity(len.min(5000)), woff + i * 3000))
                            .collect();
                        for (i, (res, buf)) in file.read_batch(reads).await.into_iter().enumerate()
                        {
                            let mut b = vec![0u8; len.min(5000)];
                            let n = oracle.read_at(&mut b, woff + i as u64 * 3000).unwrap();
                            if len == 0 {
                                // An owned read into 0 bytes: refused.
                                let e = res.unwrap_err();
                                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
                                continue;
                            }
                            assert_eq!(res.unwrap(), n, "{what}: batch read {i}");
                            assert!(buf[..] == b[..n], "{what}: batch read {i} bytes");
                        }
                        let mut scanned = Vec::new();
                        let mut scan = file.scan(..).unwrap();
                        while let Some(chunk) = scan.next().await {
                            scanned.extend_from_slice(&chunk.unwrap());
                        }
                        assert!(
                            scanned == std::fs::read(dir.path().join("oracle")).unwrap(),
                            "{what}: scan"
                        );
                    }
                }
            }
            assert_same_files(dir.path(), "the sequence");
            drop(dir);
        });
    }
}

/// Reads at and after the end of the file, zero-length buffers, offsets at
/// and beyond `i64::MAX`: the same as std, or a clear error where std's is
/// an error too (or where the crate's documented clamp at `i64::MAX`
/// reads nothing).
fn edges_against_std(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (ours, oracle) = two_copies(dir.path(), 5000);
    common::run("handle_edges", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![ours], |b| b);
        let file = ctx.file(0).unwrap();
        for off in [
            0,
            4999,
            5000,
            5001,
            1 << 40,
            MAX - 1,
            MAX,
            MAX + 1,
            u64::MAX,
        ] {
            for len in [0usize, 1, 4096] {
                let what = format!("{len} bytes at {off}");
                let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                let ra = file.read_at(&mut a, off).await;
                let rb = oracle.read_at(&mut b, off);
                same(&ra, &rb, Some(0), &what);
                if let Err(e) = &ra {
                    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
                    assert!(e.to_string().contains("i64::MAX"), "{what}: not clear: {e}");
                }
                let (ra, _) = file.read_at_owned(Vec::with_capacity(len), off).await;
                same(&ra, &rb, Some(0), &format!("owned {what}"));
                let ra = file.read_exact_at(&mut a, off).await;
                let rb = oracle.read_exact_at(&mut b, off);
                match (&ra, &rb) {
                    // Clamped at i64::MAX: nothing to read there.
                    (Err(x), Err(y))
                        if x.kind() == ErrorKind::UnexpectedEof
                            && y.raw_os_error() == Some(libc::EINVAL) => {}
                    _ => same(&ra, &rb, None, &format!("exact {what}")),
                }
                if off <= 10_000 {
                    let data = bytes(off, len);
                    let ra = file.write_at(&data, off).await;
                    let rb = oracle.write_at(&data, off);
                    same(&ra, &rb, None, &format!("write {what}"));
                }
            }
        }
        assert_same_files(dir.path(), "the edges");
        // The length, at the end.
        assert_eq!(file.len().await.unwrap(), oracle.metadata().unwrap().len());
        drop(dir);
    });
}

/// A handle whose file is unregistered fails with a clear error — even
/// once the index holds another file — and never reaches that file.
fn handle_outliving_its_registration(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = two_copies(dir.path(), 8192);
    second.write_all_at(&[0xAB; 8192], 0).unwrap();
    common::run("handle_stale", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![first], |b| b);
        let file = ctx.file(0u32).unwrap();
        let plain = ctx.file(FileId::from(0u32)).unwrap();
        assert!(plain.fid().is_tagged(), "a handle holds the checked id");
        ctx.unregister_file(file.fid()).unwrap();
        let again = ctx.register_file(second).unwrap();
        assert_eq!(again.index(), 0, "the index is reused");
        let stale = |e: io::Error, what: &str| {
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
            assert!(e.to_string().contains("stale"), "{what}: not clear: {e}");
        };
        for f in [&file, &plain] {
            let mut buf = [0u8; 16];
            stale(f.read_at(&mut buf, 0).await.unwrap_err(), "read_at");
            assert_eq!(buf, [0; 16], "no byte of another file");
            stale(
                f.read_exact_at(&mut buf, 0).await.unwrap_err(),
                "read_exact_at",
            );
            let (r, b) = f.read_at_owned(Vec::with_capacity(16), 0).await;
            stale(r.unwrap_err(), "read_at_owned");
            assert!(b.is_empty());
            stale(
                f.write_all_at(b"stale", 0).await.unwrap_err(),
                "write_all_at",
            );
            stale(
                f.write_at_owned(b"x".to_vec(), 0).await.0.unwrap_err(),
                "write_at_owned",
            );
            stale(f.sync_all().await.unwrap_err(), "sync_all");
            stale(
                f.sync_range(0, 0, SyncRange::WRITE).await.unwrap_err(),
                "sync_range",
            );
            stale(f.allocate(0, 1 << 20).await.unwrap_err(), "allocate");
            stale(f.len().await.unwrap_err(), "len");
            stale(f.scan(..).unwrap_err(), "scan");
            let (r, _) = f.read_batch([(Vec::with_capacity(8), 0)]).await.remove(0);
            stale(r.unwrap_err(), "read_batch");
        }
        // The new file is untouched and served through its own handle.
        let new = ctx.file(again).unwrap();
        assert_eq!(new.len().await.unwrap(), 8192);
        let mut buf = [0u8; 8192];
        new.read_exact_at(&mut buf, 0).await.unwrap();
        assert!(buf.iter().all(|&b| b == 0xAB));
        // A handle for an id no longer registered cannot be made.
        stale(ctx.file(file.fid()).unwrap_err(), "file");
        drop(dir);
    });
}

/// After `shutdown`, every op through a handle fails with the shut-down
/// error, and no handle can be made; a handle keeps its context alive
/// after every `UringContext` is dropped.
fn handle_after_shutdown(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = two_copies(dir.path(), 4096);
    common::run("handle_shutdown", Flavor::Multi, 60, move || async move {
        // Outliving the context's handles.
        let file = {
            let ctx = common::build_ctx(choice, vec![second], |b| b);
            ctx.file(0).unwrap()
        };
        let (n, buf) = tokio::spawn(file.read_at_owned(Vec::with_capacity(4096), 0))
            .await
            .unwrap();
        assert_eq!((n.unwrap(), buf), (4096, bytes(7, 4096)));

        let ctx = common::build_ctx(choice, vec![first], |b| b);
        let file = ctx.file(0).unwrap();
        ctx.shutdown().await;
        let down = |e: io::Error, what: &str| {
            assert!(
                e.to_string().contains("shut down"),
                "{what}: not clear: {e}"
            );
        };
        let mut buf = [0u8; 8];
        down(file.read_at(&mut buf, 0).await.unwrap_err(), "read_at");
        down(
            file.read_at_owned(Vec::with_capacity(8), 0)
                .await
                .0
                .unwrap_err(),
            "read_at_owned",
        );
        down(file.write_at(b"x", 0).await.unwrap_err(), "write_at");
        down(file.sync_data().await.unwrap_err(), "sync_data");
        down(file.metadata().await.unwrap_err(), "metadata");
        down(file.scan(..).unwrap_err(), "scan");
        let (r, _) = file
            .read_batch([(Vec::with_capacity(8), 0)])
            .await
            .remove(0);
        down(r.unwrap_err(), "read_batch");
        down(ctx.file(0).unwrap_err(), "file");
        let opts = OpenOptions::new().read(true).clone();
        down(
            ctx.open_file(dir.path().join("oracle"), &opts)
                .await
                .unwrap_err(),
            "open_file",
        );
        drop(dir);
    });
}

/// The future is `Send + 'static`: it can be spawned as it is.
fn spawnable<F: Future + Send + 'static>(f: F) -> F {
    f
}

/// The stream is `Send + 'static`.
fn spawnable_stream<S: Stream + Send + 'static>(s: S) -> S {
    s
}

/// Every op, in a `'static` form: checked at compile time by `spawnable`,
/// and spawned for real.
fn every_op_spawnable(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let (ours, _oracle) = two_copies(dir.path(), 16384);
    common::run("handle_spawnable", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![ours], |b| b);
        let file = ctx.file(0).unwrap();
        let f = &file;
        let cap = || Vec::<u8>::with_capacity(4096);
        // Reads.
        let read = tokio::spawn(spawnable(f.read_at_owned(cap(), 0)));
        let exact = tokio::spawn(spawnable(f.read_exact_at_owned(cap(), 4096)));
        let vectored = tokio::spawn(spawnable(f.read_vectored_at_owned(vec![cap(), cap()], 0)));
        let batch = tokio::spawn(spawnable(f.read_batch([(cap(), 0), (cap(), 8192)])));
        let unordered = f.read_batch([(cap(), 0)]).unordered();
        let unordered = tokio::spawn(spawnable_stream(unordered).collect::<Vec<_>>());
        let scan = tokio::spawn(spawnable_stream(f.scan(..).unwrap()).count());
        let ctx_batch = tokio::spawn(spawnable(ctx.read_batch_static([(0, 0, cap())])));
        let ctx_reads = (
            tokio::spawn(spawnable(ctx.read_owned_static(0, 0, cap()))),
            tokio::spawn(spawnable(ctx.read_exact_owned_static(0, 0, cap()))),
            tokio::spawn(spawnable(ctx.read_vectored_owned_static(0, 0, vec![cap()]))),
        );
        assert_eq!(read.await.unwrap().0.unwrap(), 4096);
        exact.await.unwrap().0.unwrap();
        assert_eq!(vectored.await.unwrap().0.unwrap(), 8192);
        assert!(batch
            .await
            .unwrap()
            .into_iter()
            .all(|(r, _)| r.unwrap() == 4096));
        assert_eq!(unordered.await.unwrap().len(), 1);
        assert!(scan.await.unwrap() >= 1);
        assert_eq!(ctx_batch.await.unwrap()[0].0.as_ref().unwrap(), &4096);
        ctx_reads.0.await.unwrap().0.unwrap();
        ctx_reads.1.await.unwrap().0.unwrap();
        ctx_reads.2.await.unwrap().0.unwrap();
        // Writes, syncs, metadata.
        let data = bytes(3, 4096);
        tokio::spawn(spawnable(f.write_at_owned(data.clone(), 0)))
            .await
            .unwrap()
            .0
            .unwrap();
        tokio::spawn(spawnable(f.write_all_at_owned(data.clone(), 4096)))
            .await
            .unwrap()
            .0
            .unwrap();
        tokio::spawn(spawnable(ctx.write_all_owned_static(0, 8192, data.clone())))
            .await
            .unwrap()
            .0
            .unwrap();
        tokio::spawn(spawnable(f.sync_all()))
            .await
            .unwrap()
            .unwrap();
        tokio::spawn(spawnable(f.sync_data()))
            .await
            .unwrap()
            .unwrap();
        tokio::spawn(spawnable(f.sync_range(0, 0, SyncRange::WRITE_AND_WAIT)))
            .await
            .unwrap()
            .unwrap();
        tokio::spawn(spawnable(f.allocate(0, 20_000)))
            .await
            .unwrap()
            .unwrap();
        let keep = tokio::spawn(spawnable(f.fallocate(FallocateMode::KEEP_SIZE, 0, 4096)));
        match keep.await.unwrap() {
            Ok(()) => {}
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        }
        assert_eq!(
            tokio::spawn(spawnable(f.len())).await.unwrap().unwrap(),
            20_000
        );
        let st = tokio::spawn(spawnable(f.metadata()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(st.size, 20_000);
        // Open.
        let opts = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .clone();
        let opened = tokio::spawn(spawnable(ctx.open_file(dir.path().join("new"), &opts)))
            .await
            .unwrap()
            .unwrap();
        opened.write_all_at(b"new", 0).await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("new")).unwrap(), b"new");
        // The handle itself moves into a task.
        let moved = file.clone();
        let n = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            moved.read_at(&mut buf, 0).await
        });
        assert_eq!(n.await.unwrap().unwrap(), 16);
        // Borrowed-buffer futures borrow the buffer only: the handle that
        // made them may be gone.
        let mut buf = [0u8; 4];
        let read = ctx.file(0).unwrap().read_at(&mut buf, 0);
        assert_eq!(read.await.unwrap(), 4);
        let write = ctx.file(0).unwrap().write_all_at(&buf, 100);
        write.await.unwrap();
        let mut buf = [0u8; 4];
        let exact = ctx.file(0).unwrap().read_exact_at(&mut buf, 100);
        exact.await.unwrap();
        assert_eq!(buf, data[..4]);
        drop(dir);
    });
}

/// Ids as `usize` indices into the `Vec` of files; one beyond `u32::MAX`
/// is a clear error, never a truncated index (here: `1 << 32` would be
/// file #0).
fn usize_ids(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<_> = (0..3).map(|i| dir.path().join(format!("f{i}"))).collect();
    for (i, p) in paths.iter().enumerate() {
        std::fs::write(p, vec![i as u8 + 1; 100]).unwrap();
    }
    let files: Vec<File> = paths.iter().map(|p| rw(p)).collect();
    common::run("handle_usize_ids", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, files, |b| b);
        for i in 0..3usize {
            let mut buf = [0u8; 10];
            ctx.read_exact(i, 0, &mut buf).await.unwrap();
            assert_eq!(buf, [i as u8 + 1; 10]);
            let file = ctx.file(i).unwrap();
            assert_eq!(file.fid().index() as usize, i);
            assert_eq!(file.fid(), ctx.file_id(i as u32).unwrap());
            assert_eq!(file.len().await.unwrap(), 100);
        }
        let mut buf = [0u8; 10];
        for (big, shown) in [
            (FileId::from(1usize << 32), "4294967296"),
            (FileId::from(usize::MAX), "18446744073709551615"),
            (FileId::from(-1), "-1"),
        ] {
            assert!(big.is_out_of_range() && !big.is_tagged(), "{big:?}");
            let e = ctx.read(big, 0, &mut buf).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains(shown), "{e}");
            assert_eq!(buf, [0; 10], "no file was read");
            let e = ctx.file(big).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
            assert!(ctx.write(big, 0, b"x").await.is_err());
            assert!(ctx.fsync(big).await.is_err());
            assert!(ctx.unregister_file(big).is_err());
        }
        assert_eq!(FileId::from(2usize), FileId::from(2u32));
        let batch = ctx
            .read_batch((0..3usize).map(|i| (i, 0, Vec::with_capacity(1))))
            .await;
        for (i, (r, b)) in batch.into_iter().enumerate() {
            assert_eq!((r.unwrap(), b[0]), (1, i as u8 + 1));
        }
        drop(dir);
    });
}

/// `fallocate(fd, mode, ..)` straight through libc on the oracle file.
fn libc_fallocate(f: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: `f` is an open file, so its descriptor is valid for the call;
    // fallocate takes no pointers.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Each typed mode is the flag the kernel knows by that name: the handle
/// and `libc::fallocate` with the `FALLOC_FL_*` constants leave the two
/// copies the same (contents, size, and whether a hole was punched).
fn typed_flags_against_libc(choice: BackendChoice) {
    assert_eq!(FallocateMode::ALLOCATE.bits(), 0);
    assert_eq!(FallocateMode::KEEP_SIZE.bits(), libc::FALLOC_FL_KEEP_SIZE);
    assert_eq!(FallocateMode::PUNCH_HOLE.bits(), libc::FALLOC_FL_PUNCH_HOLE);
    assert_eq!(FallocateMode::ZERO_RANGE.bits(), libc::FALLOC_FL_ZERO_RANGE);
    assert_eq!(
        FallocateMode::COLLAPSE_RANGE.bits(),
        libc::FALLOC_FL_COLLAPSE_RANGE
    );
    assert_eq!(
        FallocateMode::INSERT_RANGE.bits(),
        libc::FALLOC_FL_INSERT_RANGE
    );
    assert_eq!(
        SyncRange::WAIT_BEFORE.bits(),
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
    );
    assert_eq!(SyncRange::WRITE.bits(), libc::SYNC_FILE_RANGE_WRITE);
    assert_eq!(
        SyncRange::WAIT_AFTER.bits(),
        libc::SYNC_FILE_RANGE_WAIT_AFTER
    );
    let mut m = FallocateMode::PUNCH_HOLE;
    m |= FallocateMode::KEEP_SIZE;
    assert_eq!(
        m.bits(),
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
    );
    assert!(m.contains(FallocateMode::KEEP_SIZE) && !m.contains(FallocateMode::ZERO_RANGE));

    let dir = tempfile::tempdir().unwrap();
    let (ours, oracle) = two_copies(dir.path(), 64 << 10);
    common::run("handle_flags", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![ours], |b| b);
        let file = ctx.file(0).unwrap();
        let hole = FallocateMode::PUNCH_HOLE | FallocateMode::KEEP_SIZE;
        let cases = [
            (hole, 4096, 8192),
            (hole, 60 << 10, 16 << 10), // past the end: the size stays
            (FallocateMode::ZERO_RANGE, 20_000, 5000),
            (
                FallocateMode::ZERO_RANGE | FallocateMode::KEEP_SIZE,
                62 << 10,
                8192,
            ),
            (FallocateMode::ZERO_RANGE, 62 << 10, 8192), // grows the file
            (FallocateMode::KEEP_SIZE, 100 << 10, 1 << 20),
            (FallocateMode::ALLOCATE, 0, 80 << 10),
            (FallocateMode::COLLAPSE_RANGE, 8192, 4096),
            (FallocateMode::INSERT_RANGE, 4096, 4096),
            (FallocateMode::PUNCH_HOLE, 0, 4096), // without KEEP_SIZE: refused
        ];
        for (mode, off, len) in cases {
            let what = format!("{mode:?} of {len} at {off}");
            let ra = file.fallocate(mode, off, len).await;
            let rb = libc_fallocate(&oracle, mode.bits(), off, len);
            match (&ra, &rb) {
                (Ok(()), Ok(())) => {}
                (Err(a), Err(b)) => assert_eq!(a.raw_os_error(), b.raw_os_error(), "{what}"),
                _ => panic!("{what}: ours {ra:?}, libc {rb:?}"),
            }
            assert_same_files(dir.path(), &what);
            let (a, b) = (file.metadata().await.unwrap(), oracle.metadata().unwrap());
            assert_eq!(a.size, b.len(), "{what}");
            if mode == hole && ra.is_ok() && off == 4096 {
                assert!(
                    a.blocks < (64 << 10) / 512,
                    "{what}: no hole punched ({} blocks)",
                    a.blocks
                );
                let mut buf = [1u8; 8192];
                file.read_exact_at(&mut buf, 4096).await.unwrap();
                assert!(
                    buf.iter().all(|&b| b == 0),
                    "{what}: the hole reads as zeroes"
                );
            }
        }
        let refused = file
            .fallocate(FallocateMode::PUNCH_HOLE, 0, 4096)
            .await
            .unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EOPNOTSUPP), "{refused}");
        // Writeback flags: each accepted, as sync_file_range(2) takes them.
        file.write_all_at(&[9u8; 8192], 0).await.unwrap();
        for flags in [
            SyncRange::empty(),
            SyncRange::WRITE,
            SyncRange::WAIT_BEFORE | SyncRange::WRITE,
            SyncRange::WRITE_AND_WAIT,
        ] {
            file.sync_range(0, 8192, flags).await.unwrap();
        }
        drop(dir);
    });
}

/// Handles made by `open_file` and `file`, and the `Debug` of a handle.
fn handle_basics(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    common::run("handle_basics", Flavor::Current, 60, move || async move {
        let ctx: UringContext = common::build_ctx(choice, vec![], |b| b);
        let opts = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .clone();
        let file: UringFile = ctx.open_file(dir.path().join("x"), &opts).await.unwrap();
        assert_eq!(ctx.file(file.fid()).unwrap().fid(), file.fid());
        let fid = ctx.open(dir.path().join("y"), &opts).await.unwrap();
        assert_eq!(ctx.file(fid).unwrap().fid(), fid);
        let dbg = format!("{file:?}");
        assert!(
            dbg.contains("UringFile") && dbg.contains("FileId(0"),
            "{dbg}"
        );
        let missing = ctx
            .open_file(dir.path().join("none"), OpenOptions::new().read(true))
            .await
            .unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        // Owned semantics as the context's: from the start, up to the
        // capacity; 0 bytes refused.
        file.write_all_at(b"abcdef", 0).await.unwrap();
        let (n, full) = file.read_at_owned(vec![0u8; 4], 1).await;
        assert_eq!((n.unwrap(), &full[..]), (4, &b"bcde"[..]));
        let (n, empty) = file.read_at_owned(Vec::new(), 0).await;
        assert_eq!(
            (n.unwrap_err().kind(), empty.len()),
            (ErrorKind::InvalidInput, 0)
        );
        let mut grow = b"xy".to_vec();
        grow.reserve_exact(3);
        let (n, grown) = file.read_at_owned(grow.slice(2..5), 1).await;
        assert_eq!((n.unwrap(), &grown.into_inner()[..]), (3, &b"xybcd"[..]));
        drop(dir);
    });
}

backend_tests!(
    proptest_handle_against_std,
    edges_against_std,
    handle_outliving_its_registration,
    handle_after_shutdown,
    every_op_spawnable,
    usize_ids,
    typed_flags_against_libc,
    handle_basics,
);
