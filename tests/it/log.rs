//! `AppendLog` (feature `append-log`), on both backends: concurrent
//! appends recovered exactly and in offset order; acknowledgement implies
//! the record and every one before it are in the file (a child process
//! killed with SIGKILL); torn and corrupt tails end recovery, and appends
//! after recovery never make an old record after the tear look valid;
//! preallocated zeroes end the log; a failed `fdatasync` or write fails
//! the appends it covers and poisons the log (FUSE faults); errors for
//! oversize records and a closed log; a dropped append still completes.
//! Write coalescing: concurrent appends are gathered into fewer writes
//! than records (counted by `stats`), a dropped append inside a group, a
//! short write of a group continued (or poisoning when nothing is
//! written), records above the group cap written alone; preallocation on
//! a file system that refuses `fallocate` reported stopped.

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
    AppendLog, AppendLogOptions, BackendChoice, LogRecord, OpenOptions, Preallocation,
    UringContext, UringFile, RECORD_HEADER_LEN,
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
        let st = log.stats();
        let commits = st.syncs + st.durable_writes;
        assert!(commits >= 1 && commits <= acked.len() as u64, "{st:?}");
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
        // What recovery read is not known durable: the first commit is an
        // fdatasync (which covers it), the next a durable write.
        assert_eq!(log.durable(), 0);
        let more = log.append(b"after recovery".to_vec()).await.unwrap();
        assert_eq!(more, tail);
        let st = log.stats();
        assert_eq!((st.syncs, st.durable_writes), (1, 0), "{st:?}");
        log.append(b"after recovery".to_vec()).await.unwrap();
        let st = log.stats();
        assert_eq!((st.syncs, st.durable_writes), (1, 1), "{st:?}");
        log.close().await.unwrap();
        drop(log);
        let (_ctx, log, again) = reopen(choice, &path, &options).await;
        assert_eq!(again.len(), records.len() + 2);
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
    concurrent_appends_are_coalesced,
    dropped_appends_inside_a_group,
    records_above_the_group_cap_are_written_alone,
    short_group_write_is_continued,
    group_write_of_nothing_poisons,
    preallocation_refused_is_reported,
    direct_log_round_trip,
    crash_after_acknowledged_append_direct,
    home_runtime_dies_mid_append,
);

type FuseBody = Box<
    dyn FnOnce(
            std::sync::Arc<FaultFs>,
            AppendLog,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
        + Send
        + 'static,
>;

/// A log in a writable FUSE file (through the page cache), for faults.
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
    fuse_log_with(
        choice,
        test,
        AppendLogOptions::new(),
        Cache::Page,
        Box::new(body),
    );
}

/// How a FUSE log's file is cached.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cache {
    /// Through the page cache.
    Page,
    /// The mount's `direct_io` (no page cache: a `pwrite` is one FUSE
    /// request, and a short reply a short write).
    DirectIo,
    /// The file opened `O_DIRECT`: the log writes whole blocks.
    ODirect,
}

/// [`fuse_log`] with `options` and `cache`.
fn fuse_log_with(
    choice: BackendChoice,
    test: &'static str,
    options: AppendLogOptions,
    cache: Cache,
    body: FuseBody,
) {
    let Some(fs) =
        FaultFs::mount_writable_or_skip(&[FileSpec::new("w", 0, 0x106)], cache == Cache::DirectIo)
    else {
        return;
    };
    let fs = std::sync::Arc::new(fs);
    let path = fs.path("w");
    common::run(test, Flavor::Multi, 90, move || async move {
        use std::os::unix::fs::OpenOptionsExt;
        let flags = if cache == Cache::ODirect {
            libc::O_DIRECT
        } else {
            0
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(&path)
            .unwrap();
        let ctx = common::build_ctx(choice, vec![f], |b| {
            b.shutdown_timeout(Duration::from_secs(1))
        });
        let file = ctx.file(0u32).unwrap();
        let (log, records) = options.open(file).await.unwrap();
        assert!(records.is_empty());
        body(fs, log).await;
    });
}

/// A failing `fdatasync`: every append it covers fails with its errno, and
/// every later one (the log is poisoned); nothing is acknowledged after the
/// fault. The appends acknowledged before it are in the file.
/// With durable writes the failing flush is the one inside a durable
/// write (FUSE sends a sync for an `RWF_DSYNC` write), which fails the
/// same way, as the write.
fn failed_sync_fails_covered_appends_and_poisons(choice: BackendChoice) {
    for durable in [true, false] {
        failed_sync(choice, durable);
    }
}

fn failed_sync(choice: BackendChoice, durable: bool) {
    let options = AppendLogOptions::new().durable_writes(durable);
    let what = if durable { "write: " } else { "fdatasync: " };
    let body: FuseBody = Box::new(move |fs, log| {
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
                    assert!(e.to_string().contains(what), "{e}");
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
            let st = log.stats();
            assert_eq!(st.durable_writes > 0, durable, "{st:?}");
        })
    });
    fuse_log_with(choice, "log_sync_fault", options, Cache::Page, body);
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

/// A small record appended after a 16 MiB one (whose write is still
/// going on) resolves only once the large one is whole in the file: read
/// back at once (with `pread`), its last bytes are there.
/// The same on the file opened `O_DIRECT` (the small record's write waits
/// for its turn behind the large one's).
fn small_record_waits_for_a_large_one_before_it(choice: BackendChoice) {
    for direct in [false, true] {
        large_then_small(choice, direct);
    }
}

fn large_then_small(choice: BackendChoice, direct: bool) {
    common::run(
        "log_large_then_small",
        Flavor::Multi,
        60,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("wal");
            if direct && common::open_direct(&path).is_none() {
                return;
            }
            const BIG: usize = 16 << 20;
            let options = AppendLogOptions::new().max_record_len(BIG);
            let ctx = common::build_ctx(choice, vec![], |b| b);
            let file = ctx
                .open_file(&path, &rw().direct(direct).clone())
                .await
                .unwrap();
            let (log, _) = options.open(file).await.unwrap();
            let f = File::open(&path).unwrap();
            for round in 0..3u8 {
                let start = log.tail();
                let big = tokio::spawn(log.append(vec![round + 1; BIG]));
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

/// A record whose write hangs is a hole: the records after it are not
/// acknowledged while it hangs — one above the group cap issued alone, at
/// once, and a small one gathered — and when its write fails, they fail
/// too. The same on the file opened `O_DIRECT`, where the record above
/// the cap waits for its turn (its first block is the hung write's) and
/// the failure that poisons the log ends that wait.
fn no_acknowledgement_past_a_hole(choice: BackendChoice) {
    for cache in [Cache::Page, Cache::ODirect] {
        hole(choice, cache);
    }
}

fn hole(choice: BackendChoice, cache: Cache) {
    let options = AppendLogOptions::new().max_group_len(1024);
    fuse_log_with(
        choice,
        "log_hole",
        options,
        cache,
        Box::new(|fs, log| {
            Box::pin(async move {
                log.append(vec![1u8; 100]).await.unwrap();
                let at = log.tail();
                fs.set_write_fault("w", at..at + 1, Fault::Hang);
                let hung = tokio::spawn(log.append(vec![2u8; 100]));
                let n = fs.writes_hung("w", 1, Duration::from_secs(10)).await;
                assert_eq!(n, 1, "the first write did not reach the server");
                // Above the cap: issued alone, at once, past the hole (the
                // kernel may hold it behind the hung one: FUSE serializes
                // a file's writes); the small one after it is gathered.
                let later = tokio::spawn(log.append(vec![3u8; 2000]));
                let small = tokio::spawn(log.append(vec![4u8; 10]));
                while log.stats().records < 4 {
                    tokio::task::yield_now().await;
                }
                // Issued alone: 3 writes, or 4 when the small one reached
                // the log first (spawned on the other worker) and was
                // gathered, then written by the large one's append before
                // its own, as the log does for a record above the cap.
                let st = log.stats();
                assert!(
                    (3..=4).contains(&st.writes),
                    "the record above the cap not issued alone: {st:?}"
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(
                    !later.is_finished(),
                    "a record after a hole resolved: {:?}",
                    later.await
                );
                assert!(!small.is_finished(), "a record after a hole resolved");
                fs.release_hangs();
                let e = hung.await.unwrap().unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
                assert!(
                    later.await.unwrap().is_err(),
                    "a record after a hole acknowledged"
                );
                assert!(
                    small.await.unwrap().is_err(),
                    "a record after a hole acknowledged"
                );
            })
        }),
    );
}

/// Appends polled together (one task, `join_all`) while the first one's
/// write is in flight are gathered: the first record is written alone at
/// once (an idle log), the other 23 as one group — 2 writes for 24
/// records, each a durable write (no sync), or with durable writes off
/// 1 sync; each resolves to its reservation order's position, and
/// recovery gives every record back, intact, in that order. Then 16 tasks
/// appending in loops: fewer writes than records, every record recovered.
fn concurrent_appends_are_coalesced(choice: BackendChoice) {
    for durable in [true, false] {
        coalesced(choice, durable);
    }
}

fn coalesced(choice: BackendChoice, durable: bool) {
    common::run("log_coalesce", Flavor::Current, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let options = AppendLogOptions::new().durable_writes(durable);
        let (_ctx, log, _) = reopen(choice, &path, &options).await;
        let payloads: Vec<Vec<u8>> = (0..24).map(|i| payload(1, i)).collect();
        let appends: Vec<_> = payloads.iter().map(|p| log.append(p.clone())).collect();
        let lsns: Vec<u64> = futures::future::join_all(appends)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let st = log.stats();
        assert_eq!(st.records, 24);
        let commits = if durable { (0, 2) } else { (1, 0) };
        assert_eq!(
            (st.writes, (st.syncs, st.durable_writes)),
            (2, commits),
            "24 appends at once: one record alone, then one group ({st:?})"
        );
        assert_eq!(st.bytes, log.tail());
        assert_eq!(st.preallocation, Preallocation::Off);
        let mut at = 0;
        for (lsn, p) in lsns.iter().zip(&payloads) {
            assert_eq!(*lsn, at, "positions in reservation (first-poll) order");
            at += (RECORD_HEADER_LEN + p.len()) as u64;
        }
        log.close().await.unwrap();
        drop(log);
        let (_ctx, log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 24);
        for ((r, p), lsn) in records.iter().zip(&payloads).zip(&lsns) {
            assert_eq!((&r.payload, r.offset), (p, *lsn));
        }

        // Many tasks: fewer writes than records; all recovered at their
        // positions.
        let mut tasks = Vec::new();
        for w in 0..16u64 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..30u64 {
                    let p = payload(w, i);
                    acked.push((log.append(p.clone()).await.unwrap(), p));
                }
                acked
            }));
        }
        let mut acked = HashMap::new();
        for t in tasks {
            acked.extend(t.await.unwrap());
        }
        log.close().await.unwrap();
        let st = log.stats();
        assert_eq!(st.records, 480);
        assert!(st.writes < st.records, "no coalescing: {st:?}");
        drop(log);
        let (_ctx, _log, records) = reopen(choice, &path, &options).await;
        assert_eq!(records.len(), 24 + 480);
        check_contiguous(&records);
        for r in &records[24..] {
            assert_eq!(acked.get(&r.offset), Some(&r.payload));
        }
    });
}

/// Appends dropped after their first poll, inside a group and while
/// writing alone, still end up in the log, and the others are
/// acknowledged (no hole left behind).
fn dropped_appends_inside_a_group(choice: BackendChoice) {
    common::run(
        "log_drop_in_group",
        Flavor::Current,
        60,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("wal");
            let options = AppendLogOptions::new();
            let (_ctx, log, _) = reopen(choice, &path, &options).await;
            let mut futs: Vec<_> = (0..6u8).map(|i| log.append(vec![i; 50])).collect();
            for f in &mut futs {
                let _ = common::poll_once(std::pin::Pin::new(f)).await;
            }
            // 0 is writing alone; 1..6 are gathered. Drop 0, 2 and 5.
            let mut kept = Vec::new();
            for (i, f) in futs.into_iter().enumerate() {
                if ![0, 2, 5].contains(&i) {
                    kept.push(f);
                }
            }
            for r in futures::future::join_all(kept).await {
                r.unwrap();
            }
            log.close().await.unwrap();
            assert_eq!(log.stats().writes, 2);
            drop(log);
            let (_ctx, _log, records) = reopen(choice, &path, &options).await;
            let got: Vec<Vec<u8>> = records.into_iter().map(|r| r.payload).collect();
            let want: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; 50]).collect();
            assert_eq!(got, want);
        },
    );
}

/// With a group cap of 1 KiB, records above it are written alone (and the
/// group gathered before one is written then): 6 records, 5 writes.
fn records_above_the_group_cap_are_written_alone(choice: BackendChoice) {
    common::run("log_group_cap", Flavor::Current, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        let options = AppendLogOptions::new().max_group_len(1024);
        let (_ctx, log, _) = reopen(choice, &path, &options).await;
        let lens = [10usize, 2000, 30, 40, 3000, 60];
        let payloads: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8 + 1; n])
            .collect();
        let appends: Vec<_> = payloads.iter().map(|p| log.append(p.clone())).collect();
        for r in futures::future::join_all(appends).await {
            r.unwrap();
        }
        // 10 alone (idle log); 2000 alone; 30+40 a group, written by the
        // 3000's append before its own; 60 a group.
        let st = log.stats();
        assert_eq!((st.records, st.writes), (6, 5), "{st:?}");
        log.close().await.unwrap();
        drop(log);
        let (_ctx, _log, records) = reopen(choice, &path, &options).await;
        let got: Vec<Vec<u8>> = records.into_iter().map(|r| r.payload).collect();
        assert_eq!(got, payloads);
    });
}

/// Appends at once on a FUSE file without the page cache: one record
/// alone (its write delayed), then a group of 15. `set`: the fault on
/// the group's first byte.
fn fuse_group(
    fs: &FaultFs,
    log: &AppendLog,
    fault: Fault,
) -> Vec<futures::future::BoxFuture<'static, std::io::Result<u64>>> {
    let first = log.append(vec![0xaa; 64]);
    let first_at = log.tail();
    let group_at = first_at + (RECORD_HEADER_LEN + 64) as u64;
    fs.set_write_fault("w", group_at..group_at + 1, fault);
    // The lone record's write takes a while: the other 15 are all polled
    // (and gathered) by the time it completes.
    fs.set_write_fault(
        "w",
        first_at..first_at + 1,
        Fault::Delay(Duration::from_millis(100)),
    );
    let mut all: Vec<futures::future::BoxFuture<'static, _>> = vec![Box::pin(first)];
    for i in 0..15u8 {
        all.push(Box::pin(log.append(vec![i; 64])));
    }
    all
}

/// A group write that comes back short (the server takes 100 bytes) is
/// continued: every record is acknowledged and in the file.
fn short_group_write_is_continued(choice: BackendChoice) {
    fuse_log_with(
        choice,
        "log_short_group",
        AppendLogOptions::new(),
        Cache::DirectIo,
        Box::new(|fs, log| {
            Box::pin(async move {
                let appends = fuse_group(&fs, &log, Fault::Short(100));
                let lsns: Vec<u64> = futures::future::join_all(appends)
                    .await
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
                // One record alone, then the 15 in one group (in two if
                // the polling thread stalled past the first one's delay).
                let st = log.stats();
                assert_eq!(st.records, 16, "{st:?}");
                assert!((2..=3).contains(&st.writes), "no coalescing: {st:?}");
                let frame = (RECORD_HEADER_LEN + 64) as u64;
                let writes = fs.write_log();
                assert!(
                    writes
                        .iter()
                        .any(|w| w.offset == frame && matches!(w.fault, Some(Fault::Short(_)))),
                    "the group's write was not cut short: {writes:?}"
                );
                assert!(
                    writes.iter().any(|w| w.offset == frame + 100),
                    "the short group write was not continued: {writes:?}"
                );
                let content = fs.content("w");
                assert_eq!(content.len() as u64, 16 * frame);
                for (i, lsn) in lsns.iter().enumerate().skip(1) {
                    let at = *lsn as usize + RECORD_HEADER_LEN;
                    assert!(content[at..at + 64].iter().all(|&b| b == i as u8 - 1));
                }
                log.close().await.unwrap();
            })
        }),
    );
}

/// A group write of which the server takes nothing fails: no append of
/// the group is acknowledged, and the log is poisoned.
fn group_write_of_nothing_poisons(choice: BackendChoice) {
    fuse_log_with(
        choice,
        "log_zero_group",
        AppendLogOptions::new(),
        Cache::DirectIo,
        Box::new(|fs, log| {
            Box::pin(async move {
                let appends = fuse_group(&fs, &log, Fault::Short(0));
                let results = futures::future::join_all(appends).await;
                for (i, r) in results.iter().enumerate().skip(1) {
                    let e = r
                        .as_ref()
                        .expect_err("a record of a group never written acknowledged");
                    assert!(e.to_string().contains("write"), "record {i}: {e}");
                }
                fs.clear_faults();
                let e = log.append(b"after".to_vec()).await.unwrap_err();
                assert!(e.to_string().contains("failed earlier"), "{e}");
            })
        }),
    );
}

/// FUSE here refuses `fallocate` (`EOPNOTSUPP`): a log asked to
/// preallocate reports it stopped, and appends go on; on the temp dir's
/// file system it is active, ahead of the tail.
fn preallocation_refused_is_reported(choice: BackendChoice) {
    common::run(
        "log_prealloc_stats",
        Flavor::Multi,
        60,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("wal");
            let options = AppendLogOptions::new().preallocate(1 << 20);
            let (_ctx, log, _) = reopen(choice, &path, &options).await;
            assert_eq!(log.stats().preallocation, Preallocation::Active { end: 0 });
            log.append(vec![1u8; 100]).await.unwrap();
            if let Preallocation::Active { end } = log.stats().preallocation {
                assert!(end >= 1 << 20, "{end}");
            } else {
                // Only a file system that refuses fallocate gets here.
                let st = log.stats();
                eprintln!("the temp dir refuses fallocate: {st:?}");
            }
        },
    );
    let options = AppendLogOptions::new().preallocate(1 << 20);
    fuse_log_with(
        choice,
        "log_prealloc_refused",
        options,
        Cache::Page,
        Box::new(|fs, log| {
            Box::pin(async move {
                for i in 0..20u8 {
                    log.append(vec![i; 100]).await.unwrap();
                }
                let st = log.stats();
                assert_eq!(
                    st.preallocation,
                    Preallocation::Stopped {
                        errno: Some(libc::EOPNOTSUPP)
                    },
                    "{st:?}"
                );
                assert_eq!(st.records, 20);
                log.close().await.unwrap();
                assert_eq!(fs.content("w").len(), 20 * (RECORD_HEADER_LEN + 100));
            })
        }),
    );
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
    let (backend, rest) = spec.split_once(':').unwrap();
    let (mode, path) = rest.split_once(':').unwrap();
    let choice = if backend == "uring" {
        BackendChoice::IoUring
    } else {
        BackendChoice::Fallback
    };
    let path = PathBuf::from(path);
    let rt = common::runtime(Flavor::Multi);
    rt.block_on(async move {
        let ctx = common::build_ctx(choice, vec![], |b| b);
        let file = ctx
            .open_file(&path, &rw().direct(mode == "direct").clone())
            .await
            .unwrap();
        let (log, _) = AppendLogOptions::new()
            .preallocate(64 << 10)
            .open(file)
            .await
            .unwrap();
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
    crash_test(choice, false);
}

/// The crash test with the log opened `O_DIRECT` (whole-block writes that
/// rewrite the tail block), recovered through the page cache.
fn crash_after_acknowledged_append_direct(choice: BackendChoice) {
    crash_test(choice, true);
}

fn crash_test(choice: BackendChoice, direct: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal");
    if direct && common::open_direct(&path).is_none() {
        return;
    }
    let mode = if direct { "direct" } else { "buffered" };
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
            .env(CHILD_ENV, format!("{backend}:{mode}:{}", p.display()))
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
            "log crash test ({backend}, {mode}): {} acknowledged of {} recovered records verified, \
             log {end} of {len} bytes",
            acked.len(),
            records.len()
        );
        drop(dir);
    });
}

/// A log in a file opened with `O_DIRECT`: every write is whole blocks
/// (the start of the first block rewritten as it was, the end of the last
/// zero-padded), one at a time in offset order. Concurrent appends of
/// every length, with a group cap small enough that full groups and
/// records above it are written while another write is in flight, recover
/// exactly — through `O_DIRECT` and through the page cache (one format) —
/// and a log reopened with its tail inside a block (written by either)
/// goes on from there. The bytes after the tail, to the end of its block,
/// are zeroes.
///
/// Twice: with a group cap of 2 KiB, and with every record written alone
/// (a cap of 0: most writes wait for their turn) and commits by
/// `fdatasync` (no durable writes).
fn direct_log_round_trip(choice: BackendChoice) {
    let capped = AppendLogOptions::new().max_group_len(2048);
    let alone = AppendLogOptions::new()
        .max_group_len(0)
        .durable_writes(false);
    for (options, gathers) in [(capped, true), (alone, false)] {
        direct_log(choice, options, gathers);
    }
}

fn direct_log(choice: BackendChoice, options: AppendLogOptions, gathers: bool) {
    common::run("log_direct", Flavor::Multi, 120, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        if common::open_direct(&path).is_none() {
            return;
        }
        let direct = rw().direct(true).clone();
        let open = |o: OpenOptions| {
            let path = path.clone();
            async move {
                let ctx = common::build_ctx(choice, vec![], |b| b);
                let file = ctx.open_file(&path, &o).await.unwrap();
                (ctx, file)
            }
        };
        let mut acked = HashMap::new();
        let mut tail = 0;
        // Direct, buffered, direct again: each opening appends after what
        // the one before wrote.
        for (round, o) in [direct.clone(), rw(), direct.clone()]
            .into_iter()
            .enumerate()
        {
            let (_ctx, file) = open(o).await;
            let (log, records) = options.open(file).await.unwrap();
            assert_eq!(
                records.len(),
                acked.len(),
                "round {round}: records recovered"
            );
            assert_eq!(check_contiguous(&records), tail, "round {round}");
            for r in &records {
                assert!(
                    acked.get(&r.offset) == Some(&r.payload),
                    "round {round}: record at {} is not the one acknowledged there",
                    r.offset
                );
            }
            let mut tasks = Vec::new();
            for w in 0..12u64 {
                let log = log.clone();
                tasks.push(tokio::spawn(async move {
                    let mut out = Vec::new();
                    for i in 0..30u64 {
                        // Mostly small; every seventh above the cap.
                        let mut p = payload(w, i + 100 * round as u64);
                        if i % 7 == 3 {
                            p.resize(2500 + (w as usize * 997) % 9000, w as u8);
                        }
                        if i % 2 == 0 {
                            out.push((log.append(p.clone()).await.unwrap(), p));
                        } else {
                            let q = payload(w, i + 5000);
                            let (x, y) =
                                tokio::try_join!(log.append(p.clone()), log.append(q.clone()))
                                    .unwrap();
                            out.push((x, p));
                            out.push((y, q));
                        }
                    }
                    out
                }));
            }
            for t in tasks {
                for (lsn, p) in t.await.unwrap() {
                    assert!(acked.insert(lsn, p).is_none(), "position {lsn} given twice");
                }
            }
            log.close().await.unwrap();
            tail = log.tail();
            let st = log.stats();
            if gathers {
                assert!(st.writes > 1 && st.writes < st.records, "{st:?}");
            } else {
                assert_eq!(st.writes, st.records, "{st:?}");
                assert_eq!(st.durable_writes, 0, "{st:?}");
            }
        }
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() as u64 >= tail, "the file holds the log");
        let block_end = (tail.next_multiple_of(4096) as usize).min(bytes.len());
        assert!(
            bytes[tail as usize..block_end].iter().all(|&b| b == 0),
            "the rest of the last block is zeroes"
        );
        for o in [direct, rw()] {
            let (_ctx, file) = open(o).await;
            let (_log, records) = options.open(file).await.unwrap();
            assert_eq!(records.len(), acked.len());
            assert_eq!(check_contiguous(&records), tail);
            for r in &records {
                assert!(acked.get(&r.offset) == Some(&r.payload));
            }
        }
    });
}

/// The runtime a log was opened on shuts down while 16 tasks append to it
/// (buffered and `O_DIRECT`): the log used from another runtime
/// afterwards answers `append` and `close` — an error or success, never a
/// hang — and what it acknowledged before is recovered.
fn home_runtime_dies_mid_append(choice: BackendChoice) {
    for direct in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        if direct && common::open_direct(&path).is_none() {
            continue;
        }
        let p = path.clone();
        let acked = common::watchdog("log_runtime_dies", 60, move || {
            let home = common::runtime(Flavor::Multi);
            let (ctx, log) = home.block_on(async {
                let ctx = common::build_ctx(choice, vec![], |b| b);
                let file = ctx
                    .open_file(&p, &rw().direct(direct).clone())
                    .await
                    .unwrap();
                let (log, _) = AppendLogOptions::new().open(file).await.unwrap();
                (ctx, log)
            });
            let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            for w in 0..16u64 {
                let (log, acked) = (log.clone(), acked.clone());
                home.spawn(async move {
                    for i in 0.. {
                        let p = payload(w, i);
                        match log.append(p.clone()).await {
                            Ok(at) => acked.lock().unwrap().push((at, p)),
                            Err(_) => break,
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(100));
            drop(home);
            let other = common::runtime(Flavor::Multi);
            other.block_on(async {
                let answered = tokio::time::timeout(Duration::from_secs(20), async {
                    let _ = log.append(b"after".to_vec()).await;
                    let _ = log.close().await;
                })
                .await;
                assert!(answered.is_ok(), "the log hung after its runtime died");
            });
            drop((log, ctx));
            let acked = acked.lock().unwrap().clone();
            acked
        });
        assert!(
            !acked.is_empty(),
            "nothing was appended before the runtime died"
        );
        common::run(
            "log_runtime_dies_recover",
            Flavor::Multi,
            60,
            move || async move {
                let (_ctx, _log, records) = reopen(choice, &path, &AppendLogOptions::new()).await;
                let at: HashMap<u64, &[u8]> =
                    records.iter().map(|r| (r.offset, &r.payload[..])).collect();
                for (lsn, p) in &acked {
                    assert_eq!(
                        at.get(lsn),
                        Some(&&p[..]),
                        "acknowledged record at {lsn} lost"
                    );
                }
                drop(dir);
            },
        );
    }
}
