//! The ops other than reads: writes, syncs, `fallocate` and `statx`
//! ([`Ring::submit_op`]). They share everything else with reads —
//! the op table and its lifecycle, the in-flight permits, the backlog,
//! submission through the driver, completion through
//! [`Ring::poll_complete`], cancellation through [`Ring::abandon`] — and
//! differ only in the SQE and in what memory the kernel touches.
//!
//! SAFETY (as `submit.rs`): every SQE pushed here points only into memory
//! owned by its op until its CQE: a pool buffer or a one-off `AlignedBuf`
//! holding a copy of borrowed data (`OpBuf::Pool`/`Heap`), or caller memory
//! that the future holds and parks in the op if it is dropped
//! (`OpBuf::Caller`), or nothing (syncs, `fallocate`). The file's
//! fixed index and raw descriptor stay valid while the op holds its
//! `Arc<FileEntry>` (in `Keep`).

use std::io;
use std::sync::Arc;

use crate::permit::Permit;
use io_uring::{opcode, squeue, types};

use super::{Keep, Ring, MAX_READ};
use crate::buf::{AlignedBuf, BOUNCE_ALIGN};
use crate::files::FileEntry;
use crate::op::OpBuf;
use crate::util::lock;

/// One op other than a read, as the caller describes it.
#[derive(Debug)]
pub(crate) enum RingOp<'b> {
    /// Write `data` at `offset`, copied first into a bounce buffer the op
    /// owns (so the caller's borrow may end at once).
    WriteCopy { offset: u64, data: &'b [u8] },
    /// Write `len` bytes at `ptr` (memory of an owned buffer the future
    /// holds, and parks in the op if it is dropped) at `offset`.
    WriteCaller {
        offset: u64,
        ptr: *const u8,
        len: usize,
    },
    /// `fsync` (or `fdatasync` when `datasync`).
    Fsync { datasync: bool },
    /// `sync_file_range(offset, len, flags)`.
    SyncRange { offset: u64, len: u32, flags: u32 },
    /// `fallocate(mode, offset, len)`.
    Fallocate { mode: i32, offset: u64, len: u64 },
    /// `statx` of the file itself into `buf` (caller memory, as
    /// `WriteCaller`).
    Statx { buf: *mut libc::statx, mask: u32 },
}

/// The length field of a write SQE (callers cap writes at [`MAX_READ`],
/// the kernel's `MAX_RW_COUNT`, which applies to writes as well).
fn rw_len(len: usize) -> u32 {
    u32::try_from(len.min(MAX_READ)).unwrap_or(u32::MAX)
}

impl Ring {
    /// Queues one op on `file` (`None`: an open) and returns its key; from
    /// here on it is an op like a read: collect it with
    /// [`poll_complete`](Ring::poll_complete), walk away with
    /// [`abandon`](Ring::abandon).
    #[allow(
        clippy::too_many_lines,
        reason = "one arm per op kind, each building its SQE, reads best in one place"
    )]
    pub(crate) fn submit_op(
        &self,
        file: Option<Arc<FileEntry>>,
        permit: Permit,
        op: &RingOp<'_>,
    ) -> io::Result<usize> {
        // A copy larger than a pool buffer goes into a one-off buffer,
        // allocated and filled before taking the lock (the write path
        // bounds its size, see `BORROWED_CHUNK`).
        let mut heap = match *op {
            RingOp::WriteCopy { data, .. } if data.len() > self.pool.buf_size() => {
                Some(copied(data)?)
            }
            _ => None,
        };
        let mut st = lock(&self.state);
        if let Some(closed) = &st.closed {
            return Err(closed.error());
        }
        let fixed = file.as_ref().map(|f| types::Fixed(f.index));
        let need_file = || fixed.ok_or_else(|| io::Error::other("op without a file (a bug)"));
        let (buf, entry): (OpBuf, squeue::Entry) = match *op {
            RingOp::WriteCopy { offset, data } => {
                let fd = need_file()?;
                match (heap.take(), st.free_bufs.pop()) {
                    (None, Some(i)) => {
                        let ptr = self.pool.ptr(i as usize);
                        // SAFETY: buffer `i` was on the free list, so no op
                        // and no kernel request uses it; it holds
                        // buf_size() >= data.len() bytes (the larger copies
                        // took the `heap` path above); the lock is held, so
                        // nobody else can pop it meanwhile.
                        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
                        let len = rw_len(data.len());
                        let entry = match u16::try_from(i) {
                            Ok(index) if self.pool_registered => {
                                opcode::WriteFixed::new(fd, ptr, len, index)
                                    .offset(offset)
                                    .build()
                            }
                            _ => opcode::Write::new(fd, ptr, len).offset(offset).build(),
                        };
                        (OpBuf::Pool(i), entry)
                    }
                    (heap, free) => {
                        if let Some(i) = free {
                            st.free_bufs.push(i);
                        }
                        let b = if let Some(b) = heap {
                            b
                        } else {
                            // Pool exhausted: a one-off copy, made unlocked.
                            drop(st);
                            let b = copied(data)?;
                            st = lock(&self.state);
                            if let Some(closed) = &st.closed {
                                return Err(closed.error());
                            }
                            b
                        };
                        // Moving `b` into the op moves the header, not the
                        // heap block the SQE points to.
                        let entry = opcode::Write::new(fd, b.as_ptr(), rw_len(data.len()))
                            .offset(offset)
                            .build();
                        (OpBuf::Heap(b), entry)
                    }
                }
            }
            RingOp::WriteCaller { offset, ptr, len } => (
                OpBuf::Caller,
                opcode::Write::new(need_file()?, ptr, rw_len(len))
                    .offset(offset)
                    .build(),
            ),
            RingOp::Fsync { datasync } => {
                let flags = if datasync {
                    types::FsyncFlags::DATASYNC
                } else {
                    types::FsyncFlags::empty()
                };
                (
                    OpBuf::Caller,
                    opcode::Fsync::new(need_file()?).flags(flags).build(),
                )
            }
            RingOp::SyncRange { offset, len, flags } => (
                OpBuf::Caller,
                opcode::SyncFileRange::new(need_file()?, len)
                    .offset(offset)
                    .flags(flags)
                    .build(),
            ),
            RingOp::Fallocate { mode, offset, len } => (
                OpBuf::Caller,
                opcode::Fallocate::new(need_file()?, len)
                    .offset(offset)
                    .mode(mode)
                    .build(),
            ),
            RingOp::Statx { buf, mask } => {
                // STATX takes no fixed file: the raw descriptor, kept open
                // by the op's file entry, with an empty path.
                let fd = file
                    .as_ref()
                    .map(|f| std::os::fd::AsRawFd::as_raw_fd(&f.file))
                    .ok_or_else(|| io::Error::other("statx without a file (a bug)"))?;
                (
                    OpBuf::Caller,
                    opcode::Statx::new(types::Fd(fd), c"".as_ptr(), buf.cast())
                        .flags(libc::AT_EMPTY_PATH)
                        .mask(mask)
                        .build(),
                )
            }
        };
        let key = st.ops.insert(
            buf,
            Keep {
                _file: file,
                _permit: permit,
            },
        );
        let user_data = st.ops.user_data(key).expect("op just inserted");
        self.push_locked(&mut st, entry.user_data(user_data));
        st.live += 1;
        drop(st);
        self.submit_queued();
        Ok(key)
    }
}

/// A page-aligned copy of `data` (aligned so that `O_DIRECT` files accept
/// it, as the pool's buffers).
fn copied(data: &[u8]) -> io::Result<AlignedBuf> {
    let mut b = AlignedBuf::try_new(data.len(), BOUNCE_ALIGN)?;
    b.copy_from_slice(data);
    Ok(b)
}
