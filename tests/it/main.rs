//! The integration tests of the library: one test binary, one module per
//! area. The shared harness (test files, runtimes, watchdogs, the FUSE
//! fault-injection file system, seccomp helpers) is `tests/common/`.
//!
//! The tests of one binary run in parallel threads of one process. A test
//! that measures the whole process (its file descriptors, its CPU time, its
//! threads, timer gaps) takes `common::serial()` and runs alone; every other
//! test takes `common::shared()` (`backend_tests!` does it for the tests it
//! generates).
//!
//! Tests that need a process of their own are in other binaries:
//! `tests/process/` (a recording global allocator, fd accounting) and
//! `tests/fallback_seccomp.rs` (a seccomp filter).

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

/// Adapters: `UringFileCursor` (tokio's `AsyncRead`, `AsyncSeek`,
/// `AsyncWrite`) and reads into `bytes::Bytes`.
mod adapters;
/// `read_batch`: many owned reads submitted together.
mod batch;
/// The block cache (feature `cache`).
#[cfg(feature = "cache")]
mod cache;
/// Reads dropped at every point of their life.
mod cancellation;
/// Many more reads than ring entries, in-flight limits, per-file shares.
mod concurrency;
/// Every read path against `pread(2)` on random files, offsets and lengths.
mod differential;
/// The background driver: batching into enters, sleeping when idle, user code
/// (buffer drops, wakers) called back, the ring failing for good.
mod driver;
/// Error kinds and messages: what is refused, and naming the cause.
mod errors;
/// Cached reads in tight loops leave the runtime's other tasks running.
mod fairness;
/// The fault-injecting FUSE harness itself (`tests/common/fuse.rs`).
mod fuse_harness;
/// `UringFile`, the file handle, against `std` and `libc`; `'static` ops,
/// `usize` ids, typed flags.
mod handle;
/// Shutdown, drop, runtimes that die, contexts used from other runtimes.
mod lifecycle;
/// `AppendLog`, the write-ahead log helper (feature `append-log`).
#[cfg(feature = "append-log")]
mod log;
/// Builder options: valid ones keep results, invalid ones are errors.
mod options;
/// Reads: borrowed and owned buffers, file ids, offsets and EOF edges.
mod read;
/// Sequential scans (`ScanOptions::scan`).
mod scan;
/// The in-flight-slot scheduler: file shares and priority classes, on slow
/// (FUSE) storage.
mod sched;
/// Slow, failing, hung and network-like (FUSE) storage.
mod storage;
/// One-time decisions logged through `tracing` (feature `tracing`).
#[cfg(feature = "tracing")]
mod tracing;
/// Vectored reads.
mod vectored;
/// Writes, syncs, `fallocate`, `statx` and `open`.
mod write;
