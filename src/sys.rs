//! Thin syscall wrappers.

use std::io;
use std::os::fd::RawFd;

/// Outcome of a non-blocking page-cache read attempt.
#[derive(Debug)]
pub(crate) enum Nowait {
    /// This many bytes were copied (0 = end of file).
    Read(usize),
    /// Some of the range is not cached: use the ring.
    WouldBlock,
    /// The file system does not support RWF_NOWAIT: never try again.
    Unsupported,
}

/// `preadv2(fd, buf, offset, RWF_NOWAIT)`: reads only what the page cache
/// already holds, never waiting for the device.
pub(crate) fn pread_nowait(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<Nowait> {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the iovec describes `buf`, valid for writes for the whole call;
    // the call is synchronous, so nothing touches `buf` after it returns.
    let n = unsafe { libc::preadv2(fd, &iov, 1, offset as libc::off_t, libc::RWF_NOWAIT) };
    if n >= 0 {
        return Ok(Nowait::Read(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(Nowait::WouldBlock),
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENOSYS) => Ok(Nowait::Unsupported),
        _ => Err(e),
    }
}
