//! What the bench's FUSE file systems share (`slow-file`'s slow file,
//! `soak`'s flaky one): a root directory holding one read-only file
//! ([`OneFile`]: its attributes, `lookup`, `getattr`, `open`), and the
//! mount ([`Mount`]: as root with `mount(2)`, unmounted on drop).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, MountOption, OpenFlags,
    ReplyAttr, ReplyEntry, ReplyOpen,
};

/// The root directory's inode and the file's.
pub const ROOT: u64 = 1;
pub const INO: u64 = 2;
const TTL: Duration = Duration::from_secs(3600);

/// The one file: its name and size, owned by the mounting user.
pub struct OneFile {
    name: &'static str,
    size: u64,
    uid: u32,
    gid: u32,
}

impl OneFile {
    pub fn new(name: &'static str, size: u64) -> OneFile {
        // SAFETY: plain syscalls without arguments.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        OneFile {
            name,
            size,
            uid,
            gid,
        }
    }

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

    /// `Filesystem::lookup`.
    pub fn lookup(&self, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if u64::from(parent) == ROOT && name.as_bytes() == self.name.as_bytes() {
            let attr = self.attr(INO).expect("the file");
            reply.entry(&TTL, &attr, fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    /// `Filesystem::getattr`.
    pub fn getattr(&self, ino: INodeNo, reply: ReplyAttr) {
        match self.attr(u64::from(ino)) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// `Filesystem::open`: the file, read-only, with `flags` (direct I/O
    /// or the page cache).
    pub fn open(&self, ino: INodeNo, flags: OpenFlags, fopen: FopenFlags, reply: ReplyOpen) {
        if u64::from(ino) != INO {
            return reply.error(Errno::ENOENT);
        }
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), fopen);
    }
}

/// A mounted file system; unmounted on drop.
pub struct Mount {
    dir: tempfile::TempDir,
    /// The file's path.
    pub path: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl Mount {
    /// Mounts `fs` (named `label`, its file `file`) on a new directory, its
    /// requests served by 2 threads; an error says why not (no
    /// `/dev/fuse`, not root).
    pub fn new<FS: Filesystem + Send + 'static>(
        fs: FS,
        label: &str,
        file: &str,
    ) -> Result<Mount, String> {
        if !std::path::Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse does not exist (no FUSE in this kernel or container)".into());
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("{label}-"))
            .tempdir()
            .map_err(|e| format!("cannot create a mount point: {e}"))?;
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName(label.into()),
            MountOption::Subtype(label.into()),
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
        Ok(Mount {
            path: dir.path().join(file),
            dir,
            session: Some(session),
        })
    }
}

impl Drop for Mount {
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
                        "cannot unmount {}: {}",
                        self.dir.path().display(),
                        std::io::Error::last_os_error()
                    );
                }
            }
        }
    }
}
