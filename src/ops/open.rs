//! `open` ([`UringContext::open`](crate::UringContext::open)) with
//! [`OpenOptions`]: `open(2)` on the blocking pool, then the new file is
//! registered ([`UringOpenFuture`]).

use std::ffi::CString;
use std::fmt;
use std::future::Future;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use super::{Core, Op, Piece};
use crate::blocking::BlockingPool;
use crate::blocking::PoolJob;
use crate::error::{self, shut_down_error};
use crate::files::{Facts, FileEntry};
use crate::id::FileId;
use crate::ring::RingOp;
use crate::shared::{Ctx, Inner};
use crate::sys;

/// How [`UringContext::open`](crate::UringContext::open) opens a file:
/// like [`std::fs::OpenOptions`], plus `O_DIRECT`; without append mode,
/// which positioned writes cannot use (on Linux, `pwrite` on an
/// `O_APPEND` file appends whatever the offset).
///
/// ```
/// use uring_positioned_io::OpenOptions;
/// let wal = OpenOptions::new().read(true).write(true).create(true).clone();
/// let data = OpenOptions::new().read(true).write(true).direct(true).clone();
/// # let _ = (wal, data);
/// ```
#[derive(Debug, Clone)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent open flags, as std's"
)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    create: bool,
    create_new: bool,
    truncate: bool,
    direct: bool,
    mode: u32,
    custom_flags: i32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// Nothing set: set `read` and/or `write`.
    #[must_use]
    pub fn new() -> Self {
        OpenOptions {
            read: false,
            write: false,
            create: false,
            create_new: false,
            truncate: false,
            direct: false,
            mode: 0o666,
            custom_flags: 0,
        }
    }
    /// Open for reading.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Create the file if it does not exist (needs `write`).
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Create the file, failing if it exists (needs `write`).
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Truncate the file to length 0 (needs `write`).
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    /// `O_DIRECT`: bypass the page cache. Offsets, lengths and buffer
    /// addresses must then be aligned (see [`FileStat::dio_offset_align`](crate::FileStat::dio_offset_align)).
    pub fn direct(&mut self, on: bool) -> &mut Self {
        self.direct = on;
        self
    }
    /// Permission bits of a created file (before the umask); 0o666 unless set.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
    /// More `open(2)` flags (such as `O_NOATIME`, `O_DSYNC`); the access
    /// mode bits are ignored. Refused: `O_APPEND` (a positioned write
    /// would land at the end of the file), `O_PATH` (no I/O), `O_NONBLOCK`
    /// (the context never blocks a runtime worker anyway, and on a regular
    /// file it would turn io_uring reads into `EAGAIN`), and `O_CREAT`,
    /// `O_EXCL` or `O_TRUNC` without [`write`](Self::write), as
    /// [`create`](Self::create) and [`truncate`](Self::truncate).
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }

    /// The `open(2)` flags, or why these options are invalid. Always
    /// `O_CLOEXEC`, and `O_NONBLOCK` (so that opening a FIFO never blocks;
    /// cleared once the file is open).
    fn flags(&self) -> io::Result<i32> {
        let invalid = |why: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, why.to_owned()));
        let access = match (self.read, self.write) {
            (true, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
            (false, false) => return invalid("OpenOptions: set read and/or write"),
        };
        if (self.create || self.create_new || self.truncate) && !self.write {
            return invalid("OpenOptions: create, create_new and truncate need write");
        }
        let custom = self.custom_flags & !libc::O_ACCMODE;
        if custom & (libc::O_APPEND | libc::O_PATH) != 0 {
            return invalid(
                "OpenOptions: O_APPEND (pwrite on it appends whatever the offset) and O_PATH are refused",
            );
        }
        if custom & libc::O_NONBLOCK != 0 {
            return invalid(
                "OpenOptions: O_NONBLOCK is refused: the context never blocks a runtime worker, \
                 and on a regular file it turns io_uring reads into EAGAIN",
            );
        }
        if custom & (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) != 0 && !self.write {
            return invalid("OpenOptions: O_CREAT, O_EXCL and O_TRUNC in custom_flags need write");
        }
        let mut flags = access | custom | libc::O_CLOEXEC | libc::O_NONBLOCK;
        if self.create_new {
            flags |= libc::O_CREAT | libc::O_EXCL;
        } else if self.create {
            flags |= libc::O_CREAT;
        }
        if self.truncate {
            flags |= libc::O_TRUNC;
        }
        if self.direct {
            flags |= libc::O_DIRECT;
        }
        Ok(flags)
    }
}

pub(crate) struct Open {
    path: CString,
    flags: i32,
    mode: u32,
    /// The file and its facts, once opened.
    pub(crate) opened: Option<(std::fs::File, Facts)>,
}

impl Open {
    pub(crate) fn new(path: &Path, options: &OpenOptions) -> io::Result<Self> {
        let path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
        Ok(Open {
            path,
            flags: options.flags()?,
            mode: options.mode,
            opened: None,
        })
    }
}

/// `open(2)` of `path` and the file's `Facts` (each may wait for the file
/// system), on a blocking-pool thread. `ENXIO` (a FIFO, socket or device
/// with no driver) is worded as the refusal of a file of that kind.
fn open_blocking(path: &CString, flags: i32, mode: u32) -> io::Result<(std::fs::File, Facts)> {
    let e = match sys::open(path, flags, mode) {
        Ok(file) => {
            // Opened with O_NONBLOCK so that a FIFO could not block the open;
            // a regular file needs it cleared (io_uring would return EAGAIN).
            sys::clear_nonblock(&file)?;
            let name = format!(
                "{:?} (opened with UringContext::open)",
                path.to_string_lossy()
            );
            let facts = Facts::of(&file, &name)?;
            return Ok((file, facts));
        }
        Err(e) => e,
    };
    if e.raw_os_error() != Some(libc::ENXIO) {
        return Err(e);
    }
    let shown = std::path::Path::new(std::ffi::OsStr::from_bytes(path.as_bytes())).display();
    let what = match std::fs::metadata(std::ffi::OsStr::from_bytes(path.as_bytes())) {
        Ok(m) if m.file_type().is_fifo() => "a pipe or FIFO",
        Ok(m) if m.file_type().is_socket() => "a socket",
        Ok(m) if m.file_type().is_char_device() => "a character device",
        Ok(m) if m.file_type().is_block_device() => "a block device with no driver",
        _ => return Err(e),
    };
    Err(error::explained(
        io::ErrorKind::InvalidInput,
        e,
        format!(
            "open {shown}: it is {what}; only regular files and block devices support \
             positioned I/O"
        ),
    ))
}

impl Op for Open {
    type Blocking = io::Result<(std::fs::File, Facts)>;
    const ON_FILE: bool = false;
    const BLOCKING_DETACHABLE: bool = true;

    fn name(&self) -> &'static str {
        "open"
    }

    fn check(&mut self, _fid: FileId, _file: Option<&FileEntry>) -> io::Result<Option<usize>> {
        Ok(None)
    }

    fn sqe(&mut self) -> RingOp<'_> {
        unreachable!("an open runs on the blocking pool (`Core::via_blocking_pool`)")
    }

    fn blocking_job(
        &mut self,
        pool: &BlockingPool,
        _file: Option<Arc<FileEntry>>,
    ) -> io::Result<PoolJob<Self::Blocking>> {
        let path = self.path.clone();
        let (flags, mode) = (self.flags, self.mode);
        // The descriptor is owned as soon as it exists: a dropped future's
        // task closes it.
        pool.job(move || open_blocking(&path, flags, mode))
    }

    fn finish_blocking(&mut self, out: Self::Blocking) -> io::Result<usize> {
        self.opened = Some(out?);
        Ok(0)
    }

    fn advance(&mut self, piece: Piece<'_>) -> Option<io::Result<usize>> {
        Some(piece.res)
    }
}

/// Registers a file `open` opened (with the facts its pool task read).
pub(crate) fn register_opened(
    inner: &Inner,
    file: std::fs::File,
    facts: Facts,
) -> io::Result<FileId> {
    if inner.closed.load(Ordering::Acquire) {
        return Err(shut_down_error());
    }
    inner.files.insert(file, facts, inner.fixed())
}

/// The future of [`UringContext::open`](crate::UringContext::open):
/// resolves to the checked id of the newly registered file. Dropped before
/// it resolves, the file may or may not have been opened (and created);
/// if it was, it is closed again and never registered.
#[must_use = "futures do nothing unless polled"]
pub struct UringOpenFuture<'a> {
    pub(crate) core: Result<Core<'a, Open>, Option<io::Error>>,
}

impl<'a> UringOpenFuture<'a> {
    /// An open runs on the blocking pool whatever the backend: any directory
    /// on its path may be a mount whose server never answers, which on a
    /// ring would block `io_uring_enter` on a runtime worker.
    pub(crate) fn new(ctx: Ctx<'a>, path: &Path, options: &OpenOptions) -> Self {
        UringOpenFuture {
            core: Open::new(path, options)
                .map(|op| Core::new(ctx, FileId::from(0), op).via_blocking_pool())
                .map_err(Some),
        }
    }
}

impl Future for UringOpenFuture<'_> {
    type Output = io::Result<FileId>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let core = match &mut self.get_mut().core {
            Ok(core) => core,
            Err(e) => {
                let e = e.take().expect("future polled after completion");
                return Poll::Ready(Err(e));
            }
        };
        ready!(core.poll_op(cx))?;
        let (file, facts) = core
            .op
            .opened
            .take()
            .ok_or_else(|| io::Error::other("open returned no descriptor (a bug)"))?;
        Poll::Ready(register_opened(core.ctx(), file, facts))
    }
}

impl fmt::Debug for UringOpenFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.core {
            Ok(core) => core.fmt(f),
            Err(_) => f.write_str("Open(invalid)"),
        }
    }
}
