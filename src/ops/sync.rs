//! Ops on a file that move no data: `fsync`, `fdatasync`,
//! `sync_file_range` and `fallocate` ([`UringSyncFuture`]).

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{Core, Op, Piece};
use crate::blocking::BlockingPool;
use crate::blocking::PoolJob;
use crate::error;
use crate::files::FileEntry;
use crate::flags::{FallocateMode, SyncRange};
use crate::id::FileId;
use crate::latency::OpKind;
use crate::ring::RingOp;
use crate::sys;

/// An op with no memory: `fsync`, `fdatasync`, `sync_file_range`,
/// `fallocate`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sync {
    Fsync { datasync: bool },
    Range { offset: u64, len: u32, flags: u32 },
    Fallocate { mode: i32, offset: u64, len: u64 },
}

impl Sync {
    pub(crate) fn range(offset: u64, len: u32, flags: SyncRange) -> Sync {
        Sync::Range {
            offset,
            len,
            flags: flags.bits(),
        }
    }

    pub(crate) fn fallocate(mode: FallocateMode, offset: u64, len: u64) -> Sync {
        Sync::Fallocate {
            mode: mode.bits(),
            offset,
            len,
        }
    }
}

impl Op for Sync {
    type Blocking = io::Result<usize>;
    const BLOCKING_DETACHABLE: bool = true;
    const KIND: OpKind = OpKind::Sync;

    fn name(&self) -> &'static str {
        match self {
            Sync::Fsync { datasync: false } => "fsync",
            Sync::Fsync { datasync: true } => "fdatasync",
            Sync::Range { .. } => "sync_file_range",
            Sync::Fallocate { .. } => "fallocate",
        }
    }

    fn check(&mut self, fid: FileId, _file: Option<&FileEntry>) -> io::Result<Option<usize>> {
        let max = i64::MAX.unsigned_abs();
        match *self {
            Sync::Range { offset, len, .. } if offset > max || max - offset < u64::from(len) => {
                Err(error::write_beyond_max(fid, offset, len as usize))
            }
            Sync::Fallocate { offset, len, .. } if offset > max || max - offset < len => Err(
                error::write_beyond_max(fid, offset, usize::try_from(len).unwrap_or(usize::MAX)),
            ),
            _ => Ok(None),
        }
    }

    #[cfg(feature = "cache")]
    fn changes(&self) -> Option<(u64, u64)> {
        match *self {
            // Collapsing or inserting a range moves every byte after it.
            Sync::Fallocate { mode, offset, .. }
                if mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0 =>
            {
                Some((offset, u64::MAX))
            }
            Sync::Fallocate { offset, len, .. } => Some((offset, len)),
            _ => None,
        }
    }

    fn iowq_serialized(&self) -> bool {
        matches!(self, Sync::Fallocate { .. })
    }

    fn sqe(&mut self) -> RingOp<'_> {
        match *self {
            Sync::Fsync { datasync } => RingOp::Fsync { datasync },
            Sync::Range { offset, len, flags } => RingOp::SyncRange { offset, len, flags },
            Sync::Fallocate { mode, offset, len } => RingOp::Fallocate { mode, offset, len },
        }
    }

    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Option<Arc<FileEntry>>,
    ) -> io::Result<PoolJob<io::Result<usize>>> {
        let file = file.ok_or_else(|| io::Error::other("sync without a file (a bug)"))?;
        let op = *self;
        pool.job(move || {
            let file = &file.file;
            match op {
                Sync::Fsync { datasync } => sys::fsync(file, datasync),
                // Offsets and lengths were checked to stay within i64::MAX
                // (`check`): `off` never saturates.
                Sync::Range { offset, len, flags } => {
                    sys::sync_file_range(file, off(offset), libc::off64_t::from(len), flags)
                }
                Sync::Fallocate { mode, offset, len } => {
                    sys::fallocate(file, mode, off(offset), off(len))
                }
            }
            .map(|()| 0)
        })
    }

    fn finish_blocking(&mut self, out: io::Result<usize>) -> io::Result<usize> {
        out
    }

    fn advance(&mut self, piece: Piece<'_>) -> Option<io::Result<usize>> {
        Some(match piece.res {
            Err(e) if piece.tainted => Err(io::Error::other(format!(
                "the thread that submitted this op exited while it was in the kernel \
                 (the context's home runtime shut down), and io_uring cancelled it ({e})"
            ))),
            res => res.map(|_| 0),
        })
    }
}

/// The future of [`fsync`](crate::UringContext::fsync),
/// [`fdatasync`](crate::UringContext::fdatasync),
/// [`sync_file_range`](crate::UringContext::sync_file_range) and
/// [`fallocate`](crate::UringContext::fallocate), and of the
/// [`UringFile`](crate::UringFile) methods that make them (`'static`
/// there).
#[must_use = "futures do nothing unless polled"]
pub struct UringSyncFuture<'a> {
    pub(crate) core: Core<'a, Sync>,
}

impl Future for UringSyncFuture<'_> {
    type Output = io::Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().core.poll_op(cx).map_ok(drop)
    }
}

impl fmt::Debug for UringSyncFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

/// An offset or length as `off64_t` (callers check it fits).
fn off(v: u64) -> libc::off64_t {
    libc::off64_t::try_from(v).unwrap_or(libc::off64_t::MAX)
}
