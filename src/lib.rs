//! Positioned file reads through io_uring for ordinary tokio runtimes.
//!
//! `uring-positioned-io` lets async code on a stock tokio runtime
//! (`multi_thread` or `current_thread`) await random reads of files —
//! `ctx.read(fid, offset, &mut buf).await` — with thousands in flight, without
//! blocking worker threads and without a hop to the blocking pool per read.
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
//!
//!     // Owned buffers avoid the copy: the kernel writes straight into
//!     // their spare capacity, and they come back grown by the bytes read.
//!     let (res, buf) = ctx.read_owned(0, 0, Vec::with_capacity(5)).await;
//!     assert_eq!((res?, &buf[..]), (5, &b"hello"[..]));
//!     println!("backend: {}, {:?}", ctx.backend(), ctx.stats());
//!     Ok(())
//! })
//! # }
//! ```
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
//! reactor on the ring's own file descriptor: an idle context costs no CPU. See [the design document](design) for the full design, the
//! failure model and measurements.
//!
//! # Ownership and cancellation
//!
//! The kernel never writes into memory the caller owns through a borrow:
//! [`UringContext::read`] reads into a bounce buffer owned by the in-flight
//! operation and copies the bytes out on completion. Dropping a read future
//! at any point is therefore safe: an operation still in the kernel is marked
//! *ignored* and its buffer is recycled only when its completion arrives.
//! [`UringContext::read_owned`] takes the buffer by value instead (no copy)
//! and fills its spare capacity — a `Vec`'s `len()..capacity()`, an
//! [`AlignedBuf`]'s, a `BytesMut`'s with the `bytes` feature, or a window of
//! any of them ([`IoBufMut::slice`]); [`UringContext::read_exact_owned`]
//! fills all of it. A dropped owned read parks the buffer in the context
//! until the kernel is done with it. Dropping a read the kernel holds also
//! sends it a cancel (`IORING_OP_ASYNC_CANCEL`): a read the kernel can still
//! stop (queued for a blocked io-wq worker) comes back at once and frees its
//! in-flight slot; one the device already has completes as usual.
//!
//! # Batches and vectored reads
//!
//! [`UringContext::read_batch`] reads many `(file, offset, buffer)` with one
//! `io_uring_enter` per ring; [`ReadBatch::merge_gap`] merges reads of
//! nearby ranges into one, and [`ReadBatch::unordered`] yields the results
//! in completion order ([`ReadBatchStream`]).
//! [`UringContext::read_vectored`] and [`UringContext::read_vectored_owned`]
//! are `preadv` at an offset, into borrowed slices or owned buffers.
//!
//! # `'static` futures
//!
//! The read futures borrow the context, which costs nothing per read. To
//! pass an owned read to `tokio::spawn` as it is, use
//! [`UringContext::read_owned_static`] or
//! [`UringContext::read_exact_owned_static`]: their futures hold a handle to
//! the context (a reference count per read) and are `'static`.
//!
//! # Fallback
//!
//! Where io_uring is unavailable (old kernel, seccomp, `io_uring_disabled`,
//! memlock limits) the same API runs on `pread` in tokio's blocking pool;
//! [`UringContext::backend`] says which backend runs and why.
#![deny(missing_docs, missing_debug_implementations, rust_2018_idioms)]
// The workspace lint set ([workspace.lints] in Cargo.toml) applies too; the
// library is also held to all of clippy's pedantic lints, with each
// exception allowed where it occurs, with its reason.
#![warn(clippy::pedantic)]

mod batch;
mod blocking;
mod buf;
mod builder;
#[cfg(feature = "cache")]
mod cache;
#[cfg(feature = "cache")]
mod changes;
mod context;
mod error;
mod file;
mod files;
mod flags;
mod id;
mod inline;
mod ops;
mod permit;
mod ring;
mod scan;
mod shared;
mod sys;
mod thread;
mod util;

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
pub use context::{Stats, UringContext};
pub use error::os_error;
pub use file::{UringFile, UringOpenFileFuture};
pub use files::FileRoute;
pub use flags::{FallocateMode, SyncRange};
pub use id::FileId;
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
pub use scan::{Chunk, Scan, ScanOptions};
pub use shared::{BackendChoice, BackendInfo, BackendKind};
