//! Writes and durability, on both backends, with `std` as the
//! oracle: positioned writes (borrowed, owned, `write_all`) against a model
//! of the file checked with `std::fs::read`; `fsync`, `fdatasync`,
//! `sync_file_range`, `fallocate`, `statx` against `std::fs::metadata`;
//! `open`; hostile inputs (read-only files, pipes, offsets beyond
//! `i64::MAX`, empty and huge buffers, misaligned `O_DIRECT`); dropped
//! writes; shutdown; and a crash test (a child process killed with SIGKILL
//! after acknowledged `fdatasync`s, its acknowledged writes checked).

use crate::common;

use common::BOTH;
use std::sync::Arc;

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Flavor;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use uring_positioned_io::{
    AlignedBuf, BackendChoice, FallocateMode, IoBufMut, OpenOptions, SyncRange, UringContext,
    BORROWED_CHUNK,
};

use common::open_rw as rw;

/// A context over one read-write file at `dir/name`, on a runtime of
/// `flavor`; runs `f(ctx, path)`.
fn with_file<F, Fut>(name: &str, choice: BackendChoice, flavor: Flavor, f: F)
where
    F: FnOnce(UringContext, PathBuf) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let file = rw(&path);
    common::run(name, flavor, 120, move || async move {
        let ctx = common::build_ctx(choice, vec![file], |b| b);
        f(ctx, path).await;
        drop(dir);
    });
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    common::fill_pattern(seed, 0, &mut v);
    v
}

/// Applies a write of `data` at `offset` to the model of the file.
fn model_write(model: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if model.len() < offset + data.len() {
        model.resize(offset + data.len(), 0);
    }
    model[offset..offset + data.len()].copy_from_slice(data);
}

/// Random writes of every kind against a model, compared with what `std`
/// reads back from the file (and with reads through the context).
fn proptest_writes_against_std(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        with_file("proptest_writes", choice, flavor, |ctx, path| async move {
            let mut runner = TestRunner::new(Config {
                failure_persistence: None,
                ..Config::default()
            });
            let strategy = (
                0u8..5,
                prop_oneof![0usize..20_000, 0usize..(3 << 20)],
                prop_oneof![4 => 0usize..9000, 1 => BORROWED_CHUNK - 5..BORROWED_CHUNK * 2 + 7],
                any::<u64>(),
            );
            let cases: Vec<_> = (0..96)
                .map(|_| strategy.new_tree(&mut runner).unwrap().current())
                .collect();
            let mut model = Vec::new();
            for (kind, offset, len, seed) in cases {
                let data = bytes(seed, len);
                let off = offset as u64;
                let what = format!("kind {kind}, {len} bytes at {offset}");
                match kind {
                    0 => assert_eq!(ctx.write(0u32, off, &data).await.unwrap(), len, "{what}"),
                    1 => ctx.write_all(0u32, off, &data).await.unwrap(),
                    2 => {
                        let (n, back) = ctx.write_owned(0u32, off, data.clone()).await;
                        assert_eq!((n.unwrap(), &back), (len, &data), "{what}");
                    }
                    3 => {
                        // A window of a larger buffer: only the window is written.
                        let mut big = bytes(seed ^ 1, 7);
                        big.extend_from_slice(&data);
                        big.extend_from_slice(b"tail");
                        let (r, s) = ctx.write_all_owned(0u32, off, big.slice(7..7 + len)).await;
                        r.unwrap();
                        assert_eq!(s.into_inner().len(), len + 11);
                    }
                    _ => {
                        let (r, _) = ctx.write_all_owned_static(0u32, off, data.clone()).await;
                        r.unwrap();
                    }
                }
                model_write(&mut model, offset, &data);
                if len > 0 {
                    let mut back = vec![0u8; len];
                    assert_eq!(ctx.read(0u32, off, &mut back).await.unwrap(), len);
                    assert_eq!(back, data, "read back through the context: {what}");
                }
            }
            let on_disk = std::fs::read(&path).unwrap();
            assert_eq!(on_disk.len(), model.len(), "file size");
            assert!(on_disk == model, "file content differs from the model");
            assert_eq!(ctx.file_size(0u32).await.unwrap(), model.len() as u64);
        });
    }
}

/// `fsync`, `fdatasync`, `sync_file_range`, `fallocate` and `statx`
/// against `std`.
fn syncs_fallocate_statx(choice: BackendChoice) {
    with_file("syncs", choice, Flavor::Multi, |ctx, path| async move {
        ctx.write_all(0u32, 0, &bytes(1, 10_000)).await.unwrap();
        ctx.fsync(0u32).await.unwrap();
        ctx.fdatasync(0u32).await.unwrap();
        ctx.sync_file_range(
            0u32,
            0,
            0,
            SyncRange::WAIT_BEFORE | SyncRange::WRITE | SyncRange::WAIT_AFTER,
        )
        .await
        .unwrap();
        let st = ctx.statx(0u32).await.unwrap();
        let md = std::fs::metadata(&path).unwrap();
        assert_eq!(st.size, md.len());
        assert_eq!(st.size, 10_000);
        assert_eq!(st.blocks, md.blocks());
        assert_eq!(u64::from(st.block_size), md.blksize());

        // Mode 0 allocates and extends.
        ctx.fallocate(0u32, FallocateMode::ALLOCATE, 0, 1 << 20)
            .await
            .unwrap();
        let md = std::fs::metadata(&path).unwrap();
        assert_eq!(md.len(), 1 << 20);
        assert_eq!(ctx.file_size(0u32).await.unwrap(), 1 << 20);
        // KEEP_SIZE allocates beyond without growing the size.
        match ctx
            .fallocate(0u32, FallocateMode::KEEP_SIZE, 1 << 20, 1 << 20)
            .await
        {
            Ok(()) => assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        }
        // A punched hole reads back as zeroes, as std sees it.
        match ctx
            .fallocate(
                0u32,
                FallocateMode::PUNCH_HOLE | FallocateMode::KEEP_SIZE,
                4096,
                4096,
            )
            .await
        {
            Ok(()) => {
                let mut buf = vec![1u8; 4096];
                File::open(&path)
                    .unwrap()
                    .read_exact_at(&mut buf, 4096)
                    .unwrap();
                assert!(buf.iter().all(|&b| b == 0), "the hole reads as zeroes");
                let mut buf2 = vec![1u8; 4096];
                ctx.read(0u32, 4096, &mut buf2).await.unwrap();
                assert_eq!(buf, buf2);
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        }
        // Bad modes and ranges are the kernel's (or our) clear errors.
        // PUNCH_HOLE without KEEP_SIZE is a mode the kernel refuses.
        let e = ctx
            .fallocate(0u32, FallocateMode::PUNCH_HOLE, 0, 4096)
            .await
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
        let e = ctx
            .fallocate(0u32, FallocateMode::ALLOCATE, u64::MAX, 1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = ctx
            .fallocate(0u32, FallocateMode::ALLOCATE, 0, 0)
            .await
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        let e = ctx
            .sync_file_range(0u32, u64::MAX, 1, SyncRange::empty())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // Unknown files.
        for e in [
            ctx.fsync(9u32).await.unwrap_err(),
            ctx.statx(9u32).await.unwrap_err(),
            ctx.write(9u32, 0, b"x").await.unwrap_err(),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
    });
}

/// `open` through the context: create, write, read back; clear errors for
/// missing files, bad options, FIFOs and directories — never a hang.
fn open_files(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().to_path_buf();
    common::run("open", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![], |b| b);
        let opts = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .clone();
        let fid = ctx.open(base.join("a"), &opts).await.unwrap();
        assert!(fid.is_tagged());
        ctx.write_all(fid, 3, b"abc").await.unwrap();
        assert_eq!(std::fs::read(base.join("a")).unwrap(), b"\0\0\0abc");
        // Opened again, read-only: writes refused by name.
        let ro = ctx
            .open(base.join("a"), OpenOptions::new().read(true))
            .await
            .unwrap();
        let mut buf = [0u8; 6];
        assert_eq!(ctx.read(ro, 0, &mut buf).await.unwrap(), 6);
        let e = ctx.write(ro, 0, b"x").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        // create_new on an existing file; missing file; bad options.
        let e = ctx
            .open(
                base.join("a"),
                OpenOptions::new().write(true).create_new(true),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        let e = ctx
            .open(base.join("missing"), OpenOptions::new().read(true))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        for bad in [
            OpenOptions::new().clone(),
            OpenOptions::new().read(true).create(true).clone(),
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_APPEND)
                .clone(),
        ] {
            let e = ctx.open(base.join("a"), &bad).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
        let e = ctx
            .open(Path::new("nul\0byte"), OpenOptions::new().read(true))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // A FIFO with no writer: refused, not a hang; a directory: refused.
        let fifo = base.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = ctx
            .open(&fifo, OpenOptions::new().read(true))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(ctx
            .open(&base, OpenOptions::new().read(true))
            .await
            .is_err());
        // O_DIRECT through the options.
        let direct = ctx
            .open(
                base.join("d"),
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .direct(true),
            )
            .await;
        if let Ok(fid) = direct {
            let e = ctx.write_all(fid, 1, &[7u8; 4096]).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("O_DIRECT"), "{e}");
        }
        drop(dir);
    });
}

/// Hostile inputs: each a clear error (or the right no-op), never a panic
/// or a hang, and the file unchanged.
fn hostile_writes(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, b"0123456789").unwrap();
    let ro = File::open(&path).unwrap();
    let file = rw(&path);
    common::run("hostile", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![file, ro], |b| b);
        // Read-only descriptor.
        let e = ctx.write(1u32, 0, b"xx").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let (r, buf) = ctx.write_owned(1u32, 0, b"xx".to_vec()).await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(buf, b"xx");
        let e = ctx
            .fallocate(1u32, FallocateMode::ALLOCATE, 0, 100)
            .await
            .unwrap_err();
        assert!(e.raw_os_error().is_some() || e.kind() == io::ErrorKind::PermissionDenied);
        // Offsets beyond i64::MAX, and writes that would end beyond it.
        for (off, len) in [
            (u64::MAX, 1),
            (i64::MAX as u64, 1),
            (i64::MAX as u64 - 1, 2),
        ] {
            let e = ctx.write(0u32, off, &vec![1u8; len]).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            let (r, _) = ctx.write_all_owned(0u32, off, vec![1u8; len]).await;
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        }
        // Zero-length writes: Ok(0), nothing changes.
        assert_eq!(ctx.write(0u32, 5, b"").await.unwrap(), 0);
        ctx.write_all(0u32, 1 << 40, b"").await.unwrap();
        let (r, _) = ctx.write_owned(0u32, 3, Vec::new()).await;
        assert_eq!(r.unwrap(), 0);
        assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
        // Pipes are refused at registration, as for reads.
        let (r, w) = pipe();
        assert!(ctx.register_file(r).is_err());
        assert!(ctx.register_file(w).is_err());
        // A huge borrowed write goes in chunks (bounded bounce buffers) and
        // lands whole.
        let big = bytes(9, 5 * BORROWED_CHUNK + 3);
        assert_eq!(ctx.write(0u32, 1, &big).await.unwrap(), big.len());
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk[0], b'0');
        assert!(on_disk[1..] == big[..]);
        drop(dir);
    });
}

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are new and owned here.
    unsafe {
        (
            std::os::fd::FromRawFd::from_raw_fd(fds[0]),
            std::os::fd::FromRawFd::from_raw_fd(fds[1]),
        )
    }
}

/// `O_DIRECT`: aligned writes (owned and borrowed) read back; misaligned
/// offsets, lengths and buffers give an error naming the rule.
fn o_direct_writes(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let Some(direct) = common::open_direct(&path) else {
        return;
    };
    common::run("o_direct_writes", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![direct], |b| b);
        let st = ctx.statx(0u32).await.unwrap();
        eprintln!("statx: {st:?}");
        let mut block = AlignedBuf::new(8192, 4096);
        common::fill_pattern(3, 0, &mut block);
        let (r, block) = ctx.write_all_owned(0u32, 4096, block).await;
        r.unwrap();
        let data = bytes(4, 4096);
        ctx.write_all(0u32, 0, &data).await.unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[..4096], &data[..]);
        assert_eq!(&on_disk[4096..], &block[..]);
        // Misaligned offset, length, and buffer address.
        let misaligned = [
            ctx.write_all(0u32, 1, &data).await.unwrap_err(),
            ctx.write_all(0u32, 0, &data[..100]).await.unwrap_err(),
            ctx.write_all_owned(0u32, 0, block.slice(1..4097))
                .await
                .0
                .unwrap_err(),
        ];
        for e in misaligned {
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("O_DIRECT"), "{e}");
        }
        drop(dir);
    });
}

/// Writes dropped after their first poll (in the kernel, or queued for a
/// permit): the context stays usable, every slot comes back, and each
/// byte of a dropped write's range is either old or new — never anything
/// else.
fn dropped_writes(choice: BackendChoice) {
    with_file(
        "dropped_writes",
        choice,
        Flavor::Multi,
        |ctx, path| async move {
            let old = bytes(5, 1 << 20);
            ctx.write_all(0u32, 0, &old).await.unwrap();
            let new = bytes(6, 1 << 20);
            for round in 0..20 {
                let mut futs = Vec::new();
                for i in 0..64usize {
                    let off = ((i * 16_384 + round * 512) % ((1 << 20) - 16_384)) as u64;
                    let len = 16_384;
                    let o = off as usize;
                    if i % 2 == 0 {
                        let mut f = Box::pin(ctx.write(0u32, off, &new[o..o + len]));
                        let _ = common::poll_once(f.as_mut()).await;
                        futs.push(Box::pin(async move { drop(f) })
                            as std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>);
                    } else {
                        let mut f = Box::pin(ctx.write_owned(0u32, off, new[o..o + len].to_vec()));
                        let _ = common::poll_once(f.as_mut()).await;
                        futs.push(Box::pin(async move { drop(f) }));
                    }
                }
                for f in futs {
                    f.await;
                }
            }
            common::wait_in_flight_zero(&ctx, Duration::from_secs(30)).await;
            assert_eq!(ctx.stats().in_flight, 0);
            let on_disk = std::fs::read(&path).unwrap();
            assert_eq!(on_disk.len(), old.len());
            for (i, &b) in on_disk.iter().enumerate() {
                assert!(
                    b == old[i] || b == new[i],
                    "byte {i} is neither old nor new"
                );
            }
            // Still usable.
            ctx.write_all(0u32, 0, b"after").await.unwrap();
            ctx.fdatasync(0u32).await.unwrap();
        },
    );
}

/// After `shutdown`, writes and syncs fail with a clear error.
fn shutdown_fails_writes(choice: BackendChoice) {
    with_file(
        "shutdown_writes",
        choice,
        Flavor::Multi,
        |ctx, _| async move {
            ctx.write_all(0u32, 0, b"x").await.unwrap();
            ctx.shutdown().await;
            for e in [
                ctx.write(0u32, 0, b"y").await.unwrap_err(),
                ctx.fdatasync(0u32).await.unwrap_err(),
                ctx.statx(0u32).await.unwrap_err(),
                ctx.write_all_owned(0u32, 0, vec![1]).await.0.unwrap_err(),
            ] {
                assert!(e.to_string().contains("shut down"), "{e}");
            }
        },
    );
}

/// Many concurrent writers (spawned `'static` futures) filling disjoint
/// blocks, then one fdatasync: every block reads back.
fn concurrent_writers(choice: BackendChoice) {
    with_file(
        "concurrent_writers",
        choice,
        Flavor::Multi,
        |ctx, path| async move {
            let mut tasks = Vec::new();
            for t in 0..16u64 {
                let ctx = ctx.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..32u64 {
                        let block = t * 32 + i;
                        let (r, _) = ctx
                            .write_all_owned_static(0u32, block * 4096, bytes(block, 4096))
                            .await;
                        r.unwrap();
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            ctx.fdatasync(0u32).await.unwrap();
            let on_disk = std::fs::read(&path).unwrap();
            for block in 0..512u64 {
                let b = block as usize * 4096;
                assert!(
                    on_disk[b..b + 4096] == bytes(block, 4096)[..],
                    "block {block}"
                );
            }
        },
    );
}

backend_tests!(
    proptest_writes_against_std,
    syncs_fallocate_statx,
    open_files,
    hostile_writes,
    o_direct_writes,
    dropped_writes,
    shutdown_fails_writes,
    concurrent_writers,
    crash_after_acknowledged_fdatasync,
);

// ------------------------------------------------------------ crash test

const CHILD_ENV: &str = "URING_WRITE_CRASH_CHILD";
const RECORD: usize = 4096;

fn record(i: u64) -> Vec<u8> {
    let mut r = bytes(0xc0ffee ^ i, RECORD);
    r[..8].copy_from_slice(&i.to_le_bytes());
    r
}

/// The child's side of the crash test (a no-op unless started by
/// `crash_after_acknowledged_fdatasync` with `URING_WRITE_CRASH_CHILD`
/// set): writes records in groups of 8 — a group's writes concurrently,
/// then one `fdatasync` — and prints `DURABLE <i>` for each record of a
/// group once its `fdatasync` completed, until killed.
#[test]
fn crash_child() {
    let _shared = common::shared();
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (backend, path) = spec.split_once(':').unwrap();
    let choice = if backend == "uring" {
        BackendChoice::IoUring
    } else {
        BackendChoice::Fallback
    };
    let path = PathBuf::from(path);
    let rt = common::runtime(Flavor::Multi);
    rt.block_on(async move {
        let ctx = common::build_ctx(choice, vec![], |b| b);
        let fid = ctx
            .open(
                &path,
                OpenOptions::new().read(true).write(true).create(true),
            )
            .await
            .unwrap();
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for group in 0..100_000u64 {
            let writes = (0..8).map(|k| {
                let i = group * 8 + k;
                ctx.write_all_owned(fid, i * RECORD as u64, record(i))
            });
            for (r, _) in futures::future::join_all(writes).await {
                r.unwrap();
            }
            ctx.fdatasync(fid).await.unwrap();
            for k in 0..8 {
                writeln!(out, "DURABLE {}", group * 8 + k).unwrap();
            }
            out.flush().unwrap();
        }
    });
}

/// Re-runs this test binary as a child that writes and `fdatasync`s,
/// kills it with SIGKILL once it has acknowledged enough records (while it
/// is writing more), then checks that every acknowledged record reads back
/// whole. (A process kill does not lose the page cache, so this checks
/// that an acknowledgement is never given early — before the write and its
/// sync completed — not power-loss durability, which only the `fdatasync`
/// contract itself gives.)
fn crash_after_acknowledged_fdatasync(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let backend = if choice == BackendChoice::IoUring {
        "uring"
    } else {
        "fallback"
    };
    common::watchdog("crash", 120, move || {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "write::crash_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{backend}:{}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut acked = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(i) = line.strip_prefix("DURABLE ") {
                acked.push(i.parse::<u64>().unwrap());
                if acked.len() >= 400 {
                    break;
                }
            }
        }
        child.kill().unwrap(); // SIGKILL, mid-way through later groups
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child was killed, not finished");
        assert!(
            acked.len() >= 400,
            "the child acknowledged only {}",
            acked.len()
        );
        let f = File::open(&path).unwrap();
        for &i in &acked {
            let mut got = vec![0u8; RECORD];
            f.read_exact_at(&mut got, i * RECORD as u64)
                .unwrap_or_else(|e| panic!("acknowledged record {i} missing: {e}"));
            assert!(got == record(i), "acknowledged record {i} reads back wrong");
        }
        eprintln!(
            "crash test ({backend}): {} acknowledged records verified, file {} bytes",
            acked.len(),
            f.metadata().unwrap().len()
        );
        drop(dir);
    });
}

fn rw_file(path: &std::path::Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

/// A registered `O_APPEND` descriptor is never written at the end of
/// the file when an offset was asked for: every write is refused by name
/// and the file is unchanged, on both backends, given to `new` or to
/// `register_file`; its reads work.
#[test]
fn o_append_descriptors_are_not_written_elsewhere() {
    let _shared = common::shared();
    for choice in BOTH {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, b"0123456789").unwrap();
        let append = || {
            std::fs::OpenOptions::new()
                .read(true)
                .append(true)
                .open(&path)
                .unwrap()
        };
        let (first, second) = (append(), append());
        let p = path.clone();
        common::run("r2_01", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, vec![first], |b| b);
            let registered = ctx.register_file(second).unwrap();
            for fid in [uring_positioned_io::FileId::from(0u32), registered] {
                let errors = [
                    ctx.write(fid, 0, b"XYZ").await.unwrap_err(),
                    ctx.write_all(fid, 2, b"XYZ").await.unwrap_err(),
                    ctx.write_owned(fid, 0, b"XYZ".to_vec())
                        .await
                        .0
                        .unwrap_err(),
                    ctx.write_all_owned(fid, 0, b"XYZ".to_vec())
                        .await
                        .0
                        .unwrap_err(),
                    ctx.write_all_owned_static(fid, 0, b"XYZ".to_vec())
                        .await
                        .0
                        .unwrap_err(),
                ];
                for e in errors {
                    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{choice:?}: {e}");
                    assert!(e.to_string().contains("O_APPEND"), "{choice:?}: {e}");
                }
                let mut buf = [0u8; 10];
                ctx.read_exact(fid, 0, &mut buf).await.unwrap();
                assert_eq!(&buf, b"0123456789");
            }
            assert_eq!(std::fs::read(&p).unwrap(), b"0123456789", "{choice:?}");
            drop(dir);
        });
    }
}

/// A borrowed `write` cut by `shutdown()` returns the bytes it
/// wrote, as `write(2)` does when a later part fails: `Ok(n)` with exactly
/// its first `n` bytes in the file, or an error with none of them there.
/// A cut `write_all` fails, saying how much it wrote.
#[test]
fn a_write_cut_by_shutdown_reports_what_it_wrote() {
    let _shared = common::shared();
    const LEN: usize = 32 << 20;
    for choice in BOTH {
        let (mut short, mut failed, mut whole) = (0, 0, 0);
        for round in 0..12u64 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            let file = rw_file(&path);
            let p = path.clone();
            let outcome = common::run("r2_03", Flavor::Multi, 60, move || async move {
                let data = Arc::new({
                    let mut v = vec![0u8; LEN];
                    common::fill_pattern(round + 1, 0, &mut v);
                    v
                });
                let ctx = common::build_ctx(choice, vec![file], |b| b);
                let (ctx2, data2) = (ctx.clone(), data.clone());
                let exact = round % 4 == 3;
                let writer = tokio::spawn(async move {
                    if exact {
                        ctx2.write_all(0u32, 0, &data2).await.map(|()| LEN)
                    } else {
                        ctx2.write(0u32, 0, &data2).await
                    }
                });
                // Let it write some pieces first (more in later rounds).
                tokio::time::sleep(Duration::from_micros(500 * round)).await;
                ctx.shutdown().await;
                let res = writer.await.unwrap();
                let on_disk = std::fs::read(&p).unwrap();
                match &res {
                    Ok(n) => {
                        assert!(*n > 0 && *n <= LEN, "{choice:?}: Ok({n})");
                        assert!(
                            on_disk.len() >= *n && on_disk[..*n] == data[..*n],
                            "{choice:?}: Ok({n}) but the file holds {} bytes of it",
                            on_disk.len()
                        );
                    }
                    Err(e) if exact => {
                        // write_all: the error says how far it got.
                        if !on_disk.is_empty() {
                            assert!(e.to_string().contains("bytes were written"), "{e}");
                        }
                    }
                    Err(e) => assert!(
                        on_disk.is_empty(),
                        "{choice:?}: {e}, with {} bytes of it in the file",
                        on_disk.len()
                    ),
                }
                drop(dir);
                (res.map_err(|e| e.to_string()), exact)
            });
            match outcome {
                (Ok(n), _) if n < LEN => short += 1,
                (Ok(_), _) => whole += 1,
                (Err(_), _) => failed += 1,
            }
        }
        eprintln!("{choice:?}: {short} short counts, {whole} whole, {failed} errors");
    }
}
