//! The file table: `FileId` → open file, shared by every ring.
//!
//! Each file is also registered with every ring's fixed-file table at the
//! same index as its `FileId`. An index is reused only after every op that
//! captured the old file has completed: each op holds an `Arc<FileEntry>`,
//! and the entry returns its index to the free list when the last reference
//! drops. So an SQE that names index `i` can only ever refer to the file
//! registered under `i` when the op was issued (or fail with `EBADF` if that
//! file was unregistered meanwhile), never to a newcomer.
//!
//! Ids handed out by a context are *checked* (`FileId::tagged`): they carry
//! the table's process-unique number and the generation of the registration
//! at their index, and a lookup compares both with the entry it finds. A
//! reused index gets the next generation (carried in the free list), so an
//! id of an unregistered file never matches the newcomer; an index whose
//! generation would wrap is retired instead of reused.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use crate::error;
use crate::id::FileId;
use crate::sys::{self, FileKind, Identity};
use crate::thread::thread_slot;

/// How the ops on a file are issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRoute {
    /// Through the io_uring rings (with the inline path).
    Ring,
    /// Through the rings, each op handed straight to one of the kernel's
    /// io-wq workers (`IOSQE_ASYNC`), so that no `io_uring_enter` waits for
    /// this file's storage: a FUSE or network file put on the rings with
    /// `Builder::fuse_via_blocking_pool(false)` or
    /// `Builder::network_fs_via_blocking_pool(false)` (the reason says which).
    /// Its writes and `fallocate`s go to the blocking pool: io-wq runs
    /// those of files whose inodes hash alike one at a time, and one that
    /// never returned would hold up other files' writes.
    RingAsync(&'static str),
    /// On tokio's blocking pool (`pread`, `pwrite`, ...), because io_uring is
    /// not trustworthy on this file's file system (the reason says why); also
    /// every file of a context on the fallback backend.
    BlockingPool(&'static str),
}

/// `FUSE_SUPER_MAGIC`.
const FUSE_MAGIC: i64 = 0x6573_5546;

/// Network file systems (`statfs(2)` magic numbers): NFS, SMB (old and
/// new), CIFS, 9p, Ceph, AFS (both), Coda, `OrangeFS`.
const NETWORK_MAGICS: [i64; 10] = [
    0x6969,
    0x517B,
    0xFF53_4D42,
    0xFE53_4D42,
    0x0102_1997,
    0x00C3_6400,
    0x6B41_4653,
    0x5346_414F,
    0x7375_7245,
    0x2003_0528,
];

/// How files are routed and shared out (`Builder` settings, resolved).
#[derive(Debug, Clone)]
pub(crate) struct RoutePolicy {
    /// `Builder::fuse_via_blocking_pool`.
    pub(crate) fuse_via_blocking_pool: bool,
    /// `Builder::network_fs_via_blocking_pool`.
    pub(crate) network_via_blocking_pool: bool,
}

/// What kind of file system a file is on, as far as routing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FsClass {
    Fuse,
    Network,
    Local,
}

fn classify(magic: &io::Result<i64>) -> FsClass {
    match *magic {
        Ok(FUSE_MAGIC) => FsClass::Fuse,
        Ok(m) if NETWORK_MAGICS.contains(&m) => FsClass::Network,
        // fstatfs works on every file the crate accepts; else: the rings.
        _ => FsClass::Local,
    }
}

/// Where the ops on a file on `class` go: FUSE and network files to the
/// blocking pool (io_uring returns wrong bytes on FUSE short replies, and a
/// stalled server blocks `io_uring_enter`), or, put on the rings, through
/// io-wq (`IOSQE_ASYNC`). See DESIGN, "Storage model".
fn route_for(class: FsClass, policy: &RoutePolicy) -> FileRoute {
    match class {
        FsClass::Fuse if policy.fuse_via_blocking_pool => FileRoute::BlockingPool(
            "FUSE: io_uring returns wrong bytes on short reads and blocks io_uring_enter on a request the server does not answer",
        ),
        FsClass::Network if policy.network_via_blocking_pool => FileRoute::BlockingPool(
            "network file system: a server that stalls would block io_uring's workers (not measured here; see Builder::network_fs_via_blocking_pool)",
        ),
        FsClass::Fuse => FileRoute::RingAsync("FUSE, on the rings as asked (fuse_via_blocking_pool(false))"),
        FsClass::Network => FileRoute::RingAsync(
            "network file system, on the rings as asked (network_fs_via_blocking_pool(false))",
        ),
        FsClass::Local => FileRoute::Ring,
    }
}

/// One registered file.
pub(crate) struct FileEntry {
    pub(crate) file: File,
    pub(crate) index: u32,
    /// Generation of this registration at `index`.
    gen: u32,
    /// The table's process-unique number.
    table: u64,
    /// Opened with `O_DIRECT`: no inline path.
    pub(crate) direct: bool,
    /// `O_DIRECT` alignments `(memory, offset)` the kernel reported at
    /// registration, to word an `EINVAL`.
    pub(crate) dio_align: Option<(u32, u32)>,
    /// Opened with `O_APPEND`: every write would land at the end of the
    /// file whatever its offset, so writes are refused.
    pub(crate) append: bool,
    /// The access mode (`O_RDONLY`, `O_WRONLY` or `O_RDWR`), to word an
    /// `EBADF`.
    pub(crate) access: i32,
    /// A regular file or a block device (nothing else is accepted).
    pub(crate) kind: FileKind,
    /// Ring or blocking pool (see `route_for`).
    pub(crate) route: FileRoute,
    /// `preadv2(RWF_NOWAIT)` works on this file (cleared on EOPNOTSUPP).
    pub(crate) nowait_ok: AtomicBool,
    /// Ring ops go straight to io-wq (`IOSQE_ASYNC`): a FUSE or network
    /// file the user put on the rings (see `route_for`).
    pub(crate) force_async: bool,
    /// The registrations of the same file in this table, this one among
    /// them until it is unregistered.
    aliases: Arc<Aliases>,
    free: Weak<Mutex<Vec<Freed>>>,
}

/// The registrations of one file ([`Identity`]) in a table: a change
/// through one of them is a change of all (`FileEntry::for_each_alias`).
/// Shared by every entry of the file, unregistered ones included: a write
/// still in flight on an unregistered entry is told to a registration of
/// the same file made since.
#[derive(Debug)]
struct Aliases {
    identity: Identity,
    /// The checked ids registered now: one added before its entry is
    /// published, removed once it is unpublished.
    ids: Mutex<Vec<FileId>>,
    map: Weak<AliasMap>,
}

/// Per file of a table, its [`Aliases`] while an entry holds them.
type AliasMap = Mutex<HashMap<Identity, Weak<Aliases>>>;

impl Drop for Aliases {
    /// The file's last entry is gone: its map entry goes too, unless a new
    /// registration of the file replaced it meanwhile.
    fn drop(&mut self) {
        if let Some(map) = self.map.upgrade() {
            let mut map = crate::util::lock(&map);
            if map
                .get(&self.identity)
                .is_some_and(|w| w.strong_count() == 0)
            {
                map.remove(&self.identity);
            }
        }
    }
}

/// Whether `fid` may name the registration of generation `gen` in table
/// `table`: a plain index always may; a checked id only if it was issued
/// for that very registration.
#[inline]
fn answers(fid: FileId, table: u64, gen: u32) -> bool {
    fid.ctx() == 0 || (fid.ctx() == table && fid.gen() == gen)
}

/// An index back on the free list, with the generation of the registration
/// that last used it.
#[derive(Debug, Clone, Copy)]
struct Freed {
    index: u32,
    gen: u32,
}

impl FileEntry {
    /// The checked id of this registration.
    pub(crate) fn id(&self) -> FileId {
        FileId::tagged(self.index, self.gen, self.table)
    }

    /// Whether `fid` may name this entry: a plain index always may; a
    /// checked id only if it was issued for this very registration.
    #[inline]
    fn answers_to(&self, fid: FileId) -> bool {
        answers(fid, self.table, self.gen)
    }

    /// Whether the descriptor was opened for reading.
    pub(crate) fn readable(&self) -> bool {
        self.access != libc::O_WRONLY
    }

    /// Whether the descriptor was opened for writing.
    pub(crate) fn writable(&self) -> bool {
        self.access != libc::O_RDONLY
    }

    pub(crate) fn nowait_ok(&self) -> bool {
        !self.direct && self.nowait_ok.load(Ordering::Relaxed)
    }

    /// Whether ops on this file may use the rings (reads: the inline path too).
    pub(crate) fn on_ring(&self) -> bool {
        matches!(self.route, FileRoute::Ring | FileRoute::RingAsync(_))
    }

    /// Whether its storage may never answer and it is on the rings anyway
    /// (`FileRoute::RingAsync`): ops io-wq serializes by inode stay off
    /// the rings (`Op::iowq_serialized`).
    pub(crate) fn may_hang(&self) -> bool {
        matches!(self.route, FileRoute::RingAsync(_))
    }

    /// Calls `f` with the checked id of this registration and of every
    /// other registration of the same file in the table now: the ones a
    /// change through this one changes too.
    #[cfg(feature = "cache")]
    pub(crate) fn for_each_alias(&self, mut f: impl FnMut(FileId)) {
        let own = self.id();
        f(own);
        let others: Vec<FileId> = {
            let ids = crate::util::lock(&self.aliases.ids);
            if ids.iter().all(|&id| id == own) {
                return;
            }
            ids.iter().copied().filter(|&id| id != own).collect()
        };
        others.into_iter().for_each(f);
    }

    /// This registration's key in the in-flight scheduler (`permit`):
    /// unique within the context.
    pub(crate) fn key(&self) -> crate::permit::FileKey {
        (u64::from(self.index) << 32) | u64::from(self.gen)
    }
}

impl Drop for FileEntry {
    fn drop(&mut self) {
        // Every op that named this index is done: the index may be reused,
        // under the next generation (retired if there is none).
        if self.gen == u32::MAX {
            return;
        }
        if let Some(free) = self.free.upgrade() {
            crate::util::lock(&free).push(Freed {
                index: self.index,
                gen: self.gen,
            });
        }
    }
}

#[allow(clippy::missing_fields_in_debug, reason = "the fd identifies the file")]
impl fmt::Debug for FileEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileEntry")
            .field("index", &self.index)
            .field("gen", &self.gen)
            .field("fd", &self.file.as_raw_fd())
            .field("direct", &self.direct)
            .finish()
    }
}

/// What registering a file with the rings means; implemented by the io_uring
/// backend (fixed files), a no-op for the fallback backend.
pub(crate) trait FixedFiles {
    /// Puts `fd` (or -1 to clear) at `index` in every ring's table.
    fn update(&self, index: u32, fd: i32) -> io::Result<()>;
}

/// The fallback backend's fixed-file tables: there are none.
pub(crate) struct NoRings;

impl FixedFiles for NoRings {
    fn update(&self, _: u32, _: i32) -> io::Result<()> {
        Ok(())
    }
}

type FileSlots = Vec<Option<Arc<FileEntry>>>;

/// One replica of the table, on its own cache lines: the threads that use
/// different shards never write to a shared line when they look a file up.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(RwLock<FileSlots>);

impl Shard {
    fn read(&self) -> RwLockReadGuard<'_, FileSlots> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn write(&self) -> RwLockWriteGuard<'_, FileSlots> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The table, replicated once per runtime worker (and at least once per
/// ring): a lookup read-locks only its thread's shard, and the inline path
/// borrows the entry without touching its count, so workers on one file
/// share no cache line (DESIGN, "Measured costs"). Register and unregister
/// lock every shard, in order.
#[derive(Debug)]
pub(crate) struct FileTable {
    shards: Box<[Shard]>,
    free: Arc<Mutex<Vec<Freed>>>,
    /// Process-unique number of this table (of its context), never 0: the
    /// tag of the ids it hands out.
    id: u64,
    capacity: u32,
    policy: RoutePolicy,
    /// Per index, the registration there now, read without a lock
    /// ([`current`](Self::current)): 0 for none, else `LIVE`, `DIRECT` if
    /// opened with `O_DIRECT`, and the generation in the low 32 bits.
    /// Written under every shard's write lock, with the shards.
    marks: Box<[AtomicU64]>,
    /// The registrations of each file an entry holds.
    aliases: Arc<AliasMap>,
}

/// A `marks` word's bits besides the generation.
const LIVE: u64 = 1 << 63;
const DIRECT: u64 = 1 << 62;

/// The `marks` word of `entry`.
fn mark(entry: &FileEntry) -> u64 {
    LIVE | if entry.direct { DIRECT } else { 0 } | u64::from(entry.gen)
}

/// What registering a file needs to know of it, read from the kernel once.
/// Gathering them (`fstat`, `fstatfs`, `statx`) may wait for the file
/// system: `open` gathers them on the blocking pool, with the open.
#[derive(Debug)]
pub(crate) struct Facts {
    kind: FileKind,
    /// The file system's magic number (`statfs.f_type`), or why unknown.
    magic: io::Result<i64>,
    /// The status flags (`F_GETFL`).
    flags: i32,
    /// `O_DIRECT` alignments, for a file opened with it.
    dio_align: Option<(u32, u32)>,
    /// Which file it is (registrations of the same one are aliases).
    identity: Identity,
}

impl Facts {
    /// The facts of `file`, or why it cannot be registered (`name` names it).
    ///
    /// Positioned I/O needs a seekable file: a regular file or a block
    /// device (a pipe or socket would have the ring ignore the offset).
    pub(crate) fn of(file: &File, name: &dyn fmt::Display) -> io::Result<Facts> {
        let (kind, identity) = sys::file_kind(file)?;
        let kind = match kind {
            FileKind::Other(what) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{name} is {what}: only regular files and block devices support \
                         positioned reads"
                    ),
                ))
            }
            kind => kind,
        };
        let flags = sys::status_flags(file)?;
        Ok(Facts {
            kind,
            magic: sys::fs_magic(file),
            flags,
            dio_align: if flags & libc::O_DIRECT != 0 {
                sys::dio_align(file)
            } else {
                None
            },
            identity,
        })
    }
}

/// The entry `fid` names in `slots` (of table `table`), or why none.
#[inline]
fn find(slots: &FileSlots, table: u64, fid: FileId) -> io::Result<&Arc<FileEntry>> {
    match slots.get(fid.index() as usize).and_then(Option::as_ref) {
        Some(e) if e.answers_to(fid) => Ok(e),
        found => Err(error::bad_fid(fid, table, found.map(|e| e.gen))),
    }
}

/// A read lock on one shard; `lookup` borrows entries from it.
pub(crate) struct FilesGuard<'a> {
    slots: RwLockReadGuard<'a, FileSlots>,
    table: u64,
}

impl FilesGuard<'_> {
    pub(crate) fn lookup(&self, fid: FileId) -> io::Result<&Arc<FileEntry>> {
        find(&self.slots, self.table, fid)
    }
}

/// Numbers tables (contexts) in the process: the tag of their checked ids.
static NEXT_TABLE: AtomicU64 = AtomicU64::new(1);

impl FileTable {
    pub(crate) fn new(
        files: Vec<File>,
        capacity: u32,
        shards: usize,
        policy: RoutePolicy,
    ) -> io::Result<FileTable> {
        if files.len() > capacity as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} files exceed the file table's capacity of {capacity} (see Builder::max_files)",
                    files.len()
                ),
            ));
        }
        let free = Arc::new(Mutex::new(Vec::new()));
        let aliases = Arc::default();
        let id = NEXT_TABLE.fetch_add(1, Ordering::Relaxed);
        let slots = files
            .into_iter()
            .zip(0u32..)
            .map(|(file, i)| {
                let facts = Facts::of(&file, &FileId::from(i))?;
                Ok(Some(Self::entry(
                    file,
                    facts,
                    (i, 0, id),
                    (&free, &aliases),
                    &policy,
                )))
            })
            .collect::<io::Result<FileSlots>>()?;
        let marks = (0..capacity as usize)
            .map(|i| {
                let e = slots.get(i).and_then(Option::as_ref);
                AtomicU64::new(e.map_or(0, |e| mark(e)))
            })
            .collect();
        Ok(FileTable {
            shards: (0..shards.max(1))
                .map(|_| Shard(RwLock::new(slots.clone())))
                .collect(),
            free,
            id,
            capacity,
            policy,
            marks,
            aliases,
        })
    }

    /// A new entry; `(index, gen, table)` say where and which registration.
    fn entry(
        file: File,
        facts: Facts,
        (index, gen, table): (u32, u32, u64),
        (free, aliases): (&Arc<Mutex<Vec<Freed>>>, &Arc<AliasMap>),
        policy: &RoutePolicy,
    ) -> Arc<FileEntry> {
        let Facts {
            kind,
            magic,
            flags,
            dio_align,
            identity,
        } = facts;
        let aliases = {
            let mut map = crate::util::lock(aliases);
            let same = if let Some(same) = map.get(&identity).and_then(Weak::upgrade) {
                same
            } else {
                let same = Arc::new(Aliases {
                    identity,
                    ids: Mutex::default(),
                    map: Arc::downgrade(aliases),
                });
                map.insert(identity, Arc::downgrade(&same));
                same
            };
            crate::util::lock(&same.ids).push(FileId::tagged(index, gen, table));
            same
        };
        let direct = flags & libc::O_DIRECT != 0;
        let route = route_for(classify(&magic), policy);
        #[cfg(feature = "tracing")]
        if let FileRoute::BlockingPool(why) = route {
            crate::util::decision!(
                info,
                fid = index,
                reason = why,
                "file routed to pread on the blocking pool"
            );
        }
        Arc::new(FileEntry {
            kind,
            route,
            direct,
            dio_align,
            append: flags & libc::O_APPEND != 0,
            access: flags & libc::O_ACCMODE,
            file,
            index,
            gen,
            table,
            nowait_ok: AtomicBool::new(true),
            force_async: matches!(route, FileRoute::RingAsync(_)),
            aliases,
            free: Arc::downgrade(free),
        })
    }

    /// Raw fds of the initial files, in index order (for registration).
    pub(crate) fn raw_fds(&self) -> Vec<i32> {
        self.shards[0]
            .read()
            .iter()
            .map(|s| s.as_ref().map_or(-1, |e| e.file.as_raw_fd()))
            .collect()
    }

    /// Read-locks the shard of thread slot `slot`.
    pub(crate) fn shard(&self, slot: usize) -> FilesGuard<'_> {
        FilesGuard {
            slots: self.shards[slot % self.shards.len()].read(),
            table: self.id,
        }
    }

    /// The checked ids of every registered file, in index order.
    pub(crate) fn ids(&self) -> Vec<FileId> {
        let guard = self.shard(thread_slot());
        guard.slots.iter().flatten().map(|e| e.id()).collect()
    }

    /// The checked id of the registration `fid` names now, and whether it
    /// was opened with `O_DIRECT`: one load, no lock. `None` if `fid` names
    /// none (`lookup` says why).
    #[cfg(any(feature = "cache", test))]
    #[inline]
    pub(crate) fn current(&self, fid: FileId) -> Option<(FileId, bool)> {
        let m = self
            .marks
            .get(fid.index() as usize)?
            .load(Ordering::Acquire);
        let gen = u32::try_from(m & u64::from(u32::MAX)).unwrap_or(0);
        (m & LIVE != 0 && answers(fid, self.id, gen))
            .then(|| (FileId::tagged(fid.index(), gen, self.id), m & DIRECT != 0))
    }

    pub(crate) fn get(&self, fid: FileId) -> io::Result<Arc<FileEntry>> {
        self.shard(thread_slot()).lookup(fid).cloned()
    }

    fn write_all(&self) -> Vec<RwLockWriteGuard<'_, FileSlots>> {
        self.shards.iter().map(Shard::write).collect()
    }

    /// Registers `file` (its `facts` checked before an index is taken) under
    /// a free index, publishing it only once the rings know it.
    pub(crate) fn insert(
        &self,
        file: File,
        facts: Facts,
        fixed: &dyn FixedFiles,
    ) -> io::Result<FileId> {
        let mut shards = self.write_all();
        let len = shards[0].len();
        let recycled = crate::util::lock(&self.free).pop();
        let (index, gen) = match recycled {
            Some(Freed { index, gen }) => (index, gen + 1),
            None if len < self.capacity as usize => (u32::try_from(len).unwrap_or(u32::MAX), 0),
            None => {
                return Err(io::Error::other(format!(
                    "file table is full ({} files); raise Builder::max_files or unregister files",
                    self.capacity
                )))
            }
        };
        if let Err(e) = fixed.update(index, file.as_raw_fd()) {
            if let Some(freed) = recycled {
                crate::util::lock(&self.free).push(freed);
            }
            return Err(e);
        }
        let entry = Self::entry(
            file,
            facts,
            (index, gen, self.id),
            (&self.free, &self.aliases),
            &self.policy,
        );
        for slots in &mut shards {
            if index as usize == slots.len() {
                slots.push(Some(entry.clone()));
            } else {
                slots[index as usize] = Some(entry.clone());
            }
        }
        self.marks[index as usize].store(mark(&entry), Ordering::Release);
        Ok(entry.id())
    }

    /// Removes `fid`. Ops already holding the entry finish (or fail with
    /// EBADF if not yet submitted); its index is reused only after them.
    pub(crate) fn remove(&self, fid: FileId, fixed: &dyn FixedFiles) -> io::Result<()> {
        let mut shards = self.write_all();
        // A checked id of another context, or of an earlier registration at
        // this index, removes nothing.
        find(&shards[0], self.id, fid)?;
        let mut entry = None;
        for slots in &mut shards {
            entry = slots.get_mut(fid.index() as usize).and_then(Option::take);
        }
        let entry = entry.ok_or_else(|| error::unknown_fid(fid))?;
        self.marks[entry.index as usize].store(0, Ordering::Release);
        let own = entry.id();
        crate::util::lock(&entry.aliases.ids).retain(|&id| id != own);
        // Clear the kernel's slot under the write locks: the index cannot be
        // handed out before the kernel forgot it.
        let res = fixed.update(entry.index, -1);
        drop(shards);
        drop(entry);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> File {
        tempfile::tempfile().unwrap()
    }

    /// Registers a fresh temp file.
    fn add(t: &FileTable) -> io::Result<FileId> {
        let f = tmp();
        let facts = Facts::of(&f, &"tmp")?;
        t.insert(f, facts, &NoRings)
    }

    fn policy() -> RoutePolicy {
        RoutePolicy {
            fuse_via_blocking_pool: true,
            network_via_blocking_pool: true,
        }
    }

    #[test]
    fn file_systems_are_routed_by_class() {
        let p = policy();
        assert_eq!(classify(&Ok(0xEF53)), FsClass::Local, "ext4");
        assert_eq!(classify(&Ok(0x0102_1994)), FsClass::Local, "tmpfs");
        assert_eq!(classify(&Err(io::Error::other("x"))), FsClass::Local);
        assert_eq!(classify(&Ok(FUSE_MAGIC)), FsClass::Fuse);
        assert_eq!(classify(&Ok(0x6969)), FsClass::Network, "NFS");
        assert_eq!(classify(&Ok(0xFF53_4D42)), FsClass::Network, "CIFS");
        assert_eq!(route_for(FsClass::Local, &p), FileRoute::Ring);
        assert!(matches!(
            route_for(FsClass::Fuse, &p),
            FileRoute::BlockingPool(why) if why.contains("FUSE")
        ));
        assert!(matches!(
            route_for(FsClass::Network, &p),
            FileRoute::BlockingPool(why) if why.contains("network")
        ));
        let on_rings = RoutePolicy {
            fuse_via_blocking_pool: false,
            network_via_blocking_pool: false,
        };
        // On the rings, their ops go straight to io-wq.
        assert!(
            matches!(route_for(FsClass::Fuse, &on_rings), FileRoute::RingAsync(why) if why.contains("FUSE"))
        );
        assert!(
            matches!(route_for(FsClass::Network, &on_rings), FileRoute::RingAsync(why) if why.contains("network"))
        );
    }

    /// The registrations of one file, as `for_each_alias` gives them.
    #[cfg(feature = "cache")]
    fn aliases(t: &FileTable, fid: FileId) -> Vec<FileId> {
        let mut ids = Vec::new();
        t.get(fid).unwrap().for_each_alias(|id| ids.push(id));
        ids
    }

    /// Registrations of one file (the same descriptor's file opened again,
    /// or a hard link) are aliases; other files are not; an unregistered
    /// entry still alive hands its aliases to a registration made since;
    /// and the table forgets a file once no entry of it is left.
    #[cfg(feature = "cache")]
    #[test]
    fn registrations_of_one_file_are_aliases() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        std::fs::hard_link(&path, dir.path().join("link")).unwrap();
        let t = FileTable::new(vec![File::open(&path).unwrap(), tmp()], 8, 2, policy()).unwrap();
        let first = t.ids()[0];
        let other = t.ids()[1];
        let open = |p: &std::path::Path| {
            let f = File::open(p).unwrap();
            let facts = Facts::of(&f, &"f").unwrap();
            t.insert(f, facts, &NoRings).unwrap()
        };
        let second = open(&path);
        let linked = open(&dir.path().join("link"));
        assert_eq!(aliases(&t, first), [first, second, linked]);
        assert_eq!(aliases(&t, linked), [linked, first, second]);
        assert_eq!(aliases(&t, other), [other]);
        // An op's hold on the first entry outlives its registration.
        let held = t.get(first).unwrap();
        t.remove(first, &NoRings).unwrap();
        t.remove(second, &NoRings).unwrap();
        t.remove(linked, &NoRings).unwrap();
        let mut told = Vec::new();
        held.for_each_alias(|id| told.push(id));
        assert_eq!(told, [first]);
        let again = open(&path);
        let mut told = Vec::new();
        held.for_each_alias(|id| told.push(id));
        assert_eq!(told, [first, again], "a registration made since");
        t.remove(again, &NoRings).unwrap();
        drop(held);
        t.remove(other, &NoRings).unwrap();
        assert!(crate::util::lock(&t.aliases).is_empty());
    }

    #[test]
    fn index_is_reused_only_after_last_user() {
        let t = FileTable::new(vec![tmp(), tmp()], 8, 2, policy()).unwrap();
        let held = t.get(FileId::from(1)).unwrap();
        t.remove(FileId::from(1), &NoRings).unwrap();
        assert!(t.get(FileId::from(1)).is_err());
        // Index 1 is still held by an "in-flight op": a new file gets index 2.
        assert_eq!(add(&t).unwrap().index(), 2);
        drop(held);
        assert_eq!(add(&t).unwrap().index(), 1);
    }

    #[test]
    fn checked_ids_name_one_registration_of_one_table() {
        let a = FileTable::new(vec![tmp(), tmp()], 8, 2, policy()).unwrap();
        let b = FileTable::new(vec![tmp(), tmp()], 8, 2, policy()).unwrap();
        let ids = a.ids();
        assert_eq!(ids.len(), 2);
        assert!(ids.iter().all(|f| f.is_tagged()));
        assert_eq!(a.get(ids[1]).unwrap().index, 1);
        // Another table refuses it, by name, and removes nothing.
        let e = b.get(ids[1]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("file #1 belongs to another"), "{e}");
        assert!(b.remove(ids[1], &NoRings).is_err());
        assert!(b.get(FileId::from(1)).is_ok(), "b's file #1 is still there");
        // Stale after unregistering, also once the index is reused.
        a.remove(ids[1], &NoRings).unwrap();
        let e = a.get(ids[1]).unwrap_err();
        assert!(e.to_string().contains("stale"), "{e}");
        let again = add(&a).unwrap();
        assert_eq!(again.index(), 1, "the index is reused");
        assert_ne!(again, ids[1]);
        let e = a.get(ids[1]).unwrap_err();
        assert!(e.to_string().contains("now holds a file"), "{e}");
        assert!(a.remove(ids[1], &NoRings).is_err());
        assert!(a.get(again).is_ok(), "the stale id removed nothing");
        // A plain index means whatever is there now.
        assert!(Arc::ptr_eq(
            &a.get(FileId::from(1)).unwrap(),
            &a.get(again).unwrap()
        ));
    }

    /// `current` (one load, no lock) answers as `get` does, through
    /// registering, unregistering and reusing an index.
    #[test]
    fn the_lock_free_word_agrees_with_the_entries() {
        use std::os::unix::fs::OpenOptionsExt;
        let a = FileTable::new(vec![tmp(), tmp()], 8, 2, policy()).unwrap();
        let b = FileTable::new(vec![tmp()], 8, 1, policy()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        // O_DIRECT where the file system takes it.
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.path().join("d"));
        let mut seen = a.ids();
        seen.extend(b.ids());
        seen.extend([
            FileId::from(0),
            FileId::from(1),
            FileId::from(5),
            FileId::from(-1),
        ]);
        let agree = |seen: &[FileId]| {
            for &fid in seen {
                let want = a.get(fid).ok().map(|e| (e.id(), e.direct));
                assert_eq!(a.current(fid), want, "{fid:?}");
            }
        };
        agree(&seen);
        a.remove(seen[1], &NoRings).unwrap();
        agree(&seen);
        seen.push(add(&a).unwrap());
        assert_eq!(seen.last().unwrap().index(), 1, "the index is reused");
        agree(&seen);
        if let Ok(f) = direct {
            let facts = Facts::of(&f, &"direct").unwrap();
            seen.push(a.insert(f, facts, &NoRings).unwrap());
            assert_eq!(a.current(*seen.last().unwrap()).map(|c| c.1), Some(true));
        }
        agree(&seen);
        for fid in seen.clone() {
            let _ = a.remove(fid, &NoRings);
        }
        agree(&seen);
        assert!(seen.iter().all(|&f| a.current(f).is_none()));
    }

    #[test]
    fn an_index_whose_generation_would_wrap_is_retired() {
        let t = FileTable::new(vec![], 4, 1, policy()).unwrap();
        crate::util::lock(&t.free).push(Freed {
            index: 0,
            gen: u32::MAX - 1,
        });
        let last = add(&t).unwrap();
        assert_eq!((last.index(), last.gen()), (0, u32::MAX));
        t.remove(last, &NoRings).unwrap();
        assert!(crate::util::lock(&t.free).is_empty(), "index 0 retired");
        assert_eq!(add(&t).unwrap().index(), 1);
    }

    #[test]
    fn errors_name_the_file() {
        let t = FileTable::new(vec![tmp()], 1, 3, policy()).unwrap();
        let e = t.get(FileId::from(7)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("file #7"), "{e}");
        assert!(t.remove(FileId::from(7), &NoRings).is_err());
        assert!(add(&t).is_err(), "capacity 1 is full");
        assert!(FileTable::new(vec![tmp(), tmp()], 1, 1, policy()).is_err());
    }
}
