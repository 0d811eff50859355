//! Memory bounds (hardening finding 11): a borrowed read allocates at most a
//! bounded bounce buffer however large it is (the old code allocated one as
//! large as the read: a 2.5 GiB read peaked at 4.2 GB RSS). A global
//! allocator that records the largest single allocation makes this exact.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::Flavor;
use uring_positioned_io::{BackendChoice, BORROWED_CHUNK};

struct Recording;

static RECORDING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only
// records sizes on the side.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if RECORDING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if RECORDING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if RECORDING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Recording = Recording;

#[test]
fn borrowed_reads_allocate_bounded_bounce_buffers() {
    // The recording allocator is process-wide: the other test's 48 MiB
    // buffers must not be allocated while this one records.
    let _serial = common::serial();
    const READ: usize = 48 << 20;
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        // Sparse: a hole reads as zeros; the last bytes are real data.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(READ as u64 + 4096).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"tail", READ as u64 - 4).unwrap();
        drop(f);
        let opened = vec![std::fs::File::open(&path).unwrap()];
        common::run("memory", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b.inline_nowait(false));
            let mut buf = vec![1u8; READ];
            LARGEST.store(0, Ordering::Relaxed);
            RECORDING.store(true, Ordering::Relaxed);
            let n = ctx.read(0u32, 0, &mut buf).await.expect("large read");
            RECORDING.store(false, Ordering::Relaxed);
            let largest = LARGEST.load(Ordering::Relaxed);
            assert_eq!(n, READ, "{choice:?}: the caller sees one read");
            assert!(buf[..READ - 4].iter().all(|&b| b == 0), "{choice:?}: hole");
            assert_eq!(&buf[READ - 4..], b"tail", "{choice:?}: data after the hole");
            eprintln!(
                "{choice:?}: a {READ}-byte borrowed read allocated at most {largest} bytes at once"
            );
            assert!(
                largest <= BORROWED_CHUNK + 4096,
                "{choice:?}: a {READ}-byte borrowed read allocated {largest} bytes at once"
            );
            drop(dir);
        });
    }
}

/// The write side (issue #11): a borrowed write of 48 MiB copies at most
/// one `BORROWED_CHUNK` at a time into its bounce buffer, on both backends,
/// and lands whole.
#[test]
fn borrowed_writes_allocate_bounded_bounce_buffers() {
    let _serial = common::serial();
    const WRITE: usize = 48 << 20;
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let opened = vec![std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap()];
        let check = path.clone();
        common::run("memory-write", Flavor::Multi, 60, move || async move {
            let ctx = common::build_ctx(choice, opened, |b| b);
            let data: Vec<u8> = (0..WRITE).map(|i| (i % 251) as u8).collect();
            LARGEST.store(0, Ordering::Relaxed);
            RECORDING.store(true, Ordering::Relaxed);
            let n = ctx.write(0u32, 0, &data).await.expect("large write");
            RECORDING.store(false, Ordering::Relaxed);
            let largest = LARGEST.load(Ordering::Relaxed);
            assert_eq!(n, WRITE, "{choice:?}: the caller sees one write");
            eprintln!(
                "{choice:?}: a {WRITE}-byte borrowed write allocated at most {largest} bytes at once"
            );
            assert!(
                largest <= BORROWED_CHUNK + 4096,
                "{choice:?}: a {WRITE}-byte borrowed write allocated {largest} bytes at once"
            );
            let on_disk = std::fs::read(&check).unwrap();
            assert!(on_disk == data, "{choice:?}: the file holds the write");
        });
        drop(dir);
    }
}
