//! The errors the crate words itself (shut down, ring closed or broken,
//! `shutdown()` gave up, submitter exited, unknown or stale file id, setting
//! out of range): the call sites decide when (DESIGN, "Failure model"),
//! this module what each says. Errors about one place's own input stay
//! with their check.

use std::error::Error;
use std::fmt;
use std::io;

use crate::id::FileId;

/// Why a ring takes no more ops.
#[derive(Debug, Clone)]
pub(crate) enum Closed {
    /// `shutdown()` or the last handle dropped.
    Shutdown,
    /// The driver task was dropped: its (home) runtime shut down.
    RuntimeGone,
    /// `io_uring_enter` failed in a way retrying cannot fix.
    Broken(String),
}

impl Closed {
    pub(crate) fn error(&self) -> io::Error {
        match self {
            Closed::Shutdown => shut_down_error(),
            Closed::RuntimeGone => runtime_gone_error(),
            Closed::Broken(why) => io::Error::other(format!(
                "the io_uring ring is broken (io_uring_enter failed: {why}); this operation never reached the kernel"
            )),
        }
    }
}

/// The context's home runtime shut down: its ring drivers were dropped, or
/// the blocking pool cancelled a task it had not started.
pub(crate) fn runtime_gone_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the UringContext is shut down: the tokio runtime it was created on (its home runtime) has shut down",
    )
}

pub(crate) fn shut_down_error() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the UringContext is shut down")
}

/// A borrowed op (a read, write or sync) still in the kernel or on the
/// blocking pool when `shutdown()` stopped waiting.
pub(crate) fn gave_up() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "shutdown() stopped waiting for this operation: the kernel did not complete or cancel it \
         within the shutdown timeout (a write may or may not have happened)",
    )
}

/// A read the kernel cancelled (with the errno `os`) or cut short (`what`)
/// because the thread that submitted it exited; the kernel's errno stays
/// visible to [`os_error`]. Not `Interrupted`: that means "retry", and a
/// retry cannot succeed on a context whose home runtime is gone.
pub(crate) fn submitter_exited(
    fid: FileId,
    offset: u64,
    what: &str,
    os: Option<io::Error>,
) -> io::Error {
    let what = format!(
        "a read of {fid} at offset {offset} was {what} because the thread that submitted it \
         exited (the UringContext's home runtime shut down); the context is shut down"
    );
    match os {
        Some(os) => explained(io::ErrorKind::BrokenPipe, os, what),
        None => io::Error::new(io::ErrorKind::BrokenPipe, what),
    }
}

pub(crate) fn unknown_fid(fid: FileId) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{fid} is not registered with this UringContext"),
    )
}

/// `fid` names no entry of table `table` that it may name: `found` is the
/// generation registered at its index, if any. A plain index is simply not
/// registered; a checked id is of another context, or stale.
pub(crate) fn bad_fid(fid: FileId, table: u64, found: Option<u32>) -> io::Error {
    if fid.is_out_of_range() {
        return io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{fid} is no file index: indices are u32 (0..={}), so no file is registered there",
                u32::MAX
            ),
        );
    }
    if !fid.is_tagged() {
        return unknown_fid(fid);
    }
    let why = if fid.ctx() != table {
        "belongs to another UringContext: a FileId handed out by one context is \
         refused by every other (use FileId::from(index) for an unchecked index)"
    } else if found.is_some() {
        "is stale: that file was unregistered, and its index now holds a file \
         registered later"
    } else {
        "is stale: that file was unregistered from this UringContext"
    };
    io::Error::new(io::ErrorKind::InvalidInput, format!("{fid} {why}"))
}

/// An op (`what`: "read", "write", ...) of a file unregistered before its
/// SQE reached the kernel (which failed it with EBADF), in terms of the
/// caller's fid.
pub(crate) fn unregistered_while_queued(fid: FileId, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{fid} was unregistered while this {what} was queued"),
    )
}

/// A kernel error worded for the caller, with the kernel's own error kept
/// as its [`source`](Error::source) (see [`os_error`]) and in its text.
#[derive(Debug)]
struct Explained {
    what: String,
    os: io::Error,
}

impl fmt::Display for Explained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.what, self.os)
    }
}

impl Error for Explained {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.os)
    }
}

/// `os` (an errno from the kernel) with the crate's explanation `what`.
pub(crate) fn explained(kind: io::ErrorKind, os: io::Error, what: String) -> io::Error {
    io::Error::new(kind, Explained { what, os })
}

/// The errno behind an error of this crate, where the kernel gave one:
/// [`io::Error::raw_os_error`] for a bare kernel error, and the kernel's
/// errno for one the crate explained (an `EBADF` on a file not open for
/// writing, an `EINVAL` on an `O_DIRECT` file, ...), which
/// `raw_os_error()` does not see.
///
/// ```
/// # use std::io;
/// let e = io::Error::from_raw_os_error(libc::EINVAL);
/// assert_eq!(uring_positioned_io::os_error(&e), Some(libc::EINVAL));
/// assert_eq!(uring_positioned_io::os_error(&io::Error::other("no errno")), None);
/// ```
#[must_use]
pub fn os_error(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
        .or_else(|| e.get_ref()?.downcast_ref::<Explained>()?.os.raw_os_error())
}

/// An `EINVAL` from an op on an `O_DIRECT` file: names what is not
/// aligned (`op` of `len` bytes at `offset`, memory at `addr` when the
/// kernel sees the caller's buffer) against the alignments the kernel
/// reported (`align`: memory, offset), or says the kernel refused an
/// aligned request.
pub(crate) fn direct_einval(
    os: io::Error,
    fid: FileId,
    op: &str,
    (offset, len, addr): (u64, usize, Option<usize>),
    align: Option<(u32, u32)>,
) -> io::Error {
    let what = format!("{op} of {len} bytes at offset {offset} of {fid}, opened with O_DIRECT");
    let Some((mem, off)) = align else {
        return explained(
            io::ErrorKind::InvalidInput,
            os,
            format!(
                "{what}: the kernel refused it; offset and length must be multiples of the \
                 device's logical block size, and the buffer's address of its memory alignment \
                 (the kernel does not report them for this file; AlignedBuf gives 4096-byte \
                 aligned buffers)"
            ),
        );
    };
    let (mem, off) = (u64::from(mem.max(1)), u64::from(off.max(1)));
    let mut wrong = Vec::new();
    if offset % off != 0 {
        wrong.push(format!("the offset is not a multiple of {off}"));
    }
    if len as u64 % off != 0 {
        wrong.push(format!("the length is not a multiple of {off}"));
    }
    if let Some(a) = addr {
        if a as u64 % mem != 0 {
            wrong.push(format!(
                "the buffer address {a:#x} is not a multiple of {mem}"
            ));
        }
    }
    let why = if wrong.is_empty() {
        format!(
            "the kernel refused it, though the request is aligned (offsets and lengths to {off}, \
             memory to {mem})"
        )
    } else {
        format!(
            "{} (O_DIRECT needs offsets and lengths aligned to {off} and buffers to {mem}: \
             UringContext::statx reports both; AlignedBuf gives aligned buffers)",
            wrong.join(", ")
        )
    };
    explained(io::ErrorKind::InvalidInput, os, format!("{what}: {why}"))
}

/// An owned read (`op`) whose destination has no storage
/// (`bytes_total() == 0`, or 0 in all for a vectored read): it would read
/// nothing, which would look like the end of the file.
pub(crate) fn nothing_to_read_into(op: &str, fid: FileId) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{op} of {fid} into 0 bytes of buffer: an owned read fills the buffer from its start \
             up to bytes_total() (a Vec's capacity, not its len()), and a read of nothing would \
             look like the end of the file — pass a buffer with storage (Vec::with_capacity(n), \
             vec![0u8; n], AlignedBuf::with_capacity), or a window buf.slice(..n) to read n bytes"
        ),
    )
}

/// An exact read that reached the end of the file after `n` of `want` bytes.
pub(crate) fn ends_before(fid: FileId, offset: u64, n: usize, want: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "{fid} ends before offset {} (read {n} of {want} bytes at offset {offset})",
            offset.saturating_add(want as u64)
        ),
    )
}

pub(crate) fn offset_beyond_max(fid: FileId, offset: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("offset {offset} of a read of {fid} is beyond i64::MAX"),
    )
}

/// A write (or range op) of `len` bytes at `offset` that would reach
/// beyond `i64::MAX`, which no file can.
pub(crate) fn write_beyond_max(fid: FileId, offset: u64, len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{len} bytes at offset {offset} of {fid} would end beyond i64::MAX"),
    )
}

/// A blocking-pool op whose task panicked.
pub(crate) fn blocking_task_failed() -> io::Error {
    io::Error::other("blocking-pool task failed: it panicked")
}

/// A setting out of range (`msg` names it and its limit).
pub(crate) fn invalid<T>(msg: String) -> io::Result<T> {
    Err(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_cancelled_with_its_submitter_keeps_the_errno() {
        let fid = FileId::from(3u32);
        let os = io::Error::from_raw_os_error(libc::ECANCELED);
        let e = submitter_exited(fid, 4096, "cancelled", Some(os));
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(os_error(&e), Some(libc::ECANCELED));
        let msg = e.to_string();
        assert!(
            msg.contains("home runtime") && msg.contains("os error 125"),
            "{msg}"
        );
        let e = submitter_exited(fid, 4096, "cut short (10 of 4096 bytes)", None);
        assert_eq!((e.kind(), os_error(&e)), (io::ErrorKind::BrokenPipe, None));
        assert!(e.to_string().contains("cut short (10 of 4096 bytes)"));
    }
}
