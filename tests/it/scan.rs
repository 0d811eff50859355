//! Sequential scans (`ScanOptions::scan`): order and content for many sizes
//! and ranges, O_DIRECT, short reads mid-file and errors (FUSE), dropping a
//! scan with reads in flight, a consumer holding every chunk (an error by
//! default, waiting with `wait_for_dropped_chunks`), chunks dropped on
//! other threads, bad ids at the call, buffer reuse, both backends. Every
//! test runs under a watchdog.

use crate::common;

use std::fs::File;
use std::io;
use std::ops::{Bound, Range};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use common::fuse::{Fault, FaultFs, FileSpec};
use common::{check_pattern, Flavor, TestFile};
use futures::StreamExt;
use uring_positioned_io::{BackendChoice, Chunk, FileId, ScanOptions, UringContext};

const CHUNK: usize = 64 << 10;

/// Scans `range` of `fid` and checks that the chunks are contiguous, in
/// order, with the pattern's bytes, and cover `range` clamped to the file.
/// Returns the number of chunks.
async fn check_scan(
    ctx: &UringContext,
    fid: u32,
    file: &TestFile,
    opts: ScanOptions,
    range: Range<u64>,
) -> usize {
    let mut scan = opts
        .scan(ctx, fid, range.clone())
        .unwrap_or_else(|e| panic!("scan {range:?}: {e}"));
    let mut at = range.start;
    let mut chunks = 0;
    while let Some(chunk) = scan.next().await {
        let chunk = chunk.unwrap_or_else(|e| panic!("scan {range:?} @ {at}: {e}"));
        assert_eq!(chunk.offset(), at, "chunks out of order in {range:?}");
        assert!(!chunk.is_empty(), "empty chunk @ {at} in {range:?}");
        check_pattern(file.seed, at, &chunk).unwrap_or_else(|e| panic!("{range:?}: {e}"));
        at += chunk.len() as u64;
        chunks += 1;
    }
    assert_eq!(
        at,
        range.end.min(file.len).max(range.start),
        "scan of {range:?} of a {}-byte file ended early or late",
        file.len
    );
    assert!(
        scan.next().await.is_none(),
        "a finished scan stays finished"
    );
    assert!(scan.buffers_allocated() <= opts_in_flight(opts));
    chunks
}

fn opts_in_flight(opts: ScanOptions) -> usize {
    // ScanOptions has no getters; its Debug output names the field.
    let s = format!("{opts:?}");
    let v = s.split("in_flight: ").nth(1).expect("in_flight in Debug");
    v.split([',', ' ', '}']).next().unwrap().parse().unwrap()
}

const SIZES: [u64; 11] = [
    0,
    1,
    4095,
    4096,
    4097,
    CHUNK as u64 - 1,
    CHUNK as u64,
    CHUNK as u64 + 1,
    3 * CHUNK as u64 + 4096,
    (3 << 20) + 12_345,
    (5 << 20) + 1,
];

fn sizes_in_order(choice: BackendChoice) {
    let set = common::FileSet::new(0x5ca1, &SIZES);
    common::run("sizes_in_order", Flavor::Multi, 40, move || async move {
        let ctx = common::default_ctx(choice, set.open_all());
        for (fid, file) in set.files.iter().enumerate() {
            for (in_flight, align) in [(1, 4096), (4, 4096), (16, 512), (3, 1)] {
                let opts = ScanOptions::new()
                    .chunk_size(CHUNK)
                    .in_flight(in_flight)
                    .align(align);
                let n = check_scan(&ctx, fid as u32, file, opts, 0..u64::MAX).await;
                assert_eq!(n as u64, file.len.div_ceil(CHUNK as u64), "{file:?}");
                // Known end: exactly the file.
                check_scan(&ctx, fid as u32, file, opts, 0..file.len).await;
            }
        }
        drop(set);
    });
}

fn ranges_mid_chunk(choice: BackendChoice) {
    let set = common::FileSet::new(0x7a9e, &[(2 << 20) + 777]);
    common::run("ranges_mid_chunk", Flavor::Multi, 40, move || async move {
        let file = &set.files[0];
        let ctx = common::default_ctx(choice, set.open_all());
        let c = CHUNK as u64;
        let mut ranges = vec![
            1..c - 1,
            c - 1..c + 1,
            100..3 * c + 5,
            c..2 * c,
            5000..5000,
            file.len - 10..file.len,
            file.len - 10..file.len + 5000,
            file.len..file.len + 1,
            file.len + 4096..u64::MAX,
            4097..file.len - 4097,
        ];
        let mut rng = common::Rng::new(0x11);
        for _ in 0..30 {
            let a = rng.below(file.len + 100);
            let b = a + rng.below(5 * c);
            ranges.push(a..b);
        }
        for r in ranges {
            for (in_flight, align) in [(2, 4096), (5, 1)] {
                let opts = ScanOptions::new()
                    .chunk_size(CHUNK)
                    .in_flight(in_flight)
                    .align(align);
                check_scan(&ctx, 0, file, opts, r.clone()).await;
            }
        }
        drop(set);
    });
}

fn o_direct(choice: BackendChoice) {
    let set = common::FileSet::new(
        0xd12ec7,
        &[(1 << 20) + 8192 + 123, 4096, 100, (9 << 20) + 4096 + 77],
    );
    set.sync_all();
    let open = |f: &TestFile| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&f.path)
    };
    let files: Vec<File> = match set.files.iter().map(open).collect() {
        Ok(f) => f,
        Err(e) => {
            println!(
                "skipped: the file system under {} refuses O_DIRECT: {e}",
                set.dir.path().display()
            );
            return;
        }
    };
    common::run("o_direct", Flavor::Multi, 30, move || async move {
        let ctx = common::default_ctx(choice, files);
        for (fid, file) in set.files.iter().enumerate() {
            let len = file.len;
            for r in [
                0..u64::MAX,
                0..len,
                1..len - 1,
                4095.min(len)..len,
                len / 2..len + 9,
            ] {
                for in_flight in [1, 4] {
                    let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(in_flight);
                    check_scan(&ctx, fid as u32, file, opts, r.clone()).await;
                }
            }
        }
        // Defaults on an O_DIRECT file are 2 MiB chunks (huge-page
        // buffers) × 4; on the same file opened buffered, 1 MiB × 8. The
        // 9 MiB file has more chunks than either, so the scan allocates
        // all of its buffers; a caller's in_flight is kept on both.
        let big = &set.files[3];
        let direct = ctx.register_file(open(big).unwrap()).unwrap();
        let buffered = ctx.register_file(File::open(&big.path).unwrap()).unwrap();
        for (fid, chunk, opts, buffers) in [
            (direct, 2 << 20, ScanOptions::new(), 4),
            (buffered, 1 << 20, ScanOptions::new(), 8),
            (direct, 2 << 20, ScanOptions::new().in_flight(2), 2),
            (buffered, 1 << 20, ScanOptions::new().in_flight(3), 3),
        ] {
            let mut scan = opts.scan(&ctx, fid, ..).unwrap();
            let mut at = 0;
            while let Some(c) = scan.next().await {
                let c = c.unwrap();
                assert_eq!(c.offset(), at);
                assert_eq!(c.len() as u64, (big.len - at).min(chunk), "{fid:?} @ {at}");
                check_pattern(big.seed, at, &c).unwrap();
                at += c.len() as u64;
            }
            assert_eq!(at, big.len);
            assert_eq!(scan.buffers_allocated(), buffers, "{fid:?}, {opts:?}");
        }
        // Dropped with huge-page reads in flight, the first chunk kept: the
        // chunk stays valid, and every read comes back.
        let mut scan = ScanOptions::new().scan(&ctx, direct, ..).unwrap();
        let first = scan.next().await.unwrap().unwrap();
        drop(scan);
        check_pattern(big.seed, 0, &first).unwrap();
        drop(first);
        let n = common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await;
        assert_eq!(n, 0, "reads of a dropped O_DIRECT scan still in flight");
        drop(set);
    });
}

fn zero_length_and_empty(choice: BackendChoice) {
    let set = common::FileSet::new(0x2e20, &[0, 10_000]);
    common::run("zero_length", Flavor::Current, 20, move || async move {
        let ctx = common::default_ctx(choice, set.open_all());
        for (fid, r) in [
            (0u32, 0..u64::MAX),
            (0, 0..0),
            (1, 5..5),
            (1, 20_000..30_000),
        ] {
            let mut scan = ScanOptions::new().scan(&ctx, fid, r.clone()).unwrap();
            assert!(scan.next().await.is_none(), "{fid} {r:?}");
            assert!(scan.next().await.is_none(), "{fid} {r:?}");
        }
        drop(set);
    });
}

/// Dropping a scan with reads in the kernel: the context keeps working and
/// nothing stays in flight.
fn drop_mid_scan(choice: BackendChoice) {
    let set = common::FileSet::new(0xd20b, &[16 << 20]);
    set.sync_all();
    common::run("drop_mid_scan", Flavor::Multi, 30, move || async move {
        let file = set.files[0].clone();
        let ctx = common::default_ctx(choice, set.open_all());
        for (take, in_flight) in [(0, 16), (1, 16), (3, 8), (1, 1)] {
            file.drop_cache();
            let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(in_flight);
            let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
            let mut kept = Vec::new();
            if take == 0 {
                // Polled once: reads issued, then dropped.
                let _ = common::poll_once(std::pin::Pin::new(&mut scan.next())).await;
            }
            for _ in 0..take {
                kept.push(scan.next().await.unwrap().unwrap());
            }
            drop(scan);
            // Chunks outlive the stream.
            for (i, c) in kept.iter().enumerate() {
                assert_eq!(c.offset(), (i * CHUNK) as u64);
                check_pattern(file.seed, c.offset(), c).unwrap();
            }
            drop(kept);
            let n = common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await;
            assert_eq!(n, 0, "reads of a dropped scan still in flight");
            common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
        }
        drop(set);
    });
}

/// Dropping a scan whose read-ahead is on the blocking pool (the consumer
/// is a task, the file cached): the chunks kept stay intact, the pool's
/// reads finish into buffers nobody sees, every slot comes back, and the
/// file still reads right. Both flavours (on `current_thread`, `block_on`
/// itself takes this route).
fn drop_mid_scan_on_the_blocking_pool(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        let set = common::FileSet::new(0xd2b1, &[24 << 20]);
        common::run(
            "drop_mid_scan_on_the_blocking_pool",
            flavor,
            30,
            move || async move {
                let file = set.files[0].clone();
                let ctx = common::default_ctx(choice, set.open_all());
                // Cache it.
                common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
                for take in [4usize, 5, 9, 17] {
                    let (ctx2, file2) = (ctx.clone(), file.clone());
                    tokio::spawn(async move {
                        let opts = ScanOptions::new().chunk_size(1 << 20).in_flight(8);
                        let mut scan = opts.scan(&ctx2, 0u32, ..).unwrap();
                        let mut kept = Vec::new();
                        for i in 0..take {
                            let c = scan.next().await.unwrap().unwrap();
                            assert_eq!(c.offset(), (i << 20) as u64);
                            if i % 3 == 0 {
                                kept.push(c);
                            }
                        }
                        // Pool reads in flight (8 buffers: some kept, the rest
                        // being read).
                        drop(scan);
                        tokio::task::yield_now().await;
                        for c in &kept {
                            check_pattern(file2.seed, c.offset(), c).unwrap();
                        }
                    })
                    .await
                    .unwrap();
                    let n = common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await;
                    assert_eq!(n, 0, "reads of a dropped scan still in flight");
                }
                common::verify_whole_file(&ctx, 0, &file, 1 << 20).await;
                drop(set);
            },
        );
    }
}

/// A consumer that keeps every chunk, with `wait_for_dropped_chunks`: the
/// stream stops reading and waits; dropping one chunk lets it go on.
fn holding_chunks(choice: BackendChoice) {
    let set = common::FileSet::new(0x401d, &[10 * CHUNK as u64 + 99]);
    common::run("holding_chunks", Flavor::Multi, 30, move || async move {
        let file = set.files[0].clone();
        let ctx = common::default_ctx(choice, set.open_all());
        let opts = ScanOptions::new()
            .chunk_size(CHUNK)
            .in_flight(3)
            .wait_for_dropped_chunks(true);
        let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
        let mut held: Vec<Chunk> = Vec::new();
        for _ in 0..3 {
            held.push(scan.next().await.unwrap().unwrap());
        }
        let stats = ctx.stats();
        // Every buffer is with the consumer: the stream must wait.
        let waited = tokio::time::timeout(Duration::from_millis(200), scan.next()).await;
        assert!(
            waited.is_err(),
            "the scan yielded a 4th chunk with 3 buffers out"
        );
        assert_eq!(
            ctx.stats().submitted,
            stats.submitted,
            "no read without a buffer"
        );
        assert_eq!(scan.buffers_allocated(), 3);
        // The buffers share one allocation: the chunks held at once must
        // not overlap.
        let mut spans: Vec<(usize, usize)> = held
            .iter()
            .map(|c| (c.as_ptr() as usize, c.as_ptr() as usize + c.len()))
            .collect();
        spans.sort_unstable();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "chunks held at once overlap: {spans:?}"
        );
        let mut at = 0;
        let mut n = 0;
        loop {
            // Give one back (from the front, in order); the next one comes.
            if !held.is_empty() {
                let c = held.remove(0);
                assert_eq!(c.offset(), at);
                check_pattern(file.seed, at, &c).unwrap();
                at += c.len() as u64;
                n += 1;
            }
            match tokio::time::timeout(Duration::from_secs(5), scan.next()).await {
                Ok(Some(c)) => held.push(c.unwrap()),
                Ok(None) => break,
                Err(_) => panic!("the scan did not wake after a chunk was dropped"),
            }
        }
        for c in held.drain(..) {
            assert_eq!(c.offset(), at);
            check_pattern(file.seed, at, &c).unwrap();
            at += c.len() as u64;
            n += 1;
        }
        assert_eq!((at, n), (file.len, 11));
        assert_eq!(scan.buffers_allocated(), 3);
        drop(set);
    });
}

/// The error a consumer holding every buffer gets: names the count and
/// the ways out.
fn assert_all_held(e: &io::Error, buffers: usize) {
    assert_eq!(e.kind(), io::ErrorKind::ResourceBusy, "{e}");
    let msg = e.to_string();
    for what in [
        &format!("all {buffers} buffers are held by chunks not dropped yet")[..],
        "in_flight",
        "wait_for_dropped_chunks(true)",
    ] {
        assert!(msg.contains(what), "does not say `{what}`: {msg}");
    }
}

/// Collects `scan` under a timeout (a hang fails here, not at the
/// watchdog): the chunks it yielded (checked) and the error, if any, which
/// must be the last item.
async fn collect_checked(
    scan: uring_positioned_io::Scan<'_>,
    seed: u64,
    mut at: u64,
) -> (Vec<Chunk>, Option<io::Error>) {
    let items: Vec<io::Result<Chunk>> =
        tokio::time::timeout(Duration::from_secs(10), scan.collect())
            .await
            .expect("collect() of a scan whose consumer holds every chunk hung");
    let mut chunks = Vec::new();
    let mut err = None;
    for item in items {
        assert!(err.is_none(), "an item after the error");
        match item {
            Ok(c) => {
                assert_eq!(c.offset(), at);
                check_pattern(seed, at, &c).unwrap();
                at += c.len() as u64;
                chunks.push(c);
            }
            Err(e) => err = Some(e),
        }
    }
    (chunks, err)
}

/// `collect()` holds every chunk. With 4 buffers over 16 chunks it gets the
/// first 4 and then an error saying why (it used to wait forever); the
/// next `next()` goes on once a chunk is dropped, and ends the stream if
/// none was. A range that ends right after the chunks held (at end of file
/// or of the range) ends without the error.
fn collect_holding_every_chunk(choice: BackendChoice) {
    let c = CHUNK as u64;
    let set = common::FileSet::new(0xc011, &[16 * c, 4 * c, 16 * c + 1]);
    common::run(
        "collect_holding_every_chunk",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::default_ctx(choice, set.open_all());
            let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(4);
            let seed = set.files[0].seed;
            let (chunks, err) = collect_checked(opts.scan(&ctx, 0u32, ..).unwrap(), seed, 0).await;
            assert_eq!(chunks.len(), 4);
            assert_all_held(&err.expect("the error after 4 chunks"), 4);
            // A range of 16 chunks; 1 buffer; a file of 16 chunks and a byte.
            for (fid, opts, range, n) in [
                (0u32, opts, 0..16 * c, 4),
                (0, opts.in_flight(1), 0..u64::MAX, 1),
                (2, opts.in_flight(16), 0..u64::MAX, 16),
                (2, opts.in_flight(3), 100..10 * c, 3),
            ] {
                let scan = opts.scan(&ctx, fid, range.clone()).unwrap();
                let seed = set.files[fid as usize].seed;
                let (chunks, err) = collect_checked(scan, seed, range.start).await;
                assert_eq!(chunks.len(), n, "{fid} {range:?}");
                assert_all_held(&err.expect("the error"), n);
            }
            // Ends right after the chunks held: no error. A file of exactly
            // 4 chunks (whole reads: only a read at its end tells) and
            // ranges of exactly 4 chunks.
            for (fid, range) in [(1u32, 0..u64::MAX), (1, 0..4 * c), (0, 3 * c..7 * c)] {
                let scan = opts.scan(&ctx, fid, range.clone()).unwrap();
                let seed = set.files[fid as usize].seed;
                let (chunks, err) = collect_checked(scan, seed, range.start).await;
                assert!(err.is_none(), "{fid} {range:?}: {err:?}");
                assert_eq!(chunks.len(), 4, "{fid} {range:?}");
            }

            // After the error: a dropped chunk lets the scan go on, in order.
            let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
            let mut held = Vec::new();
            for _ in 0..4 {
                held.push(scan.next().await.unwrap().unwrap());
            }
            assert_all_held(&scan.next().await.unwrap().unwrap_err(), 4);
            held.remove(0);
            let next = scan.next().await.unwrap().unwrap();
            assert_eq!(next.offset(), 4 * c);
            check_pattern(seed, 4 * c, &next).unwrap();
            held.push(next);
            // Told again; nothing dropped: the stream ends, for good.
            assert_all_held(&scan.next().await.unwrap().unwrap_err(), 4);
            assert!(scan.next().await.is_none(), "still holding every chunk");
            held.clear();
            assert!(scan.next().await.is_none(), "an ended stream stays ended");
            drop(scan);
            assert_eq!(
                common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await,
                0
            );
            drop(set);
        },
    );
}

/// With `wait_for_dropped_chunks(true)`, a consumer that hands every chunk
/// to another task or thread (which drops it later) gets every chunk, in
/// order, with no error: `next()` waits for the drops.
fn pipeline_waits_for_dropped_chunks(choice: BackendChoice) {
    let set = common::FileSet::new(0x919e, &[40 * CHUNK as u64 + 5]);
    common::run(
        "pipeline_waits_for_dropped_chunks",
        Flavor::Multi,
        60,
        move || async move {
            let file = set.files[0].clone();
            let ctx = common::default_ctx(choice, set.open_all());
            for (in_flight, on_thread) in [(1, false), (4, false), (4, true), (2, true)] {
                let opts = ScanOptions::new()
                    .chunk_size(CHUNK)
                    .in_flight(in_flight)
                    .wait_for_dropped_chunks(true);
                let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Chunk>();
                let seed = file.seed;
                // Checks the chunks in order and drops each a little later.
                let check = move |c: Chunk, at: &mut u64| {
                    assert_eq!(c.offset(), *at);
                    check_pattern(seed, *at, &c).unwrap();
                    *at += c.len() as u64;
                    c
                };
                let sink = if on_thread {
                    tokio::task::spawn_blocking(move || {
                        let mut at = 0;
                        while let Some(c) = rx.blocking_recv() {
                            let c = check(c, &mut at);
                            std::thread::sleep(Duration::from_millis(1));
                            drop(c);
                        }
                        at
                    })
                } else {
                    tokio::spawn(async move {
                        let mut at = 0;
                        while let Some(c) = rx.recv().await {
                            let c = check(c, &mut at);
                            tokio::task::yield_now().await;
                            drop(c);
                        }
                        at
                    })
                };
                while let Some(c) = scan.next().await {
                    tx.send(c.expect("no error in a pipeline")).unwrap();
                }
                drop(tx);
                assert_eq!(sink.await.unwrap(), file.len);
                assert!(scan.buffers_allocated() <= in_flight);
            }
            drop(set);
        },
    );
}

/// Chunks dropped on other threads while `next()` runs: without the
/// opt-in, a consumer that never has more than `in_flight − 1` chunks out
/// (counting a chunk until its drop is acknowledged) never gets the
/// error; with it, a consumer handing every chunk out never misses a
/// wake-up. Bounded: a few hundred chunks per round.
fn concurrent_drops(choice: BackendChoice) {
    let set = common::FileSet::new(0xc0d2, &[(256 * CHUNK as u64) + 77]);
    common::run("concurrent_drops", Flavor::Multi, 120, move || async move {
        let file = set.files[0].clone();
        let ctx = common::default_ctx(choice, set.open_all());
        for (round, (in_flight, wait)) in [(2, false), (4, false), (1, true), (2, true), (4, true)]
            .into_iter()
            .enumerate()
        {
            let opts = ScanOptions::new()
                .chunk_size(CHUNK)
                .in_flight(in_flight)
                .wait_for_dropped_chunks(wait);
            let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
            let (tx, rx) = std::sync::mpsc::channel::<Chunk>();
            let (ack, mut acks) = tokio::sync::mpsc::unbounded_channel::<()>();
            // Drops each chunk after a short random spin, then acknowledges.
            let dropper = std::thread::spawn(move || {
                let mut rng = common::Rng::new(0xd0 + round as u64);
                for c in rx {
                    for _ in 0..rng.below(20_000) {
                        std::hint::spin_loop();
                    }
                    drop(c);
                    let _ = ack.send(());
                }
            });
            let (mut at, mut out) = (0, 0usize);
            loop {
                if !wait {
                    while out >= in_flight {
                        acks.recv().await.unwrap();
                        out -= 1;
                    }
                    while acks.try_recv().is_ok() {
                        out -= 1;
                    }
                }
                let item = tokio::time::timeout(Duration::from_secs(10), scan.next())
                    .await
                    .unwrap_or_else(|_| panic!("round {round}: a lost wake-up at {at}"));
                let Some(c) = item else { break };
                let c = c.unwrap_or_else(|e| panic!("round {round} @ {at}: {e}"));
                assert_eq!(c.offset(), at);
                check_pattern(file.seed, at, &c).unwrap();
                at += c.len() as u64;
                if in_flight == 1 && !wait {
                    drop(c);
                } else {
                    out += 1;
                    tx.send(c).unwrap();
                }
            }
            drop(tx);
            dropper.join().unwrap();
            assert_eq!(at, file.len, "round {round}");
        }
        drop(set);
    });
}

/// Attacks on a consumer holding chunks, on both runtime flavours: a chunk
/// larger than the file, an empty range, `align(1)` and `O_DIRECT` files
/// that end right after the chunks held (the end-of-file check), the scan
/// dropped while that check is in flight and with chunks held, chunks
/// dropped after the context is shut down and after it is dropped.
fn hostile_holders(choice: BackendChoice) {
    let c = CHUNK as u64;
    for flavor in [Flavor::Multi, Flavor::Current] {
        let set = common::FileSet::new(0x4057, &[10_000, 4 * c, 8 * c]);
        set.sync_all();
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&set.files[1].path)
            .map_err(|e| println!("O_DIRECT part skipped: {e}"))
            .ok();
        common::run("hostile_holders", flavor, 60, move || async move {
            let ctx = common::default_ctx(choice, set.open_all());
            let [small, four, eight] = [0, 1, 2].map(|i| set.files[i].clone());
            let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(4);
            // A chunk larger than the file; an empty range; one buffer.
            let big = ScanOptions::new().chunk_size(1 << 20).in_flight(4);
            let (got, err) =
                collect_checked(big.scan(&ctx, 0u32, ..).unwrap(), small.seed, 0).await;
            assert!(err.is_none(), "{err:?}");
            assert_eq!((got.len(), got[0].len()), (1, 10_000));
            let (got, err) = collect_checked(opts.scan(&ctx, 1u32, c..c).unwrap(), 0, c).await;
            assert!(got.is_empty() && err.is_none());
            let one = opts.in_flight(1);
            let (got, err) =
                collect_checked(one.scan(&ctx, 0u32, ..).unwrap(), small.seed, 0).await;
            assert!(err.is_none() && got.len() == 1);
            // Ends right after the chunks held, unaligned reads.
            let a1 = opts.align(1);
            let (got, err) = collect_checked(a1.scan(&ctx, 1u32, 1..).unwrap(), four.seed, 1).await;
            assert!(err.is_none(), "{err:?}");
            assert_eq!(got.iter().map(|c| c.len() as u64).sum::<u64>(), 4 * c - 1);
            if let Some(f) = direct {
                let fid = ctx.register_file(f).unwrap();
                for o in [opts, opts.align(512)] {
                    let (got, err) =
                        collect_checked(o.scan(&ctx, fid, ..).unwrap(), four.seed, 0).await;
                    assert!(err.is_none(), "O_DIRECT {o:?}: {err:?}");
                    assert_eq!(got.len(), 4);
                }
            }

            // A chunk dropped while the scan checks for the end of file
            // (cold file: the check may be in flight) or after it failed:
            // the scan goes on, in order.
            eight.drop_cache();
            let mut scan = opts.scan(&ctx, 2u32, ..).unwrap();
            let mut held = Vec::new();
            for _ in 0..4 {
                held.push(scan.next().await.unwrap().unwrap());
            }
            let first = common::poll_once(std::pin::Pin::new(&mut scan.next())).await;
            assert!(
                matches!(
                    &first,
                    std::task::Poll::Pending | std::task::Poll::Ready(Some(Err(_)))
                ),
                "{first:?}"
            );
            held.remove(0);
            let (at, err) = drain_checked(&mut scan, eight.seed, 4 * c).await;
            assert!(err.is_none() && at == 8 * c, "{at} {err:?}");
            drop((scan, held));

            // Dropped while checking for the end of file (cold file), with
            // every chunk held: the chunks stay intact, nothing stays in
            // flight.
            eight.drop_cache();
            let mut scan = opts.scan(&ctx, 2u32, ..).unwrap();
            let mut held = Vec::new();
            for _ in 0..4 {
                held.push(scan.next().await.unwrap().unwrap());
            }
            let _ = common::poll_once(std::pin::Pin::new(&mut scan.next())).await;
            drop(scan);
            assert_eq!(
                common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await,
                0
            );
            for c in &held {
                check_pattern(eight.seed, c.offset(), c).unwrap();
            }
            // Shut down with a scan holding every chunk: its next() fails
            // (never waits), chunks stay intact through the shutdown and
            // the context's drop, and drop fine afterwards.
            let mut scan = opts.scan(&ctx, 2u32, ..).unwrap();
            let mut held2 = Vec::new();
            for _ in 0..4 {
                held2.push(scan.next().await.unwrap().unwrap());
            }
            ctx.shutdown().await;
            assert!(matches!(scan.next().await, Some(Err(_))));
            assert!(scan.next().await.is_none());
            held.pop();
            drop(scan);
            drop(ctx);
            for c in held.iter().chain(&held2) {
                check_pattern(eight.seed, c.offset(), c).unwrap();
            }
            drop((held, held2));
            drop(set);
        });
    }
}

/// A long scan allocates at most `in_flight` buffers.
fn buffers_recycled(choice: BackendChoice) {
    let set = common::FileSet::new(0xbeef, &[8 << 20]);
    common::run("buffers_recycled", Flavor::Multi, 30, move || async move {
        let file = set.files[0].clone();
        let ctx = common::default_ctx(choice, set.open_all());
        for in_flight in [1, 4, 16] {
            let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(in_flight);
            let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
            let mut chunks = 0;
            let mut seen = std::collections::HashSet::new();
            while let Some(c) = scan.next().await {
                let c = c.unwrap();
                seen.insert(c.as_ptr() as usize - (c.offset() % CHUNK as u64) as usize);
                chunks += 1;
            }
            assert_eq!(chunks, 128);
            assert!(scan.buffers_allocated() <= in_flight);
            assert!(seen.len() <= in_flight, "{} distinct buffers", seen.len());
        }
        // A range of three chunks uses three buffers, whatever `in_flight`
        // says; the content is right and the chunks outlive the scan.
        let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(16);
        let mut scan = opts.scan(&ctx, 0u32, 5..(2 * CHUNK + 6) as u64).unwrap();
        let mut kept = Vec::new();
        while let Some(c) = scan.next().await {
            kept.push(c.unwrap());
        }
        assert_eq!(scan.buffers_allocated(), 3);
        drop(scan);
        let mut at = 5;
        for c in &kept {
            assert_eq!(c.offset(), at);
            check_pattern(file.seed, at, c).unwrap();
            at += c.len() as u64;
        }
        assert_eq!(at, (2 * CHUNK + 6) as u64);
        drop(file);
        drop(set);
    });
}

/// A scan that keeps at least 512 KiB of reads ahead of its consumer sends
/// them to the ring even when the file is cached (the thread entering the
/// ring copies while the consumer works, and uncached reads keep the
/// kernel's readahead window whole), except one chunk in four after the
/// first chunk is out, which the consumer's thread reads from the page cache
/// (its share of the copying); when the consumer's thread would copy the
/// ring's reads itself (a task, or `block_on` of a `current_thread`
/// runtime), the reads that are not its share go to the blocking pool once
/// the share has hit the page cache. With less ahead, every read takes the
/// page-cache fast path. Content is checked either way, on both runtime
/// flavours.
fn read_ahead_goes_to_the_ring(flavor: Flavor) {
    let set = common::FileSet::new(0x7ead, &[(24 << 20) + 4097]);
    common::run(
        "read_ahead_goes_to_the_ring",
        flavor,
        60,
        move || async move {
            let file = set.files[0].clone();
            let ctx = common::default_ctx(BackendChoice::IoUring, set.open_all());
            // Cache the file, and learn that the fast path hits.
            let warm = ScanOptions::new().chunk_size(1 << 20).in_flight(1);
            check_scan(&ctx, 0, &file, warm, 0..u64::MAX).await;
            let before = ctx.stats();
            let chunks = check_scan(&ctx, 0, &file, warm, 0..u64::MAX).await as u64;
            let after = ctx.stats();
            assert!(
                after.inline_completed >= before.inline_completed + chunks - 1,
                "in_flight(1) on a cached file: {} of {chunks} chunks served inline",
                after.inline_completed - before.inline_completed
            );
            // From 512 KiB ahead: the ring, but for the consumer's share.
            for (chunk, in_flight) in [(1 << 20, 4), (128 << 10, 5), (512 << 10, 2)] {
                let opts = ScanOptions::new().chunk_size(chunk).in_flight(in_flight);
                let before = ctx.stats();
                let chunks = check_scan(&ctx, 0, &file, opts, 0..u64::MAX).await as u64;
                let after = ctx.stats();
                let inline = after.inline_completed - before.inline_completed;
                let submitted = after.submitted - before.submitted;
                let enters = after.enters - before.enters;
                assert!(
                    inline >= 1 && inline <= chunks / 4,
                    "{chunk} x {in_flight}: {inline} of {chunks} chunks inline, \
                 want the consumer's share (1 in 4, from the first chunk out)"
                );
                assert!(
                    submitted >= chunks - inline,
                    "{chunk} x {in_flight}: {submitted} reads submitted for {chunks} chunks, {inline} inline"
                );
                match flavor {
                    // block_on's thread is not a worker: the ring copies
                    // on a worker.
                    Flavor::Multi => assert!(
                        enters >= (chunks - inline) / in_flight as u64,
                        "{chunk} x {in_flight}: {enters} enters for {submitted} reads"
                    ),
                    // The runtime's only thread would copy the ring reads
                    // itself: once the share hits, the blocking pool does.
                    Flavor::Current => assert!(
                        enters <= 2 * in_flight as u64,
                        "{chunk} x {in_flight}: {enters} enters: the ring read past the first hit"
                    ),
                }
            }
            // Less than 512 KiB ahead (128 KiB x 4): the fast path for all.
            let opts = ScanOptions::new().chunk_size(128 << 10).in_flight(4);
            let before = ctx.stats();
            let chunks = check_scan(&ctx, 0, &file, opts, 0..u64::MAX).await as u64;
            let inline = ctx.stats().inline_completed - before.inline_completed;
            assert!(inline > chunks / 2, "{inline} of {chunks} inline");
            // A consumer inside a task (on a runtime worker, whose own poll
            // would submit and copy the ring reads): its share inline, and
            // once that has hit, the rest on the blocking pool, not the ring.
            let (ctx2, file2) = (ctx.clone(), file.clone());
            let (chunks, inline, submitted, enters) = tokio::spawn(async move {
                let opts = ScanOptions::new().chunk_size(1 << 20).in_flight(4);
                let before = ctx2.stats();
                let chunks = check_scan(&ctx2, 0, &file2, opts, 0..u64::MAX).await as u64;
                let after = ctx2.stats();
                (
                    chunks,
                    after.inline_completed - before.inline_completed,
                    after.submitted - before.submitted,
                    after.enters - before.enters,
                )
            })
            .await
            .unwrap();
            assert!(
                inline >= 1 && inline <= chunks / 4,
                "in a task: {inline} of {chunks} chunks inline, want the consumer's share"
            );
            assert!(
                submitted >= chunks - inline,
                "in a task: {submitted} submitted"
            );
            assert!(
                enters <= 8,
                "in a task: {enters} enters for {chunks} chunks: the ring read past the first hit"
            );
            drop(file);
            drop(set);
        },
    );
}

#[test]
fn read_ahead_goes_to_the_ring_multi_thread() {
    let _shared = common::shared();
    read_ahead_goes_to_the_ring(Flavor::Multi);
}

#[test]
fn read_ahead_goes_to_the_ring_current_thread() {
    let _shared = common::shared();
    read_ahead_goes_to_the_ring(Flavor::Current);
}

fn bad_options() {
    common::run("bad_options", Flavor::Current, 10, || async {
        let f = tempfile::tempfile().unwrap();
        let ctx = UringContext::new(vec![f]).unwrap();
        for (opts, what) in [
            (ScanOptions::new().chunk_size(0), "chunk_size"),
            (ScanOptions::new().chunk_size(5000), "chunk_size"),
            (ScanOptions::new().in_flight(0), "in_flight"),
            (ScanOptions::new().align(3), "align"),
            // Absurd sizes: an error, not a capacity-overflow panic or an
            // allocation failure that aborts the process.
            (ScanOptions::new().in_flight(usize::MAX), "in_flight"),
            (ScanOptions::new().in_flight(1 << 30), "in_flight"),
            (ScanOptions::new().chunk_size(1 << 40), "chunk_size"),
            (
                ScanOptions::new().chunk_size(usize::MAX & !4095),
                "chunk_size",
            ),
            (
                ScanOptions::new().align(1 << 40).chunk_size(1 << 40),
                "chunk_size",
            ),
        ] {
            let e = opts.scan(&ctx, 0u32, ..).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains(what), "{e}");
        }
        #[allow(clippy::reversed_empty_ranges)]
        let e = ScanOptions::new().scan(&ctx, 0u32, 10..5).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // A range past i64::MAX is named with the caller's numbers.
        let e = ScanOptions::new()
            .scan(&ctx, 0u32, u64::MAX - 1..)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains(&(u64::MAX - 1).to_string()), "{e}");
    });
}

/// Storage that returns short reads mid-file (FUSE, direct_io): the scan
/// reads the rest, never skips; an error is yielded once and ends the stream.
fn short_reads_and_errors(choice: BackendChoice) {
    let len = (1 << 20) + 5000;
    let spec = FileSpec::new("s", len, 0x5407);
    let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), true) else {
        return;
    };
    let file = TestFile {
        path: fs.path("s"),
        seed: spec.seed,
        len,
    };
    common::run("short_reads", Flavor::Multi, 30, move || async move {
        let ctx = common::default_ctx(choice, vec![file.open()]);
        fs.set_fault("s", 100_000..300_000, Fault::Short(1000));
        fs.set_fault("s", 600_000..600_001, Fault::Short(4096));
        // On io_uring the kernel's asynchronous FUSE direct I/O reports a
        // short reply as a full read (a plain `read_owned` of 64 KiB returns
        // 65536 with wrong bytes after the reply's 1000; kernel 6.18), so a
        // short read never reaches the crate: only the fallback's pread sees
        // one.
        let shorts = if choice == BackendChoice::Fallback {
            &[(4, 4096), (2, 1)][..]
        } else {
            println!("skipped (short reads, io_uring): async FUSE direct I/O hides them");
            &[]
        };
        for &(in_flight, align) in shorts {
            let opts = ScanOptions::new()
                .chunk_size(CHUNK)
                .in_flight(in_flight)
                .align(align);
            check_scan(&ctx, 0, &file, opts, 0..u64::MAX).await;
            check_scan(&ctx, 0, &file, opts, 99_999..700_001).await;
        }
        fs.clear_faults();
        fs.set_fault(
            "s",
            5 * CHUNK as u64..5 * CHUNK as u64 + 1,
            Fault::Errno(libc::EIO),
        );
        let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(4);
        let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
        let mut at = 0;
        let err = loop {
            match scan.next().await.expect("the error comes before the end") {
                Ok(c) => {
                    assert_eq!(c.offset(), at);
                    check_pattern(file.seed, at, &c).unwrap();
                    at += c.len() as u64;
                }
                Err(e) => break e,
            }
        };
        assert_eq!(at, 5 * CHUNK as u64, "every chunk before the failed one");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        assert!(scan.next().await.is_none(), "an error ends the stream");
        drop(scan);
        assert_eq!(
            common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await,
            0
        );
        drop(ctx);
        drop(fs);
    });
}

/// The largest settings (1024 chunks of 1 GiB) on a small file: the scan
/// maps buffers as it needs them rather than all 1 TiB at once (which the
/// kernel refuses), and reads the file whole.
fn largest_settings_on_a_small_file(choice: BackendChoice) {
    let set = common::FileSet::new(0x1a26, &[3 * CHUNK as u64 + 7]);
    common::run(
        "largest_settings_on_a_small_file",
        Flavor::Multi,
        60,
        move || async move {
            let file = set.files[0].clone();
            let ctx = common::default_ctx(choice, set.open_all());
            let opts = ScanOptions::new().chunk_size(1 << 30).in_flight(1024);
            let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
            let mut at = 0;
            while let Some(c) = scan.next().await {
                let c = c.unwrap_or_else(|e| panic!("{choice:?}: {e}"));
                assert_eq!(c.offset(), at);
                check_pattern(file.seed, at, &c).unwrap();
                at += c.len() as u64;
            }
            assert_eq!(at, file.len);
            drop(scan);
            let n = common::wait_in_flight_zero(&ctx, Duration::from_secs(30)).await;
            assert_eq!(n, 0);
            drop(set);
        },
    );
}

/// Drains `scan` from `at`: every chunk contiguous and with the pattern's
/// bytes, until the end or the first error (after which the stream stays
/// ended). Returns where it stopped and the error, if any.
async fn drain_checked(
    scan: &mut uring_positioned_io::Scan<'_>,
    seed: u64,
    mut at: u64,
) -> (u64, Option<io::Error>) {
    while let Some(c) = scan.next().await {
        match c {
            Ok(c) => {
                assert_eq!(c.offset(), at, "chunks out of order");
                check_pattern(seed, at, &c).unwrap();
                at += c.len() as u64;
            }
            Err(e) => {
                assert!(scan.next().await.is_none(), "an error ends the stream");
                return (at, Some(e));
            }
        }
    }
    (at, None)
}

/// The context's runtime is dropped while a scan consumed from another
/// thread (its own runtime) has reads in flight and holds chunks: the rest
/// of the scan is either read (the ring is driven by its waiting futures)
/// or ends with an error, never hangs, and the chunks held stay intact.
fn runtime_dropped_mid_scan(choice: BackendChoice) {
    let set = common::FileSet::new(0x5c0d, &[(4 << 20) + 777]);
    set.sync_all();
    let file = set.files[0].clone();
    common::watchdog("runtime_dropped_mid_scan", 60, move || {
        // 16 × 64 KiB ahead: reads go to the ring (read-ahead); 4 × 64 KiB:
        // they try the page cache on the consumer's thread first.
        let rounds = [
            (Flavor::Multi, 16),
            (Flavor::Current, 16),
            (Flavor::Multi, 4),
            (Flavor::Current, 4),
            (Flavor::Multi, 16),
        ];
        for (round, (flavor, in_flight)) in rounds.into_iter().enumerate() {
            if round != 4 {
                file.drop_cache();
            }
            let rt = common::runtime(flavor);
            let ctx = rt.block_on(async { common::default_ctx(choice, vec![file.open()]) });
            let (half, half_rx) = std::sync::mpsc::channel();
            let (go, go_rx) = std::sync::mpsc::channel::<()>();
            let consumer = std::thread::spawn({
                let (ctx, file) = (ctx.clone(), file.clone());
                move || {
                    let rt2 = common::runtime(Flavor::Current);
                    rt2.block_on(async move {
                        let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(in_flight);
                        let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
                        let mut kept: Vec<Chunk> = Vec::new();
                        for i in 0..2 {
                            let c = scan.next().await.unwrap().unwrap();
                            assert_eq!(c.offset(), (i * CHUNK) as u64);
                            kept.push(c);
                        }
                        half.send(()).unwrap();
                        go_rx.recv().unwrap();
                        let (at, err) = drain_checked(&mut scan, file.seed, 2 * CHUNK as u64).await;
                        match &err {
                            None => assert_eq!(at, file.len, "ended early without an error"),
                            // The error says why.
                            Some(e) => assert!(
                                e.kind() == io::ErrorKind::BrokenPipe
                                    && e.to_string().contains("runtime"),
                                "{e}"
                            ),
                        }
                        drop(scan);
                        for c in &kept {
                            check_pattern(file.seed, c.offset(), c).unwrap();
                        }
                        (at, err.map(|e| e.to_string()))
                    })
                }
            });
            // Drive the context's runtime (a current_thread one runs its
            // driver only here) until the scan is half-way.
            rt.block_on(async {
                while half_rx.try_recv().is_err() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
            drop(rt);
            go.send(()).unwrap();
            let (at, err) = consumer
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e));
            println!(
                "{choice:?}/{flavor:?} round {round}: stopped at {at} of {}, error {err:?}",
                file.len
            );
            drop(ctx);
        }
    });
}

/// `shutdown()` while a scan has reads in flight and the consumer holds
/// chunks: the shutdown returns, the scan ends (with an error or at the
/// end), and the chunks held stay intact.
fn shutdown_mid_scan(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        let set = common::FileSet::new(0x5d5c, &[(3 << 20) + 4097]);
        set.sync_all();
        set.drop_caches();
        common::run("shutdown_mid_scan", flavor, 30, move || async move {
            let file = set.files[0].clone();
            let ctx = common::default_ctx(choice, set.open_all());
            let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(8);
            let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
            let kept = scan.next().await.unwrap().unwrap();
            let stopper = tokio::spawn({
                let ctx = ctx.clone();
                async move { ctx.shutdown().await }
            });
            let (at, err) = drain_checked(&mut scan, file.seed, CHUNK as u64).await;
            stopper.await.unwrap();
            assert!(
                err.is_some() || at == file.len,
                "ended at {at} without an error"
            );
            drop(scan);
            check_pattern(file.seed, 0, &kept).unwrap();
            // A scan started after the shutdown fails at once, or yields an error.
            match opts.scan(&ctx, 0u32, ..) {
                Err(_) => {}
                Ok(mut s) => assert!(
                    matches!(s.next().await, Some(Err(_))),
                    "a scan after shutdown"
                ),
            }
            println!(
                "{choice:?}/{flavor:?}: stopped at {at} of {}, error {err:?}",
                file.len
            );
            drop(set);
        });
    }
}

/// Storage that never answers one chunk (FUSE): the scan waits for it
/// without freezing the runtime; the consumer gives up and drops the
/// stream; other reads of the file go on; once the storage answers, every
/// dropped read comes back and a new scan reads the file whole.
fn hung_storage_mid_scan(choice: BackendChoice) {
    let len = 12 * CHUNK as u64 + 5;
    let spec = FileSpec::new("h", len, 0x4a06);
    let Some(fs) = FaultFs::mount_or_skip(std::slice::from_ref(&spec), true) else {
        return;
    };
    let file = TestFile {
        path: fs.path("h"),
        seed: spec.seed,
        len,
    };
    common::run(
        "hung_storage_mid_scan",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::default_ctx(choice, vec![file.open()]);
            let hung = 5 * CHUNK as u64;
            fs.set_fault("h", hung..hung + 1, Fault::Hang);
            let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(4);
            let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
            let mut at = 0;
            while at < hung {
                let c = scan.next().await.unwrap().unwrap();
                assert_eq!(c.offset(), at);
                check_pattern(file.seed, at, &c).unwrap();
                at += c.len() as u64;
            }
            let ticks = tokio::spawn(async {
                let mut n = 0;
                for _ in 0..20 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    n += 1;
                }
                n
            });
            let waited = tokio::time::timeout(Duration::from_millis(300), scan.next()).await;
            assert!(
                waited.is_err(),
                "the hung chunk came back: {:?}",
                waited.map(|c| c.map(|c| c.map(|c| c.offset())))
            );
            assert_eq!(ticks.await.unwrap(), 20, "the runtime kept running timers");
            // Other parts of the file are still readable while one read hangs.
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), ctx.read(0u32, 4096, &mut buf))
                .await
                .expect("a read elsewhere in the file finished")
                .unwrap();
            assert_eq!(n, 4096);
            check_pattern(file.seed, 4096, &buf).unwrap();
            drop(scan);
            fs.release_hangs();
            assert_eq!(
                common::wait_in_flight_zero(&ctx, Duration::from_secs(20)).await,
                0
            );
            fs.clear_faults();
            check_scan(&ctx, 0, &file, opts, 0..u64::MAX).await;
            drop(ctx);
            drop(fs);
        },
    );
}

/// The file is truncated (at a page boundary) while a scan of it is under
/// way: every chunk yielded has the file's bytes (read before or after the
/// cut), and the stream ends at the new end or at a chunk read before it.
fn truncated_mid_scan(choice: BackendChoice) {
    let set = common::FileSet::new(0x7c47, &[16 * CHUNK as u64]);
    set.sync_all();
    common::run(
        "truncated_mid_scan",
        Flavor::Multi,
        30,
        move || async move {
            let file = set.files[0].clone();
            for (round, in_flight) in [1usize, 4, 8].into_iter().enumerate() {
                // Rebuild the file at full length.
                let full =
                    common::make_file(file.path.parent().unwrap(), file.seed, 16 * CHUNK as u64);
                assert_eq!(full.path, file.path);
                if round % 2 == 1 {
                    file.drop_cache();
                }
                let ctx = common::default_ctx(choice, vec![file.open()]);
                let opts = ScanOptions::new().chunk_size(CHUNK).in_flight(in_flight);
                let mut scan = opts.scan(&ctx, 0u32, ..).unwrap();
                let mut at = 0;
                for _ in 0..2 {
                    let c = scan.next().await.unwrap().unwrap();
                    check_pattern(file.seed, at, &c).unwrap();
                    at += c.len() as u64;
                }
                let cut = 6 * CHUNK as u64;
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file.path)
                    .unwrap()
                    .set_len(cut)
                    .unwrap();
                let (end, err) = drain_checked(&mut scan, file.seed, at).await;
                assert!(err.is_none(), "{err:?}");
                assert!(
                    end >= cut && end <= 16 * CHUNK as u64 && end % CHUNK as u64 == 0,
                    "ended at {end}"
                );
                drop(scan);
                assert_eq!(
                    common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await,
                    0
                );
            }
            drop(set);
        },
    );
}

/// What a scan can check without reading, `scan()` checks at the call,
/// with the error every other call gives: an unregistered index, a checked
/// id of another context or of an unregistered file, a range starting
/// beyond `i64::MAX` (even an empty one, as for a read), a shut-down
/// context. Nothing is refused that a read would take.
fn refused_at_the_call(choice: BackendChoice) {
    let set = common::FileSet::new(0x1d5c, &[10_000, 20_000]);
    common::run(
        "refused_at_the_call",
        Flavor::Multi,
        30,
        move || async move {
            let a = common::default_ctx(choice, vec![set.files[0].open()]);
            let b = common::default_ctx(choice, vec![set.files[1].open()]);
            let ida = a.file_id(0).unwrap();
            let extra = b.register_file(set.files[1].open()).unwrap();
            let stale = a.register_file(set.files[1].open()).unwrap();
            a.unregister_file(stale).unwrap();
            let mut buf = vec![0u8; 64];
            for (ctx, fid, why) in [
                (&b, ida, "belongs to another UringContext"),
                (&a, extra, "belongs to another UringContext"),
                (&a, FileId::from(7), "is not registered"),
                (&a, stale, "is stale"),
            ] {
                let read = ctx.read(fid, 0, &mut buf).await.unwrap_err();
                let e = ScanOptions::new()
                    .scan(ctx, fid, ..)
                    .expect_err("a bad id is refused by scan() itself");
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                assert_eq!(e.to_string(), read.to_string(), "the error a read gives");
                assert!(e.to_string().contains(why), "{e}");
            }
            let max = i64::MAX.unsigned_abs();
            let beyond: [(Bound<u64>, Bound<u64>); 4] = [
                (Bound::Included(max + 1), Bound::Unbounded),
                (Bound::Included(max + 1), Bound::Excluded(max + 1)),
                (Bound::Excluded(max), Bound::Included(max + 5)),
                (Bound::Included(u64::MAX), Bound::Unbounded),
            ];
            for r in beyond {
                let e = ScanOptions::new().scan(&a, ida, r).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{r:?}: {e}");
                assert!(e.to_string().contains("beyond i64::MAX"), "{e}");
            }
            // At i64::MAX a read returns 0: so does the scan, an empty stream.
            let mut s = ScanOptions::new().scan(&a, ida, max..).unwrap();
            assert!(s.next().await.is_none());
            drop(s);
            // Good ids still scan.
            let n = check_scan(&a, 0, &set.files[0], ScanOptions::new(), 0..u64::MAX).await;
            assert_eq!(n, 1);
            a.shutdown().await;
            let read = a.read(ida, 0, &mut buf).await.unwrap_err();
            let e = ScanOptions::new().scan(&a, ida, ..).unwrap_err();
            assert_eq!(e.kind(), read.kind(), "{e} / {read}");
            assert!(e.to_string().contains("shut down"), "{e}");
            drop((a, b));
            drop(set);
        },
    );
}

backend_tests!(
    largest_settings_on_a_small_file,
    refused_at_the_call,
    runtime_dropped_mid_scan,
    shutdown_mid_scan,
    hung_storage_mid_scan,
    truncated_mid_scan,
    sizes_in_order,
    ranges_mid_chunk,
    o_direct,
    zero_length_and_empty,
    drop_mid_scan,
    drop_mid_scan_on_the_blocking_pool,
    holding_chunks,
    collect_holding_every_chunk,
    pipeline_waits_for_dropped_chunks,
    concurrent_drops,
    hostile_holders,
    buffers_recycled,
    short_reads_and_errors,
);

#[test]
fn invalid_options() {
    let _shared = common::shared();
    bad_options();
}
