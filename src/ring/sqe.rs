//! What an op asks of a ring ([`RingOp`]) and the SQE that becomes
//! ([`Ring::sqe`]), with the memory the kernel touches until the CQE: a
//! bounce buffer the op owns (a pool buffer, or a one-off `AlignedBuf`),
//! caller memory the future holds and parks in the op if it is dropped, or
//! nothing (syncs, `fallocate`).
//!
//! SAFETY (as `submit.rs`): every SQE built here points only into memory
//! owned by its op until its CQE (`OpBuf::Pool`/`Heap`, or `OpBuf::Caller`
//! for memory the future parks with the op), and at a file whose fixed
//! index and raw descriptor stay valid while the op holds its
//! `Arc<FileEntry>` (in `Keep`).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::MutexGuard;

use io_uring::{opcode, squeue, types};

use super::table::OpBuf;
use super::{Ring, State, MAX_RW};
use crate::buf::{AlignedBuf, Registered, BOUNCE_ALIGN};
use crate::files::FileEntry;
use crate::util::lock;

/// Buffered ring reads of at least this many bytes go to io-wq
/// (`IOSQE_ASYNC`): see [`Ring::sqe`].
const ASYNC_READ_FROM: usize = 8 << 20;

/// Where a read's bytes go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dst {
    /// Into a bounce buffer owned by the op; copied out on completion.
    Bounce(usize),
    /// Straight into caller memory that outlives the op (an owned buffer,
    /// parked in the op if the future is dropped); a `READ_FIXED` where
    /// the memory is registered with this ring ([`Ring::fixed_index`]).
    Caller(*mut u8, usize, Option<Registered>),
    /// Straight into several owned buffers (`IORING_OP_READV`): `count`
    /// iovecs at the pointer, which stay in place, like the buffers they
    /// describe, until the op's CQE (parked with the buffers if the future
    /// is dropped).
    CallerVec(*const libc::iovec, usize),
}

/// Where a write's bytes come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src<'b> {
    /// Borrowed bytes, copied first into a bounce buffer the op owns (so
    /// the caller's borrow may end at once).
    Copy(&'b [u8]),
    /// `len` bytes at the pointer: memory of an owned buffer the future
    /// holds, and parks in the op if it is dropped.
    Caller(*const u8, usize),
}

/// One op, as its future describes it to a ring.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RingOp<'b> {
    /// Read into `dst` from `offset`.
    Read { offset: u64, dst: Dst },
    /// Write `src` at `offset`; with `dsync`, `RWF_DSYNC` (durable when
    /// it completes, as under `O_DSYNC`).
    Write {
        offset: u64,
        src: Src<'b>,
        dsync: bool,
    },
    /// `fsync` (or `fdatasync` when `datasync`).
    Fsync { datasync: bool },
    /// `sync_file_range(offset, len, flags)`.
    SyncRange { offset: u64, len: u32, flags: u32 },
    /// `fallocate(mode, offset, len)`.
    Fallocate { mode: i32, offset: u64, len: u64 },
    /// `statx` of the file itself into `buf` (caller memory, as
    /// `Src::Caller`).
    Statx { buf: *mut libc::statx, mask: u32 },
}

impl RingOp<'_> {
    /// The size of the bounce buffer the op needs, if any.
    fn bounce_len(&self) -> Option<usize> {
        match *self {
            RingOp::Read {
                dst: Dst::Bounce(len),
                ..
            } => Some(len),
            RingOp::Write {
                src: Src::Copy(data),
                ..
            } => Some(data.len()),
            _ => None,
        }
    }

    /// The bytes to copy into its bounce buffer (a borrowed write's).
    fn fill(&self) -> Option<&[u8]> {
        match *self {
            RingOp::Write {
                src: Src::Copy(data),
                ..
            } => Some(data),
            _ => None,
        }
    }
}

/// The length field of a read or write SQE (the kernel never moves more
/// than [`MAX_RW`] in one call; callers cap their pieces there).
fn rw_len(len: usize) -> u32 {
    u32::try_from(len.min(MAX_RW)).unwrap_or(u32::MAX)
}

/// A page-aligned bounce buffer of `len` bytes (aligned so that `O_DIRECT`
/// files accept it, as the pool's buffers), holding a copy of `fill`.
fn one_off(len: usize, fill: Option<&[u8]>) -> io::Result<AlignedBuf> {
    let mut b = AlignedBuf::try_new(len, BOUNCE_ALIGN)?;
    if let Some(data) = fill {
        b.copy_from_slice(data);
    }
    Ok(b)
}

/// A bounce buffer taken for one op.
struct Bounce {
    buf: OpBuf,
    ptr: *mut u8,
    /// Its index among the registered buffers, for `READ_FIXED`/`WRITE_FIXED`.
    fixed: Option<u16>,
}

impl Ring {
    /// A one-off bounce buffer for `op`, made before the state lock is
    /// taken, when it needs one larger than a pool buffer (its future
    /// bounds its size, see `BORROWED_CHUNK`).
    pub(super) fn large_bounce(&self, op: &RingOp<'_>) -> io::Result<Option<AlignedBuf>> {
        match op.bounce_len() {
            Some(len) if len > self.pool.buf_size() => one_off(len, op.fill()).map(Some),
            _ => Ok(None),
        }
    }

    /// The SQE of `op` on `file` and what the op owns for the kernel,
    /// under the state lock `st` (given back: it is released while a
    /// one-off buffer is allocated). `large` is the buffer from
    /// [`large_bounce`](Ring::large_bounce).
    #[allow(clippy::too_many_lines, reason = "one match over every ring op")]
    pub(super) fn sqe<'s>(
        &'s self,
        st: MutexGuard<'s, State>,
        file: Option<&FileEntry>,
        op: &RingOp<'_>,
        large: Option<AlignedBuf>,
        ioprio: u16,
    ) -> io::Result<(MutexGuard<'s, State>, OpBuf, squeue::Entry)> {
        let Some(file) = file else {
            return Err(io::Error::other("ring op without a file (a bug)"));
        };
        let fd = types::Fixed(file.index);
        let (st, bounce) = match op.bounce_len() {
            Some(len) => {
                let (st, b) = self.bounce(st, len, op.fill(), large)?;
                (st, Some(b))
            }
            None => (st, None),
        };
        let (buf, entry) = match (*op, bounce) {
            (RingOp::Read { offset, dst }, bounce) => {
                let entry = match (dst, &bounce) {
                    (Dst::Caller(ptr, len, fixed), _) => {
                        match fixed.and_then(|r| self.fixed_index(r)) {
                            Some(index) => {
                                #[cfg(test)]
                                self.region_reads
                                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                opcode::ReadFixed::new(fd, ptr, rw_len(len), index)
                                    .offset(offset)
                                    .ioprio(ioprio)
                                    .build()
                            }
                            None => opcode::Read::new(fd, ptr, rw_len(len))
                                .offset(offset)
                                .ioprio(ioprio)
                                .build(),
                        }
                    }
                    // The caller bounds `count` at `sys::IOV_MAX`.
                    (Dst::CallerVec(iov, count), _) => {
                        opcode::Readv::new(fd, iov, u32::try_from(count).unwrap_or(u32::MAX))
                            .offset(offset)
                            .ioprio(ioprio)
                            .build()
                    }
                    (Dst::Bounce(len), Some(b)) => match b.fixed {
                        Some(index) => opcode::ReadFixed::new(fd, b.ptr, rw_len(len), index)
                            .offset(offset)
                            .ioprio(ioprio)
                            .build(),
                        None => opcode::Read::new(fd, b.ptr, rw_len(len))
                            .offset(offset)
                            .ioprio(ioprio)
                            .build(),
                    },
                    (Dst::Bounce(_), None) => unreachable!("a bounce read has its buffer"),
                };
                // A large buffered read would be copied inside the enter, on
                // a runtime worker: from `ASYNC_READ_FROM` bytes io-wq copies
                // it instead (DESIGN, "The read path").
                let big = match dst {
                    Dst::Caller(_, len, _) | Dst::Bounce(len) => len >= ASYNC_READ_FROM,
                    Dst::CallerVec(..) => false,
                };
                let entry = if file.force_async || (big && !file.direct) {
                    entry.flags(squeue::Flags::ASYNC)
                } else {
                    entry
                };
                (bounce.map_or(OpBuf::Caller, |b| b.buf), entry)
            }
            (RingOp::Write { offset, src, dsync }, bounce) => {
                let rw_flags = if dsync { libc::RWF_DSYNC } else { 0 };
                match (src, bounce) {
                    (Src::Caller(ptr, len), _) => (
                        OpBuf::Caller,
                        opcode::Write::new(fd, ptr, rw_len(len))
                            .offset(offset)
                            .ioprio(ioprio)
                            .rw_flags(rw_flags)
                            .build(),
                    ),
                    (Src::Copy(data), Some(b)) => {
                        let len = rw_len(data.len());
                        let entry = match b.fixed {
                            Some(index) => opcode::WriteFixed::new(fd, b.ptr, len, index)
                                .offset(offset)
                                .ioprio(ioprio)
                                .rw_flags(rw_flags)
                                .build(),
                            None => opcode::Write::new(fd, b.ptr, len)
                                .offset(offset)
                                .ioprio(ioprio)
                                .rw_flags(rw_flags)
                                .build(),
                        };
                        (b.buf, entry)
                    }
                    (Src::Copy(_), None) => unreachable!("a copied write has its buffer"),
                }
            }
            (RingOp::Fsync { datasync }, _) => {
                let flags = if datasync {
                    types::FsyncFlags::DATASYNC
                } else {
                    types::FsyncFlags::empty()
                };
                (OpBuf::Caller, opcode::Fsync::new(fd).flags(flags).build())
            }
            (RingOp::SyncRange { offset, len, flags }, _) => (
                OpBuf::Caller,
                opcode::SyncFileRange::new(fd, len)
                    .offset(offset)
                    .flags(flags)
                    .build(),
            ),
            (RingOp::Fallocate { mode, offset, len }, _) => (
                OpBuf::Caller,
                opcode::Fallocate::new(fd, len)
                    .offset(offset)
                    .mode(mode)
                    .build(),
            ),
            // STATX takes no fixed file: the raw descriptor, kept open by
            // the op's file entry, with an empty path.
            (RingOp::Statx { buf, mask }, _) => (
                OpBuf::Caller,
                opcode::Statx::new(types::Fd(file.file.as_raw_fd()), c"".as_ptr(), buf.cast())
                    .flags(libc::AT_EMPTY_PATH)
                    .mask(mask)
                    .build(),
            ),
        };
        Ok((st, buf, entry))
    }

    /// A bounce buffer of `len` bytes holding a copy of `fill`: `large` if
    /// given, else a free pool buffer, else (more live ops than pool
    /// buffers) a one-off one, allocated with the lock released.
    fn bounce<'s>(
        &'s self,
        mut st: MutexGuard<'s, State>,
        len: usize,
        fill: Option<&[u8]>,
        large: Option<AlignedBuf>,
    ) -> io::Result<(MutexGuard<'s, State>, Bounce)> {
        let mut b = if let Some(b) = large {
            b
        } else {
            if let Some(i) = st.free_bufs.pop() {
                let ptr = self.pool.ptr(i as usize);
                if let Some(data) = fill {
                    // SAFETY: buffer `i` was on the free list, so no op and
                    // no kernel request uses it; it holds buf_size() >= len
                    // bytes (larger ones are `large`); the lock is held, so
                    // nobody else can pop it meanwhile.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
                }
                let fixed = u16::try_from(i).ok().filter(|_| self.pool_registered);
                let buf = OpBuf::Pool(i);
                return Ok((st, Bounce { buf, ptr, fixed }));
            }
            drop(st);
            let b = one_off(len, fill)?;
            st = lock(&self.state);
            if let Some(closed) = &st.closed {
                return Err(closed.error());
            }
            b
        };
        // Moving `b` into the op moves the header, not the heap block the
        // SQE points to.
        let ptr = b.as_mut_ptr();
        let buf = OpBuf::Heap(b);
        Ok((
            st,
            Bounce {
                buf,
                ptr,
                fixed: None,
            },
        ))
    }
}
