//! Thin wrappers around the raw syscalls the crate makes (other than
//! io_uring's own, which go through the `io-uring` crate): each turns `-1`
//! into `io::Error::last_os_error()` and owns what it creates.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Turns a `-1` return into the thread's `errno`.
fn cvt<T: Copy + PartialOrd + Default>(ret: T, minus_one: T) -> io::Result<T> {
    if ret == minus_one {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Outcome of a non-blocking page-cache read attempt.
#[derive(Debug)]
pub(crate) enum Nowait {
    /// This many bytes were copied (0 = end of file).
    Read(usize),
    /// Some of the range is not cached: use the ring.
    WouldBlock,
    /// The file system does not support RWF_NOWAIT: never try again.
    Unsupported,
    /// Any other error: let the ring (the authoritative path) answer.
    Ring,
}

/// `preadv2(fd, buf, offset, RWF_NOWAIT)`: reads only what the page cache
/// already holds, never waiting for the device. The caller guarantees
/// `offset + buf.len() <= i64::MAX` (see `read::clamp_len`). `buf` may be
/// uninitialised (an owned buffer's storage); the bytes read are
/// initialised by the kernel.
pub(crate) fn pread_nowait(fd: RawFd, buf: &mut [MaybeUninit<u8>], offset: u64) -> Nowait {
    let iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    // SAFETY: the iovec describes `buf`, valid for writes for the whole call.
    unsafe { preadv_nowait(fd, &iov, offset) }
}

/// The most iovecs one `preadv`/`IORING_OP_READV` takes (`UIO_MAXIOV`).
pub(crate) const IOV_MAX: usize = 1024;

/// `preadv2(fd, iov, offset, RWF_NOWAIT)`: [`pread_nowait`] into several
/// buffers (at most [`IOV_MAX`]).
///
/// # Safety
///
/// Every iovec describes memory valid for writes of `iov_len` bytes (possibly
/// uninitialised) for the whole call, and the caller guarantees that the
/// sum of the lengths plus `offset` is at most `i64::MAX`.
pub(crate) unsafe fn preadv_nowait(fd: RawFd, iov: &[libc::iovec], offset: u64) -> Nowait {
    let offset = libc::off_t::try_from(offset).unwrap_or(libc::off_t::MAX);
    let count = libc::c_int::try_from(iov.len().min(IOV_MAX)).unwrap_or(0);
    // SAFETY: the iovecs describe writable memory for the whole call (the
    // caller's contract); the call is synchronous, so nothing touches that
    // memory after it returns.
    let n = unsafe { libc::preadv2(fd, iov.as_ptr(), count, offset, libc::RWF_NOWAIT) };
    if let Ok(n) = usize::try_from(n) {
        return Nowait::Read(n);
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => Nowait::WouldBlock,
        // Only "this file (system) cannot do it" disables the inline path for
        // the file; EINVAL and the rest go to the ring, which gives the
        // authoritative answer for this one read.
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => Nowait::Unsupported,
        _ => Nowait::Ring,
    }
}

/// `pwrite(fd, buf, offset)`, or with `dsync` `pwritev2(.., RWF_DSYNC)`:
/// the bytes are durable when it returns, as under `O_DSYNC`. The blocking
/// twin of a ring write.
pub(crate) fn pwrite(file: &File, buf: &[u8], offset: u64, dsync: bool) -> io::Result<usize> {
    if !dsync {
        return std::os::unix::fs::FileExt::write_at(file, buf, offset);
    }
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let iov = [libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: buf.len(),
    }];
    // SAFETY: the iovec describes `buf`, valid for reads for the whole
    // (synchronous) call; the kernel only reads it.
    let n = unsafe { libc::pwritev2(file.as_raw_fd(), iov.as_ptr(), 1, offset, libc::RWF_DSYNC) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `pread(fd, buf, offset)`, into memory that may be uninitialised (an
/// owned buffer's storage); the bytes read are initialised by the
/// kernel. An offset beyond `i64::MAX` is clamped (the read then fails or
/// reads nothing, as for any offset past the end).
pub(crate) fn pread(file: &File, buf: &mut [MaybeUninit<u8>], offset: u64) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset).unwrap_or(libc::off_t::MAX);
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole
    // (synchronous) call; the kernel writes only bytes it read.
    let n = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), offset) };
    cvt(n, -1).map(isize::unsigned_abs)
}

/// `preadv(fd, iov, offset)` (at most [`IOV_MAX`] iovecs), into memory
/// that may be uninitialised; the bytes read are initialised by the kernel.
///
/// # Safety
///
/// Every iovec describes memory valid for writes of `iov_len` bytes for the
/// whole call.
pub(crate) unsafe fn preadv(file: &File, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset).unwrap_or(libc::off_t::MAX);
    let count = libc::c_int::try_from(iov.len().min(IOV_MAX)).unwrap_or(0);
    // SAFETY: the iovecs describe writable memory for the whole
    // (synchronous) call, by the caller's contract.
    let n = unsafe { libc::preadv(file.as_raw_fd(), iov.as_ptr(), count, offset) };
    cvt(n, -1).map(isize::unsigned_abs)
}

/// What kind of file a descriptor refers to (only regular files and block
/// devices support positioned reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    Regular,
    Block,
    Other(&'static str),
}

/// Which file a descriptor refers to, as the kernel knows it: two
/// descriptors with the same identity read and write the same bytes (a
/// file opened twice, or through a hard link). A regular file's device and
/// inode; a block device's device number (any node of it), with a device
/// of `u64::MAX`, which no file system has.
pub(crate) type Identity = (u64, u64);

/// What kind of file `file` is, and which ([`Identity`]).
pub(crate) fn file_kind(file: &File) -> io::Result<(FileKind, Identity)> {
    let st = fstat(file)?;
    let mode = st.st_mode & libc::S_IFMT;
    let identity = if mode == libc::S_IFBLK {
        (u64::MAX, st.st_rdev)
    } else {
        (st.st_dev, st.st_ino)
    };
    // An O_PATH descriptor stats like its file but can be neither read nor
    // written (io_uring refused it with a bare EBADF; `pread` too, later).
    // SAFETY: F_GETFL on a descriptor the caller owns; no pointers.
    let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    cvt(fl, -1)?;
    if fl & libc::O_PATH != 0 {
        return Ok((
            FileKind::Other(
                "an O_PATH descriptor (it cannot be read or written; open the file itself)",
            ),
            identity,
        ));
    }
    let kind = match mode {
        libc::S_IFREG => FileKind::Regular,
        libc::S_IFBLK => FileKind::Block,
        libc::S_IFIFO => FileKind::Other("a pipe or FIFO"),
        libc::S_IFSOCK => FileKind::Other("a socket"),
        libc::S_IFCHR => FileKind::Other("a character device"),
        libc::S_IFDIR => FileKind::Other("a directory"),
        libc::S_IFLNK => FileKind::Other("a symbolic link"),
        _ => FileKind::Other("of an unknown type"),
    };
    Ok((kind, identity))
}

fn fstat(file: &File) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole `struct stat` into the provided buffer,
    // which is properly sized and aligned; it is read only on success.
    let ret = unsafe { libc::fstat(file.as_raw_fd(), st.as_mut_ptr()) };
    cvt(ret, -1)?;
    // SAFETY: fstat succeeded, so the struct is initialised.
    Ok(unsafe { st.assume_init() })
}

/// The size in bytes of a regular file or block device.
pub(crate) fn file_size(file: &File, kind: FileKind) -> io::Result<u64> {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    if kind != FileKind::Block {
        return Ok(u64::try_from(fstat(file)?.st_size).unwrap_or(0));
    }
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 into `size`, which outlives the call.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &raw mut size) };
    cvt(ret, -1)?;
    Ok(size)
}

/// The magic number of the file system `file` is on (`statfs.f_type`).
pub(crate) fn fs_magic(file: &File) -> io::Result<i64> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs writes a whole `struct statfs` into the provided
    // buffer, which is properly sized and aligned; read only on success.
    let ret = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    cvt(ret, -1)?;
    // SAFETY: fstatfs succeeded, so the struct is initialised.
    Ok(unsafe { st.assume_init() }.f_type)
}

/// The descriptor's status flags (`F_GETFL`: access mode, `O_DIRECT`,
/// `O_APPEND`, ...).
pub(crate) fn status_flags(file: &File) -> io::Result<i32> {
    // SAFETY: F_GETFL on a valid, owned descriptor has no memory effects.
    cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) }, -1)
}

/// Clears `O_NONBLOCK` from the descriptor's status flags.
pub(crate) fn clear_nonblock(file: &File) -> io::Result<()> {
    let fl = status_flags(file)?;
    // SAFETY: F_SETFL on a valid, owned descriptor has no memory effects.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK) };
    cvt(r, -1)?;
    Ok(())
}

/// The `O_DIRECT` alignments of an open file, `(memory, offset)` in bytes,
/// as `statx(STATX_DIOALIGN)` reports them (kernel 6.1+); `None` where the
/// kernel or the file system does not say.
pub(crate) fn dio_align(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor, a NUL-terminated empty path with
    // AT_EMPTY_PATH (the descriptor itself), and a writable statx.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &raw mut st,
        )
    };
    (r == 0 && st.stx_mask & libc::STATX_DIOALIGN != 0 && st.stx_dio_offset_align != 0)
        .then_some((st.stx_dio_mem_align, st.stx_dio_offset_align))
}

/// RLIMIT_NOFILE's soft limit (1024 if it cannot be read).
pub(crate) fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the provided, properly sized struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// A non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<File> {
    // SAFETY: eventfd has no memory arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    let fd = cvt(fd, -1)?;
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A close-on-exec duplicate of `fd` (`F_DUPFD_CLOEXEC`), owned by the caller.
pub(crate) fn dup_cloexec(fd: i32) -> io::Result<File> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) has no memory arguments; an invalid fd
    // is an error return.
    let new = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) }, -1)?;
    // SAFETY: `new` is a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(new) })
}

/// Reads (and so resets) an eventfd's or timerfd's counter; `Ok(false)` if
/// it was zero (EAGAIN).
pub(crate) fn drain_counter(fd: &File) -> io::Result<bool> {
    let mut counter = [0u8; 8];
    match (&*fd).read(&mut counter) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

/// A non-blocking, close-on-exec CLOCK_MONOTONIC timerfd (disarmed).
pub(crate) fn timerfd() -> io::Result<File> {
    // SAFETY: timerfd_create has no memory arguments.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
        )
    };
    let fd = cvt(fd, -1)?;
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Arms a timerfd to expire once, `after` from now (at least 1 ns, so that
/// a zero duration does not disarm it).
pub(crate) fn arm_timer(fd: &File, after: Duration) -> io::Result<()> {
    let after = after.max(Duration::from_nanos(1));
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(after.subsec_nanos()),
        },
    };
    // SAFETY: `spec` is a valid itimerspec that outlives the call; the old
    // value is not requested (null).
    let ret =
        unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &raw const spec, std::ptr::null_mut()) };
    cvt(ret, -1)?;
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes (EINTR counts as a
/// wake-up: the caller re-checks its condition anyway).
pub(crate) fn wait_readable(fd: &File, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd that outlives the call.
    unsafe { libc::poll(&raw mut pfd, 1, ms) };
}

/// `fsync(fd)`, or `fdatasync(fd)` with `datasync`.
pub(crate) fn fsync(file: &File, datasync: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: plain syscalls on a descriptor `file` keeps open; no memory is
    // passed.
    let r = unsafe {
        if datasync {
            libc::fdatasync(fd)
        } else {
            libc::fsync(fd)
        }
    };
    cvt(r, -1)?;
    Ok(())
}

/// `sync_file_range(fd, offset, len, flags)`.
pub(crate) fn sync_file_range(
    file: &File,
    offset: libc::off64_t,
    len: libc::off64_t,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: a plain syscall on a descriptor `file` keeps open; no memory
    // is passed.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    cvt(r, -1)?;
    Ok(())
}

/// `fallocate(fd, mode, offset, len)`.
pub(crate) fn fallocate(
    file: &File,
    mode: i32,
    offset: libc::off64_t,
    len: libc::off64_t,
) -> io::Result<()> {
    // SAFETY: a plain syscall on a descriptor `file` keeps open; no memory
    // is passed.
    let r = unsafe { libc::fallocate64(file.as_raw_fd(), mode, offset, len) };
    cvt(r, -1)?;
    Ok(())
}

/// `statx(fd, "", AT_EMPTY_PATH, mask)`: the descriptor's own metadata.
pub(crate) fn statx(file: &File, mask: u32) -> io::Result<Box<libc::statx>> {
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut st: Box<libc::statx> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: a valid descriptor, a NUL-terminated empty path, and a
    // writable statx the call fills.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            mask,
            &raw mut *st,
        )
    };
    cvt(r, -1)?;
    Ok(st)
}

/// `open(path, flags, mode)`: a new descriptor, owned by the returned file.
pub(crate) fn open(path: &CStr, flags: i32, mode: u32) -> io::Result<File> {
    // SAFETY: a NUL-terminated path that outlives the call; the result is a
    // new descriptor.
    let fd = cvt(unsafe { libc::open(path.as_ptr(), flags, mode) }, -1)?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A new private, anonymous, readable and writable mapping of `len` bytes
/// (zeroed), at an address the kernel picks. The caller owns it and
/// unmaps it with [`munmap`].
pub(crate) fn mmap_anonymous(len: usize) -> io::Result<*mut libc::c_void> {
    // SAFETY: a new private anonymous mapping at an address of the kernel's
    // choosing (no MAP_FIXED): no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(raw)
}

/// `munmap(addr, len)`.
///
/// # Safety
///
/// `[addr, addr + len)` is memory the caller mapped and owns, and nothing
/// uses it any more (no reference into it outlives the call).
pub(crate) unsafe fn munmap(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: the range is the caller's own, unused mapping (the caller's
    // contract).
    let r = unsafe { libc::munmap(addr, len) };
    cvt(r, -1)?;
    Ok(())
}

/// `madvise(addr, len, MADV_HUGEPAGE)`: asks that the range be backed by
/// transparent huge pages. Advice only: the range's contents and mapping
/// stay as they are.
pub(crate) fn advise_huge_pages(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: MADV_HUGEPAGE changes only how the kernel may back the range,
    // never its contents or whether it is mapped; a range that is not
    // mapped is refused (ENOMEM), so no address can cause harm.
    let r = unsafe { libc::madvise(addr, len, libc::MADV_HUGEPAGE) };
    cvt(r, -1)?;
    Ok(())
}

/// `madvise(addr, len, MADV_DONTFORK)`: a child made by `fork` gets no
/// copy of the range (memory registered with a ring stays pinned, and
/// `fork` would otherwise copy it into the child at once).
#[cfg_attr(not(feature = "cache"), allow(dead_code))]
pub(crate) fn advise_dont_fork(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: MADV_DONTFORK changes only what a future child inherits,
    // never this process's mapping or contents; a range that is not mapped
    // is refused (ENOMEM).
    let r = unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) };
    cvt(r, -1)?;
    Ok(())
}

/// Faults in `len` bytes at `addr` for writing (`MADV_POPULATE_WRITE`,
/// 5.14+), without changing what they hold, so that whoever uses the
/// range later does not wait for fresh memory. Refused by older kernels.
#[cfg(feature = "cache")]
pub(crate) fn advise_populate_write(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: MADV_POPULATE_WRITE faults the pages in as a write would,
    // without changing their contents; a range that is not mapped is
    // refused (ENOMEM).
    let r = unsafe { libc::madvise(addr.cast(), len, libc::MADV_POPULATE_WRITE) };
    cvt(r, -1)?;
    Ok(())
}

/// [`advise_populate_write`], or where the kernel refuses it, a write of
/// each page's first byte as it is.
///
/// # Safety
///
/// The range is writable memory of the caller's that nothing reads or
/// writes meanwhile (the kernel included: no read is filling it).
#[cfg(feature = "cache")]
pub(crate) unsafe fn populate_write(addr: *mut u8, len: usize) {
    if advise_populate_write(addr, len).is_ok() {
        return;
    }
    let page = page_size().unwrap_or(4096);
    let mut off = 0;
    while off < len {
        // SAFETY: inside the caller's writable range, which nothing else
        // touches meanwhile; the byte is written back unchanged.
        unsafe {
            let p = addr.add(off);
            p.write_volatile(p.read_volatile());
        }
        off += page;
    }
}

/// The size of a memory page in bytes (`sysconf(_SC_PAGESIZE)`).
pub(crate) fn page_size() -> io::Result<usize> {
    // SAFETY: sysconf only reads a value (glibc: from the auxiliary vector).
    let page = cvt(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }, -1)?;
    usize::try_from(page).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The calling thread's I/O priority set to `ioprio` (`ioprio_set(2)`)
/// until the guard drops, which sets it back to none (the thread's CPU
/// priority decides): a blocking-pool thread runs other tasks after this
/// op. Nothing is called for `ioprio` 0; a failure leaves the thread as
/// it was (an I/O priority is a hint).
pub(crate) struct IoprioGuard(bool);

const IOPRIO_WHO_PROCESS: libc::c_int = 1;

impl IoprioGuard {
    pub(crate) fn set(ioprio: u16) -> IoprioGuard {
        if ioprio == 0 {
            return IoprioGuard(false);
        }
        // SAFETY: `ioprio_set` takes only integers; `who` 0 with
        // IOPRIO_WHO_PROCESS is the calling thread.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ioprio_set,
                IOPRIO_WHO_PROCESS,
                0,
                libc::c_int::from(ioprio),
            )
        };
        IoprioGuard(r == 0)
    }
}

impl Drop for IoprioGuard {
    fn drop(&mut self) {
        if self.0 {
            // SAFETY: as in `set`; 0 is "no priority class".
            unsafe {
                libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, 0);
            }
        }
    }
}

/// The I/O scheduler of the block device `file` is on (a block device:
/// itself), as `/sys/dev/block/MAJ:MIN/queue/scheduler` names it between
/// brackets; `None` for a file on no named block device.
pub(crate) fn io_scheduler(file: &File, kind: FileKind) -> Option<String> {
    let st = fstat(file).ok()?;
    let dev = if matches!(kind, FileKind::Block) {
        st.st_rdev
    } else {
        st.st_dev
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return None;
    }
    let base = format!("/sys/dev/block/{major}:{minor}");
    // A partition has no queue of its own: its disk's, one level up.
    let text = std::fs::read_to_string(format!("{base}/queue/scheduler"))
        .or_else(|_| std::fs::read_to_string(format!("{base}/../queue/scheduler")))
        .ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_owned())
}
