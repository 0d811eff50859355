//! Automatic fallback for real: the test binary re-executes itself, and the
//! child installs a seccomp filter that makes `io_uring_setup(2)` fail with
//! EPERM (as container runtimes do) before creating a runtime and a context.
//! With `BackendChoice::Auto` the context must come up on the fallback
//! backend, say why, and read correctly; forcing `BackendChoice::IoUring`
//! must return an error, not panic.
#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

// This binary uses only part of the shared harness.
#[allow(dead_code)]
mod common;

use common::seccomp::{install_errno_filter, is_child, mentions_eperm, run_child, CHILD_OK};
use common::{Flavor, Rng};
use uring_positioned_io::{BackendChoice, BackendKind, UringContext};

/// io_uring_setup(2) is 425 on both x86_64 and aarch64.
const NR_IO_URING_SETUP: u32 = 425;

/// Make io_uring_setup fail with EPERM for this thread and every thread it
/// creates from now on (as container runtimes do); everything else works.
fn install_io_uring_setup_eperm_filter() {
    install_errno_filter(NR_IO_URING_SETUP, libc::EPERM, false);
    // The filter works: a raw io_uring_setup now fails with EPERM.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(1, &params) with a zeroed, large enough params struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            1 as libc::c_long,
            params.as_mut_ptr(),
        )
    };
    let err = std::io::Error::last_os_error();
    assert_eq!(r, -1, "io_uring_setup still works under the filter");
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EPERM),
        "io_uring_setup under filter: {err}"
    );
}

/// Child body: Auto backend under the filter.
#[test]
fn child_auto_falls_back() {
    let _shared = common::shared();
    if !is_child() {
        return; // only meaningful inside the re-executed child
    }
    install_io_uring_setup_eperm_filter();
    let set = common::FileSet::new(0x5ecc, &[300 * 1024 + 3, 4096, 0]);
    let files = set.files.clone();
    let opened = set.open_all();
    let opened2 = set.open_all();
    common::run(
        "child_auto_falls_back",
        Flavor::Multi,
        30,
        move || async move {
            let ctx =
                UringContext::new(opened).expect("UringContext::new must fall back, not fail");
            let info = ctx.backend().clone();
            println!("backend under seccomp: {info:?}");
            assert_eq!(
                info.kind,
                BackendKind::Fallback,
                "Auto did not fall back: {info:?}"
            );
            let reason = info.reason.clone().expect("fallback without a reason");
            assert!(
                mentions_eperm(&reason),
                "fallback reason does not mention the EPERM error: {reason:?}"
            );

            // Reads work and are correct.
            let mut rng = Rng::new(1);
            let mut tasks = Vec::new();
            for t in 0..64u64 {
                let ctx = ctx.clone();
                let files = files.clone();
                let mut rng = Rng::new(t);
                tasks.push(tokio::spawn(async move {
                    for _ in 0..16 {
                        let fid = rng.below(files.len() as u64) as usize;
                        let off = rng.below(files[fid].len + 100);
                        let len = rng.range(1, 70_000) as usize;
                        let mut buf = vec![0u8; len];
                        let n = ctx
                            .read(fid as u32, off, &mut buf)
                            .await
                            .expect("fallback read");
                        assert_eq!(&buf[..n], &files[fid].expected(off, len)[..]);
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            for (fid, f) in files.iter().enumerate() {
                common::verify_whole_file(&ctx, fid as u32, f, 65536).await;
            }
            let off = rng.below(files[0].len - 1000);
            let mut buf = vec![0u8; 1000];
            ctx.read_exact(0u32, off, &mut buf).await.unwrap();
            assert_eq!(buf, files[0].expected(off, 1000));
            let (r, b) = ctx.read_owned(0u32, 0, Vec::with_capacity(5000)).await;
            assert_eq!(&b[..r.unwrap()], &files[0].expected(0, 5000)[..]);
            assert_eq!(ctx.read(0u32, files[0].len + 1, &mut buf).await.unwrap(), 0);
            // The builder's Auto is the same as new().
            let ctx2 = UringContext::builder()
                .backend(BackendChoice::Auto)
                .build(opened2)
                .expect("Auto build");
            assert_eq!(ctx2.backend().kind, BackendKind::Fallback);
            ctx.shutdown().await;
            drop(set);
        },
    );
    println!("{CHILD_OK}");
}

/// Child body: forcing io_uring under the filter is an error, not a panic;
/// forcing the fallback still works.
#[test]
fn child_forced_io_uring_errs() {
    let _shared = common::shared();
    if !is_child() {
        return;
    }
    install_io_uring_setup_eperm_filter();
    let set = common::FileSet::new(0x5ecd, &[10_000]);
    let file = set.files[0].clone();
    let a = set.open_all();
    let b = set.open_all();
    common::run(
        "child_forced_io_uring_errs",
        Flavor::Current,
        30,
        move || async move {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                UringContext::builder()
                    .backend(BackendChoice::IoUring)
                    .build(a)
            }));
            match r {
                Err(_) => panic!("forcing IoUring under seccomp panicked instead of returning Err"),
                Ok(Ok(ctx)) => panic!(
                    "forcing IoUring under seccomp succeeded: {:?}",
                    ctx.backend()
                ),
                Ok(Err(e)) => {
                    println!("forced IoUring under seccomp -> {:?}: {e}", e.kind());
                    assert!(
                        e.raw_os_error() == Some(libc::EPERM)
                            || e.kind() == std::io::ErrorKind::PermissionDenied
                            || mentions_eperm(&e.to_string()),
                        "error does not carry the EPERM cause: {e:?}"
                    );
                }
            }
            let ctx = common::default_ctx(BackendChoice::Fallback, b);
            common::verify_whole_file(&ctx, 0, &file, 4096).await;
            drop(set);
        },
    );
    println!("{CHILD_OK}");
}

#[test]
fn auto_falls_back_when_io_uring_setup_is_blocked() {
    let _shared = common::shared();
    if is_child() {
        return;
    }
    run_child("child_auto_falls_back", 90);
}

#[test]
fn forced_io_uring_errors_when_io_uring_setup_is_blocked() {
    let _shared = common::shared();
    if is_child() {
        return;
    }
    run_child("child_forced_io_uring_errs", 90);
}

/// Without the filter, Auto picks io_uring on this kernel.
#[test]
fn auto_picks_io_uring_when_available() {
    let _shared = common::shared();
    if is_child() {
        return;
    }
    let set = common::FileSet::new(0x5ece, &[4096]);
    let opened = set.open_all();
    common::run(
        "auto_picks_io_uring",
        Flavor::Current,
        20,
        move || async move {
            let ctx = UringContext::new(opened).expect("new");
            assert_eq!(
                ctx.backend().kind,
                BackendKind::IoUring,
                "{:?}",
                ctx.backend()
            );
            drop(set);
        },
    );
}
