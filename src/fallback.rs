//! The portable backend: `pread` on tokio's blocking pool. Used when io_uring
//! cannot be set up (ENOSYS, EPERM from seccomp or `kernel.io_uring_disabled`,
//! ENOMEM from RLIMIT_MEMLOCK) or when the builder asks for it.
//!
//! Soundness is by ownership: each blocking task owns its buffer (a fresh
//! `Vec` for borrowed reads, the caller's buffer for owned reads), so a
//! dropped future merely detaches a task that finishes on its own.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::buf::IoBufMut;
use crate::files::FileEntry;
use crate::ring::shut_down_error;

#[derive(Debug, Default)]
pub(crate) struct Fallback {
    closed: AtomicBool,
    submitted: AtomicU64,
    completed: Arc<AtomicU64>,
    idle: Arc<Notify>,
}

/// Counts a blocking read as completed however its task ends.
struct Done {
    completed: Arc<AtomicU64>,
    idle: Arc<Notify>,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.completed.fetch_add(1, Ordering::AcqRel);
        self.idle.notify_waiters();
    }
}

impl Fallback {
    fn start(&self) -> io::Result<Done> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down_error());
        }
        self.submitted.fetch_add(1, Ordering::AcqRel);
        Ok(Done {
            completed: self.completed.clone(),
            idle: self.idle.clone(),
        })
    }

    /// A read into a buffer owned by the blocking task.
    pub(crate) fn read(
        &self,
        file: Arc<FileEntry>,
        offset: u64,
        len: usize,
    ) -> io::Result<JoinHandle<io::Result<Vec<u8>>>> {
        let done = self.start()?;
        Ok(tokio::task::spawn_blocking(move || {
            let _done = done;
            let mut buf = vec![0u8; len];
            let n = file.file.read_at(&mut buf, offset)?;
            buf.truncate(n);
            Ok(buf)
        }))
    }

    /// A read into the caller's owned buffer, lent to the blocking task
    /// through `lent` and put back there when the read is over.
    pub(crate) fn read_owned<B: IoBufMut>(
        &self,
        file: Arc<FileEntry>,
        offset: u64,
        lent: Arc<Mutex<Option<B>>>,
    ) -> io::Result<JoinHandle<io::Result<usize>>> {
        let done = self.start()?;
        Ok(tokio::task::spawn_blocking(move || {
            let _done = done;
            let mut guard = lent.lock().unwrap_or_else(|e| e.into_inner());
            let buf = guard
                .as_mut()
                .expect("owned buffer lent to the blocking read");
            let len = buf.bytes_total();
            // SAFETY: IoBufMut promises `len` writable bytes at this pointer
            // while `buf` lives; the lock keeps it in place for the call.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf.stable_mut_ptr(), len) };
            file.file.read_at(dst, offset)
        }))
    }

    pub(crate) fn counters(&self) -> (u64, u64) {
        (
            self.submitted.load(Ordering::Acquire),
            self.completed.load(Ordering::Acquire),
        )
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Waits until every started read has finished.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let (s, c) = self.counters();
            if s == c {
                return;
            }
            notified.await;
        }
    }
}
