//! Edge cases, for both backends:
//! - read futures dropped before ever being polled, or polled exactly once
//!   (real waker, no-op waker, `now_or_never`) and then dropped;
//! - a tiny bounce-buffer pool (`buffer_pool(2, 4096)`) with reads far bigger
//!   than one pool buffer, many at once;
//! - far more tasks than `max_in_flight` / ring entries: only waiting, no errors;
//! - owned buffer types (`Vec<u8>`, `AlignedBuf`, and windows of `Box<[u8]>`
//!   and of a full `AlignedBuf`), `O_DIRECT` files;
//! - less common ring options (SQPOLL, COOP_TASKRUN, several rings) still read
//!   correctly; invalid option values are an `Err` from `build`, never a panic
//!   or a context whose reads hang.

mod common;

use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use common::{Flavor, Rng, TestFile};
use futures::FutureExt;
use std::os::unix::fs::OpenOptionsExt;
use uring_positioned_io::{
    AlignedBuf, BackendChoice, BackendKind, IoBufMut, UringContext, UringReadFuture,
};

#[test]
fn read_future_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<UringReadFuture<'static>>();
}

fn unpolled_futures_dropped(choice: BackendChoice) {
    let set = common::FileSet::new(0xed1, &[1 << 20]);
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "unpolled_futures_dropped",
        Flavor::Multi,
        30,
        move || async move {
            let ctx = common::default_ctx(choice, opened);
            let before = ctx.stats();
            for i in 0..2000u64 {
                let mut buf = vec![0x11u8; 4096];
                let fut = ctx.read(0u32, (i * 4096) % file.len, &mut buf);
                drop(fut);
                assert!(
                    buf.iter().all(|&b| b == 0x11),
                    "never-polled read wrote into the buffer"
                );
                let fut = ctx.read_owned(0u32, 0, Vec::with_capacity(4096));
                drop(fut);
            }
            let after = ctx.stats();
            assert_eq!(
                after.in_flight, 0,
                "never-polled futures left reads in flight: {after:?}"
            );
            assert_eq!(
                after.submitted, before.submitted,
                "never-polled futures submitted reads: {before:?} -> {after:?}"
            );
            common::verify_whole_file(&ctx, 0, &file, 65536).await;
            drop(set);
        },
    );
}

fn polled_once_then_dropped(choice: BackendChoice) {
    let set = common::FileSet::new(0xed2, &[4 << 20]);
    set.sync_all();
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "polled_once_then_dropped",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b.ring_entries(8));
            let mut rng = Rng::new(5);
            let mut pending = 0;
            for i in 0..1500u64 {
                if i % 100 == 0 {
                    file.drop_cache();
                }
                let off = rng.below(file.len);
                let len = rng.range(1, 128 * 1024) as usize;
                let mut buf = vec![0u8; len];
                let polled = match i % 4 {
                    0 => {
                        let fut = pin!(ctx.read(0u32, off, &mut buf));
                        common::poll_once(fut).await
                    }
                    1 => match ctx.read(0u32, off, &mut buf).now_or_never() {
                        Some(r) => Poll::Ready(r),
                        None => Poll::Pending,
                    },
                    2 => {
                        let fut = pin!(ctx.read(0u32, off, &mut buf));
                        common::poll_once_noop(fut)
                    }
                    _ => {
                        let fut = pin!(ctx.read_owned(0u32, off, Vec::with_capacity(len)));
                        match common::poll_once_noop(fut) {
                            Poll::Ready((r, b)) => {
                                buf = b;
                                Poll::Ready(r)
                            }
                            Poll::Pending => Poll::Pending,
                        }
                    }
                };
                match polled {
                    Poll::Ready(r) => {
                        let n = r.expect("read");
                        assert_eq!(
                            &buf[..n],
                            &file.expected(off, len)[..],
                            "read @ {off}+{len}"
                        );
                    }
                    Poll::Pending => pending += 1,
                }
            }
            eprintln!("{choice:?}: {pending} of 1500 futures dropped while pending");
            let left = common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await;
            assert_eq!(
                left,
                0,
                "in_flight stuck after dropped futures: {:?}",
                ctx.stats()
            );
            common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
            drop(set);
        },
    );
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

/// Ring options that change the submission path must not change results.
#[test]
fn ring_options_smoke() {
    type Tweak = fn(uring_positioned_io::Builder) -> uring_positioned_io::Builder;
    let configs: [(&str, Flavor, Tweak); 7] = [
        ("sqpoll", Flavor::Multi, |b| {
            b.sqpoll(Some(Duration::from_millis(50)))
        }),
        ("sqpoll_ct", Flavor::Current, |b| {
            b.sqpoll(Some(Duration::from_millis(50)))
        }),
        // COOP_TASKRUN is documented as current_thread only.
        ("coop_taskrun", Flavor::Current, |b| b.coop_taskrun(true)),
        ("inline_nowait", Flavor::Multi, |b| b.inline_nowait(true)),
        ("no_inline", Flavor::Multi, |b| b.inline_nowait(false)),
        ("no_inline_ct", Flavor::Current, |b| {
            b.inline_nowait(false).ring_entries(4)
        }),
        ("rings4", Flavor::Multi, |b| b.rings(4).ring_entries(16)),
    ];
    for (name, flavor, tweak) in configs {
        let set = common::FileSet::new(0xed6, &[2 << 20]);
        // Cold data, so reads really go through the ring.
        set.sync_all();
        set.drop_caches();
        let file = set.files[0].clone();
        let opened = set.open_all();
        common::run(name, flavor, 30, move || async move {
            let ctx = match tweak(UringContext::builder().backend(BackendChoice::IoUring))
                .build(opened)
            {
                Ok(ctx) => ctx,
                Err(e) => panic!("{name}: build failed: {e}"),
            };
            assert_eq!(ctx.backend().kind, BackendKind::IoUring);
            let futs = (0..64u64).map(|i| {
                let ctx = ctx.clone();
                let file = file.clone();
                tokio::spawn(async move {
                    let off = (i * 33_331) % file.len;
                    let mut buf = vec![0u8; 20_000];
                    let n = ctx.read(0u32, off, &mut buf).await.expect("read");
                    assert_eq!(&buf[..n], &file.expected(off, 20_000)[..], "{name} @ {off}");
                })
            });
            for r in futures::future::join_all(futs).await {
                r.expect("reader panicked");
            }
            common::verify_whole_file(&ctx, 0, &file, 300_000).await;
            assert_eq!(
                common::wait_in_flight_zero(&ctx, Duration::from_secs(5)).await,
                0
            );
            eprintln!("{name}: {:?}", ctx.stats());
            ctx.shutdown().await;
            drop(set);
        });
    }
}

/// Invalid or degenerate options give an error at `build` or a context that
/// works; never a panic, never a context that hangs every read.
#[test]
fn invalid_options_are_errors() {
    type Tweak = fn(uring_positioned_io::Builder) -> uring_positioned_io::Builder;
    let configs: [(&str, Flavor, Tweak); 10] = [
        ("coop_taskrun_multi_thread", Flavor::Multi, |b| {
            b.coop_taskrun(true)
        }),
        ("coop_taskrun_sqpoll", Flavor::Current, |b| {
            b.coop_taskrun(true).sqpoll(Some(Duration::from_millis(10)))
        }),
        ("ring_entries_0", Flavor::Multi, |b| b.ring_entries(0)),
        ("ring_entries_huge", Flavor::Multi, |b| {
            b.ring_entries(1 << 20)
        }),
        ("rings_0", Flavor::Multi, |b| b.rings(0)),
        ("max_in_flight_0", Flavor::Multi, |b| b.max_in_flight(0)),
        ("buffer_pool_0", Flavor::Multi, |b| b.buffer_pool(0, 0)),
        ("buffer_pool_0_count", Flavor::Current, |b| {
            b.buffer_pool(0, 4096)
        }),
        ("shallow_batch_0", Flavor::Multi, |b| b.shallow_batch(0)),
        ("shallow_batch_huge", Flavor::Current, |b| {
            b.shallow_batch(u32::MAX)
        }),
    ];
    let set = common::FileSet::new(0xed7, &[100_000]);
    let file = set.files[0].clone();
    for (name, flavor, tweak) in configs {
        for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
            let opened = set.open_all();
            let file = file.clone();
            common::run(name, flavor, 30, move || async move {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tweak(UringContext::builder().backend(choice)).build(opened)
                }));
                let ctx = match r {
                    Err(_) => panic!("{name}/{choice:?}: build panicked instead of returning Err"),
                    Ok(Err(e)) => {
                        eprintln!("{name}/{choice:?}: rejected: {e}");
                        return;
                    }
                    Ok(Ok(ctx)) => ctx,
                };
                let mut buf = vec![0u8; 70_000];
                let r =
                    tokio::time::timeout(Duration::from_secs(5), ctx.read(0u32, 1000, &mut buf))
                        .await
                        .unwrap_or_else(|_| {
                            panic!("{name}/{choice:?}: accepted, but a read hangs")
                        });
                let n = r.unwrap_or_else(|e| {
                    panic!("{name}/{choice:?}: accepted, but a read fails: {e}")
                });
                assert_eq!(
                    &buf[..n],
                    &file.expected(1000, 70_000)[..],
                    "{name}/{choice:?}"
                );
                eprintln!("{name}/{choice:?}: accepted and works");
            });
        }
    }
}

/// `shallow_batch` outside 1..=32768 is refused at `build`, by name, on
/// either backend.
#[test]
fn shallow_batch_out_of_range_is_refused() {
    let set = common::FileSet::new(0x5ba7, &[4096]);
    for n in [0, 32_769, u32::MAX] {
        for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
            let opened = set.open_all();
            let e = common::run(
                "shallow_batch_out_of_range",
                Flavor::Current,
                30,
                move || async move {
                    UringContext::builder()
                        .backend(choice)
                        .shallow_batch(n)
                        .build(opened)
                        .map(|_| ())
                },
            )
            .expect_err("accepted an out-of-range shallow_batch");
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::InvalidInput,
                "{n}/{choice:?}: {e}"
            );
            assert!(
                e.to_string().contains("shallow_batch"),
                "{n}/{choice:?}: {e}"
            );
        }
    }
}

backend_tests!(
    unpolled_futures_dropped,
    polled_once_then_dropped,
    tiny_buffer_pool,
    more_tasks_than_max_in_flight,
    tiny_ring,
    owned_buffer_types,
    o_direct_files,
);
