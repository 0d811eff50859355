//! The block cache (feature `cache`): coherence with writes, `fallocate` and
//! re-registration through the context (a property test against `pread`),
//! a write whose future was dropped landing late, coalesced misses, errors
//! and hung reads reaching every waiter (FUSE harness), a cancelled leader,
//! scan resistance, the memory bound, and the hit path (no allocation,
//! yields). Every test runs on both backends.

use crate::common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use common::fuse::{Fault, FaultFs, FileSpec};
use common::{check_pattern, make_file, poll_once_noop, Flavor, Rng};
use proptest::prelude::*;
use uring_positioned_io::{
    os_error, BackendChoice, BlockCache, CacheOptions, FallocateMode, UringContext,
};

// ---------------------------------------------------------------------------
// Allocation counting (for the hit path), per thread and only when asked.
// ---------------------------------------------------------------------------

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counters are const-initialised
// thread locals (no allocation to reach them).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: as the caller promised us.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller promised us.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread while `f` runs.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    ALLOCS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCS.with(Cell::get))
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const BS: usize = 4096;

fn opts(capacity_bytes: u64) -> CacheOptions {
    CacheOptions {
        capacity_bytes,
        block_size: BS,
    }
}

/// `pread` of `len` bytes at `off` of `path` (short at the end of the file).
fn pread(path: &std::path::Path, off: u64, len: usize) -> Vec<u8> {
    let f = File::open(path).unwrap();
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.read_at(&mut buf[done..], off + done as u64).unwrap();
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    buf
}

async fn cache_read(
    cache: &BlockCache,
    fid: impl Into<uring_positioned_io::FileId>,
    off: u64,
    len: usize,
) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = cache.read(fid, off, &mut buf).await?;
    buf.truncate(n);
    Ok(buf)
}

/// Waits (yielding) until `cond` holds; panics after `secs` (a hang).
async fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited {secs} s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn is_eio(e: &io::Error) -> bool {
    os_error(e) == Some(libc::EIO)
}

// ---------------------------------------------------------------------------
// Coherence: a property test against pread
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum CohOp {
    /// A read through the cache (any offset and length), checked against pread.
    Read { off: u64, len: usize },
    /// The same through a plain index (whatever is registered at it now).
    ReadPlain { off: u64, len: usize },
    /// A write through the context, racing a cache read started (a miss
    /// in flight) before it, of the same range or of `early`'s (any
    /// range, the end of the file among them); once the write completed,
    /// and before that read is finished, the early range is read again.
    Write {
        off: u64,
        len: usize,
        byte: u8,
        early: Option<(u64, usize)>,
    },
    /// A write racing a cache read (tokio::join).
    WriteJoined { off: u64, len: usize, byte: u8 },
    /// fallocate(PUNCH_HOLE | KEEP_SIZE) through the context.
    Punch { off: u64, len: u64 },
    /// fallocate(0) through the context: may extend the file.
    Extend { off: u64, len: u64 },
    /// Unregister the file, register another one (other bytes).
    Reregister,
}

const FILE_LEN: u64 = 40_000; // ten blocks, the last one short

fn coh_op() -> impl Strategy<Value = CohOp> {
    let off = 0..FILE_LEN + 10 * BS as u64;
    let len = 1usize..12_000;
    prop_oneof![
        4 => (off.clone(), len.clone()).prop_map(|(off, len)| CohOp::Read { off, len }),
        1 => (off.clone(), len.clone()).prop_map(|(off, len)| CohOp::ReadPlain { off, len }),
        // Writes may start beyond the end of the file (extending it past
        // a short last block, leaving a hole).
        3 => (
            0..FILE_LEN + 4 * BS as u64,
            1usize..9000,
            any::<u8>(),
            proptest::option::of((0..FILE_LEN + 4 * BS as u64, 1usize..9000)),
        )
            .prop_map(|(off, len, byte, early)| CohOp::Write {
                off,
                len,
                byte,
                early
            }),
        2 => (0..FILE_LEN + 4 * BS as u64, 1usize..9000, any::<u8>())
            .prop_map(|(off, len, byte)| CohOp::WriteJoined { off, len, byte }),
        1 => (0..FILE_LEN, 1u64..12_000).prop_map(|(off, len)| CohOp::Punch { off, len }),
        1 => (0..FILE_LEN + 4 * BS as u64, 1u64..12_000).prop_map(|(off, len)| CohOp::Extend { off, len }),
        1 => Just(CohOp::Reregister),
    ]
}

fn coherence(choice: BackendChoice) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = proptest::collection::vec(coh_op(), 1..40);
    runner
        .run(&strategy, |ops| {
            run_coherence(choice, &ops);
            Ok(())
        })
        .unwrap();
}

fn run_coherence(choice: BackendChoice, ops: &[CohOp]) {
    let dir = tempfile::tempdir().unwrap();
    let ops = ops.to_vec();
    let dir_path = dir.path().to_owned();
    common::run("cache-coherence", Flavor::Multi, 120, move || async move {
        let mut seed = 0xC0FFEE_u64;
        let mut path = make_file(&dir_path, seed, FILE_LEN).path;
        // Ring reads stay in flight over a poll (no inline page-cache hits).
        let ctx = common::build_ctx(choice, vec![common::open_rw(&path)], |b| {
            b.inline_nowait(false)
        });
        // Smaller than the file: evictions happen too.
        let cache = BlockCache::new(&ctx, opts(6 * BS as u64)).unwrap();
        let mut fid = ctx.file_id(0).unwrap();
        let mut punch_ok = true;
        for (i, op) in ops.iter().enumerate() {
            let check = |path: &std::path::Path, off: u64, got: &[u8], len: usize| {
                let want = pread(path, off, len);
                assert!(
                    got == &want[..],
                    "op {i} {op:?}: read {len} at {off}: {} bytes differ from pread ({} vs {} bytes)",
                    got.iter().zip(&want).filter(|(a, b)| a != b).count(),
                    got.len(),
                    want.len()
                );
            };
            match *op {
                CohOp::Read { off, len } => {
                    let got = cache_read(&cache, fid, off, len).await.unwrap();
                    check(&path, off, &got, len);
                }
                CohOp::ReadPlain { off, len } => {
                    let got = cache_read(&cache, fid.index(), off, len).await.unwrap();
                    check(&path, off, &got, len);
                }
                CohOp::Write {
                    off,
                    len,
                    byte,
                    early,
                } => {
                    // A miss, in flight before the write starts (polled
                    // once), finished after the write completed.
                    let (early_off, early_len) = early.unwrap_or((off, len));
                    let mut early = vec![0u8; early_len];
                    let mut read = Box::pin(cache.read(fid, early_off, &mut early));
                    let first = poll_once_noop(read.as_mut());
                    ctx.write_all(fid, off, &vec![byte; len]).await.unwrap();
                    // A read that starts now must not get the early one's
                    // bytes (from before the write).
                    let got = cache_read(&cache, fid, early_off, early_len).await.unwrap();
                    check(&path, early_off, &got, early_len);
                    if first.is_pending() {
                        read.await.unwrap(); // old or new bytes: it raced
                    }
                    let got = cache_read(&cache, fid, off, len).await.unwrap();
                    check(&path, off, &got, len);
                }
                CohOp::WriteJoined { off, len, byte } => {
                    let data = vec![byte; len];
                    let (r, w) = tokio::join!(
                        cache_read(&cache, fid, off, len),
                        ctx.write_all(fid, off, &data)
                    );
                    r.unwrap();
                    w.unwrap();
                    let got = cache_read(&cache, fid, off, len).await.unwrap();
                    check(&path, off, &got, len);
                }
                CohOp::Punch { off, len } => {
                    if !punch_ok {
                        continue;
                    }
                    let mode = FallocateMode::PUNCH_HOLE | FallocateMode::KEEP_SIZE;
                    match ctx.fallocate(fid, mode, off, len).await {
                        Ok(()) => {}
                        Err(e) if os_error(&e) == Some(libc::EOPNOTSUPP) => {
                            eprintln!("punch hole not supported here: {e}");
                            punch_ok = false;
                            continue;
                        }
                        Err(e) => panic!("punch: {e}"),
                    }
                    let got = cache_read(&cache, fid, off, len as usize).await.unwrap();
                    check(&path, off, &got, len as usize);
                }
                CohOp::Extend { off, len } => {
                    ctx.fallocate(fid, FallocateMode::ALLOCATE, off, len)
                        .await
                        .unwrap();
                    let got = cache_read(&cache, fid, off.saturating_sub(6000), 9000)
                        .await
                        .unwrap();
                    check(&path, off.saturating_sub(6000), &got, 9000);
                }
                CohOp::Reregister => {
                    let old = fid;
                    ctx.unregister_file(old).unwrap();
                    seed += 1;
                    path = make_file(&dir_path, seed, FILE_LEN - seed % 3 * 1000).path;
                    fid = ctx.register_file(common::open_rw(&path)).unwrap();
                    // The old id never reads anything again.
                    let e = cache_read(&cache, old, 0, 10).await.unwrap_err();
                    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                    if fid.index() == old.index() {
                        // Same index, new file: no block of the old one.
                        let got = cache_read(&cache, fid.index(), 0, 9000).await.unwrap();
                        check(&path, 0, &got, 9000);
                    }
                }
            }
            assert!(cache.stats().resident_bytes <= cache.capacity_bytes());
        }
        // Everything once more, after all the ops.
        for off in (0..FILE_LEN + 16 * BS as u64).step_by(3000) {
            let got = cache_read(&cache, fid, off, 5000).await.unwrap();
            check_eq(&path, off, &got, 5000);
        }
    });
    drop(dir);
}

fn check_eq(path: &std::path::Path, off: u64, got: &[u8], len: usize) {
    assert!(
        got == &pread(path, off, len)[..],
        "final read {len} at {off} differs from pread"
    );
}

/// Writers and readers at once on a multi-thread runtime: every block holds
/// its version (a `u64` repeated); a read started after a write of a block
/// resolved never sees an older version of that block.
fn concurrent_writes_never_stale(choice: BackendChoice) {
    const BLOCKS: u64 = 64;
    common::run("cache-concurrent", Flavor::Multi, 120, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("versions");
        std::fs::write(&path, vec![0u8; BLOCKS as usize * BS]).unwrap();
        let ctx = common::default_ctx(choice, vec![common::open_rw(&path)]);
        // Smaller than the file: evictions and misses all along.
        let cache = BlockCache::new(&ctx, opts(16 * BS as u64)).unwrap();
        let done: Arc<Vec<AtomicU64>> = Arc::new((0..BLOCKS).map(|_| AtomicU64::new(0)).collect());
        let mut tasks = Vec::new();
        for w in 0..2u64 {
            let (ctx, done) = (ctx.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng::new(100 + w);
                for _ in 0..300 {
                    // Each writer owns half the blocks: versions rise per block.
                    let b = rng.below(BLOCKS / 2) * 2 + w;
                    let v = done[b as usize].load(Ordering::Relaxed) + 1;
                    let bytes: Vec<u8> = (0..BS / 8).flat_map(|_| v.to_le_bytes()).collect();
                    ctx.write_all(0u32, b * BS as u64, &bytes).await.unwrap();
                    done[b as usize].store(v, Ordering::Release);
                }
            }));
        }
        for r in 0..4u64 {
            let (cache, done) = (cache.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng::new(200 + r);
                for _ in 0..300 {
                    let off = rng.below(BLOCKS * BS as u64 - 8) & !7;
                    let len = (rng.range(8, 3 * BS as u64) as usize) & !7;
                    let len = len.min((BLOCKS * BS as u64 - off) as usize);
                    let first = off / BS as u64;
                    let last = (off + len as u64 - 1) / BS as u64;
                    let floor: Vec<u64> = (first..=last)
                        .map(|b| done[b as usize].load(Ordering::Acquire))
                        .collect();
                    let got = cache_read(&cache, 0u32, off, len).await.unwrap();
                    assert_eq!(got.len(), len);
                    for (k, word) in got.chunks_exact(8).enumerate() {
                        let at = off + 8 * k as u64;
                        let b = at / BS as u64;
                        let v = u64::from_le_bytes(word.try_into().unwrap());
                        let min = floor[(b - first) as usize];
                        assert!(v >= min, "block {b} at {at}: version {v}, but {min} had completed before the read");
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// The race the epoch guards, alone and deterministic: a miss in flight
/// (polled once) while a write of its block completes must not leave the
/// old bytes cached.
fn miss_in_flight_during_write(choice: BackendChoice) {
    common::run(
        "cache-miss-vs-write",
        Flavor::Current,
        60,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = make_file(dir.path(), 7, 4 * BS as u64 + 904).path;
            let ctx = common::build_ctx(choice, vec![common::open_rw(&path)], |b| {
                b.inline_nowait(false)
            });
            let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
            for round in 0..20u8 {
                let mut get = pin!(cache.get(0, 1));
                let first = poll_once_noop(get.as_mut());
                // Time for the read to end in the kernel (old bytes) before
                // the write starts; its future lands it after the write.
                tokio::time::sleep(Duration::from_millis(5)).await;
                ctx.write_all(0, BS as u64 + 100, &[round; 10])
                    .await
                    .unwrap();
                if first.is_pending() {
                    get.await.unwrap();
                }
                let block = cache.get(0, 1).await.unwrap();
                assert_eq!(
                    &block[100..110],
                    &[round; 10],
                    "round {round}: old bytes cached"
                );
            }
            // The block at the end of the file, in flight while a write
            // beyond it extends the file: it must not stay cached short.
            let mut at = 4 * BS as u64 + 904; // the end of the file
            for round in 0..20u64 {
                let last = at / BS as u64;
                let mut get = pin!(cache.get(0, last));
                let mut first = poll_once_noop(get.as_mut());
                // Time for the read to end in the kernel (old bytes); a
                // second poll sees its short count and issues the read of
                // the rest, which ends too (0: the end of the file) before
                // the write starts; the future lands the block after it.
                tokio::time::sleep(Duration::from_millis(5)).await;
                if first.is_pending() {
                    first = poll_once_noop(get.as_mut());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                ctx.write_all(0, at + 2 * BS as u64, &[2u8; 10])
                    .await
                    .unwrap();
                // A get that starts after the write must not join the read
                // started before it: that read holds the short block.
                let after = cache.get(0, last).await.unwrap();
                assert_eq!(
                    after.len(),
                    BS,
                    "round {round}: a get after the write joined the read before it"
                );
                if first.is_pending() {
                    get.await.unwrap();
                }
                at += 2 * BS as u64 + 10;
                let block = cache.get(0, last).await.unwrap();
                assert_eq!(
                    block.len(),
                    BS,
                    "round {round}: the end-of-file block stayed short"
                );
                assert_eq!(&block[..], &pread(&path, last * BS as u64, BS)[..]);
            }
        },
    );
}

/// A FUSE file system with one file, `src`, whose reads hang: the source
/// of [`InodeLockHolder`]'s write.
fn hanging_source() -> Option<Arc<FaultFs>> {
    const SRC: u64 = 1 << 20;
    let fs = FaultFs::mount_or_skip(&[FileSpec::new("src", SRC, 0x1A7E)], false)?;
    fs.set_fault("src", 0..SRC, Fault::Hang);
    Some(Arc::new(fs))
}

/// A `pwrite` into a file, on a thread of its own, that holds the file's
/// inode lock until released: its source is a mapping of a FUSE file whose
/// reads hang ([`hanging_source`]), and the kernel takes the page fault on
/// it with the lock held. Writes to the file through the context wait for
/// it meanwhile; reads do not.
struct InodeLockHolder {
    fs: Arc<FaultFs>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InodeLockHolder {
    async fn hold(fs: &Arc<FaultFs>, path: &std::path::Path) -> InodeLockHolder {
        let src = File::open(fs.path("src")).unwrap();
        // SAFETY: FaultFs serves fixed bytes and nothing writes the file
        // while the map lives (its reads hang, then fail).
        let map = unsafe { memmap2::Mmap::map(&src) }.unwrap();
        let file = common::open_rw(path);
        let thread = std::thread::spawn(move || {
            // Hangs until `release_hangs`, then fails (EFAULT) or writes
            // nothing.
            let _ = file.write_at(&map[..BS], 12 * BS as u64);
        });
        let f2 = fs.clone();
        wait_until("the holder's page fault to hang", 20, move || {
            f2.reads_hung_now() >= 1
        })
        .await;
        InodeLockHolder {
            fs: fs.clone(),
            thread: Some(thread),
        }
    }

    /// Lets go of the lock (the holder's write fails).
    async fn release(mut self) {
        self.fs.release_hangs();
        let thread = self.thread.take().expect("held");
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
    }
}

impl Drop for InodeLockHolder {
    /// A test that failed while holding the lock lets go of it, or its
    /// runtime's shutdown would wait for the held write forever (a thread
    /// that issued io_uring work waits for its io-wq workers when it ends).
    fn drop(&mut self) {
        self.fs.release_hangs();
    }
}

/// A file of 16 blocks of the pattern of `seed` in a directory of its own
/// (to drop after the holder let go: removing the file takes its lock), a
/// context and a cache over it, and its inode lock held.
async fn held_file(
    choice: BackendChoice,
    fs: &Arc<FaultFs>,
    seed: u64,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    UringContext,
    BlockCache,
    InodeLockHolder,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = make_file(dir.path(), seed, 16 * BS as u64).path;
    let ctx = common::build_ctx(choice, vec![common::open_rw(&path)], |b| b);
    let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
    let holder = InodeLockHolder::hold(fs, &path).await;
    (dir, path, ctx, cache, holder)
}

/// Starts a write of `bytes` at `at` of file 0 of `ctx` and drops its
/// future while an [`InodeLockHolder`] holds the write up.
async fn drop_held_write(ctx: &UringContext, at: u64, bytes: &[u8]) {
    let mut write = Box::pin(ctx.write_all(0, at, bytes));
    assert!(poll_once_noop(write.as_mut()).is_pending());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        poll_once_noop(write.as_mut()).is_pending(),
        "the write was not held up by the inode lock"
    );
}

/// A write whose future is dropped while the write is held up in the
/// kernel or the blocking pool, a read through the cache meanwhile (the old
/// bytes), then the write lands: the cache must not keep the old bytes.
/// (The drop may also cancel the write before it starts; then the old
/// bytes are the file's, and the cache must say so.)
fn dropped_write_landing_late(choice: BackendChoice) {
    dropped_write_lands(choice, "cache-dropped-write-late", false);
}

/// The same held-up write, dropped, then its registration unregistered
/// and the file registered again: when the write lands, the new
/// registration's cached block goes too.
fn dropped_write_seen_by_a_later_registration(choice: BackendChoice) {
    dropped_write_lands(choice, "cache-dropped-write-reregistered", true);
}

/// The body of the two above: the cache reads through the file's
/// registration, or (`reregister`) through a new one made while the
/// dropped write is held.
fn dropped_write_lands(choice: BackendChoice, name: &'static str, reregister: bool) {
    let Some(fs) = hanging_source() else {
        return;
    };
    common::run(name, Flavor::Multi, 60, move || async move {
        let (_dir, path, ctx, cache, holder) = held_file(choice, &fs, 0x1A7).await;
        let (block, at) = (3u64, 3 * BS as u64 + 100);
        let new = [0xAB_u8; 10];
        let old = pread(&path, at, new.len());
        assert_ne!(old, new);
        drop_held_write(&ctx, at, &new).await;
        let fid = if reregister {
            ctx.unregister_file(ctx.file_id(0).unwrap()).unwrap();
            ctx.register_file(File::open(&path).unwrap()).unwrap()
        } else {
            ctx.file_id(0).unwrap()
        };
        let b = cache.get(fid, block).await.unwrap();
        assert_eq!(&b[100..110], &old[..], "the write landed early");
        drop(b);
        holder.release().await;
        wait_until("the dropped write to be over", 20, || {
            ctx.stats().in_flight == 0
        })
        .await;
        // Its completion is reaped, then what it parked is dropped:
        // the caches hear of it a moment after `in_flight` says so.
        let file = pread(&path, 3 * BS as u64, BS);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cache.get(fid, block).await.unwrap()[..] != file[..] {
            assert!(
                std::time::Instant::now() < deadline,
                "the cache kept the bytes from before a dropped write that landed \
                 (read through {fid:?})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

/// The same held-up write, dropped, then its cache and its context
/// dropped before it is over: the notice it carries finds no cache, and
/// nothing breaks or hangs.
fn dropped_write_outliving_cache_and_context(choice: BackendChoice) {
    let Some(fs) = hanging_source() else {
        return;
    };
    common::run(
        "cache-dropped-write-outlives",
        Flavor::Multi,
        60,
        move || async move {
            let (_dir, _path, ctx, cache, holder) = held_file(choice, &fs, 0x1A8).await;
            let at = 5 * BS as u64;
            let new = [0xCD_u8; 64];
            drop_held_write(&ctx, at, &new).await;
            assert_ne!(&cache.get(0, 5).await.unwrap()[..64], &new[..]);
            drop(cache);
            // Dropping the context may wait for the write (the kernel owns
            // it): let go of the lock from elsewhere, a little later.
            let release = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                holder.release().await;
            });
            tokio::task::spawn_blocking(move || drop(ctx))
                .await
                .unwrap();
            release.await.unwrap();
        },
    );
}

/// unregister_file drops the file's blocks; a file registered under the
/// same index never hits them.
fn unregister_drops_blocks(choice: BackendChoice) {
    common::run("cache-unregister", Flavor::Multi, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let a = make_file(dir.path(), 1, 8 * BS as u64);
        let b = make_file(dir.path(), 2, 8 * BS as u64);
        let ctx = common::default_ctx(choice, vec![a.open()]);
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        let fa = ctx.file_id(0).unwrap();
        let got = cache_read(&cache, fa, 0, 8 * BS).await.unwrap();
        check_pattern(a.seed, 0, &got).unwrap();
        assert_eq!(cache.stats().resident_bytes, 8 * BS as u64);
        ctx.unregister_file(fa).unwrap();
        assert_eq!(cache.stats().resident_bytes, 0, "unregister left blocks");
        let fb = ctx.register_file(b.open()).unwrap();
        assert_eq!(fb.index(), fa.index(), "the index is reused");
        for fid in [fb, uring_positioned_io::FileId::from(fb.index())] {
            let got = cache_read(&cache, fid, 0, 8 * BS).await.unwrap();
            check_pattern(b.seed, 0, &got).unwrap();
        }
        let e = cache.get(fa, 0).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    });
}

/// One file registered twice (a read handle and a write handle, or a
/// hard link): a write through either registration is seen by reads
/// through the other, as it is by `pread`; so is an `invalidate`.
fn one_file_registered_twice(choice: BackendChoice) {
    common::run(
        "cache-one-file-twice",
        Flavor::Multi,
        60,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = make_file(dir.path(), 3, 4 * BS as u64 + 100).path;
            let link = dir.path().join("link");
            std::fs::hard_link(&path, &link).unwrap();
            let ctx = common::default_ctx(choice, vec![common::open_rw(&path)]);
            let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
            let first = ctx.file_id(0).unwrap();
            let reader = ctx.register_file(File::open(&path).unwrap()).unwrap();
            let linked = ctx.register_file(common::open_rw(&link)).unwrap();
            let pairs = [
                (first, reader),
                (linked, reader),
                (first, linked),
                (linked, first),
            ];
            for (round, (by, read)) in pairs.into_iter().enumerate() {
                let round = round as u8 + 1;
                // Cached through every registration, then changed through
                // `by`: the middle of a block, and beyond the end of the file
                // (its short last block grows).
                let len = std::fs::metadata(&path).unwrap().len() as usize;
                for fid in [first, reader, linked] {
                    let got = cache_read(&cache, fid, 0, len + BS).await.unwrap();
                    assert_eq!(got.len(), len);
                }
                ctx.write_all(by, BS as u64 + 7, &[round; 9]).await.unwrap();
                ctx.write_all(by, len as u64 + 3, &[round; 2])
                    .await
                    .unwrap();
                let len = len + 5;
                let want = pread(&path, 0, len);
                assert_eq!(want.len(), len);
                for fid in [read, by, first, reader, linked] {
                    let got = cache_read(&cache, fid, 0, len).await.unwrap();
                    assert!(
                    got == want,
                    "round {round}: a read through {fid:?} after a write through {by:?} returned old bytes"
                );
                }
            }
            // A change the context does not see, dropped through one
            // registration: gone from all of them.
            let len = std::fs::metadata(&path).unwrap().len() as usize;
            for fid in [first, reader, linked] {
                let _ = cache_read(&cache, fid, 0, len).await.unwrap();
            }
            common::open_rw(&path).write_all_at(&[0xEE; 5], 3).unwrap();
            cache.invalidate(reader, 0..8).unwrap();
            let want = pread(&path, 0, len);
            for fid in [first, reader, linked] {
                assert!(
                    cache_read(&cache, fid, 0, len).await.unwrap() == want,
                    "{fid:?} kept bytes an invalidate through {reader:?} dropped"
                );
            }
        },
    );
}

/// A file opened with `O_DIRECT`: misses are aligned reads into aligned
/// buffers (the kernel refuses anything else), the end-of-file block is
/// short, and an aligned write through the context is seen.
fn o_direct(choice: BackendChoice) {
    common::run("cache-o-direct", Flavor::Multi, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 21, 8 * BS as u64 + 904);
        let Some(direct) = common::open_direct(&f.path) else {
            return;
        };
        let len = 9 * BS;
        common::drop_cache_until_gone(&f.open(), 0, len);
        let ctx = common::default_ctx(choice, vec![direct]);
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        let got = cache_read(&cache, 0u32, 100, 9 * BS).await.unwrap();
        assert_eq!(got.len(), 8 * BS + 804);
        check_pattern(f.seed, 100, &got).unwrap();
        assert_eq!(cache.get(0u32, 8).await.unwrap().len(), 904);
        let many = cache.get_many(0u32, [3, 9, 1]).await;
        assert_eq!(
            many.iter()
                .map(|b| b.as_ref().unwrap().len())
                .collect::<Vec<_>>(),
            [BS, 0, BS]
        );
        let mut block = uring_positioned_io::AlignedBuf::new(BS, BS);
        block.fill(0x5A);
        let (n, _) = ctx.write_owned(0u32, 2 * BS as u64, block).await;
        assert_eq!(n.unwrap(), BS);
        let got = cache_read(&cache, 0u32, 2 * BS as u64 - 1, 2)
            .await
            .unwrap();
        assert_eq!((got[1], got.len()), (0x5A, 2));
        assert_eq!(got[0], common::pattern_byte(f.seed, 2 * BS as u64 - 1));
        // The bytes are in memory once: the cache's, not the page cache.
        assert_eq!(
            common::resident_pages(&f.open(), 0, len),
            0,
            "reads through the cache of an O_DIRECT file filled the page cache"
        );
    });
}

// ---------------------------------------------------------------------------
// Coalescing, errors, hangs, cancellation
// ---------------------------------------------------------------------------

/// K concurrent misses of one block are one read.
fn coalesced_misses(choice: BackendChoice) {
    common::run("cache-coalesce", Flavor::Current, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 3, 16 * BS as u64);
        // No inline stretch to run out: a get that yields before its lookup
        // (the stretch spent on a slow machine) would find the block landed
        // and count as a hit, not as a miss joining the flight.
        let ctx = common::build_ctx(choice, vec![f.open()], |b| {
            b.inline_nowait(false)
                .inline_stretch(Duration::from_secs(1))
        });
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        let before = ctx.stats();
        const K: usize = 16;
        let blocks = futures::future::join_all((0..K).map(|_| cache.get(0, 5))).await;
        let after = ctx.stats();
        let first = blocks[0].as_ref().unwrap();
        check_pattern(f.seed, 5 * BS as u64, first).unwrap();
        for b in &blocks {
            assert_eq!(
                b.as_ref().unwrap().as_ptr(),
                first.as_ptr(),
                "one buffer for all"
            );
        }
        // One miss read the block; every other get joined its flight, or
        // (on the blocking pool, whose read may land while the gets are
        // still being polled the first time) found it cached.
        let s = cache.stats();
        assert_eq!((s.misses, s.coalesced + s.hits), (1, K as u64 - 1), "{s:?}");
        if choice == BackendChoice::IoUring {
            // A ring's completion waits for its driver, which cannot run
            // while this task polls the gets: every other get joined.
            assert_eq!(s.coalesced, K as u64 - 1, "{s:?}");
        }
        assert_eq!(
            after.submitted + after.inline_completed - before.submitted - before.inline_completed,
            1,
            "reads issued: {before:?} -> {after:?}"
        );
        // get_many: its misses together, the ones in flight joined.
        let before = ctx.stats();
        let (many, one) = tokio::join!(cache.get_many(0, [8, 9, 10, 9, 5]), cache.get(0, 10));
        let after = ctx.stats();
        for (res, b) in many.iter().zip([8u64, 9, 10, 9, 5]) {
            check_pattern(f.seed, b * BS as u64, res.as_ref().unwrap()).unwrap();
        }
        check_pattern(f.seed, 10 * BS as u64, &one.unwrap()).unwrap();
        assert_eq!(
            after.submitted - before.submitted,
            3,
            "blocks 8, 9, 10 once each"
        );
        if choice == BackendChoice::IoUring {
            assert_eq!(
                after.enters - before.enters,
                1,
                "one enter for get_many's misses"
            );
        }
    });
}

const FLEN: u64 = 4 << 20;

fn fuse_ctx(choice: BackendChoice, fs: &FaultFs) -> UringContext {
    common::default_ctx(choice, vec![File::open(fs.path("f")).unwrap()])
}

/// An EIO reaches every coalesced waiter, once read, and caches nothing.
fn eio_reaches_every_waiter(choice: BackendChoice) {
    let Some(fs) = FaultFs::mount_or_skip(&[FileSpec::new("f", FLEN, 0xE10)], true) else {
        return;
    };
    let fs = Arc::new(fs);
    let block = 64u64;
    let at = block * BS as u64;
    fs.set_fault("f", at..at + BS as u64, Fault::Errno(libc::EIO));
    common::run("cache-eio", Flavor::Multi, 60, move || async move {
        let ctx = fuse_ctx(choice, &fs);
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        const K: usize = 8;
        let tasks: Vec<_> = (0..K)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.get(0, block).await })
            })
            .collect();
        for t in tasks {
            let e = t.await.unwrap().unwrap_err();
            assert!(is_eio(&e), "{e}");
            assert!(e.to_string().contains("block cache"), "{e}");
        }
        let s = cache.stats();
        let served = fs.read_log().iter().filter(|r| r.offset == at).count();
        // Tasks that came after the failed read made their own: never more
        // reads than callers, and never a cached error.
        assert_eq!(s.misses as usize, served, "{s:?}");
        assert_eq!(s.misses + s.coalesced, K as u64, "{s:?}");
        assert_eq!(s.resident_bytes, 0);
        // All at once (one join): every one gets the EIO; a caller that
        // comes after a failed read ended makes its own (errors are not
        // cached), never more reads than callers. (That one read reaches
        // every waiter is shown by the hung read below, which stays in
        // flight until all have joined.)
        fs.clear_read_log();
        let before = cache.stats();
        let all = futures::future::join_all((0..K).map(|_| cache.get(0, block))).await;
        assert!(all.iter().all(|r| r.as_ref().is_err_and(is_eio)));
        let s = cache.stats();
        let served = fs.read_log().iter().filter(|r| r.offset == at).count() as u64;
        assert_eq!(s.misses - before.misses, served, "{s:?}");
        assert_eq!(
            s.misses + s.coalesced - before.misses - before.coalesced,
            K as u64
        );
        // Nothing was cached: once the fault is gone, the block is read.
        fs.clear_faults();
        let b = cache.get(0, block).await.unwrap();
        check_pattern(0xE10, at, &b).unwrap();
        assert_eq!(cache.stats().misses, s.misses + 1);
    });
}

/// A hung read: every waiter stays pending, and all get its result when
/// the harness answers it.
fn hung_miss_reaches_every_waiter(choice: BackendChoice) {
    let Some(fs) = FaultFs::mount_or_skip(&[FileSpec::new("f", FLEN, 0x4A6)], true) else {
        return;
    };
    let fs = Arc::new(fs);
    let block = 128u64;
    let at = block * BS as u64;
    fs.set_fault("f", at..at + BS as u64, Fault::Hang);
    let fs2 = fs.clone();
    common::run("cache-hang", Flavor::Multi, 60, move || async move {
        let fs = fs2;
        let ctx = fuse_ctx(choice, &fs);
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        const K: u64 = 8;
        let tasks: Vec<_> = (0..K)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.get(0, block).await })
            })
            .collect();
        wait_until("every waiter to join the read", 20, || {
            let s = cache.stats();
            s.misses == 1 && s.coalesced == K - 1
        })
        .await;
        let f2 = fs.clone();
        wait_until("the read to hang", 20, move || f2.reads_hung_now() == 1).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            tasks.iter().all(|t| !t.is_finished()),
            "a waiter finished while the read hangs"
        );
        assert_eq!(fs.reads_hung_now(), 1, "one read for all");
        fs.release_hangs(); // EIO
        for t in tasks {
            let e = t.await.unwrap().unwrap_err();
            assert!(is_eio(&e), "{e}");
        }
        assert_eq!(cache.stats().resident_bytes, 0);
    });
    drop(fs);
}

/// A leader whose future is dropped while its read is in flight hands the
/// read on: the waiters get the bytes from that one read.
fn cancelled_leader(choice: BackendChoice) {
    let Some(fs) = FaultFs::mount_or_skip(&[FileSpec::new("f", FLEN, 0xCA4)], true) else {
        return;
    };
    let fs = Arc::new(fs);
    let block = 200u64;
    let at = block * BS as u64;
    fs.set_fault(
        "f",
        at..at + 2 * BS as u64,
        Fault::Delay(Duration::from_millis(300)),
    );
    common::run(
        "cache-cancelled-leader",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = fuse_ctx(choice, &fs);
            let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
            let mut leader = Box::pin(cache.get(0, block));
            assert!(poll_once_noop(leader.as_mut()).is_pending());
            const K: u64 = 6;
            let tasks: Vec<_> = (0..K)
                .map(|_| {
                    let cache = cache.clone();
                    tokio::spawn(async move { cache.get(0, block).await })
                })
                .collect();
            wait_until("the waiters to join", 20, || cache.stats().coalesced == K).await;
            drop(leader);
            for t in tasks {
                let b = t.await.unwrap().unwrap();
                check_pattern(0xCA4, at, &b).unwrap();
            }
            let s = cache.stats();
            assert_eq!(s.misses, 1, "{s:?}");
            assert_eq!(fs.read_log().iter().filter(|r| r.offset == at).count(), 1);
            // A leader dropped with no one waiting drops the read: the next
            // caller reads again instead of waiting for nothing.
            let next = block + 1;
            let mut alone = Box::pin(cache.get(0, next));
            assert!(poll_once_noop(alone.as_mut()).is_pending());
            drop(alone);
            let b = cache.get(0, next).await.unwrap();
            check_pattern(0xCA4, next * BS as u64, &b).unwrap();
            assert_eq!(cache.stats().misses, 3);
            // The dropped read holds its buffer until its own (delayed)
            // read returns, which may be after the second one's.
            wait_until("the dropped read's buffer to return", 20, || {
                cache.stats().in_flight_bytes == 0
            })
            .await;
        },
    );
}

// ---------------------------------------------------------------------------
// Eviction and memory
// ---------------------------------------------------------------------------

/// A hot set read again and again survives one pass over a cold range four
/// times the capacity.
fn scan_resistance(choice: BackendChoice) {
    common::run("cache-scan", Flavor::Current, 120, move || async move {
        let dir = tempfile::tempdir().unwrap();
        const CAP_BLOCKS: u64 = 256;
        let f = make_file(dir.path(), 9, 6 * CAP_BLOCKS * BS as u64);
        let ctx = common::default_ctx(choice, vec![f.open()]);
        let cache = BlockCache::new(&ctx, opts(CAP_BLOCKS * BS as u64)).unwrap();
        let hot: Vec<u64> = (0..64).map(|i| i * 3).collect(); // spread over shards
        for _ in 0..4 {
            for &b in &hot {
                cache.get(0, b).await.unwrap();
            }
        }
        let cold = 2 * CAP_BLOCKS..6 * CAP_BLOCKS;
        let mut buf = vec![0u8; 16 * BS];
        for chunk in cold.step_by(16) {
            let n = cache.read(0, chunk * BS as u64, &mut buf).await.unwrap();
            assert_eq!(n, buf.len());
        }
        let before = cache.stats();
        for &b in &hot {
            cache.get(0, b).await.unwrap();
        }
        let after = cache.stats();
        let hits = after.hits - before.hits;
        assert!(after.evictions > 0);
        assert!(
            hits >= hot.len() as u64 * 9 / 10,
            "only {hits} of {} hot blocks survived the scan ({after:?})",
            hot.len()
        );
    });
}

/// Many random reads from concurrent tasks: resident bytes never exceed the
/// capacity, and the buffer memory stays within capacity + pinned + in flight.
fn memory_bound(choice: BackendChoice) {
    common::run("cache-memory", Flavor::Multi, 120, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 11, 4 << 20);
        let ctx = common::default_ctx(choice, vec![f.open()]);
        const CAP: u64 = 64 * BS as u64;
        let cache = BlockCache::new(&ctx, opts(CAP)).unwrap();
        assert_eq!(cache.capacity_bytes(), CAP);
        let peak = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..8u64)
            .map(|t| {
                let (cache, peak, f) = (cache.clone(), peak.clone(), f.clone());
                tokio::spawn(async move {
                    let mut rng = Rng::new(t);
                    for _ in 0..400 {
                        let off = rng.below(f.len);
                        let len = rng.range(1, 3 * BS as u64) as usize;
                        let got = cache_read(&cache, 0u32, off, len).await.unwrap();
                        check_pattern(f.seed, off, &got).unwrap();
                        let s = cache.stats();
                        assert!(s.resident_bytes <= CAP, "{s:?}");
                        peak.fetch_max(s.pool_bytes, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let s = cache.stats();
        assert!(s.evictions > 0, "{s:?}");
        assert_eq!((s.pinned_bytes, s.in_flight_bytes), (0, 0), "{s:?}");
        // Eight tasks hold at most four blocks each (pinned or in flight)
        // beyond the capacity; buffers are carved in regions.
        let bound = CAP + 8 * 4 * BS as u64 + CAP;
        assert!(
            peak.load(Ordering::Relaxed) <= bound,
            "pool grew to {peak:?}, bound {bound}"
        );
        // Pinned: a block held past its eviction is counted, then released.
        let held = cache.get(0u32, 0).await.unwrap();
        cache.invalidate(0u32, 0..1).unwrap();
        assert_eq!(cache.stats().pinned_bytes, BS as u64);
        drop(held);
        assert_eq!(cache.stats().pinned_bytes, 0);
    });
}

// ---------------------------------------------------------------------------
// Frames: pins, eviction under load
// ---------------------------------------------------------------------------

/// The word block `b` holds at version `v`: both, so that a frame handed
/// out for the wrong block is caught as surely as a stale one.
fn stress_word(b: u64, v: u64) -> u64 {
    (b << 40) | v
}

/// Checks that every word of `bytes` (of block `b`) is block `b`'s at a
/// version `floor <= v <= ceil` (a read racing a write may see some words
/// of each version, as a `pread` racing a `pwrite` may).
fn stress_check(bytes: &[u8], b: u64, floor: u64, ceil: u64, what: &str) {
    assert!(
        !bytes.is_empty() && bytes.len() % 8 == 0,
        "{what}: {} bytes",
        bytes.len()
    );
    for w in bytes.chunks_exact(8) {
        let w = u64::from_le_bytes(w.try_into().unwrap());
        let v = w & ((1 << 40) - 1);
        assert_eq!(
            w >> 40,
            b,
            "{what}: bytes of block {} for block {b}",
            w >> 40
        );
        assert!(
            (floor..=ceil).contains(&v),
            "{what}: block {b} at version {v}, not in {floor}..={ceil}"
        );
    }
}

/// A file of `blocks` blocks of `bs` bytes, each holding `stress_word(b, 0)`.
fn stress_file(dir: &std::path::Path, blocks: u64, bs: usize) -> std::path::PathBuf {
    let path = dir.join("stress");
    let init: Vec<u8> = (0..blocks)
        .flat_map(|b| (0..bs / 8).flat_map(move |_| stress_word(b, 0).to_le_bytes()))
        .collect();
    std::fs::write(&path, init).unwrap();
    path
}

/// Many tasks on a multi-thread runtime, a cache of 8 blocks over 64 that
/// evicts all the time: hits and misses through `get`, `get_many` and
/// `read`, `BlockRef`s held across other tasks' work (their bytes checked
/// again before they are dropped: a pinned frame never changes),
/// invalidations, and writes through the context. Every word returned is
/// the block's (never another block's) at a version between the last one
/// completed before the read and the last one started; a held block's
/// bytes are the same when it is dropped as when it was got.
fn frames_stress(choice: BackendChoice) {
    const BLOCKS: u64 = 64;
    common::run(
        "cache-frames-stress",
        Flavor::Multi,
        180,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = stress_file(dir.path(), BLOCKS, BS);
            let ctx = common::default_ctx(choice, vec![common::open_rw(&path)]);
            const CAP: u64 = 8;
            let cache = BlockCache::new(&ctx, opts(CAP * BS as u64)).unwrap();
            // Per block: versions completed, and started.
            let done: Arc<Vec<AtomicU64>> =
                Arc::new((0..BLOCKS).map(|_| AtomicU64::new(0)).collect());
            let started: Arc<Vec<AtomicU64>> =
                Arc::new((0..BLOCKS).map(|_| AtomicU64::new(0)).collect());
            let mut tasks = Vec::new();
            for w in 0..2u64 {
                let (ctx, done, started) = (ctx.clone(), done.clone(), started.clone());
                tasks.push(tokio::spawn(async move {
                    let mut rng = Rng::new(300 + w);
                    for _ in 0..200 {
                        // Each writer owns half the blocks.
                        let b = rng.below(BLOCKS / 2) * 2 + w;
                        let v = started[b as usize].fetch_add(1, Ordering::AcqRel) + 1;
                        let bytes: Vec<u8> = (0..BS / 8)
                            .flat_map(|_| stress_word(b, v).to_le_bytes())
                            .collect();
                        ctx.write_all(0u32, b * BS as u64, &bytes).await.unwrap();
                        done[b as usize].store(v, Ordering::Release);
                        if rng.chance(10) {
                            tokio::task::yield_now().await;
                        }
                    }
                }));
            }
            for r in 0..6u64 {
                let (cache, done, started) = (cache.clone(), done.clone(), started.clone());
                tasks.push(tokio::spawn(async move {
                    let mut rng = Rng::new(400 + r);
                    let floor = |b: u64| done[b as usize].load(Ordering::Acquire);
                    let ceil = |b: u64| started[b as usize].load(Ordering::Acquire);
                    let mut held: Vec<(uring_positioned_io::BlockRef, Vec<u8>)> = Vec::new();
                    for i in 0..600 {
                        match rng.below(4) {
                            0 => {
                                let b = rng.below(BLOCKS);
                                let lo = floor(b);
                                let block = cache.get(0u32, b).await.unwrap();
                                stress_check(&block, b, lo, ceil(b), "get");
                                if rng.chance(30) {
                                    let copy = block.to_vec();
                                    held.push((block, copy));
                                }
                            }
                            1 => {
                                let bs: Vec<u64> =
                                    (0..rng.range(1, 5)).map(|_| rng.below(BLOCKS)).collect();
                                let lows: Vec<u64> = bs.iter().map(|&b| floor(b)).collect();
                                let got = cache.get_many(0u32, bs.iter().copied()).await;
                                for ((b, lo), res) in bs.iter().zip(lows).zip(got) {
                                    stress_check(&res.unwrap(), *b, lo, ceil(*b), "get_many");
                                }
                            }
                            2 => {
                                let b0 = rng.below(BLOCKS);
                                let n = rng.range(1, 4).min(BLOCKS - b0);
                                let lows: Vec<u64> = (b0..b0 + n).map(floor).collect();
                                let skip = rng.below(BS as u64 / 8) * 8;
                                let len = (n * BS as u64 - skip) as usize;
                                let got = cache_read(&cache, 0u32, b0 * BS as u64 + skip, len)
                                    .await
                                    .unwrap();
                                assert_eq!(got.len(), len);
                                let mut at = 0;
                                for (k, b) in (b0..b0 + n).enumerate() {
                                    let end = ((k as u64 + 1) * BS as u64 - skip) as usize;
                                    stress_check(&got[at..end], b, lows[k], ceil(b), "read");
                                    at = end;
                                }
                            }
                            _ => {
                                let b = rng.below(BLOCKS);
                                cache
                                    .invalidate(
                                        0u32,
                                        b * BS as u64..(b + rng.range(1, 3)) * BS as u64,
                                    )
                                    .unwrap();
                            }
                        }
                        // Held blocks never change; some are let go.
                        if i % 7 == 0 || held.len() > 6 {
                            for (block, copy) in held.drain(..) {
                                assert!(block[..] == copy[..], "a held block changed");
                            }
                        }
                        if rng.chance(20) {
                            tokio::task::yield_now().await;
                        }
                    }
                    for (block, copy) in held {
                        assert!(block[..] == copy[..], "a held block changed");
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let s = cache.stats();
            assert!(s.evictions > 0, "{s:?}");
            assert!(s.resident_bytes <= CAP * BS as u64, "{s:?}");
            assert_eq!((s.pinned_bytes, s.in_flight_bytes), (0, 0), "{s:?}");
            // Every cached block is the file's current one.
            for b in 0..BLOCKS {
                let v = done[b as usize].load(Ordering::Acquire);
                stress_check(&cache.get(0u32, b).await.unwrap(), b, v, v, "after");
            }
        },
    );
}

/// `read` copies a hit out without pinning its frame, checking after the
/// copy that the frame was not claimed meanwhile. Here frames are claimed
/// and refilled all the time under such copies: 4 tasks on 2 workers read
/// whole 64 KiB blocks (long copies) of 8 blocks through a cache of 3
/// frames (many reads hit, every miss evicts), while a fifth task keeps
/// invalidating blocks. Every word read must be the block's own: a copy
/// that raced a refill and was let through would show another block's.
fn hits_copied_while_frames_refill(choice: BackendChoice) {
    const BLOCKS: u64 = 8;
    const BIG: usize = 64 << 10;
    common::run(
        "cache-copy-refill",
        Flavor::Multi,
        120,
        move || async move {
            let dir = tempfile::tempdir().unwrap();
            let path = stress_file(dir.path(), BLOCKS, BIG);
            let ctx = common::default_ctx(choice, vec![common::open_rw(&path)]);
            let options = CacheOptions {
                capacity_bytes: 3 * BIG as u64,
                block_size: BIG,
            };
            let cache = BlockCache::new(&ctx, options).unwrap();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let churn = {
                let (cache, stop) = (cache.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut rng = Rng::new(77);
                    while !stop.load(Ordering::Relaxed) {
                        let b = rng.below(BLOCKS);
                        let at = b * BIG as u64;
                        cache.invalidate(0u32, at..at + BIG as u64).unwrap();
                        tokio::task::yield_now().await;
                    }
                })
            };
            let mut readers = Vec::new();
            for r in 0..4u64 {
                let cache = cache.clone();
                readers.push(tokio::spawn(async move {
                    let mut rng = Rng::new(500 + r);
                    let mut buf = vec![0u8; BIG];
                    for _ in 0..3_000 {
                        let b = rng.below(BLOCKS);
                        let n = cache.read(0u32, b * BIG as u64, &mut buf).await.unwrap();
                        assert_eq!(n, BIG);
                        stress_check(&buf, b, 0, 0, "read");
                    }
                }));
            }
            for r in readers {
                r.await.unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            churn.await.unwrap();
            let s = cache.stats();
            assert!(s.hits > 1_000 && s.evictions > 100, "{s:?}");
        },
    );
}

/// Held blocks are never evicted: their frames keep their bytes and stay
/// in the cache (a later get is a hit on the same memory) while the rest
/// of the cache turns over many times; once invalidated they count as
/// pinned until dropped.
fn pinned_never_evicted(choice: BackendChoice) {
    common::run("cache-pinned", Flavor::Multi, 120, move || async move {
        let dir = tempfile::tempdir().unwrap();
        const CAP: u64 = 32;
        let f = make_file(dir.path(), 21, 8 * CAP * BS as u64);
        let ctx = common::default_ctx(choice, vec![f.open()]);
        let cache = BlockCache::new(&ctx, opts(CAP * BS as u64)).unwrap();
        let held: Vec<_> = cache
            .get_many(0u32, 0..16)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let ptrs: Vec<*const u8> = held.iter().map(|b| b.as_ptr()).collect();
        // Thrash: 16 free frames for a pass over 8 × the capacity, 4 times.
        for _ in 0..4 {
            for b in (16..8 * CAP).step_by(4) {
                let got = cache_read(&cache, 0u32, b * BS as u64, 4 * BS)
                    .await
                    .unwrap();
                check_pattern(f.seed, b * BS as u64, &got).unwrap();
            }
        }
        let s = cache.stats();
        assert!(s.evictions >= 4 * (8 * CAP - 16) - CAP, "{s:?}");
        assert_eq!(s.pinned_bytes, 0, "held blocks were evicted: {s:?}");
        for (i, block) in held.iter().enumerate() {
            check_pattern(f.seed, i as u64 * BS as u64, block).unwrap();
            let before = cache.stats().hits;
            let again = cache.get(0u32, i as u64).await.unwrap();
            assert_eq!(
                cache.stats().hits,
                before + 1,
                "block {i} is no longer cached"
            );
            assert_eq!(again.as_ptr(), ptrs[i], "block {i} moved");
        }
        cache.invalidate(0u32, 0..16 * BS as u64).unwrap();
        assert_eq!(cache.stats().pinned_bytes, 16 * BS as u64);
        for _ in 0..2 {
            for b in (16..8 * CAP).step_by(4) {
                cache_read(&cache, 0u32, b * BS as u64, 4 * BS)
                    .await
                    .unwrap();
            }
        }
        for (i, block) in held.iter().enumerate() {
            check_pattern(f.seed, i as u64 * BS as u64, block).unwrap();
        }
        drop(held);
        let s = cache.stats();
        assert_eq!(s.pinned_bytes, 0, "{s:?}");
        assert!(s.resident_bytes <= CAP * BS as u64, "{s:?}");
    });
}

/// Dropping the cache while blocks are held: the blocks stay readable
/// (their frames outlive the cache) and are freed with the last of them.
fn blocks_outlive_cache(choice: BackendChoice) {
    common::run("cache-outlive", Flavor::Multi, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 22, 8 * BS as u64);
        let ctx = common::default_ctx(choice, vec![f.open()]);
        let cache = BlockCache::new(&ctx, opts(4 * BS as u64)).unwrap();
        let held: Vec<_> = cache
            .get_many(0u32, 0..8)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let copies = held.clone();
        drop(cache);
        drop(ctx);
        for (i, (a, b)) in held.iter().zip(&copies).enumerate() {
            check_pattern(f.seed, i as u64 * BS as u64, a).unwrap();
            assert_eq!(a.as_ptr(), b.as_ptr());
        }
        drop(held);
        for (i, b) in copies.iter().enumerate() {
            check_pattern(f.seed, i as u64 * BS as u64, b).unwrap();
        }
    });
}

// ---------------------------------------------------------------------------
// The hit path
// ---------------------------------------------------------------------------

/// A hit is ready at its first poll, allocates nothing and makes no
/// syscall; a task looping on hits spends the coop budget (and yields when
/// it is gone) and the inline stretch (and yields when it is over).
fn hit_path(choice: BackendChoice) {
    common::run("cache-hits", Flavor::Current, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 12, 64 * BS as u64);
        // A stretch no pass below outlasts: only the coop budget yields.
        let ctx = common::build_ctx(choice, vec![f.open()], |b| {
            b.inline_stretch(Duration::from_secs(1))
        });
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        let mut buf = vec![0u8; 64 * BS];
        cache.read(0, 0, &mut buf).await.unwrap();
        let before = ctx.stats();
        // 32 reads and 32 gets: within one poll's coop budget (128).
        let pass = |round: u64| {
            let mut ready = 0;
            let mut small = [0u8; 100];
            for i in 0..32u64 {
                let b = (i + round) % 64;
                if let Poll::Ready(Ok(block)) = poll_once_noop(pin!(cache.get(0, b))) {
                    assert_eq!(block.len(), BS);
                    ready += 1;
                }
                // A read spanning two cached blocks.
                let off = b * BS as u64 + BS as u64 - 50;
                if let Poll::Ready(Ok(n)) = poll_once_noop(pin!(cache.read(0, off, &mut small))) {
                    assert_eq!(n, if b == 63 { 50 } else { 100 });
                    ready += 1;
                }
            }
            ready
        };
        // The first pass may set up this thread's state (thread locals).
        tokio::task::yield_now().await;
        allocations(|| pass(0));
        let (mut ready, mut allocs) = (0, 0);
        for round in 1..20 {
            tokio::task::yield_now().await; // a fresh budget
            let (r, a) = allocations(|| pass(round));
            ready += r;
            allocs += a;
        }
        assert_eq!(allocs, 0, "hits allocated");
        assert_eq!(ready, 19 * 64, "hits not ready at their first poll");
        assert_eq!(
            ctx.stats().submitted,
            before.submitted,
            "hits made syscalls"
        );
        // Past the budget, hits yield.
        tokio::task::yield_now().await;
        let pending = (0..200)
            .filter(|_| poll_once_noop(pin!(cache.get(0, 1))).is_pending())
            .count();
        assert!(
            pending >= 50,
            "only {pending} of 200 hits yielded to the coop budget"
        );

        // A task looping on hits yields: the other task runs meanwhile.
        let ticks = Arc::new(AtomicU64::new(0));
        let looping = {
            let cache = cache.clone();
            let ticks = ticks.clone();
            tokio::spawn(async move {
                for i in 0..20_000u64 {
                    cache.get(0, i % 64).await.unwrap();
                }
                ticks.load(Ordering::Relaxed)
            })
        };
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        let seen = looping.await.unwrap();
        ticker.abort();
        assert!(seen > 0, "the hit loop never yielded");
    });
}

/// With a zero inline stretch, every hit after the first of a poll yields
/// (the inline path's fairness, spent by hits as by page-cache reads).
fn hit_stretch(choice: BackendChoice) {
    common::run("cache-stretch", Flavor::Current, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 13, 4 * BS as u64);
        let ctx = common::build_ctx(choice, vec![f.open()], |b| b.inline_stretch(Duration::ZERO));
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        cache.get(0, 0).await.unwrap();
        tokio::task::yield_now().await;
        let pending = (0..40)
            .filter(|_| poll_once_noop(pin!(cache.get(0, 0))).is_pending())
            .count();
        assert!(
            pending >= 19,
            "only {pending} of 40 hits yielded to the stretch"
        );
    });
}

/// Block sizes and capacities at the edges of the frame layout (one frame
/// per region, regions smaller than a header slab, a slab per region,
/// blocks of a whole huge page): `read` and `get` return the file's bytes,
/// with evictions and with blocks held pinned across later misses (more
/// frames carved than the capacity).
fn geometries(choice: BackendChoice) {
    common::run("cache-geometries", Flavor::Multi, 120, move || async move {
        let dir = tempfile::tempdir().unwrap();
        for (i, (block, cap_blocks)) in [
            (512usize, 1u64),
            (512, 3),
            (8192, 5),
            (65536, 17),
            (2 << 20, 2),
        ]
        .into_iter()
        .enumerate()
        {
            // Nine blocks and a short tenth.
            let len = block as u64 * 9 + 123;
            let path = common::make_file(dir.path(), 77 + i as u64, len).path;
            let ctx = common::default_ctx(choice, vec![common::open_rw(&path)]);
            let cache = BlockCache::new(
                &ctx,
                CacheOptions {
                    capacity_bytes: cap_blocks * block as u64,
                    block_size: block,
                },
            )
            .unwrap();
            let mut rng = Rng::new(500 + i as u64);
            let mut held = Vec::new();
            for _ in 0..120 {
                let off = rng.below(len + block as u64);
                let n = 1 + rng.below(3 * block as u64) as usize;
                let got = cache_read(&cache, 0u32, off, n).await.unwrap();
                assert_eq!(
                    got,
                    pread(&path, off, n),
                    "block {block}: read at {off}+{n}"
                );
                let b = rng.below(11);
                let r = cache.get(0u32, b).await.unwrap();
                assert_eq!(
                    &r[..],
                    &pread(&path, b * block as u64, block)[..],
                    "block {block}: get {b}"
                );
                if rng.chance(30) {
                    held.push((b, r));
                }
                if held.len() > 2 * cap_blocks as usize {
                    held.remove(0);
                }
            }
            // Held blocks never changed while pinned.
            for (b, r) in &held {
                assert_eq!(&r[..], &pread(&path, b * block as u64, block)[..]);
            }
            drop(held);
            // A cache that holds the whole file: every block read once is
            // a hit the second time (each frame keeps its own header).
            let whole = BlockCache::new(
                &ctx,
                CacheOptions {
                    capacity_bytes: 10 * block as u64,
                    block_size: block,
                },
            )
            .unwrap();
            for round in 0..2 {
                for b in 0..10 {
                    let r = whole.get(0u32, b).await.unwrap();
                    assert_eq!(&r[..], &pread(&path, b * block as u64, block)[..]);
                }
                let st = whole.stats();
                assert_eq!(
                    (st.misses, st.hits),
                    (10, 10 * round),
                    "block {block}, round {round}"
                );
            }
            // Hits on the short last block, read past the end of the file:
            // the bytes it has, and the rest of the buffer left as it was.
            let hits = whole.stats().hits;
            for (off, n) in [(len - 123, block), (len - 1, 2), (9 * block as u64, 124)] {
                let mut buf = vec![0xEE; n];
                let got = whole.read(0u32, off, &mut buf).await.unwrap();
                assert_eq!(
                    &buf[..got],
                    &pread(&path, off, n)[..],
                    "block {block}: {off}+{n}"
                );
                assert!(
                    buf[got..].iter().all(|&b| b == 0xEE),
                    "block {block}: a read at {off}+{n} wrote past the {got} bytes it returned"
                );
            }
            assert_eq!(whole.stats().hits, hits + 3, "block {block}: hits");
            ctx.shutdown().await;
        }
    });
}

/// Bad input: clear errors, no panic.
fn bad_input(choice: BackendChoice) {
    common::run("cache-bad-input", Flavor::Current, 30, move || async move {
        let ctx = common::default_ctx(choice, vec![tempfile::tempfile().unwrap()]);
        for (cap, bs) in [(1 << 20, 1000), (1 << 20, 256), (100, 4096)] {
            let e = BlockCache::new(
                &ctx,
                CacheOptions {
                    capacity_bytes: cap,
                    block_size: bs,
                },
            )
            .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains("BlockCache::new"), "{e}");
        }
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        let e = cache.get(0, u64::MAX).await.unwrap_err();
        assert!(e.to_string().contains("beyond i64::MAX"), "{e}");
        let e = cache.get(5, 0).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let mut buf = [0u8; 10];
        assert_eq!(cache.read(0, u64::MAX - 3, &mut buf).await.unwrap(), 0);
        assert_eq!(cache.read(0, 0, &mut buf).await.unwrap(), 0); // empty file
        cache.prefetch(0, 0..1 << 40).unwrap();
        assert!(cache.invalidate(9, 0..1).is_err());
        ctx.shutdown().await;
        let e = cache.get(0, 0).await.unwrap_err();
        assert!(e.to_string().contains("shut down"), "{e}");
    });
}

/// The futures are `Send` (for `tokio::spawn`); blocks are `'static`,
/// `Send` and `Sync`.
#[test]
fn send_and_sync() {
    fn send<T: Send>(_: &T) {}
    let _shared = common::shared();
    fn shared<T: Send + Sync + 'static>() {}
    shared::<uring_positioned_io::BlockRef>();
    shared::<BlockCache>();
    let rt = common::runtime(Flavor::Current);
    rt.block_on(async {
        let ctx = UringContext::new(vec![tempfile::tempfile().unwrap()]).unwrap();
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        let mut b = [0u8; 1];
        send(&cache.read(0u32, 0, &mut b));
        send(&cache.get_many(0u32, [0]));
        send(&cache.get(0u32, 0));
    });
}

/// Hits are counted exactly whichever thread makes them: more threads
/// than have a counter word of their own, all at once.
fn hits_counted_on_every_thread(choice: BackendChoice) {
    const THREADS: u64 = 40;
    const READS: u64 = 10_000;
    common::run("cache-hit-count", Flavor::Current, 60, move || async move {
        let dir = tempfile::tempdir().unwrap();
        let f = make_file(dir.path(), 13, 16 * BS as u64);
        let ctx = common::build_ctx(choice, vec![f.open()], |b| b);
        let cache = BlockCache::new(&ctx, opts(1 << 20)).unwrap();
        let mut buf = vec![0u8; 16 * BS];
        assert_eq!(cache.read(0, 0, &mut buf).await.unwrap(), 16 * BS);
        let before = cache.stats();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let mut small = [0u8; 64];
                        for i in 0..READS {
                            let off = ((t + i) % 16) * BS as u64 + 8;
                            assert_eq!(cache.read(0, off, &mut small).await.unwrap(), 64);
                        }
                    });
                })
            })
            .collect();
        for t in threads {
            tokio::task::spawn_blocking(move || t.join().unwrap())
                .await
                .unwrap();
        }
        let after = cache.stats();
        assert_eq!(after.misses, before.misses, "{after:?}");
        assert_eq!(after.hits - before.hits, THREADS * READS, "{after:?}");
    });
}

backend_tests!(
    coherence,
    miss_in_flight_during_write,
    dropped_write_landing_late,
    dropped_write_seen_by_a_later_registration,
    dropped_write_outliving_cache_and_context,
    concurrent_writes_never_stale,
    unregister_drops_blocks,
    one_file_registered_twice,
    o_direct,
    coalesced_misses,
    eio_reaches_every_waiter,
    hung_miss_reaches_every_waiter,
    cancelled_leader,
    scan_resistance,
    memory_bound,
    frames_stress,
    hits_copied_while_frames_refill,
    pinned_never_evicted,
    blocks_outlive_cache,
    hit_path,
    hits_counted_on_every_thread,
    hit_stretch,
    geometries,
    bad_input,
);
