//! Positioned file I/O through io_uring for ordinary tokio runtimes.
//!
//! `uring-positioned-io` lets async code on a stock tokio runtime
//! (`multi_thread` or `current_thread`) await random reads of files —
//! `ctx.read(fid, offset, &mut buf).await` — with thousands in flight, without
//! blocking worker threads and without a hop to the blocking pool per read;
//! and the rest of a storage engine's file I/O (writes, syncs, `fallocate`,
//! `statx`, `open`) on the same rings, with the same backpressure and the
//! same sound cancellation.
//!
//! # Getting started
//!
//! ```
//! use std::io::Write;
//! use uring_positioned_io::UringContext;
//!
//! # fn main() -> std::io::Result<()> {
//! let mut file = tempfile::tempfile()?;
//! file.write_all(b"hello, positioned world")?;
//!
//! let rt = tokio::runtime::Runtime::new()?;
//! rt.block_on(async {
//!     // File ids are indices into this Vec.
//!     let ctx = UringContext::new(vec![file])?;
//!     let mut buf = [0u8; 10];
//!     let n = ctx.read(0, 7, &mut buf).await?;
//!     assert_eq!(&buf[..n], b"positioned");
//!     // All of the buffer, or `UnexpectedEof`:
//!     ctx.read_exact(0, 0, &mut buf[..5]).await?;
//!
//!     // Owned buffers avoid the copy: the kernel writes straight into
//!     // them from their start, up to their capacity, and they come back
//!     // with the bytes read (`buf.slice(..n)` reads exactly n bytes).
//!     let (res, buf) = ctx.read_owned(0, 0, Vec::with_capacity(5)).await;
//!     assert_eq!((res?, &buf[..]), (5, &b"hello"[..]));
//!     println!("backend: {}, {:?}", ctx.backend(), ctx.stats());
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # What it does
//!
//! | capability | methods | example in |
//! |---|---|---|
//! | a file as a value: std's names and argument order, `'static` futures | [`UringFile`] from [`file`](UringContext::file) or [`open_file`](UringContext::open_file): `read_at`, `read_exact_at`, `write_all_at`, `sync_data`, `len`, `scan`, `read_batch`, … | [`UringFile`] |
//! | tokio's `AsyncRead`, `AsyncSeek`, `AsyncWrite` (`BufReader`, `io::copy`, codecs) | [`UringFile::cursor`] → [`UringFileCursor`] | [`UringFileCursor`] |
//! | reads into borrowed buffers | [`read`](UringContext::read), [`read_exact`](UringContext::read_exact) | above |
//! | reads into owned buffers, no copy | [`read_owned`](UringContext::read_owned), [`read_exact_owned`](UringContext::read_exact_owned), their `_static` forms for `tokio::spawn` | above, [`IoBufMut`] |
//! | vectored reads (`preadv`) | [`read_vectored`](UringContext::read_vectored), [`read_vectored_owned`](UringContext::read_vectored_owned) | [`read_vectored`](UringContext::read_vectored) |
//! | many reads at once | [`read_batch`](UringContext::read_batch), [`ReadBatch::merge_gap`], [`ReadBatch::unordered`] | [below](#batches-and-scans) |
//! | sequential scans | [`ScanOptions::scan`] → a `Stream` of [`Chunk`]s | [below](#batches-and-scans) |
//! | writes | [`write`](UringContext::write), [`write_all`](UringContext::write_all), [`write_owned`](UringContext::write_owned), [`write_all_owned`](UringContext::write_all_owned) | [below](#writes-durability-and-files) |
//! | durability | [`fsync`](UringContext::fsync), [`fdatasync`](UringContext::fdatasync), a durable write (`.durable()` on a write future: `RWF_DSYNC`), [`sync_file_range`](UringContext::sync_file_range) (writeback only, not durable) | [below](#writes-durability-and-files) |
//! | space and metadata | [`fallocate`](UringContext::fallocate), [`statx`](UringContext::statx) ([`FileStat`]), [`file_size`](UringContext::file_size) | [below](#writes-durability-and-files) |
//! | files | [`open`](UringContext::open) ([`OpenOptions`]), [`register_file`](UringContext::register_file), [`unregister_file`](UringContext::unregister_file), [`FileId`] | [below](#writes-durability-and-files), [`FileId`] |
//! | settings | [`UringContext::builder`] → [`Builder`] | [below](#settings-stats-and-backends) |
//! | counters | [`stats`](UringContext::stats) → [`Stats`] | above |
//! | latency histograms per class and kind of op (opt-in) | [`Builder::latency_histograms`], [`latencies`](UringContext::latencies) → [`Latencies`], [`LatencyHistogram`] | [`LatencyHistogram`] |
//! | backends | [`backend`](UringContext::backend) → [`BackendInfo`]; [`BackendChoice`] | [below](#settings-stats-and-backends) |
//! | block cache (feature `cache`) | `BlockCache`, `CacheOptions`, `BlockRef` | `BlockCache` |
//! | errors | `std::io::Error` throughout; [`os_error`] for the errno behind one | [`os_error`] |
//!
//! # Batches and scans
//!
//! [`UringContext::read_batch`] reads many `(file, offset, buffer)` with one
//! `io_uring_enter` per ring; [`ReadBatch::merge_gap`] merges reads of
//! nearby ranges into one, and [`ReadBatch::unordered`] yields the results
//! in completion order ([`ReadBatchStream`]). A scan reads a range of a file
//! in order, keeping reads in flight ahead of the consumer and recycling
//! buffers as chunks are dropped (memory: chunk size × reads in flight).
//!
//! ```
//! use futures::StreamExt;
//! use uring_positioned_io::{ScanOptions, UringContext};
//! # use std::io::Write;
//! # fn main() -> std::io::Result<()> {
//! # let mut file = tempfile::tempfile()?;
//! # file.write_all(&[b'\n'; 65536])?;
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let ctx = UringContext::new(vec![file])?;
//!
//! // Four 4 KiB blocks, merged into one read because they are adjacent.
//! let reads = (0..4u64).map(|i| (0u32, i * 4096, Vec::with_capacity(4096)));
//! for (res, block) in ctx.read_batch(reads).merge_gap(0).await {
//!     assert_eq!((res?, block.len()), (4096, 4096));
//! }
//!
//! // The whole file, 16 KiB at a time.
//! let mut chunks = ScanOptions::new().chunk_size(16 << 10).scan(&ctx, 0, ..)?;
//! let mut lines = 0;
//! while let Some(chunk) = chunks.next().await {
//!     lines += chunk?.iter().filter(|&&b| b == b'\n').count(); // Chunk derefs to [u8]
//! }
//! assert_eq!(lines, 65536);
//! # Ok(())
//! # })
//! # }
//! ```
//!
//! # Writes, durability and files
//!
//! A write that completes `Ok` is in the page cache (or, `O_DIRECT`, on the
//! device); [`fsync`](UringContext::fsync) and
//! [`fdatasync`](UringContext::fdatasync) make every write that completed
//! before they started durable. A write future's
//! [`durable`](UringWriteAllFuture::durable) makes that write alone durable
//! when it completes (`RWF_DSYNC`), in one op. [`open`](UringContext::open) opens and
//! registers a file and resolves to a checked [`FileId`], which another
//! context, or this one after the file is unregistered, refuses with
//! `InvalidInput` instead of touching another file. What a dropped or failed
//! write leaves behind is in [the design document](design), "Writes and
//! durability".
//!
//! ```
//! use uring_positioned_io::{FallocateMode, OpenOptions, SyncRange, UringContext};
//! # fn main() -> std::io::Result<()> {
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let dir = tempfile::tempdir()?;
//! let ctx = UringContext::new(vec![])?;
//! let opts = OpenOptions::new().read(true).write(true).create(true).clone();
//! let log = ctx.open(dir.path().join("log"), &opts).await?;
//!
//! ctx.fallocate(log, FallocateMode::ALLOCATE, 0, 1 << 20).await?; // reserve 1 MiB
//! ctx.write_all(log, 0, b"record 1\n").await?;
//! ctx.sync_file_range(log, 0, 0, SyncRange::WRITE).await?; // start writeback
//! ctx.fdatasync(log).await?; // durable from here on
//! ctx.write_all(log, 9, b"record 2\n").durable().await?; // durable when done
//! assert_eq!(ctx.file_size(log).await?, 1 << 20);
//! assert!(ctx.statx(log).await?.blocks > 0);
//!
//! // A file opened elsewhere joins the same context.
//! let other = ctx.register_file(tempfile::tempfile()?)?;
//! ctx.write_all(other, 0, b"x").await?;
//! ctx.unregister_file(other)?;
//! # Ok(())
//! # })
//! # }
//! ```
//!
//! # Settings, stats and backends
//!
//! [`UringContext::new`] uses defaults: one ring per two runtime workers,
//! 512 reads in flight per worker, the inline page-cache path on.
//! [`UringContext::builder`] sets the rest ([`Builder`]: rings, ring size,
//! in-flight limits overall and per file, SQPOLL, the inline path and its
//! fairness stretch, the backend, shutdown timeout, routing of FUSE and
//! network file systems). [`UringContext::stats`] counts submissions,
//! completions, enters and inline hits, and the in-flight slots each
//! priority class took.
//!
//! Every op has a [`Priority`]: point reads and writes are
//! [`Priority::Latency`], scans [`Priority::Background`], and
//! [`UringContext::with_priority`] gives a handle whose ops are background
//! (compaction, backups). Background ops use every in-flight slot while no
//! latency op is active and a few ([`Builder::background_share`]) while one
//! is; a file's share of the slots ([`Builder::max_in_flight_per_file`])
//! binds only while another file's ops wait.
//!
//! Two backends run the same API: io_uring (Linux 5.19 or newer), and, where
//! io_uring cannot be set up (an old kernel, seccomp, `io_uring_disabled`,
//! memlock limits), `pread` on tokio's blocking pool — correct and as safe
//! to cancel, but a hop per read. [`UringContext::backend`] says which runs
//! and why; [`BackendChoice::IoUring`] makes a missing io_uring an error.
//! Files on FUSE and network file systems go to the blocking pool by default
//! ([`UringContext::file_route`] says).
//!
//! ```
//! use uring_positioned_io::{BackendChoice, BackendKind, UringContext};
//! # fn main() -> std::io::Result<()> {
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let ctx = UringContext::builder()
//!     .max_in_flight(256)
//!     .backend(BackendChoice::Auto)
//!     .build(vec![tempfile::tempfile()?])?;
//! if ctx.backend().kind == BackendKind::Fallback {
//!     eprintln!("{}", ctx.backend()); // says why
//! }
//! # Ok(())
//! # })
//! # }
//! ```
//!
//! # Errors
//!
//! Every call returns [`std::io::Error`]: the kernel's errno where it gave
//! one (explained against the file where the crate can, e.g. an unaligned
//! `O_DIRECT` read names what is misaligned; [`os_error`] recovers the
//! errno), `InvalidInput` for bad arguments (an unknown or stale
//! [`FileId`], a setting out of range), never a panic or a hang.
//! `shutdown()` returns within `Builder::shutdown_timeout` even if storage
//! never answers. The full failure model is in [the design
//! document](design), "Failure model".
//!
//! # How it works
//!
//! A [`UringContext`] owns io_uring rings (by default one per two runtime
//! workers, see [`Builder::rings`]) and spawns one background *driver* task
//! per ring. A read first tries the *inline path*: the page cache, with
//! `preadv2(RWF_NOWAIT)`, on the polling thread; on a miss it queues an SQE
//! and either submits it itself (the driver is idle) or wakes the driver,
//! which submits everything queued with one `io_uring_enter`, reaps every
//! completion and wakes the reading tasks. An idle driver sleeps in tokio's
//! reactor on the ring's own file descriptor: an idle context costs no CPU.
//! See [the design document](design) for the full design, the failure model
//! and measurements.
//!
//! # Ownership and cancellation
//!
//! The kernel never writes into memory the caller owns through a borrow:
//! [`UringContext::read`] reads into a bounce buffer owned by the in-flight
//! operation and copies the bytes out on completion. Dropping a read future
//! at any point is therefore safe: an operation still in the kernel is marked
//! *ignored* and its buffer is recycled only when its completion arrives.
//! [`UringContext::read_owned`] takes the buffer by value instead (no copy)
//! and writes into it from its start, at most `bytes_total()` bytes — a
//! `Vec`'s `capacity()` (not its `len()`, which is raised to the count if
//! shorter, never lowered), an [`AlignedBuf`]'s (aligned, for `O_DIRECT`),
//! a `BytesMut`'s with the `bytes` feature, or a window of any of them
//! ([`IoBufMut::slice`]: `buf.slice(..n)` reads `n` bytes);
//! [`UringContext::read_exact_owned`] fills all of it. A dropped owned read
//! parks the buffer in the context until the kernel is done with it.
//! Dropping a read the kernel holds also sends it a cancel
//! (`IORING_OP_ASYNC_CANCEL`): a read the kernel can still stop comes back at
//! once and frees its in-flight slot. The context's methods borrow it; a
//! future that holds the context instead is `'static`, for `tokio::spawn`:
//! every method of a [`UringFile`] with owned buffers, its syncs, `metadata`,
//! scans and batches, [`UringContext::open_file`],
//! [`UringContext::read_batch_static`] and the `*_static` forms
//! ([`UringContext::read_owned_static`],
//! [`UringContext::read_exact_owned_static`]).
//!
//! # Features
//!
//! - `cache`: `BlockCache`, a cache of fixed-size blocks read through the
//!   context, with concurrent misses of a block coalesced into one read and
//!   writes through the context kept coherent.
//! - `bytes`: `IoBufMut` for `bytes::BytesMut`; exact reads into `Bytes`
//!   (`UringFile::read_exact_at_bytes`, `read_ranges_bytes`) and a scan's
//!   `Chunk` into `Bytes`, without a copy.
//! - `append-log`: `AppendLog`, a write-ahead log over a `UringFile`:
//!   `append` resolves to the record's offset once it and every earlier
//!   record are durable (group commit, CRC-32 framing, preallocation), and
//!   opening a log recovers it up to its first torn record. Opened
//!   `O_DIRECT`, the log writes whole blocks and commits faster.
//! - `parquet`: `ParquetFileReader`, parquet's `AsyncFileReader` over a
//!   `UringFile` (one read per range, one batch per set of ranges).
//! - `tracing`: the context's one-time decisions (the fallback and why, a
//!   file routed to the blocking pool, a ring that broke) as `tracing`
//!   events, and a `TRACE` span `op` around every op (its name, file,
//!   offset, length and priority; at its end the bytes moved or the error,
//!   and whether the page cache served it inline).
#![deny(missing_docs, missing_debug_implementations, rust_2018_idioms)]
// The workspace lint set ([workspace.lints] in Cargo.toml) applies too; the
// library is also held to all of clippy's pedantic lints, with each
// exception allowed where it occurs, with its reason.
#![warn(clippy::pedantic)]

mod adapters;
#[cfg(feature = "append-log")]
mod append_log;
mod batch;
mod blocking;
mod buf;
mod builder;
#[cfg(feature = "cache")]
mod cache;
#[cfg(feature = "cache")]
mod changes;
mod clock;
mod context;
mod error;
mod file;
mod files;
mod flags;
mod id;
mod inline;
mod latency;
mod ops;
mod permit;
mod ring;
mod scan;
mod shared;
mod sys;
mod thread;
mod util;

#[cfg(feature = "parquet")]
pub use adapters::ParquetFileReader;
pub use adapters::UringFileCursor;
#[cfg(feature = "append-log")]
pub use append_log::{
    AppendFuture, AppendLog, AppendLogOptions, AppendLogStats, LogRecord, LogRecovery,
    Preallocation, RECORD_HEADER_LEN,
};
pub use batch::{ReadBatch, ReadBatchStream};
pub use buf::{AlignedBuf, IoBuf, IoBufMut, Slice, SliceError};

/// The design document (`docs/DESIGN.md` in the repository): architecture,
/// the op lifecycle and why cancellation is sound, wakeups, the failure
/// model, and measured costs.
#[doc = include_str!("../docs/DESIGN.md")]
#[allow(clippy::doc_markdown, reason = "a prose document, rendered as written")]
pub mod design {}

pub use builder::Builder;
#[cfg(feature = "cache")]
pub use cache::{BlockCache, BlockRef, CacheOptions, CacheStats, GetBlock};
pub use context::{ClassStats, Stats, UringContext};
pub use error::os_error;
pub use file::{UringFile, UringOpenFileFuture};
pub use files::FileRoute;
pub use flags::{FallocateMode, SyncRange};
pub use id::FileId;
pub use latency::{ClassLatencies, Latencies, LatencyHistogram};
pub use ops::open::{OpenOptions, UringOpenFuture};
pub use ops::read::{
    UringReadExactOwnedFuture, UringReadFuture, UringReadOwnedFuture, BORROWED_CHUNK,
};
pub use ops::readv::{UringReadVectoredFuture, UringReadVectoredOwnedFuture};
pub use ops::statx::{FileStat, UringStatxFuture};
pub use ops::sync::UringSyncFuture;
pub use ops::write::{
    UringWriteAllFuture, UringWriteAllOwnedFuture, UringWriteFuture, UringWriteOwnedFuture,
};
pub use permit::Priority;
pub use scan::{Chunk, Scan, ScanOptions};
pub use shared::{BackendChoice, BackendInfo, BackendKind};
