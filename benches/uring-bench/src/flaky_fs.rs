//! A FUSE file system of one read-only file on storage that fails now and
//! then: `uring-bench soak`'s flaky file. The file's bytes are
//! `content(offset)`; a read that touches a *flaky* 512-byte sector fails
//! with `EIO` one time in two (drawn per request), and any other read
//! returns exactly the bytes asked for, up to the end of the file. Opened
//! with `FOPEN_DIRECT_IO`: no page cache, so every read reaches the server
//! and a read of a range is one request for that range.

use std::sync::atomic::{AtomicU64, Ordering};

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, INodeNo, KernelConfig, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
};

use crate::fuse_file::{Mount, OneFile, INO};

const NAME: &str = "flaky";
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
    file: OneFile,
    size: u64,
    content: fn(u64) -> u8,
    /// The draws of the failures (splitmix64 state).
    draws: AtomicU64,
}

impl FlakyFs {
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

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &std::ffi::OsStr, reply: ReplyEntry) {
        self.file.lookup(parent, name, reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.file.getattr(ino, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.file
            .open(ino, flags, FopenFlags::FOPEN_DIRECT_IO, reply);
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

/// Mounts the file system with its file of `size` bytes of `content`;
/// an error says why not (no `/dev/fuse`, not root).
pub fn mount(size: u64, content: fn(u64) -> u8) -> Result<Mount, String> {
    let fs = FlakyFs {
        file: OneFile::new(NAME, size),
        size,
        content,
        draws: AtomicU64::new(0),
    };
    Mount::new(fs, "flakyfs", NAME)
}
