//! `AppendLog` (feature `append-log`), on both backends: concurrent
//! appends recovered exactly and in offset order; acknowledgement implies
//! the record and every one before it are in the file (a child process
//! killed with SIGKILL); torn and corrupt tails end recovery, and appends
//! after recovery never make an old record after the tear look valid;
//! preallocated zeroes end the log; a failed `fdatasync` or write fails
//! the appends it covers and poisons the log (FUSE faults); errors for
//! oversize records and a closed log; a dropped append still completes.

use crate::common;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::fuse::{Fault, FaultFs, FileSpec};
use common::Flavor;
use uring_positioned_io::{
    AppendLog, AppendLogOptions, BackendChoice, LogRecord, OpenOptions, UringContext, UringFile,
    RECORD_HEADER_LEN,
};

fn rw() -> OpenOptions {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .clone()
}

async fn open_file(choice: BackendChoice, path: &Path) -> (UringContext, UringFile) {
    let ctx = common::build_ctx(choice, vec![], |b| b);
    let file = ctx.open_file(path, &rw()).await.unwrap();
    (ctx, file)
}

/// Opens (recovers) the log at `path` through a fresh context.
async fn reopen(
    choice: BackendChoice,
    path: &Path,
    options: &AppendLogOptions,
) -> (UringContext, AppendLog, Vec<LogRecord>) {
    let (ctx, file) = open_file(choice, path).await;
    let (log, records) = options.open(file).await.unwrap();
    (ctx, log, records)
}

/// A payload naming its writer and number; lengths 0..=300.
fn payload(writer: u64, i: u64) -> Vec<u8> {
    let len = ((writer * 131 + i * 17) % 301) as usize;
    let mut p: Vec<u8> = (0..len)
        .map(|k| (writer as u8) ^ (i as u8).wrapping_mul(7) ^ (k as u8).wrapping_mul(13))
        .collect();
    if len >= 16 {
        p[..8].copy_from_slice(&writer.to_le_bytes());
        p[8..16].copy_from_slice(&i.to_le_bytes());
    }
    p
}

/// Records recovered are back to back from 0, in offset order.
fn check_contiguous(records: &[LogRecord]) -> u64 {
    let mut at = 0;
    for r in records {
        assert_eq!(r.offset, at, "records are back to back from 0");
        at += (RECORD_HEADER_LEN + r.payload.len()) as u64;
    }
    at
}

/// Many tasks append at once; a fresh context recovers exactly the
/// acknowledged records, in offset order, contents equal; appends after
/// recovery continue the log.
fn round_trip(choice: BackendChoice) {
    common::run("log_round_trip", Flavor::Multi, 120, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let options = AppendLogOptions::new();
        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert!(records.is_empty());
        assert_eq!(log.epoch(), 1);
        let mut tasks = Vec::new();
        for w in 0..16u64 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..40u64 {
                    let p = payload(w, i);
                    // Half awaited one by one, half as a burst.
                    if i % 2 == 0 {
                        acked.push((log.append(p.clone()).await.unwrap(), p));
                    } else {
                        let (a, b) = (payload(w, i + 1000), payload(w, i + 2000));
                        let (x, y) =
                            tokio::try_join!(log.append(a.clone()), log.append(b.clone())).unwrap();
                        acked.push((x, a));
                        acked.push((y, b));
                    }
                }
                acked
            }));
        }
        let mut acked = HashMap::new();
        for t in tasks {
            for (lsn, p) in t.await.unwrap() {
                assert!(acked.insert(lsn, p).is_none(), "position {lsn} given twice");
            }
        }
        log.close().await.unwrap();
        assert_eq!(log.durable(), log.tail());
        let syncs = log.syncs();
        assert!(syncs >= 1 && syncs <= acked.len() as u64);
        let tail = log.tail();
        drop(log);

        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), acked.len(), "records recovered");
        assert_eq!(check_contiguous(&records), tail);
        for r in &records {
            assert!(
                acked.get(&r.offset) == Some(&r.payload),
                "record at {} is not the one acknowledged there",
                r.offset
            );
        }
        assert_eq!((log.tail(), log.epoch()), (tail, 2));
        let more = log.append(b"after recovery".to_vec()).await.unwrap();
        assert_eq!(more, tail);
        log.close().await.unwrap();
        drop(log);
        let (_ctx, log, again) = reopen(choice, &path, &options).await;
        assert_eq!(again.len(), records.len() + 1);
        assert_eq!(again.last().unwrap().payload, b"after recovery");
        assert_eq!(log.epoch(), 3);
    });
}

/// A torn last record (the file cut inside it) ends recovery before it; a
/// corrupt byte ends it before that record; the records appended after
/// recovery are recovered next time — and an old record that a new one
/// happens to end next to is not taken as part of the log (the epoch).
fn torn_and_corrupt_tails(choice: BackendChoice) {
    common::run("log_torn_tail", Flavor::Multi, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let options = AppendLogOptions::new();
        let (_ctx, log, _) = reopen(choice, &path, &options).await;
        let mut offsets = Vec::new();
        for i in 0..10u64 {
            offsets.push(log.append(vec![i as u8; 100]).await.unwrap());
        }
        log.close().await.unwrap();
        let end = log.tail();
        drop(log);

        // 1. Cut the last record short by a byte: nine records.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(end - 1).unwrap();
        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 9);
        assert_eq!(log.tail(), offsets[9]);
        drop(log);

        // 2. Corrupt one payload byte of record 5: records 0..5, and the
        // intact records 6..9 after it are not recovered.
        let at = offsets[5] + RECORD_HEADER_LEN as u64 + 50;
        f.write_all_at(&[0xff], at).unwrap();
        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 5);
        assert_eq!(log.tail(), offsets[5]);
        let epoch = log.epoch();

        // 3. A new record of record 5's length ends exactly where the old,
        // intact record 6 starts: recovery must still stop after it.
        let lsn = log.append(vec![0xab; 100]).await.unwrap();
        assert_eq!(lsn, offsets[5]);
        log.close().await.unwrap();
        drop(log);
        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert_eq!(
            records.len(),
            6,
            "old records after a tear came back behind a new one"
        );
        assert_eq!(records[5].payload, vec![0xab; 100]);
        assert_eq!(log.epoch(), epoch + 1);
        assert_eq!(log.tail(), offsets[6]);

        // 4. And appends go on from there.
        let lsn = log.append(b"seven".to_vec()).await.unwrap();
        assert_eq!(lsn, offsets[6]);
        log.close().await.unwrap();
        drop(log);
        let (_ctx, _log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 7);
        assert_eq!(records[6].payload, b"seven");
        check_contiguous(&records);
    });
}

/// With preallocation the file is longer than the log, zeroes after the
/// last record: recovery stops there, and appends continue there.
fn preallocated_zeroes_end_recovery(choice: BackendChoice) {
    common::run("log_prealloc", Flavor::Multi, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let options = AppendLogOptions::new().preallocate(1 << 20);
        let (_ctx, log, _) = reopen(choice, &path, &options).await;
        let mut tasks = Vec::new();
        for w in 0..4u64 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..50 {
                    log.append(payload(w, i)).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        log.close().await.unwrap();
        let tail = log.tail();
        drop(log);
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len >= 1 << 20, "preallocated: {len} bytes");
        assert!(len > tail);

        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 200);
        assert_eq!(check_contiguous(&records), tail);
        assert_eq!(log.tail(), tail);
        log.append(b"next".to_vec()).await.unwrap();
        log.close().await.unwrap();
        drop(log);
        let (_ctx, _log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 201);
        assert_eq!(records[200].payload, b"next");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    });
}

/// Oversize records and appends to a closed log fail with clear errors;
/// the log goes on after an oversize one.
fn errors(choice: BackendChoice) {
    common::run("log_errors", Flavor::Multi, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let options = AppendLogOptions::new().max_record_len(1000);
        let (_ctx, log, _) = reopen(choice, &path, &options).await;
        let e = log.append(vec![0u8; 1001]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("1001"), "{e}");
        assert_eq!(log.append(vec![1u8; 1000]).await.unwrap(), 0);
        assert_eq!(log.append(Vec::new()).await.unwrap(), 1012);
        log.close().await.unwrap();
        let e = log.append(b"late".to_vec()).await.unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
        log.close().await.unwrap();
        // An unpolled append reserves nothing; one dropped after its first
        // poll is still written and made durable.
        drop(log);
        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 2);
        assert!(records[1].payload.is_empty());
        drop(log.append(b"never polled".to_vec()));
        let mut dropped = log.append(b"dropped".to_vec());
        let _ = common::poll_once(std::pin::Pin::new(&mut dropped)).await;
        drop(dropped);
        log.close().await.unwrap();
        drop(log);
        let (_ctx, _log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 3);
        assert_eq!(records[2].payload, b"dropped");
    });
}

backend_tests!(
    round_trip,
    torn_and_corrupt_tails,
    preallocated_zeroes_end_recovery,
    errors,
    crash_after_acknowledged_append,
    failed_sync_fails_covered_appends_and_poisons,
    failed_write_poisons,
    no_acknowledgement_past_a_hole,
    small_record_waits_for_a_large_one_before_it,
);

/// A log in a writable FUSE file, for faults.
fn fuse_log(
    choice: BackendChoice,
    test: &'static str,
    body: impl FnOnce(
            std::sync::Arc<FaultFs>,
            AppendLog,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
        + Send
        + 'static,
) {
    let Some(fs) = FaultFs::mount_writable_or_skip(&[FileSpec::new("w", 0, 0x106)], false) else {
        return;
    };
    let fs = std::sync::Arc::new(fs);
    let path = fs.path("w");
    common::run(test, Flavor::Multi, 90, move || async move {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let ctx = common::build_ctx(choice, vec![f], |b| {
            b.shutdown_timeout(Duration::from_secs(1))
        });
        let file = ctx.file(0u32).unwrap();
        let (log, records) = AppendLogOptions::new().open(file).await.unwrap();
        assert!(records.is_empty());
        body(fs, log).await;
    });
}

/// A failing `fdatasync`: every append it covers fails with its errno, and
/// every later one (the log is poisoned); nothing is acknowledged after the
/// fault. The appends acknowledged before it are in the file.
fn failed_sync_fails_covered_appends_and_poisons(choice: BackendChoice) {
    fuse_log(choice, "log_sync_fault", |fs, log| {
        Box::pin(async move {
            let ok = log.append(b"before".to_vec()).await.unwrap();
            assert_eq!(ok, 0);
            fs.set_sync_fault("w", Fault::Errno(libc::EIO));
            let appends: Vec<_> = (0..16u8).map(|i| log.append(vec![i; 64])).collect();
            // Those the failed sync covered fail with its errno; those
            // written after it with the poison's error.
            let mut eio = 0;
            for r in futures::future::join_all(appends).await {
                let e = r.expect_err("acknowledged although its fdatasync failed");
                if e.raw_os_error() == Some(libc::EIO) {
                    eio += 1;
                } else {
                    assert!(e.to_string().contains("fdatasync: "), "{e}");
                }
            }
            assert!(eio >= 1, "no append saw the fdatasync's EIO");
            fs.clear_faults();
            let e = log.append(b"after".to_vec()).await.unwrap_err();
            assert!(e.to_string().contains("failed earlier"), "{e}");
            assert!(log.close().await.is_err());
            let content = fs.content("w");
            assert!(content.len() >= RECORD_HEADER_LEN + 6);
            assert_eq!(
                &content[RECORD_HEADER_LEN..RECORD_HEADER_LEN + 6],
                b"before"
            );
        })
    });
}

/// A failing write: its append fails with the errno, and the log is
/// poisoned (no append after a hole can ever be acknowledged).
fn failed_write_poisons(choice: BackendChoice) {
    fuse_log(choice, "log_write_fault", |fs, log| {
        Box::pin(async move {
            log.append(vec![1u8; 100]).await.unwrap();
            let at = log.tail();
            fs.set_write_fault("w", at..at + 1, Fault::Errno(libc::EIO));
            let e = log.append(vec![2u8; 100]).await.unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
            fs.clear_faults();
            let e = log.append(vec![3u8; 100]).await.unwrap_err();
            assert!(e.to_string().contains("failed earlier"), "{e}");
        })
    });
}

/// A small record appended after a 64 MiB one (whose write is still
/// going on) resolves only once the large one is whole in the file: read
/// back at once (with `pread`), its last bytes are there.
fn small_record_waits_for_a_large_one_before_it(choice: BackendChoice) {
    common::run(
        "log_large_then_small",
        Flavor::Multi,
        60,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("wal");
            let options = AppendLogOptions::new().max_record_len(64 << 20);
            let (_ctx, log, _) = reopen(choice, &path, &options).await;
            let f = File::open(&path).unwrap();
            for round in 0..3u8 {
                let start = log.tail();
                let big = tokio::spawn(log.append(vec![round + 1; 64 << 20]));
                while log.tail() == start {
                    tokio::task::yield_now().await;
                }
                let end = log.tail();
                log.append(vec![0xee; 10]).await.unwrap();
                let mut last = vec![0u8; 4096];
                f.read_exact_at(&mut last, end - 4096).unwrap();
                assert!(
                    last.iter().all(|&b| b == round + 1),
                    "a record was acknowledged before the one before it was written"
                );
                assert_eq!(big.await.unwrap().unwrap(), start);
            }
        },
    );
}

/// A record whose write hangs is a hole: the records after it, written
/// and synced, are not acknowledged while it hangs; when its write fails,
/// they fail too.
fn no_acknowledgement_past_a_hole(choice: BackendChoice) {
    fuse_log(choice, "log_hole", |fs, log| {
        Box::pin(async move {
            log.append(vec![1u8; 100]).await.unwrap();
            let at = log.tail();
            fs.set_write_fault("w", at..at + 1, Fault::Hang);
            let hung = tokio::spawn(log.append(vec![2u8; 100]));
            let fs2 = fs.clone();
            let n = tokio::task::spawn_blocking(move || {
                fs2.wait_writes_hung("w", 1, Duration::from_secs(10))
            })
            .await
            .unwrap();
            assert_eq!(n, 1, "the first write did not reach the server");
            let later = tokio::spawn(log.append(vec![3u8; 100]));
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(
                !later.is_finished(),
                "a record after a hole resolved: {:?}",
                later.await
            );
            fs.release_hangs();
            let e = hung.await.unwrap().unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
            assert!(
                later.await.unwrap().is_err(),
                "a record after a hole acknowledged"
            );
        })
    });
}

// ------------------------------------------------------------ crash test

const CHILD_ENV: &str = "URING_LOG_CRASH_CHILD";

/// The child's side of the crash test (a no-op unless started by
/// `crash_after_acknowledged_append` with `URING_LOG_CRASH_CHILD` set):
/// 32 tasks append until killed; each acknowledged append is printed as
/// `ACK <position> <writer> <i>`.
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
        let (_ctx, log, _) = reopen(
            choice,
            &path,
            &AppendLogOptions::new().preallocate(64 << 10),
        )
        .await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        for w in 0..32u64 {
            let (log, tx) = (log.clone(), tx.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let lsn = log.append(payload(w, i)).await.unwrap();
                    let _ = tx.send(format!("ACK {lsn} {w} {i}"));
                }
            });
        }
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        while let Some(line) = rx.recv().await {
            writeln!(out, "{line}").unwrap();
            out.flush().unwrap();
        }
    });
}

/// Re-runs this test binary as a child that appends from 32 tasks, kills
/// it with SIGKILL once it has acknowledged enough (while it appends
/// more), then recovers the log: every acknowledged record is there, at
/// its position, intact, and the records are back to back from 0. A
/// process kill keeps the page cache, so this checks the order of
/// acknowledgements — never before the record's write and every earlier
/// record's write completed and a sync after them — and no holes before an
/// acknowledged record, not power-loss durability.
fn crash_after_acknowledged_append(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    let backend = if choice == BackendChoice::IoUring {
        "uring"
    } else {
        "fallback"
    };
    let p = path.clone();
    let acked = common::watchdog("log_crash", 120, move || {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "log::crash_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{backend}:{}", p.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Kill at a moment that varies: after 300..800 acknowledgements.
        let stop = 300 + (std::process::id() as usize * 7919) % 500;
        let mut acked = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("ACK ") {
                let v: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
                acked.push((v[0], v[1], v[2]));
                if acked.len() >= stop {
                    break;
                }
            }
        }
        child.kill().unwrap(); // SIGKILL, mid-way through later appends
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child was killed, not finished");
        assert!(
            acked.len() >= stop,
            "the child acknowledged only {}",
            acked.len()
        );
        acked
    });
    let len = File::open(&path).unwrap().metadata().unwrap().len();
    common::run("log_crash_recover", Flavor::Multi, 60, move || async move {
        let (_ctx, _log, records) = reopen(choice, &path, &AppendLogOptions::new()).await;
        let end = check_contiguous(&records);
        let at: HashMap<u64, &[u8]> = records.iter().map(|r| (r.offset, &r.payload[..])).collect();
        for &(lsn, w, i) in &acked {
            let got = at
                .get(&lsn)
                .unwrap_or_else(|| panic!("acknowledged record {w}/{i} at {lsn} not recovered"));
            assert!(
                *got == &payload(w, i)[..],
                "acknowledged record {w}/{i} at {lsn} recovered wrong"
            );
        }
        eprintln!(
            "log crash test ({backend}): {} acknowledged of {} recovered records verified, \
             log {end} of {len} bytes",
            acked.len(),
            records.len()
        );
        drop(dir);
    });
}
