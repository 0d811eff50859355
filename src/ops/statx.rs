//! `statx` of a registered file ([`UringStatxFuture`], [`FileStat`]).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use super::{Core, Op, Piece};
use crate::blocking::BlockingPool;
use crate::blocking::PoolJob;
use crate::files::FileEntry;
use crate::id::FileId;
use crate::ring::RingOp;
use crate::sys;

/// What [`UringContext::statx`](crate::UringContext::statx) says about a
/// file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileStat {
    /// Size in bytes (of a block device too).
    pub size: u64,
    /// Storage allocated, in 512-byte units (`st_blocks`).
    pub blocks: u64,
    /// The preferred I/O size (`st_blksize`).
    pub block_size: u32,
    /// For `O_DIRECT`: the alignment a buffer's address needs, if the
    /// kernel (6.1+) and file system say (`STATX_DIOALIGN`); `Some(0)`
    /// means the file does not support `O_DIRECT`.
    pub dio_mem_align: Option<u32>,
    /// For `O_DIRECT`: the alignment offsets and lengths need, if known.
    pub dio_offset_align: Option<u32>,
}

const STATX_MASK: u32 = libc::STATX_BASIC_STATS | libc::STATX_DIOALIGN;

pub(crate) struct Statx {
    /// The kernel writes here (boxed: stable while the future moves;
    /// parked in the op if the future is dropped).
    buf: Option<Box<libc::statx>>,
}

impl Statx {
    pub(crate) fn new() -> Self {
        Statx {
            // SAFETY: statx is plain data; all zeroes is a valid value.
            buf: Some(Box::new(unsafe { std::mem::zeroed() })),
        }
    }

    fn stat(&self, file: Option<&FileEntry>) -> io::Result<FileStat> {
        let st = self
            .buf
            .as_deref()
            .ok_or_else(|| io::Error::other("statx buffer lost"))?;
        let mut size = st.stx_size;
        if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFBLK {
            if let Some(f) = file {
                size = crate::sys::file_size(&f.file, f.kind)?;
            }
        }
        let dio = st.stx_mask & libc::STATX_DIOALIGN != 0;
        Ok(FileStat {
            size,
            blocks: st.stx_blocks,
            block_size: st.stx_blksize,
            dio_mem_align: dio.then_some(st.stx_dio_mem_align),
            dio_offset_align: dio.then_some(st.stx_dio_offset_align),
        })
    }
}

impl Op for Statx {
    type Blocking = io::Result<Box<libc::statx>>;
    const BLOCKING_DETACHABLE: bool = true;

    fn name(&self) -> &'static str {
        "statx"
    }

    fn sqe(&mut self) -> RingOp<'_> {
        let buf = self.buf.as_deref_mut().expect("statx buffer at home");
        RingOp::Statx {
            buf: std::ptr::from_mut(buf),
            mask: STATX_MASK,
        }
    }

    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        file: Option<Arc<FileEntry>>,
    ) -> io::Result<PoolJob<Self::Blocking>> {
        let file = file.ok_or_else(|| io::Error::other("statx without a file (a bug)"))?;
        pool.job(move || sys::statx(&file.file, STATX_MASK))
    }

    fn finish_blocking(&mut self, out: Self::Blocking) -> io::Result<usize> {
        self.buf = Some(out?);
        Ok(0)
    }

    fn park(&mut self) -> Option<Box<dyn Any + Send>> {
        self.buf.take().map(|b| b as Box<dyn Any + Send>)
    }

    fn check(&mut self, _fid: FileId, _file: Option<&FileEntry>) -> io::Result<Option<usize>> {
        Ok(None)
    }

    fn advance(&mut self, piece: Piece<'_>) -> Option<io::Result<usize>> {
        Some(piece.res)
    }
}

/// The future of [`UringContext::statx`](crate::UringContext::statx) and
/// of [`UringFile::metadata`](crate::UringFile::metadata) (`'static`
/// there).
#[must_use = "futures do nothing unless polled"]
pub struct UringStatxFuture<'a> {
    pub(crate) core: Core<'a, Statx>,
}

impl Future for UringStatxFuture<'_> {
    type Output = io::Result<FileStat>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        ready!(this.core.poll_op(cx))?;
        Poll::Ready(this.core.op.stat(this.core.file()))
    }
}

impl fmt::Debug for UringStatxFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}
