//! Reads: the read future, buffer types and `O_DIRECT` files, offsets near
//! `i64::MAX`, reads across the end of file, and a read's binding to its file
//! id. Owned buffers are in `owned`, checked file ids in `ids`.

use crate::common;

use std::future::Future;
use std::os::unix::fs::OpenOptionsExt;
use uring_positioned_io::IoBufMut;

use common::Flavor;
use std::io;
use std::task::Poll;
use uring_positioned_io::{AlignedBuf, BackendChoice, BackendKind, UringReadFuture};

use common::BOTH;

mod ids;
mod owned;

/// Offsets near i64::MAX: same answer everywhere, fast path kept.
#[test]
fn offsets_near_i64_max() {
    let _shared = common::shared();
    for choice in BOTH {
        let set = common::FileSet::new(0x608, &[100_000]);
        let file = set.files[0].clone();
        let opened = set.open_all();
        common::run(
            "offsets_near_i64_max",
            Flavor::Multi,
            30,
            move || async move {
                let ctx = common::default_ctx(choice, opened);
                // Warm the file so the fast path serves it.
                common::verify_whole_file(&ctx, 0, &file, 65_536).await;
                let max = i64::MAX as u64;
                let mut buf = vec![0u8; 4096];
                for off in [max - 10, max - 4096, max - 4095, max] {
                    let n = ctx
                        .read(0u32, off, &mut buf)
                        .await
                        .unwrap_or_else(|e| panic!("{choice:?} read at {off}: {e}"));
                    assert_eq!(n, 0, "past the end of file");
                    let (r, _) = ctx.read_owned(0u32, off, Vec::with_capacity(4096)).await;
                    assert_eq!(r.unwrap(), 0);
                }
                let e = ctx.read(0u32, max + 1, &mut buf).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                // The fast path still serves cached reads.
                let before = ctx.stats();
                for i in 0..64u64 {
                    let n = ctx.read(0u32, i * 1000, &mut buf).await.unwrap();
                    assert_eq!(&buf[..n], &file.expected(i * 1000, 4096)[..]);
                }
                let after = ctx.stats();
                if ctx.backend().kind == BackendKind::IoUring {
                    assert_eq!(
                        after.inline_completed - before.inline_completed,
                        64,
                        "the page-cache fast path was switched off by a bad offset"
                    );
                }
                drop(set);
            },
        );
    }
}

/// A cached read that straddles the end of file needs no ring trip.
#[test]
fn cached_read_across_eof_stays_inline() {
    let _shared = common::shared();
    let set = common::FileSet::new(0x612, &[10_000]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "cached_read_across_eof_stays_inline",
        Flavor::Multi,
        30,
        move || async move {
            let ctx = common::default_ctx(BackendChoice::IoUring, opened);
            common::verify_whole_file(&ctx, 0, &file, 4096).await;
            let before = ctx.stats();
            for _ in 0..16 {
                let mut buf = vec![0u8; 4096];
                let n = ctx.read(0u32, 8192, &mut buf).await.unwrap();
                assert_eq!(n, 10_000 - 8192);
                assert_eq!(&buf[..n], &file.expected(8192, 4096)[..]);
            }
            let after = ctx.stats();
            assert_eq!(
                after.submitted, before.submitted,
                "a cached read across EOF went to the ring"
            );
            drop(set);
        },
    );
}

/// A read is bound to the file registered under its id when it is first
/// polled, even if that poll returns Pending before the read starts (here:
/// tokio's coop budget is spent), so re-registering the id meanwhile never
/// makes it read another file.
#[test]
fn read_bound_at_first_poll() {
    let _shared = common::shared();
    for choice in BOTH {
        let set = common::FileSet::new(0x613, &[64 * 1024, 64 * 1024]);
        let (old, new) = (set.files[0].clone(), set.files[1].clone());
        let opened = vec![old.open()];
        common::run(
            "read_bound_at_first_poll",
            Flavor::Current,
            30,
            move || async move {
                let ctx = common::default_ctx(choice, opened);
                let mut buf = vec![0u8; 4096];
                let mut fut = Box::pin(ctx.read(0u32, 1000, &mut buf));
                let first = std::future::poll_fn(|cx| {
                    // Spend the task's whole budget, then poll the read once.
                    while let Poll::Ready(spent) = tokio::task::coop::poll_proceed(cx) {
                        spent.made_progress();
                    }
                    Poll::Ready(fut.as_mut().poll(cx).is_pending())
                })
                .await;
                assert!(first, "the first poll should be Pending (budget spent)");
                ctx.unregister_file(0u32).unwrap();
                let fid = ctx.register_file(new.open()).unwrap();
                match fut.await {
                    Ok(n) => assert_eq!(&buf[..n], &old.expected(1000, 4096)[..], "{choice:?}"),
                    Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}"),
                }
                eprintln!("{choice:?}: the new file got {fid}");
                drop(set);
            },
        );
    }
}

#[test]
fn read_future_is_send() {
    let _shared = common::shared();
    fn assert_send<T: Send>() {}
    assert_send::<UringReadFuture<'static>>();
}

fn owned_buffer_types(choice: BackendChoice) {
    let set = common::FileSet::new(0xed4, &[1 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "owned_buffer_types",
        Flavor::Multi,
        30,
        move || async move {
            let ctx = common::default_ctx(choice, opened);
            for (off, len) in [
                (0u64, 4096usize),
                (1, 100),
                (4096, 65536),
                (file.len - 10, 4096),
                (file.len, 10),
            ] {
                let want = file.expected(off, len);
                let (r, b) = ctx.read_owned(0u32, off, Vec::with_capacity(len)).await;
                assert_eq!(r.expect("Vec"), want.len(), "Vec @ {off}+{len}");
                assert_eq!(b, want, "Vec @ {off}+{len}: len() grew by the bytes read");

                // A boxed slice is always full: read into a window of it.
                let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
                let (r, b) = ctx.read_owned(0u32, off, boxed.slice(..)).await;
                let b = b.into_inner();
                assert_eq!(b.len(), len);
                assert_eq!(&b[..r.expect("Box<[u8]>")], &want[..], "Box @ {off}+{len}");

                for align in [512usize, 4096] {
                    let ab = AlignedBuf::with_capacity(len, align);
                    let ptr = ab.as_ptr();
                    let (r, b) = ctx.read_owned(0u32, off, ab).await;
                    assert_eq!(
                        b.as_ptr(),
                        ptr,
                        "AlignedBuf came back as a different buffer"
                    );
                    assert_eq!((b.len(), b.capacity()), (want.len(), len));
                    assert_eq!(b.as_ptr() as usize % align, 0);
                    assert_eq!(r.expect("AlignedBuf"), want.len());
                    assert_eq!(b.as_slice(), &want[..], "AlignedBuf({align}) @ {off}+{len}");
                    // A zeroed, full one, through a window: the old contract.
                    let (r, s) = ctx
                        .read_owned(0u32, off, AlignedBuf::new(len, align).slice(..))
                        .await;
                    let b = s.into_inner();
                    assert_eq!(b.len(), len);
                    assert_eq!(&b[..r.expect("AlignedBuf window")], &want[..]);
                    assert!(b[want.len()..].iter().all(|&x| x == 0), "wrote past n");
                }
            }
            drop(set);
        },
    );
}

fn o_direct_files(choice: BackendChoice) {
    let set = common::FileSet::new(0xed5, &[(1 << 20) + 8192]);
    set.sync_all();
    let file = set.files[0].clone();
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file.path)
        .expect("open O_DIRECT");
    common::run("o_direct_files", Flavor::Multi, 30, move || async move {
        let ctx = common::default_ctx(choice, vec![direct]);
        let cases = [
            (0u64, 4096usize),
            (4096, 65536),
            (1 << 20, 8192),
            (1 << 20, 16384),
            (8192, 12288),
            (0, 1 << 20),
            (file.len, 4096),
        ];
        // Several rounds: whether an internal unaligned buffer happens to be
        // aligned is up to the allocator.
        for (off, len) in cases.iter().copied().cycle().take(cases.len() * 4) {
            let want = file.expected(off, len);
            let (r, b) = ctx
                .read_owned(0u32, off, AlignedBuf::with_capacity(len, 4096))
                .await;
            let n =
                r.unwrap_or_else(|e| panic!("O_DIRECT read_owned(AlignedBuf) @ {off}+{len}: {e}"));
            assert_eq!(&b[..n], &want[..], "O_DIRECT AlignedBuf @ {off}+{len}");
            // Borrowed reads go through page-aligned bounce buffers, so an
            // unaligned user buffer works too.
            let mut v = vec![0u8; len + 1];
            let r = ctx.read(0u32, off, &mut v[1..]).await;
            let n = r.unwrap_or_else(|e| panic!("O_DIRECT borrowed read @ {off}+{len}: {e}"));
            assert_eq!(&v[1..1 + n], &want[..], "O_DIRECT borrowed @ {off}+{len}");
        }
        drop(set);
    });
}

/// Borrowed reads on the blocking pool reuse their bounce buffers (kept
/// per thread, one thread here): a read shorter than the last one through
/// the same buffer writes its own bytes only, never the old ones after
/// them, alone or many at once.
fn reused_bounce_buffers_write_only_the_bytes_read(choice: BackendChoice) {
    const SENTINEL: u8 = 0xEE;
    let set = common::FileSet::new(0xed6, &[(1 << 20) + 100, 300]);
    let files = set.files.clone();
    let opened = set.open_all();
    common::run(
        "reused_bounce_buffers",
        Flavor::Current,
        60,
        move || async move {
            let ctx = common::default_ctx(choice, opened);
            let big = &files[0];
            // (file, offset, length): full reads, then shorter ones of the
            // same size class, short ones at the end of either file, one
            // above what a thread keeps, and nothing at all.
            let reads = [
                (0usize, 0u64, 4096usize),
                (0, big.len - 100, 4096),
                (1, 0, 4096),
                (0, 4096, 3000),
                (1, 200, 4096),
                (0, 8192, 8192),
                (0, big.len - 5000, 8192),
                (0, 12345, 5000),
                (0, 65536, 65536),
                (0, big.len - 70000, 70000),
                (0, 1, 1),
                (1, 300, 4096),
                (0, big.len - 1, 4096),
            ];
            let check = |buf: &[u8], n: usize, fi: usize, off: u64, len: usize| {
                let want = files[fi].expected(off, len);
                assert_eq!(n, want.len(), "file {fi} @ {off}+{len}: count");
                assert_eq!(&buf[..n], &want[..], "file {fi} @ {off}+{len}: bytes");
                assert!(
                    buf[n..].iter().all(|&b| b == SENTINEL),
                    "file {fi} @ {off}+{len}: bytes written past the {n} read"
                );
            };
            for _ in 0..3 {
                for &(fi, off, len) in &reads {
                    let mut buf = vec![SENTINEL; len];
                    let n = ctx.read(fi as u32, off, &mut buf).await.expect("read");
                    check(&buf, n, fi, off, len);
                }
                let mut bufs: Vec<Vec<u8>> = reads
                    .iter()
                    .map(|&(_, _, len)| vec![SENTINEL; len])
                    .collect();
                let got = futures::future::join_all(
                    bufs.iter_mut()
                        .zip(&reads)
                        .map(|(buf, &(fi, off, _))| ctx.read(fi as u32, off, buf)),
                )
                .await;
                for ((n, buf), &(fi, off, len)) in got.into_iter().zip(&bufs).zip(&reads) {
                    check(buf, n.expect("concurrent read"), fi, off, len);
                }
            }
            drop(set);
        },
    );
}

/// A `Drop` impl that reads through the crate (single reads and a batch)
/// while its thread exits, before and after the thread's kept bounce
/// buffers are gone (thread locals are destroyed in the reverse order of
/// their first use): the reads are right either way, with no panic or hang.
fn reads_from_a_thread_local_destructor(choice: BackendChoice) {
    use std::cell::RefCell;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    use uring_positioned_io::UringContext;

    /// Polls `fut` (with a waker that does nothing) until it is ready, for
    /// at most 20 s: `None` if it is not by then.
    fn settle<F: Future>(fut: F) -> Option<F::Output> {
        let mut fut = std::pin::pin!(fut);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Poll::Ready(out) = common::poll_once_noop(fut.as_mut()) {
                return Some(out);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    struct ReadsOnDrop {
        ctx: UringContext,
        done: mpsc::Sender<Result<(), String>>,
        file: common::TestFile,
    }
    impl Drop for ReadsOnDrop {
        fn drop(&mut self) {
            let mut outcome = Ok(());
            for (off, len) in [(0u64, 4096usize), (self.file.len - 10, 4096), (8192, 3000)] {
                let mut buf = vec![0u8; len];
                let n = settle(self.ctx.read(0u32, off, &mut buf))
                    .unwrap_or_else(|| Err(io::Error::other("no answer in 20 s")));
                let want = self.file.expected(off, len);
                match n {
                    Ok(n) if buf[..n] == want[..] => {}
                    Ok(n) => outcome = Err(format!("@ {off}+{len}: {n} bytes, not the file's")),
                    Err(e) => outcome = Err(format!("@ {off}+{len}: {e}")),
                }
            }
            // A batch, which defers its submissions on this thread.
            let reads = (0..8u64).map(|i| (0u32, i * 4096, Vec::with_capacity(4096)));
            match settle(self.ctx.read_batch(reads)) {
                None => outcome = Err("batch: no answer in 20 s".into()),
                Some(got) => {
                    for (i, (res, block)) in got.into_iter().enumerate() {
                        let off = i as u64 * 4096;
                        match res {
                            Ok(4096) if block == self.file.expected(off, 4096) => {}
                            Ok(n) => {
                                outcome = Err(format!("batch @ {off}: {n} bytes, not the file's"));
                            }
                            Err(e) => outcome = Err(format!("batch @ {off}: {e}")),
                        }
                    }
                }
            }
            let _ = self.done.send(outcome);
        }
    }
    thread_local! {
        static ON_EXIT: RefCell<Option<ReadsOnDrop>> = const { RefCell::new(None) };
    }

    let set = common::FileSet::new(0xed7, &[1 << 20]);
    let rt = common::runtime(Flavor::Multi);
    for guard_first in [false, true] {
        let file = set.files[0].clone();
        let opened = set.open_all();
        let ctx = rt.block_on(async { common::default_ctx(choice, opened) });
        let (done, results) = mpsc::channel();
        std::thread::spawn(move || {
            if guard_first {
                ON_EXIT.with(|_| {});
            }
            // A read on this thread first: its bounce buffer (fallback) is
            // kept by this thread.
            let mut buf = vec![0u8; 4096];
            if let Err(e) = settle(ctx.read(0u32, 4096, &mut buf)).expect("first read answered") {
                let _ = done.send(Err(format!("first read: {e}")));
                return;
            }
            ON_EXIT.with(|g| *g.borrow_mut() = Some(ReadsOnDrop { ctx, done, file }));
        });
        let outcome = results
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{choice:?}: no word from the exiting thread: {e}"));
        outcome.unwrap_or_else(|e| panic!("{choice:?}, guard first {guard_first}: {e}"));
    }
    rt.shutdown_timeout(Duration::from_secs(5));
}

backend_tests!(
    owned_buffer_types,
    o_direct_files,
    reused_bounce_buffers_write_only_the_bytes_read,
    reads_from_a_thread_local_destructor
);
