//! A fault-injecting FUSE file system that integration tests mount and
//! unmount themselves, to see how the crate behaves on storage that fails,
//! lies or blocks.
//!
//! [`FaultFs::mount`] mounts a read-only file system on a fresh temp dir. It
//! holds the given files (flat, in its root directory) whose content is the
//! position-derived test pattern of `tests/common` (`fill_pattern(seed, ..)`),
//! so a test can verify every byte it reads with `check_pattern` / `expected`.
//! Faults ([`Fault`]) are set per file and byte range at any time and apply to
//! every FUSE read request that overlaps the range.
//!
//! # Writable mounts
//!
//! [`FaultFs::mount_writable`] mounts the same files read-write: their
//! content starts as the pattern and is kept in memory, FUSE write requests
//! change it (and may extend a file), `fsync`/`fdatasync` requests succeed,
//! and reads return the current content ([`FaultFs::content`]). Faults for
//! writes are set apart from read faults: [`FaultFs::set_write_fault`] applies
//! to every FUSE write request overlapping a range (`Errno`: the write fails
//! and changes nothing; `Short(n)`: only the first `n` bytes are written and
//! the reply says so, `Short(0)` is a write of nothing; `Delay`; `Hang`) and
//! [`FaultFs::set_sync_fault`] to the file's sync requests (`Errno`, `Hang`,
//! `Delay`). Without the page cache (`direct_io`) a `pwrite` of up to 1 MiB
//! is one request with the same offset and length; with it, writes go through
//! the page cache to the server synchronously (write-through), in requests
//! of whole pages where the write covers them.
//!
//! # What it needs
//!
//! * Linux, root (CAP_SYS_ADMIN) and `/dev/fuse`. The mount uses the `fuser`
//!   crate's pure-Rust path: `open("/dev/fuse")` + `mount(2)`, so no libfuse
//!   and no `fusermount3` are needed when running as root.
//! * Not root: `fuser` falls back to the setuid `fusermount3` helper (Debian
//!   package `fuse3`), which is then needed, and `/etc/fuse.conf` decides the
//!   rest. CI runs as root, so `fuse3` is only a fallback; installing it does
//!   no harm (`apt-get install -y fuse3`), and `libfuse3-dev`/`pkg-config` are
//!   never needed (fuser is built with its default, libfuse-free features).
//! * Where FUSE is unavailable (no `/dev/fuse`, no privilege in a container),
//!   `mount` returns `Err(reason)`; tests print `skipped: <reason>` and pass.
//!
//! # Kernel requests vs. your reads
//!
//! Faults apply to the *FUSE read requests the kernel sends*, which are not
//! always the reads the test issued:
//!
//! * `direct_io = true`: open replies carry `FOPEN_DIRECT_IO`. A `pread` of up
//!   to `max_pages` (256 pages = 1 MiB here) is one FUSE request with the same
//!   offset and length (larger ones are split); there is no page cache.
//! * `direct_io = false`: open replies carry `FOPEN_KEEP_CACHE`, so pages stay
//!   cached across opens for the life of the mount. Requests are whole pages;
//!   a page already cached sends nothing. Observed (kernel 6.18): an isolated
//!   ("random") pread asks for exactly its pages; sequential preads make the
//!   kernel read ahead in 128 KiB-aligned 128 KiB requests, sent
//!   asynchronously, so a request can hang or fail that no caller asked for
//!   yet, and a caller reading pages *outside* a faulted range blocks when
//!   they share a readahead request with it (after `release_hangs` the kernel
//!   retries those pages one by one and they succeed). A failed request is
//!   retried once as a single-page read, so errors are seen twice. A short
//!   reply is taken as end of file: the kernel lowers the file's size to
//!   where the data stopped (see `tests/it/fuse_harness.rs`). Place faulted
//!   ranges 128 KiB-aligned and keep unrelated ranges ≥ 1 MiB away when a
//!   test depends on a range *not* being touched.
//!
//! Replies are never produced by sleeping on a session thread: delayed replies
//! go to a timer thread and hung replies to a parked list, so one slow or hung
//! request never holds up others. `max_background` is raised to 1024 so that
//! many readahead requests can be outstanding at once (the kernel default, 12,
//! would queue new cached reads behind hung ones).
//!
//! # Teardown
//!
//! `Drop` answers every hung read with EIO and every delayed one at once,
//! unmounts with `umount2` and joins the session threads (they end at once;
//! the wait is capped at 5 s). If a file on the mount is still open the
//! plain unmount fails with EBUSY: it then detaches the mount
//! (`MNT_DETACH`), aborts the connection through fusectl if
//! `/sys/fs/fuse/connections` is mounted, and otherwise leaves the session
//! threads running (with a message on stderr) until the last open file is
//! closed, which also ends them; reads on such a file keep being served until
//! then. It never hangs a test. A process that dies without dropping a
//! `FaultFs` (killed, or `std::process::exit`) leaves a dead mount behind
//! ("Transport endpoint is not connected") under the temp dir; `umount -l`
//! removes it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};

use super::fill_pattern;

/// How long the kernel may cache entries and attributes. Content never
/// changes, so this is long: no getattr traffic interleaves with the reads a
/// test makes (which also means a size the kernel lowered after a short
/// cached read stays lowered for the life of the mount).
const TTL: Duration = Duration::from_secs(3600);

/// How long `Drop` waits for the session threads after a plain unmount.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A fault applied to every read request overlapping a byte range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Reply with this errno (e.g. `libc::EIO`).
    Errno(i32),
    /// Reply with at most this many bytes: the first `n` bytes of the
    /// requested range, with correct content (storage that lies about size).
    Short(u32),
    /// Reply with correct data after this long (from a timer thread).
    Delay(Duration),
    /// Never reply, until `release_hangs` (then EIO) or the file system is
    /// dropped (then EIO).
    Hang,
}

/// One file of the file system: `len` bytes of the pattern of `seed`.
#[derive(Clone, Debug)]
pub struct FileSpec {
    pub name: String,
    pub len: u64,
    pub seed: u64,
}

impl FileSpec {
    pub fn new(name: &str, len: u64, seed: u64) -> FileSpec {
        FileSpec {
            name: name.to_string(),
            len,
            seed,
        }
    }
}

/// One read request as the file system received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRecord {
    pub name: String,
    pub offset: u64,
    pub size: u32,
    /// The fault that applied, if any.
    pub fault: Option<Fault>,
}

/// One write request as a writable file system received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    pub name: String,
    pub offset: u64,
    pub size: usize,
    /// The fault that applied, if any.
    pub fault: Option<Fault>,
}

struct FaultRule {
    file: usize,
    range: Range<u64>,
    fault: Fault,
}

/// A write, sync or open request that is hung.
enum ParkedWrite {
    Write { reply: ReplyWrite, file: usize },
    Sync { reply: ReplyEmpty, file: usize },
    Open { reply: ReplyOpen, file: usize },
}

impl ParkedWrite {
    fn file(&self) -> usize {
        match self {
            ParkedWrite::Write { file, .. }
            | ParkedWrite::Sync { file, .. }
            | ParkedWrite::Open { file, .. } => *file,
        }
    }

    fn fail(self) {
        match self {
            ParkedWrite::Write { reply, .. } => reply.error(Errno::EIO),
            ParkedWrite::Sync { reply, .. } => reply.error(Errno::EIO),
            ParkedWrite::Open { reply, .. } => reply.error(Errno::EIO),
        }
    }
}

struct Parked {
    reply: ReplyData,
}

#[derive(Default)]
struct Inner {
    /// Most recently set first.
    faults: Vec<FaultRule>,
    /// After `release_hangs`: `Hang` answers EIO at once until `set_fault`.
    hangs_released: bool,
    /// Set by `Drop`: no new hangs or delays.
    shutting_down: bool,
    parked: Vec<Parked>,
    log: Vec<ReadRecord>,
    /// Writable mounts: faults of write requests, most recent first.
    write_faults: Vec<FaultRule>,
    /// Writable mounts: the fault of each file's sync requests.
    sync_faults: HashMap<usize, Fault>,
    /// The fault of each file's open requests (`Errno`, `Hang`, `Delay`).
    open_faults: HashMap<usize, Fault>,
    parked_writes: Vec<ParkedWrite>,
    write_log: Vec<WriteRecord>,
}

struct Shared {
    files: Vec<FileSpec>,
    /// Writable mounts: each file's current content (empty otherwise).
    contents: Vec<Mutex<Vec<u8>>>,
    by_name: HashMap<String, usize>,
    inner: Mutex<Inner>,
    reads: AtomicU64,
    timer: Mutex<Option<mpsc::Sender<TimerMsg>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn file_index(&self, name: &str) -> usize {
        *self
            .by_name
            .get(name)
            .unwrap_or_else(|| panic!("FaultFs: no file named {name:?}"))
    }

    fn writable(&self) -> bool {
        !self.contents.is_empty()
    }

    fn content(&self, file: usize) -> MutexGuard<'_, Vec<u8>> {
        self.contents[file]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn len(&self, file: usize) -> u64 {
        if self.writable() {
            self.content(file).len() as u64
        } else {
            self.files[file].len
        }
    }

    /// Reply to a read of `file` with correct content, at most `max` bytes.
    fn reply_data(&self, reply: ReplyData, file: usize, offset: u64, size: u32, max: u32) {
        if self.writable() {
            let content = self.content(file);
            let start = (offset.min(content.len() as u64)) as usize;
            let n = (content.len() - start).min(size as usize).min(max as usize);
            return reply.data(&content[start..start + n]);
        }
        let spec = &self.files[file];
        let n = spec
            .len
            .saturating_sub(offset)
            .min(u64::from(size))
            .min(u64::from(max)) as usize;
        let mut buf = vec![0u8; n];
        fill_pattern(spec.seed, offset, &mut buf);
        reply.data(&buf);
    }
}

impl Shared {
    /// Run `job` (a reply) after `d` on the timer thread; at once when
    /// shutting down or when the timer is gone.
    fn later(&self, d: Duration, shutting_down: bool, job: Box<dyn FnOnce() + Send>) {
        let timer = self
            .timer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match timer {
            Some(tx) if !shutting_down => {
                if let Err(mpsc::SendError(TimerMsg::At(_, job))) =
                    tx.send(TimerMsg::At(Instant::now() + d, job))
                {
                    job();
                }
            }
            _ => job(),
        }
    }
}

impl Shared {
    /// Answers a request without a byte range (a sync, an open) under
    /// `fault`: `ok` replies success, `fail` an errno, `park` makes it a
    /// hung request (`Short` means no fault).
    fn answer_whole<R: Send + 'static>(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        fault: Option<Fault>,
        reply: R,
        park: impl FnOnce(R) -> ParkedWrite,
        ok: impl FnOnce(R) + Send + 'static,
        fail: impl FnOnce(R, Errno),
    ) {
        match fault {
            Some(Fault::Errno(e)) => {
                drop(inner);
                fail(reply, Errno::from_i32(e));
            }
            Some(Fault::Hang) if !(inner.hangs_released || inner.shutting_down) => {
                inner.parked_writes.push(park(reply));
            }
            Some(Fault::Hang) => {
                drop(inner);
                fail(reply, Errno::EIO);
            }
            Some(Fault::Delay(d)) => {
                let shutting_down = inner.shutting_down;
                drop(inner);
                self.later(d, shutting_down, Box::new(move || ok(reply)));
            }
            Some(Fault::Short(_)) | None => {
                drop(inner);
                ok(reply);
            }
        }
    }
}

enum TimerMsg {
    At(Instant, Box<dyn FnOnce() + Send>),
    Shutdown,
}

/// The timer thread: runs each job at its deadline; on `Shutdown` (or when
/// every sender is gone) runs all remaining jobs at once and exits.
fn timer_loop(rx: mpsc::Receiver<TimerMsg>) {
    let mut jobs: Vec<(Instant, Box<dyn FnOnce() + Send>)> = Vec::new();
    loop {
        let now = Instant::now();
        let mut i = 0;
        while i < jobs.len() {
            if jobs[i].0 <= now {
                let (_, job) = jobs.swap_remove(i);
                job();
            } else {
                i += 1;
            }
        }
        let msg = match jobs.iter().map(|j| j.0).min() {
            Some(next) => match rx.recv_timeout(next.saturating_duration_since(now)) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
            },
            None => rx.recv().ok(),
        };
        match msg {
            Some(TimerMsg::At(when, job)) => jobs.push((when, job)),
            Some(TimerMsg::Shutdown) | None => {
                for (_, job) in jobs.drain(..) {
                    job();
                }
                return;
            }
        }
    }
}

const ROOT: u64 = 1;

fn ino_of(file: usize) -> u64 {
    file as u64 + 2
}

struct Fs {
    shared: Arc<Shared>,
    direct_io: bool,
    writable: bool,
    uid: u32,
    gid: u32,
}

impl Fs {
    fn file_of(&self, ino: INodeNo) -> Option<usize> {
        let i = u64::from(ino).checked_sub(2)? as usize;
        (i < self.shared.files.len()).then_some(i)
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino == ROOT {
            (FileType::Directory, 0, 0o555, 2)
        } else {
            let f = self.file_of(INodeNo(ino))?;
            let perm = if self.writable { 0o644 } else { 0o444 };
            (FileType::RegularFile, self.shared.len(f), perm, 1)
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Many readahead (background) requests may be hung or delayed at
        // once; do not let the kernel queue further ones behind them.
        let _ = config.set_max_background(1024);
        let _ = config.set_congestion_threshold(1000);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (u64::from(parent) == ROOT)
            .then(|| std::str::from_utf8(name.as_bytes()).ok())
            .flatten()
            .and_then(|n| self.shared.by_name.get(n).copied());
        match found.and_then(|f| self.attr(ino_of(f))) {
            Some(attr) => reply.entry(&TTL, &attr, fuser::Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(u64::from(ino)) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.file_of(ino).is_none() {
            return reply.error(Errno::ENOENT);
        }
        if !self.writable && flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let fl = if self.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        };
        let file = self.file_of(ino).unwrap_or_default();
        let inner = self.shared.lock();
        let fault = inner.open_faults.get(&file).cloned();
        self.shared.answer_whole(
            inner,
            fault,
            reply,
            move |reply| ParkedWrite::Open { reply, file },
            move |reply| reply.opened(FileHandle(0), fl),
            ReplyOpen::error,
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.file_of(ino) else {
            return reply.error(Errno::ENOENT);
        };
        self.shared.reads.fetch_add(1, Ordering::SeqCst);
        let end = offset.saturating_add(u64::from(size.max(1)));
        let mut inner = self.shared.lock();
        let fault = inner
            .faults
            .iter()
            .find(|r| r.file == file && r.range.start < end && offset < r.range.end)
            .map(|r| r.fault.clone());
        inner.log.push(ReadRecord {
            name: self.shared.files[file].name.clone(),
            offset,
            size,
            fault: fault.clone(),
        });
        match fault {
            None => {
                drop(inner);
                self.shared.reply_data(reply, file, offset, size, u32::MAX);
            }
            Some(Fault::Errno(e)) => {
                drop(inner);
                reply.error(Errno::from_i32(e));
            }
            Some(Fault::Short(n)) => {
                drop(inner);
                self.shared.reply_data(reply, file, offset, size, n);
            }
            Some(Fault::Hang) => {
                if inner.hangs_released || inner.shutting_down {
                    drop(inner);
                    reply.error(Errno::EIO);
                } else {
                    inner.parked.push(Parked { reply });
                }
            }
            Some(Fault::Delay(d)) => {
                let shutting_down = inner.shutting_down;
                drop(inner);
                let shared = self.shared.clone();
                let job: Box<dyn FnOnce() + Send> =
                    Box::new(move || shared.reply_data(reply, file, offset, size, u32::MAX));
                self.shared.later(d, shutting_down, job);
            }
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(file) = self.file_of(ino).filter(|_| self.writable) else {
            return reply.error(Errno::EBADF);
        };
        let end = offset.saturating_add(data.len().max(1) as u64);
        let mut inner = self.shared.lock();
        let fault = inner
            .write_faults
            .iter()
            .find(|r| r.file == file && r.range.start < end && offset < r.range.end)
            .map(|r| r.fault.clone());
        inner.write_log.push(WriteRecord {
            name: self.shared.files[file].name.clone(),
            offset,
            size: data.len(),
            fault: fault.clone(),
        });
        let n = match &fault {
            Some(Fault::Errno(e)) => {
                drop(inner);
                return reply.error(Errno::from_i32(*e));
            }
            Some(Fault::Short(n)) => data.len().min(*n as usize),
            _ => data.len(),
        };
        // The data lands now; only the reply is delayed or hung.
        {
            let mut content = self.shared.content(file);
            let (start, stop) = (offset as usize, offset as usize + n);
            if content.len() < stop {
                content.resize(stop, 0);
            }
            content[start..stop].copy_from_slice(&data[..n]);
        }
        match fault {
            Some(Fault::Hang) if !(inner.hangs_released || inner.shutting_down) => {
                inner.parked_writes.push(ParkedWrite::Write { reply, file });
            }
            Some(Fault::Hang) => {
                drop(inner);
                reply.error(Errno::EIO);
            }
            Some(Fault::Delay(d)) => {
                let shutting_down = inner.shutting_down;
                drop(inner);
                let job: Box<dyn FnOnce() + Send> = Box::new(move || reply.written(n as u32));
                self.shared.later(d, shutting_down, job);
            }
            _ => {
                drop(inner);
                reply.written(n as u32);
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(file) = self.file_of(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let inner = self.shared.lock();
        let fault = inner.sync_faults.get(&file).cloned();
        self.shared.answer_whole(
            inner,
            fault,
            reply,
            move |reply| ParkedWrite::Sync { reply, file },
            ReplyEmpty::ok,
            ReplyEmpty::error,
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if u64::from(ino) != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut entries: Vec<(u64, FileType, &str)> = vec![
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
        ];
        for (i, f) in self.shared.files.iter().enumerate() {
            entries.push((ino_of(i), FileType::RegularFile, &f.name));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// A mounted fault-injecting file system; unmounted on drop.
pub struct FaultFs {
    shared: Arc<Shared>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
    timer: Option<JoinHandle<()>>,
    /// Connection id (minor of st_dev), for a fusectl abort as last resort.
    conn: Option<u64>,
    /// The temp dir mounted on; removed after the unmount.
    _dir: Option<tempfile::TempDir>,
}

impl FaultFs {
    /// Mount with the given files on a fresh temp dir. `direct_io`: open
    /// replies carry `FOPEN_DIRECT_IO` (no page cache); otherwise the page
    /// cache is on (`FOPEN_KEEP_CACHE`, so a cached file stays cached).
    /// `Err(reason)` where FUSE is unavailable.
    pub fn mount(files: &[FileSpec], direct_io: bool) -> Result<FaultFs, String> {
        FaultFs::mount_with(files, direct_io, false)
    }

    /// [`mount`](Self::mount), read-write: see "Writable mounts" above.
    pub fn mount_writable(files: &[FileSpec], direct_io: bool) -> Result<FaultFs, String> {
        FaultFs::mount_with(files, direct_io, true)
    }

    /// [`mount_writable`](Self::mount_writable), or print `skipped:
    /// <reason>` and return `None` where FUSE is unavailable.
    pub fn mount_writable_or_skip(files: &[FileSpec], direct_io: bool) -> Option<FaultFs> {
        Self::or_skip(FaultFs::mount_writable(files, direct_io))
    }

    fn mount_with(files: &[FileSpec], direct_io: bool, writable: bool) -> Result<FaultFs, String> {
        let mut by_name = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            assert!(
                !f.name.is_empty() && !f.name.contains('/') && f.name != "." && f.name != "..",
                "FaultFs: bad file name {:?}",
                f.name
            );
            assert!(
                by_name.insert(f.name.clone(), i).is_none(),
                "FaultFs: duplicate file name {:?}",
                f.name
            );
        }
        if !Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse does not exist (no FUSE in this kernel/container)".into());
        }
        let dir = tempfile::Builder::new()
            .prefix("faultfs-")
            .tempdir()
            .map_err(|e| format!("cannot create a mount point: {e}"))?;
        let mountpoint = dir
            .path()
            .canonicalize()
            .map_err(|e| format!("canonicalize mount point: {e}"))?;

        let (tx, rx) = mpsc::channel();
        let contents = if writable {
            files
                .iter()
                .map(|f| {
                    let mut v = vec![0u8; usize::try_from(f.len).expect("file fits in memory")];
                    fill_pattern(f.seed, 0, &mut v);
                    Mutex::new(v)
                })
                .collect()
        } else {
            Vec::new()
        };
        let shared = Arc::new(Shared {
            files: files.to_vec(),
            contents,
            by_name,
            inner: Mutex::new(Inner::default()),
            reads: AtomicU64::new(0),
            timer: Mutex::new(Some(tx)),
        });
        let timer = std::thread::Builder::new()
            .name("faultfs-timer".into())
            .spawn(move || timer_loop(rx))
            .map_err(|e| format!("spawn timer thread: {e}"))?;

        // SAFETY: plain syscalls without arguments.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let fs = Fs {
            shared: shared.clone(),
            direct_io,
            writable,
            uid,
            gid,
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("faultfs".into()),
            MountOption::Subtype("faultfs".into()),
            MountOption::NoAtime,
        ];
        if !writable {
            config.mount_options.push(MountOption::RO);
        }
        // Handlers never block, so two loops are plenty; the second one only
        // spares a request the wait while the first copies a large reply.
        config.n_threads = Some(2);

        let mut me = FaultFs {
            shared,
            mountpoint: mountpoint.clone(),
            session: None,
            timer: Some(timer),
            conn: None,
            _dir: Some(dir),
        };
        let session = fuser::Session::new(fs, &mountpoint, &config).map_err(|e| {
            format!(
                "FUSE mount on {} failed: {} (mount(2) needs root/CAP_SYS_ADMIN; \
                 otherwise fuser runs fusermount3, from Debian's fuse3)",
                mountpoint.display(),
                e.to_string().trim()
            )
        })?;
        me.session = Some(
            session
                .spawn()
                .map_err(|e| format!("spawn FUSE session: {e}"))?,
        );
        // The connection id is the minor device number of the mount.
        if let Ok(md) = std::fs::metadata(&mountpoint) {
            use std::os::unix::fs::MetadataExt;
            me.conn = Some(u64::from(libc::minor(md.dev())));
        }
        Ok(me)
    }

    /// [`mount`](Self::mount), or print `skipped: <reason>` and return
    /// `None` (the calling test then returns, and passes) where FUSE is
    /// unavailable.
    pub fn mount_or_skip(files: &[FileSpec], direct_io: bool) -> Option<FaultFs> {
        Self::or_skip(FaultFs::mount(files, direct_io))
    }

    /// The mounted file system, or `None` after printing `skipped: <reason>`.
    fn or_skip(mounted: Result<FaultFs, String>) -> Option<FaultFs> {
        mounted
            .inspect_err(|reason| println!("skipped: {reason}"))
            .ok()
    }

    /// The mount point.
    pub fn root(&self) -> &Path {
        &self.mountpoint
    }

    /// Path of the file `name` inside the mount.
    pub fn path(&self, name: &str) -> PathBuf {
        self.shared.file_index(name);
        self.mountpoint.join(name)
    }

    /// Apply `fault` to every later read request of `name` overlapping
    /// `range`. The most recently set fault wins where several overlap. Also
    /// re-arms `Hang` after `release_hangs`.
    pub fn set_fault(&self, name: &str, range: Range<u64>, fault: Fault) {
        let file = self.shared.file_index(name);
        let mut inner = self.shared.lock();
        inner.hangs_released = false;
        inner.faults.insert(0, FaultRule { file, range, fault });
    }

    /// Apply `fault` to every later write request of `name` overlapping
    /// `range` (writable mounts). The most recently set fault wins.
    pub fn set_write_fault(&self, name: &str, range: Range<u64>, fault: Fault) {
        let file = self.shared.file_index(name);
        let mut inner = self.shared.lock();
        inner.hangs_released = false;
        inner
            .write_faults
            .insert(0, FaultRule { file, range, fault });
    }

    /// Apply `fault` to every later `fsync`/`fdatasync` request of `name`
    /// (`Short` means none).
    pub fn set_sync_fault(&self, name: &str, fault: Fault) {
        let file = self.shared.file_index(name);
        let mut inner = self.shared.lock();
        inner.hangs_released = false;
        inner.sync_faults.insert(file, fault);
    }

    /// Apply `fault` to every later open request of `name` (`Short` means
    /// none); a hung open counts among `writes_hung_now`.
    pub fn set_open_fault(&self, name: &str, fault: Fault) {
        let file = self.shared.file_index(name);
        let mut inner = self.shared.lock();
        inner.hangs_released = false;
        inner.open_faults.insert(file, fault);
    }

    /// Remove every fault, read, write, sync and open (hung requests stay
    /// hung until `release_hangs`).
    pub fn clear_faults(&self) {
        let mut inner = self.shared.lock();
        inner.faults.clear();
        inner.write_faults.clear();
        inner.sync_faults.clear();
        inner.open_faults.clear();
        inner.hangs_released = false;
    }

    /// The current content of `name` as the server holds it (writable
    /// mounts; the pattern otherwise).
    pub fn content(&self, name: &str) -> Vec<u8> {
        let file = self.shared.file_index(name);
        if self.shared.writable() {
            return self.shared.content(file).clone();
        }
        let spec = &self.shared.files[file];
        let mut v = vec![0u8; spec.len as usize];
        fill_pattern(spec.seed, 0, &mut v);
        v
    }

    /// Every write request received so far, in arrival order.
    pub fn write_log(&self) -> Vec<WriteRecord> {
        self.shared.lock().write_log.clone()
    }

    /// Write and sync requests of `name` hung right now.
    pub fn writes_hung_now(&self, name: &str) -> usize {
        let file = self.shared.file_index(name);
        let inner = self.shared.lock();
        inner
            .parked_writes
            .iter()
            .filter(|p| p.file() == file)
            .count()
    }

    /// [`wait_writes_hung`](Self::wait_writes_hung) from async code: it
    /// polls on the blocking pool.
    pub async fn writes_hung(
        self: &std::sync::Arc<Self>,
        name: &str,
        n: usize,
        within: Duration,
    ) -> usize {
        let (fs, name) = (self.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || fs.wait_writes_hung(&name, n, within))
            .await
            .unwrap()
    }

    /// Poll until at least `n` write or sync requests of `name` are hung
    /// or `within` passes; returns the last count.
    pub fn wait_writes_hung(&self, name: &str, n: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let k = self.writes_hung_now(name);
            if k >= n || Instant::now() >= deadline {
                return k;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Answer every hung read, write and sync now with EIO; until the next
    /// `set_*fault` (or `clear_faults`), requests that would hang are
    /// answered with EIO at once instead. (Not with data: in cached mode the kernel retries a failed
    /// readahead once with a single-page read, which would then succeed and
    /// hide the error from the reader.)
    pub fn release_hangs(&self) {
        let (parked, writes) = {
            let mut inner = self.shared.lock();
            inner.hangs_released = true;
            (
                std::mem::take(&mut inner.parked),
                std::mem::take(&mut inner.parked_writes),
            )
        };
        for p in parked {
            p.reply.error(Errno::EIO);
        }
        for w in writes {
            w.fail();
        }
    }

    /// Read requests received so far (answered, delayed or hung).
    pub fn reads_served(&self) -> u64 {
        self.shared.reads.load(Ordering::SeqCst)
    }

    /// Read requests hung right now.
    pub fn reads_hung_now(&self) -> usize {
        self.shared.lock().parked.len()
    }

    /// Poll until at least `n` reads are hung or `within` passes; returns
    /// the last count.
    pub fn wait_hung(&self, n: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let k = self.reads_hung_now();
            if k >= n || Instant::now() >= deadline {
                return k;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Every read request received so far, in arrival order.
    pub fn read_log(&self) -> Vec<ReadRecord> {
        self.shared.lock().log.clone()
    }

    /// Forget the read log.
    pub fn clear_read_log(&self) {
        self.shared.lock().log.clear();
    }

    fn teardown(&mut self) {
        // 1. No new hangs or delays; answer the hung and delayed ones.
        self.shared.lock().shutting_down = true;
        self.release_hangs();
        if let Some(tx) = self
            .shared
            .timer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = tx.send(TimerMsg::Shutdown);
        }
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
        // 2. Unmount, lazily if something still has a file open.
        let Some(session) = self.session.take() else {
            return;
        };
        let c = std::ffi::CString::new(self.mountpoint.as_os_str().as_bytes()).unwrap();
        let mut lazy = false;
        // SAFETY: valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY)
        {
            // SAFETY: as above.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            lazy = true;
        }
        // 3. The session threads end when the kernel drops the connection:
        // at once after a plain unmount, but after a lazy one only when the
        // last open file is closed. Abort the connection through fusectl
        // where it is mounted; otherwise do not wait for what may never come.
        let abort = self
            .conn
            .map(|c| PathBuf::from(format!("/sys/fs/fuse/connections/{c}/abort")))
            .filter(|p| p.exists());
        if lazy {
            if let Some(abort) = &abort {
                let _ = std::fs::write(abort, "1");
            }
        }
        let wait = if lazy && abort.is_none() {
            Duration::from_millis(100)
        } else {
            JOIN_TIMEOUT
        };
        let deadline = Instant::now() + wait;
        while !session.guard.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if session.guard.is_finished() {
            let _ = session.join();
        } else {
            eprintln!(
                "FaultFs: {} was busy (a file on it still open?): unmounted lazily; its \
                 session threads end when the last file on it is closed",
                self.mountpoint.display()
            );
            // Its Mount must not try to unmount the (reused) path later.
            std::mem::forget(session);
        }
    }
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        self.teardown();
    }
}
