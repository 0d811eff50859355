//! The file table: `FileId` → open file, shared by every ring.
//!
//! Each file is also registered with every ring's fixed-file table at the
//! same index as its `FileId`. An index is reused only after every operation
//! that captured the old file has completed: each op holds an
//! `Arc<FileEntry>`, and the entry returns its index to the free list when the
//! last reference drops. So an SQE that names index `i` can only ever refer
//! to the file registered under `i` when the read was issued (or fail with
//! `EBADF` if that file was unregistered meanwhile), never to a newcomer.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::FileId;

/// One registered file.
pub(crate) struct FileEntry {
    pub(crate) file: File,
    pub(crate) index: u32,
    /// Opened with `O_DIRECT`: no page-cache fast path.
    pub(crate) direct: bool,
    /// `preadv2(RWF_NOWAIT)` works on this file (cleared on EOPNOTSUPP).
    pub(crate) nowait_ok: AtomicBool,
    free: Weak<Mutex<Vec<u32>>>,
}

impl FileEntry {
    pub(crate) fn nowait_ok(&self) -> bool {
        !self.direct && self.nowait_ok.load(Ordering::Relaxed)
    }
}

impl Drop for FileEntry {
    fn drop(&mut self) {
        // Every op that named this index is done: the index may be reused.
        if let Some(free) = self.free.upgrade() {
            free.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.index);
        }
    }
}

impl fmt::Debug for FileEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileEntry")
            .field("index", &self.index)
            .field("fd", &self.file.as_raw_fd())
            .field("direct", &self.direct)
            .finish()
    }
}

/// What registering a file with the rings means; implemented by the io_uring
/// backend (fixed files), a no-op for the fallback.
pub(crate) trait FixedFiles {
    /// Puts `fd` (or -1 to clear) at `index` in every ring's table.
    fn update(&self, index: u32, fd: i32) -> io::Result<()>;
}

#[derive(Debug)]
pub(crate) struct FileTable {
    slots: RwLock<Vec<Option<Arc<FileEntry>>>>,
    free: Arc<Mutex<Vec<u32>>>,
    capacity: u32,
}

fn is_direct(file: &File) -> bool {
    // SAFETY: F_GETFL on a valid, owned descriptor has no memory effects.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_DIRECT != 0
}

impl FileTable {
    pub(crate) fn new(files: Vec<File>, capacity: u32) -> io::Result<FileTable> {
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
        let slots = files
            .into_iter()
            .enumerate()
            .map(|(i, file)| Some(Self::entry(file, i as u32, &free)))
            .collect();
        Ok(FileTable {
            slots: RwLock::new(slots),
            free,
            capacity,
        })
    }

    fn entry(file: File, index: u32, free: &Arc<Mutex<Vec<u32>>>) -> Arc<FileEntry> {
        Arc::new(FileEntry {
            direct: is_direct(&file),
            file,
            index,
            nowait_ok: AtomicBool::new(true),
            free: Arc::downgrade(free),
        })
    }

    /// Raw fds of the initial files, in index order (for registration).
    pub(crate) fn raw_fds(&self) -> Vec<i32> {
        self.read()
            .iter()
            .map(|s| s.as_ref().map_or(-1, |e| e.file.as_raw_fd()))
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<Arc<FileEntry>>>> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, fid: FileId) -> io::Result<Arc<FileEntry>> {
        self.read()
            .get(fid.index() as usize)
            .and_then(|s| s.clone())
            .ok_or_else(|| unknown(fid))
    }

    /// Registers `file` under a free index, publishing it only once the rings
    /// know it.
    pub(crate) fn insert(&self, file: File, fixed: &dyn FixedFiles) -> io::Result<FileId> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let recycled = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let index = match recycled {
            Some(i) => i,
            None if slots.len() < self.capacity as usize => slots.len() as u32,
            None => {
                return Err(io::Error::other(format!(
                    "file table is full ({} files); raise Builder::max_files or unregister files",
                    self.capacity
                )))
            }
        };
        if let Err(e) = fixed.update(index, file.as_raw_fd()) {
            if recycled.is_some() {
                self.free
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(index);
            }
            return Err(e);
        }
        let entry = Self::entry(file, index, &self.free);
        if index as usize == slots.len() {
            slots.push(Some(entry));
        } else {
            slots[index as usize] = Some(entry);
        }
        Ok(FileId::from(index))
    }

    /// Removes `fid`. Reads already holding the entry finish (or fail with
    /// EBADF if not yet submitted); its index is reused only after them.
    pub(crate) fn remove(&self, fid: FileId, fixed: &dyn FixedFiles) -> io::Result<()> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let entry = slots
            .get_mut(fid.index() as usize)
            .and_then(Option::take)
            .ok_or_else(|| unknown(fid))?;
        // Clear the kernel's slot while still holding the write lock, so that
        // the index cannot be handed out again before the kernel forgot it.
        let res = fixed.update(entry.index, -1);
        drop(slots);
        drop(entry);
        res
    }
}

pub(crate) fn unknown(fid: FileId) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{fid} is not registered with this UringContext"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoRings;
    impl FixedFiles for NoRings {
        fn update(&self, _: u32, _: i32) -> io::Result<()> {
            Ok(())
        }
    }

    fn tmp() -> File {
        tempfile::tempfile().unwrap()
    }

    #[test]
    fn index_is_reused_only_after_last_user() {
        let t = FileTable::new(vec![tmp(), tmp()], 8).unwrap();
        let held = t.get(FileId::from(1)).unwrap();
        t.remove(FileId::from(1), &NoRings).unwrap();
        assert!(t.get(FileId::from(1)).is_err());
        // Index 1 is still held by an "in-flight op": a new file gets index 2.
        assert_eq!(t.insert(tmp(), &NoRings).unwrap(), FileId::from(2));
        drop(held);
        assert_eq!(t.insert(tmp(), &NoRings).unwrap(), FileId::from(1));
    }

    #[test]
    fn errors_name_the_file() {
        let t = FileTable::new(vec![tmp()], 1).unwrap();
        let e = t.get(FileId::from(7)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("file #7"), "{e}");
        assert!(t.remove(FileId::from(7), &NoRings).is_err());
        assert!(t.insert(tmp(), &NoRings).is_err(), "capacity 1 is full");
        assert!(FileTable::new(vec![tmp(), tmp()], 1).is_err());
    }
}
