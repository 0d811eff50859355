//! [`UringFileCursor`]: a [`UringFile`] with a position, as
//! `tokio::io::{AsyncRead, AsyncSeek, AsyncWrite}`.
//!
//! The caller's `ReadBuf` lives only for one poll, so it cannot be lent to
//! the kernel; the cursor owns one buffer instead, which one owned op at a
//! time (a read, a write or the `statx` of a seek from the end) holds while
//! in flight, across polls. A read's bytes are copied into the caller's
//! `ReadBuf` when it completes; bytes the caller had no room for stay in
//! the buffer for the next read. A write copies the caller's bytes into the
//! buffer, starts the write and reports them written (write-behind of one
//! write, as `tokio::fs::File`): every later call waits for it first, and
//! `poll_flush` returns its error. The buffer is page-aligned, and on a
//! file opened `O_DIRECT` a read covers whole aligned blocks around the
//! position, so that reads work there at any position and length.

use std::fmt;
use std::future::Future;
use std::io::{self, SeekFrom};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use crate::buf::{AlignedBuf, IoBufMut, Slice};
use crate::file::UringFile;
use crate::ops::read::UringReadOwnedFuture;
use crate::ops::statx::UringStatxFuture;
use crate::ops::write::UringWriteAllOwnedFuture;

/// Largest read or write the cursor issues: the size of its buffer.
const CHUNK: usize = 64 << 10;
/// Smallest read the cursor issues, whatever room the caller has.
const MIN_READ: usize = 4 << 10;
/// The buffer's alignment, and the most a read on an `O_DIRECT` file
/// starts before the position (its offset alignment, up to this).
const ALIGN: usize = 4 << 10;

/// The op in flight, holding the cursor's buffer.
enum Op {
    Idle,
    /// A read at `offset` (the position when it started, which no call
    /// changes while it is in flight).
    Reading {
        read: UringReadOwnedFuture<'static, Slice<AlignedBuf>>,
        offset: u64,
    },
    /// A write already reported to the caller as done.
    Writing(UringWriteAllOwnedFuture<'static, AlignedBuf>),
    /// The `statx` of a seek from the end.
    Stat(UringStatxFuture<'static>),
}

/// A seek started by `start_seek` and not yet completed.
#[derive(Clone, Copy, Debug)]
enum Target {
    At(u64),
    FromEnd(i64),
}

/// A [`UringFile`] with a position: `tokio::io::AsyncRead`, `AsyncSeek`
/// and `AsyncWrite`, for the code written against them —
/// `tokio::io::BufReader` and its `lines()`, `tokio::io::copy`,
/// `read_to_end`, codecs. Made by [`UringFile::cursor`] (at offset 0) or
/// [`UringFileCursor::new`].
///
/// Each read is one owned read at the position of
/// `min(room in the caller's buffer, 64 KiB)` bytes, at least 4 KiB, into
/// the cursor's own buffer (page-aligned, reused), copied out when it
/// completes; what did not fit stays buffered for the next read. On a file
/// opened `O_DIRECT` the read is widened to whole blocks of the file's
/// offset alignment around the position, so reads work at any position
/// and length; writes there must be aligned themselves (a position and a
/// length the file's alignment divides), or they fail with
/// `InvalidInput`, which says so. Dropping a read future
/// mid-read is sound, as for every owned read of the crate: the buffer
/// waits in the context for the kernel. The position is the number of bytes
/// handed to the caller, so `SeekFrom::Current` is relative to what the
/// caller has seen; seeking past the end is allowed (reads there return
/// 0 bytes, writes there leave a hole), before 0 or beyond `i64::MAX` is
/// `InvalidInput`.
///
/// Writes are positioned writes at the position, of up to 64 KiB each,
/// reported done once started (as `tokio::fs::File` does): the next call
/// of any kind waits for that write, and `flush` (or `shutdown`) returns its
/// error, so flush before relying on the data. Neither makes it durable:
/// call [`UringFile::sync_data`] for that. A cursor dropped with a write in
/// flight leaves it running on the current runtime. Other handles of the
/// file may write concurrently: bytes the cursor has buffered are not
/// refreshed.
///
/// ```
/// use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};
/// use std::io::SeekFrom;
/// # use uring_positioned_io::UringContext;
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
///
/// let mut cursor = file.cursor();
/// cursor.write_all(b"first line\nsecond line\n").await?;
/// cursor.flush().await?; // the last write's error, if any
///
/// cursor.seek(SeekFrom::Start(0)).await?;
/// let mut lines = BufReader::new(cursor).lines();
/// assert_eq!(lines.next_line().await?.as_deref(), Some("first line"));
///
/// let mut cursor = file.cursor();
/// cursor.seek(SeekFrom::End(-5)).await?;
/// let mut tail = String::new();
/// cursor.read_to_string(&mut tail).await?;
/// assert_eq!(tail, "line\n");
/// # Ok(())
/// # })
/// # }
/// ```
pub struct UringFileCursor {
    file: UringFile,
    /// Bytes handed to the caller (or written) so far, plus seeks.
    pos: u64,
    op: Op,
    /// The reused buffer while no op holds it (`None` before the first op,
    /// and while one holds it): bytes of the file at `buf_off`, those from
    /// `pos` on not yet handed to the caller.
    buf: Option<AlignedBuf>,
    buf_off: u64,
    /// The offset alignment of a read: 1, or the file's `O_DIRECT` one.
    read_align: usize,
    seek: Option<Target>,
    /// The error of a write that completed after `poll_write` returned,
    /// for the next `poll_write`, `poll_flush` or `poll_shutdown`.
    write_err: Option<io::Error>,
}

impl UringFile {
    /// A cursor over the file at offset 0: `tokio::io::AsyncRead`,
    /// `AsyncSeek` and `AsyncWrite` through this handle (see
    /// [`UringFileCursor`]). Cursors of one file are independent.
    ///
    /// ```
    /// use tokio::io::AsyncReadExt;
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(&[7u8; 100_000], 0).await?;
    /// let mut all = Vec::new();
    /// file.cursor().read_to_end(&mut all).await?;
    /// assert_eq!(all, vec![7u8; 100_000]);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn cursor(&self) -> UringFileCursor {
        UringFileCursor::new(self.clone())
    }
}

impl UringFileCursor {
    /// A cursor over `file` at offset 0 (as [`UringFile::cursor`]).
    ///
    /// ```
    /// use tokio::io::AsyncWriteExt;
    /// use uring_positioned_io::{UringContext, UringFileCursor};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// let mut cursor = UringFileCursor::new(file.clone());
    /// tokio::io::copy(&mut &b"copied"[..], &mut cursor).await?;
    /// cursor.flush().await?;
    /// assert_eq!(file.len().await?, 6);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn new(file: UringFile) -> UringFileCursor {
        // An `O_DIRECT` file's offset alignment (4 KiB where the kernel
        // does not say); a file not registered any more reads as any
        // other, and its reads fail with the id's error.
        let read_align = match file.context().inner.files.get(file.fid()) {
            Ok(entry) if entry.direct => entry
                .dio_align
                .map_or(ALIGN, |(_, offset)| offset as usize)
                .clamp(1, ALIGN),
            _ => 1,
        };
        UringFileCursor {
            file,
            pos: 0,
            op: Op::Idle,
            buf: None,
            buf_off: 0,
            read_align,
            seek: None,
            write_err: None,
        }
    }

    /// The position: where the next read or write starts (a seek started
    /// with `start_seek` counts once completed).
    ///
    /// ```
    /// use tokio::io::AsyncReadExt;
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"0123456789", 0).await?;
    /// let mut cursor = file.cursor();
    /// let mut two = [0u8; 2];
    /// cursor.read_exact(&mut two).await?;
    /// assert_eq!(cursor.position(), 2);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The file handle.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// assert_eq!(file.cursor().file().fid(), file.fid());
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn file(&self) -> &UringFile {
        &self.file
    }

    /// The file handle back. A write still in flight is left running (as
    /// when the cursor is dropped): flush first to know how it went.
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// let file = ctx.file(0)?.cursor().into_file();
    /// assert_eq!(file.fid(), ctx.file_id(0)?);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn into_file(self) -> UringFile {
        self.file.clone()
    }

    /// Bytes read and not yet handed to the caller, at the position.
    fn buffered(&self) -> &[u8] {
        let Some(buf) = &self.buf else {
            return &[];
        };
        self.pos
            .checked_sub(self.buf_off)
            .and_then(|skip| usize::try_from(skip).ok())
            .and_then(|skip| buf.get(skip..))
            .unwrap_or(&[])
    }

    /// The reused buffer, empty, with room for `CHUNK` bytes and the
    /// widening of an aligned read.
    fn take_buf(&mut self) -> AlignedBuf {
        let mut buf = self
            .buf
            .take()
            .unwrap_or_else(|| AlignedBuf::with_capacity(CHUNK + ALIGN, ALIGN));
        buf.clear();
        buf
    }

    /// Gives the buffer back, keeping its bytes (at `buf_off`) or not.
    fn put_buf(&mut self, mut buf: AlignedBuf, keep: bool) {
        if !keep {
            buf.clear();
        }
        self.buf = Some(buf);
    }

    /// Waits for the read or write in flight, if any: a read's bytes stay
    /// buffered, a write's error is kept for `write_err`.
    fn poll_settle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.op {
            Op::Idle | Op::Stat(_) => {}
            Op::Reading { read, offset } => {
                let (res, win) = ready!(Pin::new(read).poll(cx));
                self.buf_off = *offset;
                // On an error nobody asked for this read's result any more.
                self.put_buf(win.into_inner(), res.is_ok());
                self.op = Op::Idle;
            }
            Op::Writing(write) => {
                let (res, buf) = ready!(Pin::new(write).poll(cx));
                self.put_buf(buf, false);
                if let Err(e) = res {
                    self.write_err.get_or_insert(e);
                }
                self.op = Op::Idle;
            }
        }
        Poll::Ready(())
    }

    /// Completes the pending seek (if any) once the op in flight is done:
    /// the body of `poll_complete`.
    fn poll_seek(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        loop {
            if let Op::Stat(stat) = &mut self.op {
                let res = ready!(Pin::new(stat).poll(cx));
                self.op = Op::Idle;
                let Some(Target::FromEnd(delta)) = self.seek.take() else {
                    unreachable!("a statx is in flight only for a seek from the end")
                };
                let size = res?.size;
                let pos = offset_by(size, delta).ok_or_else(|| {
                    invalid_seek(format_args!("{delta} bytes from the end ({size})"))
                })?;
                return Poll::Ready(Ok(self.set_pos(pos)));
            }
            ready!(self.poll_settle(cx));
            match self.seek {
                None => return Poll::Ready(Ok(self.pos)),
                Some(Target::At(pos)) => {
                    self.seek = None;
                    return Poll::Ready(Ok(self.set_pos(pos)));
                }
                Some(Target::FromEnd(_)) => self.op = Op::Stat(self.file.metadata()),
            }
        }
    }

    fn set_pos(&mut self, pos: u64) -> u64 {
        self.pos = pos;
        if let Some(buf) = &mut self.buf {
            buf.clear();
        }
        pos
    }
}

fn invalid_seek(what: fmt::Arguments<'_>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("UringFileCursor: cannot seek {what}: before 0 or beyond i64::MAX"),
    )
}

/// `base + delta` if it is a file offset (at most `i64::MAX`, as for
/// `lseek(2)`).
fn offset_by(base: u64, delta: i64) -> Option<u64> {
    base.checked_add_signed(delta)
        .filter(|&pos| i64::try_from(pos).is_ok())
}

impl AsyncRead for UringFileCursor {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.seek.is_some() {
            ready!(this.poll_seek(cx))?;
        }
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if matches!(this.op, Op::Idle) {
                if !this.buffered().is_empty() {
                    break;
                }
                // From the position, or on an O_DIRECT file from the
                // aligned offset below it, whole aligned blocks.
                let want = out.remaining().clamp(MIN_READ, CHUNK);
                let align = this.read_align;
                // Below the alignment (at most `ALIGN`): it fits.
                let skip = usize::try_from(this.pos % align as u64).unwrap_or(0);
                let start = this.pos - skip as u64;
                let len = (skip + want).next_multiple_of(align);
                let win = this.take_buf().slice(..len);
                this.op = Op::Reading {
                    read: this.file.read_at_owned(win, start),
                    offset: start,
                };
            }
            match &mut this.op {
                Op::Reading { read, offset } => {
                    let (res, win) = ready!(Pin::new(read).poll(cx));
                    this.buf_off = *offset;
                    this.put_buf(win.into_inner(), res.is_ok());
                    this.op = Op::Idle;
                    res?;
                    // Hand over what was read: nothing at the end of the file.
                    break;
                }
                Op::Writing(_) => ready!(this.poll_settle(cx)),
                // Not reached: a pending seek was completed above.
                Op::Stat(_) => {
                    ready!(this.poll_seek(cx))?;
                }
                Op::Idle => unreachable!("a read was started above"),
            }
        }
        let avail = this.buffered();
        let n = avail.len().min(out.remaining());
        out.put_slice(&avail[..n]);
        this.pos += n as u64;
        Poll::Ready(Ok(()))
    }
}

impl AsyncSeek for UringFileCursor {
    /// Starts a seek; `poll_complete` finishes it (after the op in flight,
    /// with a `statx` for `SeekFrom::End`).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a position before 0 or beyond `i64::MAX` (the
    /// largest file offset, as `lseek(2)` says; from `poll_complete` for
    /// `SeekFrom::End`); `Other` if a seek is pending
    /// already (tokio's contract: complete it first).
    fn start_seek(self: Pin<&mut Self>, to: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        if this.seek.is_some() {
            return Err(io::Error::other(
                "UringFileCursor: a seek is pending: call poll_complete before start_seek",
            ));
        }
        this.seek = Some(match to {
            SeekFrom::Start(pos) => {
                Target::At(offset_by(pos, 0).ok_or_else(|| invalid_seek(format_args!("to {pos}")))?)
            }
            SeekFrom::Current(delta) => Target::At(
                offset_by(this.pos, delta)
                    .ok_or_else(|| invalid_seek(format_args!("{delta} bytes from {}", this.pos)))?,
            ),
            SeekFrom::End(delta) => Target::FromEnd(delta),
        });
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        self.get_mut().poll_seek(cx)
    }
}

impl AsyncWrite for UringFileCursor {
    /// Copies up to 64 KiB of `data` and starts writing them at the
    /// position, after the write before (one in flight at a time); returns
    /// the error of the write before, if it failed.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.seek.is_some() {
            ready!(this.poll_seek(cx))?;
        }
        ready!(this.poll_settle(cx));
        if let Some(e) = this.write_err.take() {
            return Poll::Ready(Err(e));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = data.len().min(CHUNK);
        let Some(end) = this.pos.checked_add(n as u64) else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "UringFileCursor: a write of {n} bytes at {} ends beyond u64::MAX",
                    this.pos
                ),
            )));
        };
        let mut buf = this.take_buf();
        buf.extend_from_slice(&data[..n]);
        let mut write = this.file.write_all_at_owned(buf, this.pos);
        // Polled once now, so that it is submitted without waiting for the
        // next call.
        if let Poll::Ready((res, buf)) = Pin::new(&mut write).poll(cx) {
            this.put_buf(buf, false);
            res?;
        } else {
            this.op = Op::Writing(write);
        }
        this.pos = end;
        Poll::Ready(Ok(n))
    }

    /// Waits for the write in flight; its error, if it failed. Not a sync:
    /// see [`UringFile::sync_data`].
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_settle(cx));
        match this.write_err.take() {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }

    /// As `poll_flush`; the file stays open (the handle owns nothing to close).
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl Drop for UringFileCursor {
    fn drop(&mut self) {
        // A write reported done is finished on the runtime rather than
        // cancelled with its future (without a runtime, the context's own
        // rule for a dropped write applies).
        if let Op::Writing(write) = std::mem::replace(&mut self.op, Op::Idle) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                drop(rt.spawn(write));
            }
        }
    }
}

#[allow(
    clippy::missing_fields_in_debug,
    reason = "the buffer's bytes are not debug output"
)]
impl fmt::Debug for UringFileCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            Op::Idle => "idle",
            Op::Reading { .. } => "reading",
            Op::Writing(_) => "writing",
            Op::Stat(_) => "seeking to the end",
        };
        f.debug_struct("UringFileCursor")
            .field("file", &self.file)
            .field("position", &self.pos)
            .field("op", &op)
            .field("buffered", &self.buffered().len())
            .field("seek", &self.seek)
            .finish()
    }
}

// Send and Unpin: a cursor moves into tasks and needs no pinning.
const _: fn() = || {
    fn send_unpin<T: Send + Unpin + 'static>() {}
    send_unpin::<UringFileCursor>();
};
