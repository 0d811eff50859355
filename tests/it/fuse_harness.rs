//! Tests of the fault-injecting FUSE harness itself (`tests/common/fuse.rs`),
//! with plain std I/O (`FileExt::read_at`, i.e. pread(2)) on threads, each
//! under a watchdog. Every test prints `skipped: <reason>` and passes where
//! FUSE is unavailable.

use crate::common;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::fuse::{Fault, FaultFs, FileSpec};
use common::{check_pattern, expected, serial, watchdog};

const MIB: u64 = 1 << 20;
const WATCHDOG_SECS: u64 = 45;

fn mode_name(direct_io: bool) -> &'static str {
    if direct_io {
        "direct_io"
    } else {
        "cached"
    }
}

/// One pread: the bytes it returned or its error.
fn pread(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = file.read_at(&mut buf, offset)?;
    buf.truncate(n);
    Ok(buf)
}

/// pread on its own thread; the handle yields the result and the time taken.
fn pread_thread(
    file: &Arc<File>,
    offset: u64,
    len: usize,
) -> thread::JoinHandle<(io::Result<Vec<u8>>, Duration)> {
    let file = file.clone();
    thread::spawn(move || {
        let t = Instant::now();
        let r = pread(&file, offset, len);
        (r, t.elapsed())
    })
}

/// Wait for `h` at most `within`; `None` if it is still running.
fn join_within<T>(h: thread::JoinHandle<T>, within: Duration) -> Result<T, thread::JoinHandle<T>> {
    let deadline = Instant::now() + within;
    while !h.is_finished() {
        if Instant::now() >= deadline {
            return Err(h);
        }
        thread::sleep(Duration::from_millis(2));
    }
    Ok(h.join().expect("reader thread panicked"))
}

fn files() -> Vec<FileSpec> {
    vec![
        FileSpec::new("big", 8 * MIB, 0xB16),
        FileSpec::new("other", 2 * MIB + 77, 0x07E5),
        FileSpec::new("empty", 0, 3),
        FileSpec::new("tiny", 5, 4),
        FileSpec::new("odd", 3 * 4096 + 1234, 5),
    ]
}

#[test]
fn content_is_the_pattern_in_both_modes() {
    let _g = serial();
    watchdog("content", WATCHDOG_SECS, || {
        for direct_io in [false, true] {
            let specs = files();
            let Some(fs) = FaultFs::mount_or_skip(&specs, direct_io) else {
                return;
            };
            // Directory listing and sizes.
            let mut names: Vec<String> = std::fs::read_dir(fs.root())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            let mut want: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
            want.sort();
            assert_eq!(names, want);
            for s in &specs {
                assert_eq!(std::fs::metadata(fs.path(&s.name)).unwrap().len(), s.len);
            }
            // Whole files in odd-sized chunks, from several threads at once.
            let handles: Vec<_> = specs
                .iter()
                .cloned()
                .map(|s| {
                    let path = fs.path(&s.name);
                    thread::spawn(move || {
                        let f = File::open(&path).unwrap();
                        for chunk in [4096usize, 65536 + 123, 1 << 20] {
                            let mut off = 0u64;
                            loop {
                                let got = pread(&f, off, chunk).unwrap();
                                assert_eq!(got, expected(s.seed, s.len, off, chunk), "{}", s.name);
                                if got.is_empty() {
                                    break;
                                }
                                off += got.len() as u64;
                            }
                            assert_eq!(off, s.len, "{}", s.name);
                        }
                        // Unaligned reads, and reads past EOF.
                        for (off, len) in [(1u64, 1usize), (4095, 2), (s.len / 2 + 3, 9999)] {
                            let got = pread(&f, off, len).unwrap();
                            assert_eq!(got, expected(s.seed, s.len, off, len), "{}", s.name);
                        }
                        assert!(pread(&f, s.len + 10, 100).unwrap().is_empty());
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert!(fs.reads_served() > 0);
            println!(
                "{}: {} read requests for the content checks",
                mode_name(direct_io),
                fs.reads_served()
            );
        }
    });
}

#[test]
fn errno_faults_give_that_errno() {
    let _g = serial();
    watchdog("errno", WATCHDOG_SECS, || {
        for direct_io in [false, true] {
            let Some(fs) = FaultFs::mount_or_skip(&files(), direct_io) else {
                return;
            };
            let f = File::open(fs.path("big")).unwrap();
            fs.set_fault("big", MIB..MIB + 4096, Fault::Errno(libc::EIO));
            fs.set_fault(
                "big",
                3 * MIB..3 * MIB + 4096,
                Fault::Errno(libc::ETIMEDOUT),
            );
            // Cached mode: the kernel sends the (failing) readahead request
            // and then retries the page once with a synchronous single-page
            // read, so the file system sees each failing request twice; the
            // caller gets the errno either way. direct_io: one request.
            let e = pread(&f, MIB, 4096).unwrap_err();
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EIO),
                "{}",
                mode_name(direct_io)
            );
            let e = pread(&f, 3 * MIB + 100, 10).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT));
            // Far from the faults: fine.
            let got = pread(&f, 6 * MIB, 4096).unwrap();
            check_pattern(0xB16, 6 * MIB, &got).unwrap();
            // Cleared: the same range reads fine.
            fs.clear_faults();
            let got = pread(&f, MIB, 4096).unwrap();
            assert_eq!(got.len(), 4096);
            check_pattern(0xB16, MIB, &got).unwrap();
            let reqs: Vec<(u64, u32, Option<Fault>)> = fs
                .read_log()
                .into_iter()
                .map(|r| (r.offset, r.size, r.fault))
                .collect();
            println!("{}: requests {reqs:?}", mode_name(direct_io));
            let faulted = reqs.iter().filter(|r| r.2.is_some()).count();
            assert_eq!(faulted, if direct_io { 2 } else { 4 }, "{reqs:?}");
        }
    });
}

// Short(n): the file system answers a read request with only its first n
// bytes. pread(2) itself never retries: it returns what the file system's
// read returned. What the caller sees depends on the cache mode:
//
// * direct_io: every pread is one request (per 1 MiB); a short reply ends the
//   pread with that many bytes (a 2 MiB pread whose second request is short
//   returns the first request's bytes + n). The file size is untouched and the next pread asks
//   the file system again.
// * cached: the kernel does not retry either; it takes the short reply as
//   end of file. Observed on 6.18: pread(64 KiB @ 1 MiB) -> 1000 bytes, and
//   the inode's size is lowered to 1 MiB + 1000 (fstat shows it), so every
//   later read past that point returns 0 (EOF) even after the fault is
//   cleared, for as long as the attributes stay cached (TTL 1 h here, i.e.
//   for the life of the mount). Short(0) makes the offset itself EOF.
#[test]
fn short_faults_return_short_counts_with_correct_bytes() {
    let _g = serial();
    watchdog("short", WATCHDOG_SECS, || {
        for direct_io in [false, true] {
            let mode = mode_name(direct_io);
            let Some(fs) = FaultFs::mount_or_skip(&files(), direct_io) else {
                return;
            };
            let f = File::open(fs.path("big")).unwrap();
            fs.set_fault("big", MIB..2 * MIB, Fault::Short(1000));
            let got = pread(&f, MIB, 65536).unwrap();
            let size_after = f.metadata().unwrap().len();
            println!(
                "{mode}: pread(64 KiB @ 1 MiB), Short(1000) -> {} bytes; fstat size now {size_after}; requests {:?}",
                got.len(),
                fs.read_log()
            );
            assert!(
                !got.is_empty() && got.len() <= 1000,
                "{mode}: {} bytes",
                got.len()
            );
            check_pattern(0xB16, MIB, &got).unwrap();
            fs.clear_faults();
            let later = pread(&f, 6 * MIB, 4096).unwrap();
            println!(
                "{mode}: after clear_faults, pread(4 KiB @ 6 MiB) -> {} bytes",
                later.len()
            );
            check_pattern(0xB16, 6 * MIB, &later).unwrap();
            if direct_io {
                assert_eq!(got.len(), 1000);
                assert_eq!(size_after, 8 * MIB);
                assert_eq!(later.len(), 4096);
                // A 2 MiB pread is two requests; the short second one ends it.
                fs.set_fault("big", 5 * MIB..6 * MIB, Fault::Short(1000));
                fs.clear_read_log();
                let got = pread(&f, 4 * MIB, 2 << 20).unwrap();
                let reqs: Vec<(u64, u32)> =
                    fs.read_log().iter().map(|r| (r.offset, r.size)).collect();
                println!(
                    "{mode}: pread(2 MiB @ 4 MiB), Short(1000) on the second MiB -> {} bytes; requests {reqs:?}",
                    got.len()
                );
                // The split follows the user buffer's pages: with a buffer
                // that is not page-aligned the first request is 1 MiB minus
                // the misalignment, and the second starts that much before
                // 5 MiB (so it overlaps the fault).
                assert_eq!(reqs.len(), 2, "{reqs:?}");
                assert_eq!(reqs[0].0, 4 * MIB);
                assert_eq!(reqs[1].0, 4 * MIB + u64::from(reqs[0].1));
                assert_eq!(got.len() as u64, u64::from(reqs[0].1) + 1000);
                check_pattern(0xB16, 4 * MIB, &got).unwrap();
            }
            // Short(0) on another file.
            let o = File::open(fs.path("other")).unwrap();
            fs.set_fault("other", MIB..MIB + 4096, Fault::Short(0));
            let got = pread(&o, MIB, 4096).unwrap();
            let size_after = o.metadata().unwrap().len();
            println!(
                "{mode}: pread(4 KiB @ 1 MiB), Short(0) -> {} bytes; fstat size now {size_after}",
                got.len()
            );
            assert!(got.is_empty());
        }
    });
}

#[test]
fn delay_delays_only_the_faulted_range() {
    let _g = serial();
    watchdog("delay", WATCHDOG_SECS, || {
        const DELAY: Duration = Duration::from_millis(400);
        for direct_io in [false, true] {
            let Some(fs) = FaultFs::mount_or_skip(&files(), direct_io) else {
                return;
            };
            let big = Arc::new(File::open(fs.path("big")).unwrap());
            fs.set_fault("big", MIB..2 * MIB, Fault::Delay(DELAY));
            // 32 delayed reads at once: they overlap in time (about one
            // DELAY in all), so the timer does not serialise them.
            let t = Instant::now();
            let slow: Vec<_> = (0..32)
                .map(|i| pread_thread(&big, MIB + i * 32 * 1024, 4096))
                .collect();
            // Meanwhile other ranges of the same file answer at once.
            thread::sleep(Duration::from_millis(50));
            let t_fast = Instant::now();
            let got = pread(&big, 5 * MIB, 4096).unwrap();
            let fast = t_fast.elapsed();
            check_pattern(0xB16, 5 * MIB, &got).unwrap();
            for (i, h) in slow.into_iter().enumerate() {
                let (r, took) = h.join().unwrap();
                let got = r.unwrap();
                assert_eq!(got.len(), 4096);
                check_pattern(0xB16, MIB + i as u64 * 32 * 1024, &got).unwrap();
                assert!(took >= DELAY, "read {i} took only {took:?}");
            }
            let all = t.elapsed();
            println!(
                "{}: 32 delayed reads done in {all:?}; undelayed read meanwhile took {fast:?}",
                mode_name(direct_io)
            );
            assert!(fast < DELAY / 2, "undelayed read took {fast:?}");
            assert!(all < DELAY * 4, "delayed reads were serialised: {all:?}");
        }
    });
}

/// Hang the second MiB of `big` and check: 64 distinct reads of it hang at
/// once while other ranges and other files still answer; release_hangs
/// answers all of them with EIO; later reads of the range fail at once until
/// set_fault re-arms the hang.
fn hang_case(direct_io: bool) {
    let mode = mode_name(direct_io);
    let Some(fs) = FaultFs::mount_or_skip(&files(), direct_io) else {
        return;
    };
    let big = Arc::new(File::open(fs.path("big")).unwrap());
    let other = File::open(fs.path("other")).unwrap();
    fs.set_fault("big", MIB..2 * MIB, Fault::Hang);
    let hung: Vec<_> = (0..64)
        .map(|i| pread_thread(&big, MIB + i * 16 * 1024, 4096))
        .collect();
    // direct_io: one request per pread. Cached: one page-sized request per
    // pread as well for these scattered reads (no readahead on a random
    // read), though the kernel is free to merge them.
    let want = if direct_io { 64 } else { 1 };
    let n = fs.wait_hung(want, Duration::from_secs(10));
    thread::sleep(Duration::from_millis(200));
    let n_settled = fs.reads_hung_now();
    println!("{mode}: {n} hung requests seen, {n_settled} after 200 ms more");
    assert!(n >= want, "{mode}: only {n} reads hung");
    if direct_io {
        assert_eq!(n_settled, 64);
    }
    // Outside the range and in other files: answered.
    // (The pages right next to the range too: these scattered reads are
    // "random" to the kernel, so it asks for the requested pages only.)
    for (off, len) in [
        (0u64, 4096usize),
        (MIB - 4096, 4096),
        (2 * MIB, 4096),
        (4 * MIB, 65536),
        (7 * MIB + 5, 100_000),
    ] {
        let t = Instant::now();
        let got = pread(&big, off, len).unwrap();
        assert_eq!(got, expected(0xB16, 8 * MIB, off, len), "{mode} @ {off}");
        assert!(t.elapsed() < Duration::from_secs(2));
    }
    let got = pread(&other, MIB, 4096).unwrap();
    check_pattern(0x07E5, MIB, &got).unwrap();
    // Still hung.
    assert!(
        hung.iter().all(|h| !h.is_finished()),
        "{mode}: a hung read returned"
    );
    assert_eq!(fs.reads_hung_now(), n_settled);
    // Release: everything answers, with EIO.
    fs.clear_read_log();
    let t = Instant::now();
    fs.release_hangs();
    for h in hung {
        let (r, _) = join_within(h, Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{mode}: read still hung after release_hangs"));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO), "{mode}");
    }
    // Cached: each failed readahead is retried once by the kernel with a
    // single-page read, which now fails at once (EIO) instead of hanging.
    let retries = fs.read_log().len();
    println!(
        "{mode}: all 64 released within {:?}; {retries} retry requests from the kernel",
        t.elapsed()
    );
    if direct_io {
        assert_eq!(retries, 0);
    }
    assert_eq!(fs.reads_hung_now(), 0);
    // After release: the range fails at once instead of hanging.
    let e = pread(&big, MIB + 8192, 4096).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    // set_fault re-arms the hang; dropping the file system releases it.
    fs.set_fault("big", MIB..2 * MIB, Fault::Hang);
    let h = pread_thread(&big, MIB + 4096 * 3, 4096);
    assert_eq!(fs.wait_hung(1, Duration::from_secs(10)), 1);
    let h = join_within(h, Duration::from_millis(200)).expect_err("re-armed hang returned");
    drop(big);
    drop(other);
    let t = Instant::now();
    drop(fs);
    let dropped = t.elapsed();
    let (r, _) =
        join_within(h, Duration::from_secs(5)).unwrap_or_else(|_| panic!("hung after drop"));
    // The harness answers hung requests with EIO as it unmounts; if the
    // unmount aborts the connection first, the kernel says ECONNABORTED
    // (seen once under load). Either way the read is released with an error.
    let e = r.unwrap_err();
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::EIO | libc::ECONNABORTED | libc::ENOTCONN)
        ),
        "{mode}: {e}"
    );
    println!("{mode}: drop with a hung read took {dropped:?}");
}

#[test]
fn hang_hangs_only_the_faulted_range_cached() {
    let _g = serial();
    watchdog("hang-cached", WATCHDOG_SECS, || hang_case(false));
}

#[test]
fn hang_hangs_only_the_faulted_range_direct() {
    let _g = serial();
    watchdog("hang-direct", WATCHDOG_SECS, || hang_case(true));
}

#[test]
fn mount_and_unmount_twenty_times() {
    let _g = serial();
    watchdog("remount", WATCHDOG_SECS, || {
        let t = Instant::now();
        let mut roots = Vec::new();
        for i in 0..20u64 {
            let specs = [FileSpec::new("f", 100_000 + i, i)];
            let Some(fs) = FaultFs::mount_or_skip(&specs, i % 2 == 0) else {
                return;
            };
            let f = File::open(fs.path("f")).unwrap();
            let got = pread(&f, 99_000, 4096).unwrap();
            assert_eq!(got, expected(i, 100_000 + i, 99_000, 4096));
            roots.push(fs.root().to_path_buf());
            drop(f);
            drop(fs);
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for r in &roots {
            let r = r.to_str().unwrap();
            assert!(!mountinfo.contains(r), "{r} still mounted");
            assert!(!std::path::Path::new(r).exists(), "{r} left behind");
        }
        println!("20 mount/read/unmount cycles took {:?}", t.elapsed());
    });
}

/// Dropping the file system while a file on it is still open cannot unmount
/// it plainly (EBUSY): Drop detaches it lazily and returns at once; the open
/// file keeps working until it is closed.
#[test]
fn drop_with_a_file_still_open_does_not_hang() {
    let _g = serial();
    watchdog("drop-open", WATCHDOG_SECS, || {
        for direct_io in [false, true] {
            let mode = mode_name(direct_io);
            let Some(fs) = FaultFs::mount_or_skip(&files(), direct_io) else {
                return;
            };
            let root = fs.root().to_path_buf();
            let f = File::open(fs.path("odd")).unwrap();
            let t = Instant::now();
            drop(fs);
            let took = t.elapsed();
            println!("{mode}: drop with an open file took {took:?}");
            assert!(took < Duration::from_secs(2), "{mode}: drop took {took:?}");
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(
                !mountinfo.contains(root.to_str().unwrap()),
                "{mode}: still mounted"
            );
            // The detached file still reads (session threads still serve it),
            // unless fusectl is mounted: then Drop aborted the connection.
            match pread(&f, 4096, 8192) {
                Ok(got) => assert_eq!(got, expected(5, 3 * 4096 + 1234, 4096, 8192), "{mode}"),
                Err(e) => {
                    let fusectl = std::fs::read_to_string("/proc/self/mountinfo")
                        .unwrap()
                        .contains("/sys/fs/fuse/connections");
                    assert!(
                        fusectl && e.raw_os_error() == Some(libc::ENOTCONN),
                        "{mode}: read of the detached file: {e}"
                    );
                }
            }
            drop(f);
        }
    });
}

/// The report a timed-out test prints names every thread of the process
/// (here: a sleeping thread with a name of its own).
#[test]
fn threads_report_names_the_threads() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (up, is_up) = std::sync::mpsc::channel::<()>();
    let sleeper = thread::Builder::new()
        .name("report-sleeper".into())
        .spawn(move || {
            up.send(()).unwrap();
            rx.recv()
        })
        .unwrap();
    // Named by now: std names a thread before it runs its closure.
    is_up.recv().unwrap();
    let report = common::threads_report();
    drop(tx);
    sleeper.join().unwrap().unwrap_err();
    assert!(
        report.contains("report-sleeper in "),
        "no line for the sleeping thread:\n{report}"
    );
}
