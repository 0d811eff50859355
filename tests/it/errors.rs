//! Error kinds and messages, for both backends: files that are not regular
//! files or block devices are refused by name; errors name the op and the
//! right cause, and keep the kernel's errno (`uring_positioned_io::os_error`).

use crate::common;

use uring_positioned_io::IoBufMut;

use common::Flavor;
use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use uring_positioned_io::{BackendChoice, UringContext};

use common::BOTH;

fn pipe_files() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fresh descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are fresh and owned by nothing else.
    unsafe {
        (
            File::from(OwnedFd::from_raw_fd(fds[0])),
            File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    }
}

fn not_seekable(dir: &std::path::Path) -> Vec<(&'static str, File)> {
    let (r, _w) = pipe_files();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let (sock, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    vec![
        ("pipe", r),
        ("pipe", fifo),
        ("socket", File::from(OwnedFd::from(sock))),
        ("directory", File::open(dir).unwrap()),
        ("character device", File::open("/dev/zero").unwrap()),
    ]
}

/// Only regular files and block devices.
#[test]
fn non_seekable_files_are_rejected() {
    let _shared = common::shared();
    for choice in BOTH {
        let set = common::FileSet::new(0x605, &[10_000]);
        let file = set.files[0].clone();
        let dir = set.dir.path().join(format!("{choice:?}"));
        std::fs::create_dir(&dir).unwrap();
        let regular = set.open_all();
        common::run(
            "non_seekable_files_are_rejected",
            Flavor::Multi,
            30,
            move || async move {
                for (what, f) in not_seekable(&dir) {
                    let mut files = vec![file.open()];
                    files.push(f);
                    let e = UringContext::builder()
                        .backend(choice)
                        .build(files)
                        .expect_err(what);
                    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                    assert!(
                        e.to_string().contains("file #1") && e.to_string().contains(what),
                        "{e}"
                    );
                }
                let ctx = common::default_ctx(choice, regular);
                let again = dir.join("again");
                std::fs::create_dir(&again).unwrap();
                for (what, f) in not_seekable(&again) {
                    let e = ctx.register_file(f).expect_err(what);
                    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                    assert!(e.to_string().contains(what), "{e}");
                }
                // Nothing was half-registered: the next file gets index 1.
                assert_eq!(ctx.register_file(file.open()).unwrap().index(), 1);
                common::verify_whole_file(&ctx, 1, &file, 4096).await;
                drop(set);
            },
        );
    }
}

/// Errors that named the wrong cause.
#[test]
fn errors_name_the_right_cause() {
    let _shared = common::shared();
    use std::os::unix::fs::OpenOptionsExt;
    // The documented maximum of reads in flight builds (it was an error
    // about a buffer pool the caller never set).
    for (choice, rings, n) in [
        (BackendChoice::IoUring, 1, 65_536),
        (BackendChoice::Fallback, 1, 65_536),
    ] {
        common::run("max_in_flight", Flavor::Multi, 60, move || async move {
            let mut b = UringContext::builder().backend(choice).max_in_flight(n);
            if choice == BackendChoice::IoUring {
                b = b.rings(rings);
            }
            let ctx = b
                .build(Vec::new())
                .unwrap_or_else(|e| panic!("{choice:?} {n}: {e}"));
            ctx.shutdown().await;
        });
    }
    let set = common::FileSet::new(0x6a4, &[4096]);
    let path = set.files[0].path.clone();
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let path = path.clone();
        common::run("causes", Flavor::Multi, 60, move || async move {
            // An O_PATH descriptor: refused by name on both backends (io_uring
            // said a bare EBADF; the fallback took it, and reads failed).
            let opath = || {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH)
                    .open(&path)
                    .unwrap()
            };
            let ctx = common::build_ctx(choice, Vec::new(), |b| b);
            let e = ctx.register_file(opath()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
            assert!(e.to_string().contains("O_PATH"), "{choice:?}: {e}");
            let e = UringContext::builder()
                .backend(choice)
                .build(vec![opath()])
                .unwrap_err();
            assert!(e.to_string().contains("O_PATH"), "{choice:?}: {e}");
            // `open` of something that is not a file names the path, not
            // register_file.
            let opts = uring_positioned_io::OpenOptions::new().read(true).clone();
            let e = ctx.open("/dev/zero", &opts).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
            assert!(
                e.to_string().contains("/dev/zero") && !e.to_string().contains("register_file"),
                "{choice:?}: {e}"
            );
            ctx.shutdown().await;
        });
    }
    // A runtime without IO: said as such, not as a rejected ring setting.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        for choice in [BackendChoice::Auto, BackendChoice::IoUring] {
            let e = UringContext::builder()
                .backend(choice)
                .build(Vec::new())
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{choice:?}: {e}");
            assert!(
                e.to_string().contains("IO disabled") && !e.to_string().contains("kernel"),
                "{choice:?}: {e}"
            );
        }
    });
    drop(set);
}

/// Errors on `O_DIRECT` files keep the kernel's errno
/// (`uring_positioned_io::os_error`), blame alignment only for data
/// transfers, and an unaligned read says what must be aligned and to what.
#[test]
fn o_direct_errors_keep_the_errno_and_say_what_is_misaligned() {
    let _shared = common::shared();
    use uring_positioned_io::{os_error, AlignedBuf, FallocateMode};
    for choice in BOTH {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let Some(direct) = common::open_direct(&path) else {
            return;
        };
        common::run("r2_04", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![direct], |b| b);
            let st = ctx.statx(0u32).await.unwrap();
            let align = st.dio_offset_align.filter(|&a| a > 1).unwrap_or(512);
            // Not data transfers: the errno as on a buffered file.
            // (`SyncRange` has no invalid bits to pass to sync_file_range.)
            let e = ctx
                .fallocate(0u32, FallocateMode::ALLOCATE, 0, 0)
                .await
                .unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{choice:?}: {e}");
            assert!(!e.to_string().contains("align"), "{choice:?}: {e}");
            // Unaligned reads: borrowed (offset, length) and owned (buffer).
            let mut buf = vec![0u8; 4096];
            let off = ctx.read(0u32, 1, &mut buf).await.unwrap_err();
            let len = ctx.read(0u32, 0, &mut buf[..100]).await.unwrap_err();
            let aligned = AlignedBuf::new(8192, 4096);
            let (r, _) = ctx.read_owned(0u32, 0, aligned.slice(1..4097)).await;
            let addr = r.unwrap_err();
            for (e, what) in [(&off, "offset"), (&len, "length"), (&addr, "address")] {
                eprintln!("{choice:?}: {e}");
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
                assert_eq!(os_error(e), Some(libc::EINVAL), "{choice:?}: {e}");
                let msg = e.to_string();
                assert!(
                    msg.contains("O_DIRECT") && msg.contains(what),
                    "{choice:?}: {e}"
                );
                if st.dio_offset_align.is_some() && what != "address" {
                    assert!(msg.contains(&format!("multiple of {align}")), "{e}");
                }
            }
            // An unaligned write likewise keeps its errno.
            let e = ctx.write_all(0u32, 1, &[1u8; 4096]).await.unwrap_err();
            assert_eq!(os_error(&e), Some(libc::EINVAL), "{choice:?}: {e}");
            assert!(e.to_string().contains("offset"), "{choice:?}: {e}");
            drop(dir);
        });
    }
}

/// The messages name the op and the cause: a read of a write-only
/// descriptor and a write of a read-only one are `PermissionDenied` with
/// `EBADF` kept; `open` of a FIFO or a socket for writing is
/// `InvalidInput` naming what the file is; open flags that would change or
/// misuse a file behind the options' back are refused, and the file is
/// unchanged.
#[test]
fn messages_name_the_op_and_the_cause() {
    let _shared = common::shared();
    use uring_positioned_io::{os_error, OpenOptions};
    for choice in BOTH {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        let path = base.join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let wo = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let ro = File::open(&path).unwrap();
        common::run("r2_07", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![wo, ro], |b| b);
            let mut buf = [0u8; 4];
            let e = ctx.read(0u32, 0, &mut buf).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{choice:?}: {e}");
            assert!(e.to_string().contains("not open for reading"), "{e}");
            assert_eq!(os_error(&e), Some(libc::EBADF), "{e}");
            let (r, _) = ctx.read_owned(0u32, 0, Vec::with_capacity(4)).await;
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
            let e = ctx.write(1u32, 0, b"x").await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{choice:?}: {e}");
            assert!(e.to_string().contains("not open for writing"), "{e}");
            assert_eq!(os_error(&e), Some(libc::EBADF), "{e}");
            // FIFOs and sockets, opened for writing.
            let fifo = base.join("fifo");
            let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let sock = base.join("sock");
            let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
            for (p, what) in [(&fifo, "FIFO"), (&sock, "socket")] {
                for opts in [
                    OpenOptions::new().write(true).clone(),
                    OpenOptions::new().read(true).write(true).clone(),
                    OpenOptions::new().read(true).clone(),
                ] {
                    let e = ctx.open(p, &opts).await.unwrap_err();
                    assert_eq!(
                        e.kind(),
                        io::ErrorKind::InvalidInput,
                        "{what} {opts:?}: {e}"
                    );
                    assert!(e.to_string().contains(what), "{what} {opts:?}: {e}");
                }
            }
            // Flags that bypass the options' checks.
            for (flags, name) in [
                (libc::O_TRUNC, "O_TRUNC"),
                (libc::O_CREAT, "O_CREAT"),
                (libc::O_NONBLOCK, "O_NONBLOCK"),
            ] {
                let opts = OpenOptions::new().read(true).custom_flags(flags).clone();
                let e = ctx.open(&path, &opts).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name}: {e}");
                assert!(e.to_string().contains(name), "{name}: {e}");
            }
            assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
            drop(dir);
        });
    }
}
