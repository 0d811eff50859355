//! The background driver: it batches queued reads into few `io_uring_enter`
//! calls, and it sleeps (no spinning) when there is nothing to do.

mod common;

use std::time::Duration;

use common::{Flavor, Rng};
use uring_positioned_io::{BackendChoice, BackendKind};

/// CPU time (user + system) of the whole process so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &raw mut ru), 0);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

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
            let before = process_cpu();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let used = process_cpu().checked_sub(before).unwrap();
            eprintln!("{flavor:?}: {used:?} of CPU in 1 s idle; {:?}", ctx.stats());
            assert!(
                used < Duration::from_millis(200),
                "{flavor:?}: an idle context used {used:?} of CPU in 1 s"
            );
            assert_eq!(ctx.stats().enters, 1, "no enters while idle");
        });
    }
}
