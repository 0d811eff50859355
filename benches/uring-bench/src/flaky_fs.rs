//! A FUSE file system of one read-only file on storage that fails now and
//! then: `uring-bench soak`'s flaky file. The file's bytes are
//! `content(offset)`; a read that touches a *flaky* 512-byte sector fails
//! with `EIO` one time in two (drawn per request), and any other read
//! returns exactly the bytes asked for, up to the end of the file. Opened
//! with `FOPEN_DIRECT_IO`: no page cache, so every read reaches the server
//! and a read of a range is one request for that range.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
};

const ROOT: u64 = 1;
const INO: u64 = 2;
const NAME: &str = "flaky";
const TTL: Duration = Duration::from_secs(3600);
const SECTOR: u64 = 512;

/// Whether the 512-byte sector `s` is flaky: one in 23.
fn flaky_sector(s: u64) -> bool {
    s % 23 == 5
}

/// Whether a read of `offset..end` touches a flaky sector.
pub fn touches_flaky(offset: u64, end: u64) -> bool {
    end > offset && (offset / SECTOR..end.div_ceil(SECTOR)).any(flaky_sector)
}

struct FlakyFs {
    size: u64,
    content: fn(u64) -> u8,
    /// The draws of the failures (splitmix64 state).
    draws: AtomicU64,
    uid: u32,
    gid: u32,
}

impl FlakyFs {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = match ino {
            ROOT => (FileType::Directory, 0, 0o555, 2),
            INO => (FileType::RegularFile, self.size, 0o444, 1),
            _ => return None,
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

    /// One time in two.
    fn coin(&self) -> bool {
        let mut z = self
            .draws
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) & 1 == 1
    }
}

impl Filesystem for FlakyFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_background(256);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if u64::from(parent) == ROOT && name.as_bytes() == NAME.as_bytes() {
            let attr = self.attr(INO).expect("the file");
            reply.entry(&TTL, &attr, fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(u64::from(ino)) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if u64::from(ino) != INO {
            return reply.error(Errno::ENOENT);
        }
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
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
        if u64::from(ino) != INO {
            return reply.error(Errno::ENOENT);
        }
        let end = (offset + u64::from(size)).min(self.size).max(offset);
        if touches_flaky(offset, end) && self.coin() {
            return reply.error(Errno::EIO);
        }
        let bytes: Vec<u8> = (offset..end).map(self.content).collect();
        reply.data(&bytes);
    }
}

/// The mounted file system; unmounted on drop.
pub struct Mounted {
    dir: tempfile::TempDir,
    pub path: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl Mounted {
    /// Mounts the file system with its file of `size` bytes of `content`;
    /// an error says why not (no `/dev/fuse`, not root).
    pub fn mount(size: u64, content: fn(u64) -> u8) -> Result<Mounted, String> {
        if !std::path::Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse does not exist (no FUSE in this kernel or container)".into());
        }
        let dir = tempfile::Builder::new()
            .prefix("flakyfs-")
            .tempdir()
            .map_err(|e| format!("cannot create a mount point: {e}"))?;
        // SAFETY: plain syscalls without arguments.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let fs = FlakyFs {
            size,
            content,
            draws: AtomicU64::new(0),
            uid,
            gid,
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("flakyfs".into()),
            MountOption::Subtype("flakyfs".into()),
            MountOption::NoAtime,
            MountOption::RO,
        ];
        config.n_threads = Some(2);
        let session = fuser::Session::new(fs, dir.path(), &config)
            .map_err(|e| {
                format!(
                    "FUSE mount failed: {} (mount(2) needs root or CAP_SYS_ADMIN)",
                    e.to_string().trim()
                )
            })?
            .spawn()
            .map_err(|e| format!("spawn the FUSE session: {e}"))?;
        Ok(Mounted {
            path: dir.path().join(NAME),
            dir,
            session: Some(session),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                // Busy: the kernel lets go of a ring's registered files
                // only when it has torn the ring down, a little after the
                // ring's fd is closed. Detach it: it goes when they do.
                let Ok(dir) = std::ffi::CString::new(self.dir.path().as_os_str().as_bytes()) else {
                    return;
                };
                // SAFETY: a NUL-terminated path that outlives the call.
                if unsafe { libc::umount2(dir.as_ptr(), libc::MNT_DETACH) } != 0 {
                    eprintln!(
                        "flakyfs: cannot unmount {}: {}",
                        self.dir.path().display(),
                        std::io::Error::last_os_error()
                    );
                }
            }
        }
    }
}
