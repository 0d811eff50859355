//! [`AppendLog`]: a write-ahead log over one [`UringFile`] (feature
//! `append-log`) — reserved offsets, framed and checksummed records,
//! group commit with durable writes or `fdatasync`, preallocation, and
//! recovery.
//!
//! # On-disk format
//!
//! A log is a sequence of records from offset 0, back to back, each a
//! 12-byte header and the payload, little-endian:
//!
//! ```text
//! [len u32][epoch u32][crc u32][payload: len bytes]
//! crc = CRC-32 (IEEE) of offset u64 ‖ len ‖ epoch ‖ payload
//! ```
//!
//! `offset` is the record's own position in the file (not stored: a record
//! copied or shifted elsewhere does not verify). `epoch` is 1 for the
//! records of a new log and one more than the last recovered record's for
//! each reopening; it never decreases along a valid log. Recovery stops at
//! the first record that does not verify (a header or payload past the end
//! of the file, a checksum that does not match, an epoch of 0 or one lower
//! than the record before): so zeroes (a preallocated or never written
//! tail: epoch 0) end the log, and so do the remains of records written
//! before a crash beyond the first torn one — the records appended after
//! recovery carry a higher epoch, so an old record that one of them happens
//! to end next to is never taken for a continuation of the log.
//!
//! On an `O_DIRECT` file the log writes whole blocks: a write starts at the
//! start of the block its first record is in, rewriting the bytes before
//! that record as they are, and ends at the end of a block, zero-padded
//! after its last record; zeroes end the log, so the format is unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::buf::{AlignedBuf, IoBufMut as _};
use crate::file::UringFile;
use crate::flags::FallocateMode;

/// Zeroes to pad an `O_DIRECT` write to the end of its last block.
static ZEROES: [u8; 4096] = [0; 4096];

/// Bytes of a record's header: `len`, `epoch`, `crc`.
pub const RECORD_HEADER_LEN: usize = 12;

/// The default largest payload [`AppendLog::append`] takes (16 MiB).
const DEFAULT_MAX_RECORD: usize = 16 << 20;

/// Bytes read at once by recovery.
const RECOVERY_CHUNK: usize = 1 << 20;

/// The default cap on the bytes of records gathered into one write.
const DEFAULT_MAX_GROUP: usize = 256 << 10;

/// Payloads up to this length are checksummed whole under the log's lock;
/// a longer one is checksummed before, and only its header (which holds
/// the offset) under the lock, combined with the payload's CRC.
const CRC_UNDER_LOCK: usize = 512;

/// A group buffer is kept for the next group up to this capacity at
/// least (twice the cap when that is more).
const SPARE_MIN: usize = 64 << 10;

fn checksum(offset: u64, len: u32, epoch: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&offset.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(&epoch.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends the frame of `payload` at `offset` to `out`: the header, then
/// the payload. `body`: the payload's CRC state, if already computed.
/// `len` is the payload's length.
fn encode_frame(
    out: &mut Vec<u8>,
    offset: u64,
    (epoch, len): (u32, u32),
    payload: &[u8],
    body: Option<&crc32fast::Hasher>,
) {
    let crc = match body {
        Some(b) => {
            let mut h = crc32fast::Hasher::new();
            h.update(&offset.to_le_bytes());
            h.update(&len.to_le_bytes());
            h.update(&epoch.to_le_bytes());
            h.combine(b);
            h.finalize()
        }
        None => checksum(offset, len, epoch, payload),
    };
    out.reserve(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
}

/// Settings of an [`AppendLog`]: the largest record, the largest group
/// of records written at once, and preallocation. [`open`](Self::open)
/// recovers a log and opens it for appends.
#[derive(Clone, Debug)]
pub struct AppendLogOptions {
    max_record_len: usize,
    max_group_len: usize,
    preallocate: u64,
    durable_writes: bool,
}

impl Default for AppendLogOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl AppendLogOptions {
    /// Records up to 16 MiB, groups up to 256 KiB, no preallocation.
    #[must_use]
    pub fn new() -> Self {
        AppendLogOptions {
            max_record_len: DEFAULT_MAX_RECORD,
            max_group_len: DEFAULT_MAX_GROUP,
            preallocate: 0,
            durable_writes: true,
        }
    }

    /// Commit with durable writes where it can (on by default): a group,
    /// or a record on an idle log, written when every byte before it is
    /// already durable is issued with `RWF_DSYNC` and needs no
    /// `fdatasync` — one round trip per commit instead of a write and a
    /// sync one after the other. Off: every commit is a write and an
    /// `fdatasync`. [`AppendLogStats`] counts both kinds.
    #[must_use]
    pub fn durable_writes(mut self, on: bool) -> Self {
        self.durable_writes = on;
        self
    }

    /// The most bytes of records (frames: header and payload) gathered
    /// into one write, 256 KiB by default. Records appended while the
    /// log's earlier writes or its `fdatasync` are in flight are gathered
    /// into one buffer and written as one group; a record whose frame is
    /// larger than this is written alone, at once. 0: every record is
    /// written alone.
    #[must_use]
    pub fn max_group_len(mut self, bytes: usize) -> Self {
        self.max_group_len = bytes;
        self
    }

    /// The largest payload an append takes (at most `u32::MAX` bytes less
    /// the header); a larger one fails with `InvalidInput`. Recovery reads
    /// records of any length.
    #[must_use]
    pub fn max_record_len(mut self, bytes: usize) -> Self {
        self.max_record_len = bytes.min(u32::MAX as usize - RECORD_HEADER_LEN);
        self
    }

    /// Preallocate the file ahead of the tail in steps of `bytes` (0, the
    /// default: never) with `fallocate(2)` ([`FallocateMode::ALLOCATE`],
    /// which extends the file's size: an `fdatasync` after a write into
    /// space allocated ahead need not record a new size). Recovery sees
    /// the zeroes after the last record and stops there. A file system
    /// that cannot preallocate (or a failed `fallocate`, such as no space
    /// left) stops it for the rest of this opening; the appends go on,
    /// growing the file. [`AppendLog::stats`] says which
    /// ([`Preallocation`]), and the `tracing` feature logs it once.
    #[must_use]
    pub fn preallocate(mut self, bytes: u64) -> Self {
        self.preallocate = bytes;
        self
    }

    /// Recovers the log in `file` and opens it for appends: reads it from
    /// offset 0, verifying every record, up to the first that does not
    /// verify; returns the log, whose next append goes there, and the
    /// records recovered, in offset order. An empty file is an empty log.
    /// For a log too large to hold in memory, read it with
    /// [`recover`](Self::recover).
    ///
    /// # Errors
    ///
    /// A failed read or `statx` of the file; `NotFound`-free otherwise:
    /// a torn or corrupt tail is not an error, it ends the log.
    pub async fn open(&self, file: UringFile) -> io::Result<(AppendLog, Vec<LogRecord>)> {
        let mut rec = self.recover(file);
        let mut records = Vec::new();
        while let Some(r) = rec.next_record().await? {
            records.push(r);
        }
        Ok((rec.into_log()?, records))
    }

    /// A reader of the log in `file`, record by record; once it has
    /// returned `None`, [`LogRecovery::into_log`] opens the log for
    /// appends after the last record it returned.
    #[must_use]
    pub fn recover(&self, file: UringFile) -> LogRecovery {
        LogRecovery {
            file,
            options: self.clone(),
            size: None,
            block: None,
            buf: AlignedBuf::new(0, 64),
            buf_start: 0,
            pos: 0,
            epoch: 0,
            done: false,
        }
    }
}

/// A record read back by recovery: where it starts (the position its
/// append resolved to) and its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// The record's offset in the file: its position.
    pub offset: u64,
    /// The payload appended.
    pub payload: Vec<u8>,
}

/// Reads a log back, record by record (made by
/// [`AppendLogOptions::recover`]), and then opens it for appends.
pub struct LogRecovery {
    file: UringFile,
    options: AppendLogOptions,
    /// The file's size, once asked.
    size: Option<u64>,
    /// `O_DIRECT`: the block size reads are aligned to (asked with the
    /// size).
    block: Option<usize>,
    /// Bytes of the file from `buf_start`.
    buf: AlignedBuf,
    buf_start: u64,
    /// Where the next record starts.
    pos: u64,
    /// The epoch of the last record returned (0: none yet).
    epoch: u32,
    /// The end of the log was found.
    done: bool,
}

impl fmt::Debug for LogRecovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogRecovery")
            .field("file", &self.file)
            .field("pos", &self.pos)
            .field("epoch", &self.epoch)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl LogRecovery {
    /// `n` bytes of the file at `at` (`at + n` within the file), read
    /// unless buffered.
    async fn bytes(&mut self, at: u64, n: usize) -> io::Result<&[u8]> {
        let have = at >= self.buf_start && at + n as u64 <= self.buf_start + self.buf.len() as u64;
        if !have {
            let size = self.size.unwrap_or(0);
            // From `at` (an `O_DIRECT` file: from the start of its block),
            // at least to `at + n`, at most a chunk more, within the file.
            let block = self.block.unwrap_or(1);
            let from = at - at % block as u64;
            let left = usize::try_from(size - from).unwrap_or(usize::MAX);
            let need = usize::try_from(at - from)
                .unwrap_or(usize::MAX)
                .saturating_add(n);
            let want = need.max(RECOVERY_CHUNK).min(left);
            self.buf.clear();
            if want > 0 {
                // An `O_DIRECT` file: whole blocks (the last may end past
                // the end of the file, where the read is short).
                let len = want.next_multiple_of(block);
                let buf = std::mem::replace(&mut self.buf, AlignedBuf::new(0, 64));
                let buf = if buf.capacity() >= len {
                    buf
                } else {
                    AlignedBuf::try_with_capacity(len, block.max(64))?
                };
                let window = buf.slice(..len);
                let (res, window) = if self.block.is_some() {
                    let (res, window) = self.file.read_at_owned(window, from).await;
                    (res.map(drop), window)
                } else {
                    self.file.read_exact_at_owned(window, from).await
                };
                let mut buf = window.into_inner();
                res?;
                buf.truncate(want);
                self.buf = buf;
                if self.buf.len() < need {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "append log: short read",
                    ));
                }
            }
            self.buf_start = from;
        }
        let from = usize::try_from(at - self.buf_start).unwrap_or(usize::MAX);
        self.buf
            .get(from..from.saturating_add(n))
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "append log: short read"))
    }

    /// The next record, or `None` at the end of the log (the end of the
    /// file or the first record that does not verify).
    ///
    /// # Errors
    ///
    /// A failed read or `statx`; the reader can be asked again.
    pub async fn next_record(&mut self) -> io::Result<Option<LogRecord>> {
        if self.done {
            return Ok(None);
        }
        let size = if let Some(s) = self.size {
            s
        } else {
            let s = self.file.len().await?;
            self.block = self.file.direct_block()?;
            self.size = Some(s);
            s
        };
        let at = self.pos;
        if at + RECORD_HEADER_LEN as u64 > size {
            self.done = true;
            return Ok(None);
        }
        let h = self.bytes(at, RECORD_HEADER_LEN).await?;
        let word = |k: usize| u32::from_le_bytes([h[k], h[k + 1], h[k + 2], h[k + 3]]);
        let (len, epoch, crc) = (word(0), word(4), word(8));
        let end = at + RECORD_HEADER_LEN as u64 + u64::from(len);
        if epoch == 0 || epoch < self.epoch || end > size {
            self.done = true;
            return Ok(None);
        }
        let Ok(n) = usize::try_from(len) else {
            self.done = true;
            return Ok(None);
        };
        let payload = self.bytes(at + RECORD_HEADER_LEN as u64, n).await?;
        if checksum(at, len, epoch, payload) != crc {
            self.done = true;
            return Ok(None);
        }
        let payload = payload.to_vec();
        self.pos = end;
        self.epoch = epoch;
        Ok(Some(LogRecord {
            offset: at,
            payload,
        }))
    }

    /// Where the log ends so far: the end of the last record returned.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.pos
    }

    /// Opens the log for appends after the last record returned, with the
    /// next epoch. Call it after [`next_record`](Self::next_record)
    /// returned `None`: appending anywhere else would cut the log short.
    ///
    /// # Errors
    ///
    /// `InvalidInput` before the end was reached; the error of
    /// `tokio::runtime::Handle::try_current` outside a tokio runtime.
    pub fn into_log(self) -> io::Result<AppendLog> {
        if !self.done {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "LogRecovery::into_log before the end of the log was read",
            ));
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let epoch = self.epoch.checked_add(1).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "append log: epoch exhausted")
        })?;
        let block = self.file.direct_block()?;
        let tail = self.pos;
        let size = self.size.unwrap_or(0);
        let prealloc = if self.options.preallocate > 0 {
            Preallocation::Active { end: size }
        } else {
            Preallocation::Off
        };
        Ok(AppendLog {
            inner: Arc::new(Inner {
                file: self.file,
                runtime,
                block,
                epoch,
                max_record_len: self.options.max_record_len,
                max_group_len: self.options.max_group_len,
                state: Mutex::new(State {
                    tail,
                    written: tail,
                    done: BTreeMap::new(),
                    // What recovery read may be in the page cache only (a
                    // process that died before its sync): the first commit
                    // is an `fdatasync`, which covers it.
                    durable: 0,
                    waiters: BTreeMap::new(),
                    barriers: Vec::new(),
                    writing: 0,
                    pending: None,
                    spare: Vec::new(),
                    head: None,
                    turns: BTreeMap::new(),
                    spare_blocks: None,
                    syncing: false,
                    poisoned: None,
                    closed: false,
                    prealloc_step: self.options.preallocate,
                    durable_writes: self.options.durable_writes,
                    prealloc_end: size,
                    stats: AppendLogStats {
                        records: 0,
                        writes: 0,
                        syncs: 0,
                        durable_writes: 0,
                        bytes: 0,
                        preallocation: prealloc,
                    },
                }),
            }),
        })
    }
}

/// Work of the log whose future may be dropped before it finishes — a
/// write (its `writing` count taken) or the sync task — only when the
/// runtime running it shuts down: dropped armed, it gives back what it
/// held and poisons the log (a write that may or may not have happened is
/// a hole), so that appends and `close` waiting for it fail instead of
/// waiting forever.
struct Abandoned {
    inner: Arc<Inner>,
    /// A write (else the sync task).
    write: bool,
    armed: bool,
}

impl Abandoned {
    fn write(inner: Arc<Inner>) -> Self {
        Abandoned {
            inner,
            write: true,
            armed: true,
        }
    }

    fn sync(inner: Arc<Inner>) -> Self {
        Abandoned {
            inner,
            write: false,
            armed: true,
        }
    }

    /// The work finished (and gave back what it held itself).
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut st = self.inner.lock();
        let what = if self.write {
            st.writing -= 1;
            "write"
        } else {
            st.syncing = false;
            "sync task"
        };
        let e = io::Error::other("dropped before it finished: the runtime running it shut down");
        st.poison(Poison::new(what, &e));
    }
}

/// Why the log takes no more appends.
#[derive(Clone, Debug)]
struct Poison {
    kind: io::ErrorKind,
    errno: Option<i32>,
    what: String,
}

impl Poison {
    fn new(what: &str, e: &io::Error) -> Self {
        Poison {
            kind: e.kind(),
            errno: e.raw_os_error(),
            what: format!("{what}: {e}"),
        }
    }

    /// The error of an append the failure covers: the errno itself if
    /// there is one.
    fn covered(&self) -> io::Error {
        match self.errno {
            Some(e) => io::Error::from_raw_os_error(e),
            None => io::Error::new(self.kind, self.what.clone()),
        }
    }

    /// The error of an append after the failure.
    fn later(&self) -> io::Error {
        io::Error::new(
            self.kind,
            format!(
                "the append log failed earlier and takes no more appends ({})",
                self.what
            ),
        )
    }
}

/// Whether the log preallocates ahead of its tail (see
/// [`AppendLogOptions::preallocate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preallocation {
    /// Not asked for (`preallocate(0)`, the default).
    Off,
    /// Preallocating: the file is allocated below `end`.
    Active {
        /// The end of the space allocated so far.
        end: u64,
    },
    /// Asked for, but an `fallocate` failed (`EOPNOTSUPP` from a file
    /// system that cannot preallocate, `ENOSPC`, ...): stopped for the
    /// rest of this opening. Appends go on, growing the file, and each
    /// `fdatasync` also records the new size.
    Stopped {
        /// The `fallocate` error's errno, if it had one.
        errno: Option<i32>,
    },
}

/// What an [`AppendLog`] has done since it was opened
/// ([`AppendLog::stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AppendLogStats {
    /// Records appended (offsets reserved).
    pub records: u64,
    /// Positioned writes issued: a group of records gathered while earlier
    /// writes or a sync were in flight, or a record written alone.
    /// `records / writes` is the write coalescing.
    pub writes: u64,
    /// `fdatasync` calls made.
    pub syncs: u64,
    /// Writes issued durable (`RWF_DSYNC`), each a commit without an
    /// `fdatasync`: a group (or a lone record) written when every byte
    /// before it was already durable. `records / (syncs + durable_writes)`
    /// is the group commit.
    pub durable_writes: u64,
    /// Bytes written (record frames: headers and payloads).
    pub bytes: u64,
    /// Whether the log preallocates.
    pub preallocation: Preallocation,
}

/// Records gathered for one write, from `start`, back to back.
struct Group {
    start: u64,
    buf: Vec<u8>,
}

struct State {
    /// Where the next record goes.
    tail: u64,
    /// Every byte below has been written (its write completed).
    written: u64,
    /// Completed writes above `written`: start → end.
    done: BTreeMap<u64, u64>,
    /// Every byte below is durable (an `fdatasync` that started after its
    /// write completed has completed, or a durable write of it has).
    durable: u64,
    /// Appends waiting for their end to be durable: end → ack.
    waiters: BTreeMap<u64, oneshot::Sender<io::Result<()>>>,
    /// `close` calls waiting for `durable` to reach their tail.
    barriers: Vec<(u64, oneshot::Sender<io::Result<()>>)>,
    /// Writes in flight (or about to be issued by the append that took
    /// them).
    writing: usize,
    /// Records gathered while writes or a sync are in flight, ending at
    /// `tail`. Invariant: while there is one, `writing > 0` or the sync
    /// task runs, and whichever finishes last writes it (the sync task,
    /// which `kick` starts when the last write completes).
    pending: Option<Group>,
    /// An empty buffer for the next group (reused: no allocation per
    /// group).
    spare: Vec<u8>,
    /// `O_DIRECT`: the bytes of the log from the start of the block that
    /// holds `written` up to it, once known (read by the first write that
    /// needs them): what the next write rewrites before its records.
    head: Option<Vec<u8>>,
    /// `O_DIRECT`: writes waiting for their turn, by start: one waits until
    /// `written` reaches its start (the write before it completed), since
    /// two writes of whole blocks may share one.
    turns: BTreeMap<u64, oneshot::Sender<()>>,
    /// `O_DIRECT`: the aligned buffer of the last write, for the next
    /// (not one a record above the group cap made large).
    spare_blocks: Option<AlignedBuf>,
    /// The sync task is running (at most one): it writes the pending group
    /// once no write is in flight, and syncs.
    syncing: bool,
    poisoned: Option<Poison>,
    closed: bool,
    prealloc_step: u64,
    /// `AppendLogOptions::durable_writes`.
    durable_writes: bool,
    /// The file is allocated below.
    prealloc_end: u64,
    stats: AppendLogStats,
}

impl State {
    /// Whether the sync task is to start: none runs and there is work for
    /// it — something written that is not durable, or a pending group and
    /// no write in flight (marks it running).
    /// The caller starts it with `Inner::start_sync` once the
    /// lock is released.
    #[must_use]
    fn kick(&mut self) -> bool {
        let start = !self.syncing
            && self.poisoned.is_none()
            && (self.written > self.durable || (self.pending.is_some() && self.writing == 0));
        if start {
            self.syncing = true;
        }
        start
    }

    /// Takes the pending group to write it: a write in flight from now.
    fn take_pending(&mut self) -> Option<Group> {
        let g = self.pending.take()?;
        self.writing += 1;
        self.stats.writes += 1;
        Some(g)
    }

    /// Whether a write starting at `start` is issued durable (and counted
    /// so): when every byte before it is durable (so no other write is in
    /// flight before it), one `RWF_DSYNC` write commits it, where a write
    /// and an `fdatasync` take two round trips one after the other.
    /// (`RWF_DSYNC` flushes the write's own range only, so it cannot stand
    /// in for a sync of earlier writes.) Not while a preallocation is due:
    /// the sync task makes it, then writes and syncs.
    ///
    /// One durable write at a time: with two in flight (the next group
    /// sent while one is flushed) the groups got smaller and the commits
    /// no faster, the flushes of one file not overlapping.
    fn durable_write(&mut self, start: u64) -> bool {
        let durable = self.durable_writes && self.durable == start && self.prealloc_due().is_none();
        if durable {
            self.stats.durable_writes += 1;
        }
        durable
    }

    /// Takes the pending group to write it, and whether it goes durable.
    fn take_pending_group(&mut self) -> Option<(Group, bool)> {
        let start = self.pending.as_ref()?.start;
        let durable = self.durable_write(start);
        self.take_pending().map(|g| (g, durable))
    }

    /// The `fallocate` due before the next commit, if the tail is within
    /// half a step of the allocated end: `(from, len)`.
    fn prealloc_due(&self) -> Option<(u64, u64)> {
        let step = self.prealloc_step;
        (step > 0 && self.tail + step / 2 > self.prealloc_end)
            .then(|| (self.prealloc_end.max(self.tail), step))
    }

    /// The write of `start..end` completed: advances `written` over it
    /// and every completed write after it, or keeps it for later.
    fn completed(&mut self, start: u64, end: u64) {
        if start == self.written {
            let mut written = end;
            while let Some(e) = self.done.remove(&written) {
                written = e;
            }
            self.written = written;
            if let Some(turn) = self.turns.remove(&written) {
                let _ = turn.send(());
            }
        } else {
            self.done.insert(start, end);
        }
    }

    /// Keeps `buf` for the next group if none is kept and it is not too
    /// large.
    fn recycle(&mut self, mut buf: Vec<u8>, max_group_len: usize) {
        if self.spare.capacity() == 0
            && buf.capacity() <= max_group_len.saturating_mul(2).max(SPARE_MIN)
        {
            buf.clear();
            self.spare = buf;
        }
    }

    /// Fails every append waiting and every later one.
    fn poison(&mut self, p: Poison) {
        for (_, tx) in std::mem::take(&mut self.waiters) {
            let _ = tx.send(Err(p.covered()));
        }
        for (_, tx) in self.barriers.drain(..) {
            let _ = tx.send(Err(p.covered()));
        }
        // Writes waiting for their turn see their sender dropped: they
        // write nothing.
        self.turns.clear();
        if self.poisoned.is_none() {
            self.poisoned = Some(p);
        }
    }

    /// Every byte below `to` is durable: acknowledges what it covers.
    fn made_durable(&mut self, to: u64) {
        self.durable = self.durable.max(to);
        let to = self.durable;
        let rest = self.waiters.split_off(&(to + 1));
        for (_, tx) in std::mem::replace(&mut self.waiters, rest) {
            let _ = tx.send(Ok(()));
        }
        let mut k = 0;
        while k < self.barriers.len() {
            if self.barriers[k].0 <= to {
                let _ = self.barriers.swap_remove(k).1.send(Ok(()));
            } else {
                k += 1;
            }
        }
    }
}

struct Inner {
    file: UringFile,
    runtime: tokio::runtime::Handle,
    /// `O_DIRECT`: every write is whole blocks of this size
    /// ([`UringFile::direct_block`]).
    block: Option<usize>,
    epoch: u32,
    max_record_len: usize,
    max_group_len: usize,
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is updated by short sections that do not panic; a
        // poisoned mutex still holds a consistent state.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Spawns the sync task `kick` asked for (without the lock: on a
    /// runtime that has shut down, the task is dropped at once, and its
    /// guard poisons the log).
    fn start_sync(self: &Arc<Self>) {
        let guard = Abandoned::sync(self.clone());
        let inner = self.clone();
        drop(self.runtime.spawn(async move {
            sync_loop(inner).await;
            guard.disarm();
        }));
    }

    /// Allocates `len` bytes from `from` ahead of the tail; a failure
    /// stops preallocation (not a durability matter), reported in the
    /// stats and once as a warning.
    async fn preallocate(&self, from: u64, len: u64) {
        let res = self
            .file
            .fallocate(FallocateMode::ALLOCATE, from, len)
            .await;
        let mut st = self.lock();
        match res {
            Ok(()) => {
                st.prealloc_end = st.prealloc_end.max(from + len);
                st.stats.preallocation = Preallocation::Active {
                    end: st.prealloc_end,
                };
            }
            // Not supported here, no space left (the writes will say), or
            // anything else: stop trying.
            Err(e) => {
                st.prealloc_step = 0;
                st.stats.preallocation = Preallocation::Stopped {
                    errno: e.raw_os_error(),
                };
                crate::util::decision!(
                    warn,
                    error = %e,
                    "append log: fallocate failed, preallocation stopped; appends go on growing the file"
                );
            }
        }
    }

    /// Writes `group` (taken with `writing` counted; `RWF_DSYNC` when
    /// `durable`, see `State::durable_write`), then marks it written (and
    /// durable) and kicks the sync task, or poisons the log. A short write
    /// is continued (`write_all`); one that writes nothing fails.
    async fn write_group(self: &Arc<Self>, group: Group, durable: bool) {
        let guard = Abandoned::write(self.clone());
        if let Some(block) = self.block {
            self.write_blocks(group, durable, block).await;
        } else {
            self.write_buffered(group, durable).await;
        }
        guard.disarm();
    }

    /// `write_group` on a file not opened `O_DIRECT`.
    async fn write_buffered(self: &Arc<Self>, group: Group, durable: bool) {
        let Group { start, buf } = group;
        let end = start + buf.len() as u64;
        let write = self.file.write_all_at_owned(buf, start);
        let (res, buf) = if durable {
            write.durable().await
        } else {
            write.await
        };
        let mut st = self.lock();
        st.writing -= 1;
        match res {
            Ok(()) => {
                st.stats.bytes += end - start;
                st.completed(start, end);
                // Every byte before it was durable when it was issued, and
                // durability only grows: all below `end` is durable now.
                if durable {
                    st.made_durable(end);
                }
                st.recycle(buf, self.max_group_len);
                if st.kick() {
                    drop(st);
                    self.start_sync();
                }
            }
            Err(e) => st.poison(Poison::new("write", &e)),
        }
    }

    /// `write_group` on an `O_DIRECT` file: waits until every write
    /// before it has completed (a write of whole blocks rewrites the start
    /// of its first block, which the write before it may still be
    /// writing), then writes from the start of the group's first block —
    /// the bytes already there, as the write before left them, then the
    /// group — to the end of its last block, zero-padded.
    async fn write_blocks(self: &Arc<Self>, group: Group, durable: bool, block: usize) {
        let Group { start, buf } = group;
        let end = start + buf.len() as u64;
        let from = start - start % block as u64;
        let turn = {
            let mut st = self.lock();
            if st.poisoned.is_some() {
                st.writing -= 1;
                return;
            }
            (st.written < start).then(|| {
                let (tx, rx) = oneshot::channel();
                st.turns.insert(start, tx);
                rx
            })
        };
        // A dropped sender: the log was poisoned meanwhile.
        if let Some(turn) = turn {
            if turn.await.is_err() {
                self.lock().writing -= 1;
                return;
            }
        }
        let (head, spare) = {
            let mut st = self.lock();
            (st.head.take(), st.spare_blocks.take())
        };
        let res = async {
            let head = match head {
                Some(h) => h,
                None => self.read_head(from, start, block).await?,
            };
            let len = usize::try_from(end - from)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?
                .next_multiple_of(block);
            let mut out = match spare {
                Some(b) if b.capacity() >= len => b,
                _ => AlignedBuf::try_with_capacity(len, block)?,
            };
            out.clear();
            out.extend_from_slice(&head);
            out.extend_from_slice(&buf);
            while out.len() < len {
                out.extend_from_slice(&ZEROES[..(len - out.len()).min(ZEROES.len())]);
            }
            let write = self.file.write_all_at_owned(out, from);
            let (res, out) = if durable {
                write.durable().await
            } else {
                write.await
            };
            res.map(|()| (head, out))
        }
        .await;
        let mut st = self.lock();
        st.writing -= 1;
        match res {
            Ok((mut head, out)) => {
                st.stats.bytes += end - start;
                st.completed(start, end);
                if durable {
                    st.made_durable(end);
                }
                // The start of the block `end` is in, for the next write.
                let last = usize::try_from(end - end % block as u64 - from).unwrap_or(0);
                let stop = usize::try_from(end - from).unwrap_or(0);
                head.clear();
                head.extend_from_slice(&out[last..stop]);
                st.head = Some(head);
                // Kept unless a large record made it larger than a group
                // needs (as `recycle` does for the group buffers).
                let keep = self.max_group_len.saturating_mul(2).max(SPARE_MIN) + 2 * block;
                if out.capacity() <= keep {
                    st.spare_blocks = Some(out);
                }
                st.recycle(buf, self.max_group_len);
                if st.kick() {
                    drop(st);
                    self.start_sync();
                }
            }
            Err(e) => st.poison(Poison::new("write", &e)),
        }
    }

    /// The bytes from `from` (a block's start) to `start` as the file
    /// holds them: what a write from `from` must rewrite.
    async fn read_head(&self, from: u64, start: u64, block: usize) -> io::Result<Vec<u8>> {
        let n = usize::try_from(start - from).unwrap_or(usize::MAX);
        if n == 0 {
            return Ok(Vec::new());
        }
        let buf = AlignedBuf::try_with_capacity(block, block)?;
        let (res, buf) = self.file.read_at_owned(buf, from).await;
        if res? < n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "append log: the file ends before the log's last record",
            ));
        }
        Ok(buf[..n].to_vec())
    }
}

/// The one sync task: writes the pending group once no write is in
/// flight — durable (`RWF_DSYNC`) when everything before it is, which
/// commits it — and otherwise `fdatasync`s everything written so far,
/// acknowledges it, again while there is more; preallocates ahead of the
/// tail before a commit.
async fn sync_loop(inner: Arc<Inner>) {
    // A group was written (not durable) since the last sync: sync before
    // the next group (records gathered meanwhile wait for it), so that a
    // steady stream of appends cannot put off the sync.
    let mut wrote = false;
    loop {
        let mut group = None;
        let mut durable = false;
        let sync;
        let prealloc;
        {
            let mut st = inner.lock();
            if st.poisoned.is_some() {
                st.syncing = false;
                return;
            }
            if st.writing == 0 && (!wrote || st.written <= st.durable) {
                if let Some((g, d)) = st.take_pending_group() {
                    group = Some(g);
                    durable = d;
                }
            }
            if group.is_some() {
                sync = None;
            } else {
                if st.written <= st.durable {
                    st.syncing = false;
                    return;
                }
                st.stats.syncs += 1;
                sync = Some(st.written);
            }
            prealloc = st.prealloc_due();
        }
        if let Some((from, len)) = prealloc {
            inner.preallocate(from, len).await;
        }
        if let Some(group) = group {
            // Its kick finds this task running: the loop goes on with it.
            inner.write_group(group, durable).await;
            wrote = !durable;
            continue;
        }
        let Some(target) = sync else {
            continue;
        };
        let res = inner.file.sync_data().await;
        wrote = false;
        let mut st = inner.lock();
        match res {
            Ok(()) => st.made_durable(target),
            Err(e) => {
                st.poison(Poison::new("fdatasync", &e));
                st.syncing = false;
                return;
            }
        }
    }
}

/// An append-only log of records in one file, with group commit: many
/// tasks append at once, each append resolves to the record's position
/// once the record — and every record before it — is durable. Made by
/// [`AppendLogOptions::open`] (or [`LogRecovery::into_log`]), which first
/// recovers the log the file holds; cheap to clone (all clones are one
/// log), `Send + Sync + 'static`, and its futures `'static`.
///
/// - Positions: the log reserves each record's offset from an atomic tail
///   on the append's first poll: positions are in first-poll order.
/// - Writes: a record appended while the log is idle (no write and no
///   `fdatasync` in flight) is written at once, alone. Records appended
///   while earlier writes or a sync are in flight are gathered into one
///   buffer, back to back, and written as one positioned write (a group)
///   once no write is in flight: one commit per group, as a serial group
///   commit does. A group holds at most
///   [`max_group_len`](AppendLogOptions::max_group_len) bytes; a larger
///   record is written alone, at once. A short write is continued.
/// - Commits: a write (a group, or a record on an idle log) issued when
///   every byte before it is durable is a durable write (`RWF_DSYNC`),
///   which commits it in one round trip
///   ([`durable_writes`](AppendLogOptions::durable_writes)). Otherwise one
///   `fdatasync` at a time covers every record written contiguously from
///   the start when it starts; appends whose writes complete during it
///   wait for the next. An append resolves only once its record and every
///   record before it are durable: no acknowledged record has a hole
///   before it.
/// - Failure: a failed write (a durable one's flush included) or
///   `fdatasync` fails every append it covers
///   (with the errno) and every later one: the log is poisoned (recover it
///   by reopening). A failed append's record may or may not be recovered.
///
/// An append dropped after its first poll still completes in the
/// background (its write, or its place in a group, then its place in a
/// sync): dropping it only drops the acknowledgement.
/// [`stats`](Self::stats) counts records, writes, syncs, durable writes and
/// bytes, and
/// says whether preallocation is on. The file must not be written by
/// anything else.
///
/// A file opened with `O_DIRECT` ([`OpenOptions::direct`](crate::OpenOptions::direct))
/// is the faster log where the file system takes it: each write is then
/// whole blocks — the start of the group's first block rewritten with the
/// bytes already there, the group, zeroes to the end of its last block —
/// and a durable one reaches the device without the page cache's
/// write-back. The writes go one at a time, in offset order (two writes
/// would share a block). The format is the same: a log written either way
/// is recovered and continued either way. Rewriting the bytes already in
/// the tail block relies on the device writing a sector whole or not at
/// all, as every write-ahead log that rewrites its last page does.
///
/// ```
/// use uring_positioned_io::{AppendLogOptions, OpenOptions, UringContext};
/// # fn main() -> std::io::Result<()> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let ctx = UringContext::new(vec![])?;
/// let opts = OpenOptions::new().read(true).write(true).create(true).clone();
/// let file = ctx.open_file(dir.path().join("wal"), &opts).await?;
/// let (log, recovered) = AppendLogOptions::new().open(file.clone()).await?;
/// assert!(recovered.is_empty());
///
/// let a = log.append(b"first".to_vec());
/// let b = log.append(b"second".to_vec());
/// let (a, b) = tokio::try_join!(a, b)?; // durable, both
/// assert_ne!(a, b);
/// log.close().await?;
///
/// // After a restart: the same records, in offset order.
/// let (log, recovered) = AppendLogOptions::new().open(file).await?;
/// let payloads: Vec<_> = recovered.iter().map(|r| &r.payload[..]).collect();
/// assert_eq!(recovered[0].offset, a.min(b));
/// let (first, second): (&[u8], &[u8]) = (b"first", b"second");
/// assert!(payloads == [first, second] || payloads == [second, first]);
/// log.append(b"third".to_vec()).await?;
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone)]
pub struct AppendLog {
    inner: Arc<Inner>,
}

impl fmt::Debug for AppendLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("AppendLog")
            .field("file", &self.inner.file)
            .field("epoch", &self.inner.epoch)
            .field("tail", &st.tail)
            .field("durable", &st.durable)
            .field("poisoned", &st.poisoned.is_some())
            .field("closed", &st.closed)
            .finish()
    }
}

impl AppendLog {
    /// Appends `payload` as one record; resolves to the record's position
    /// (its offset in the file) once it and every record before it are
    /// durable. The record's offset is reserved, and its write issued, on
    /// the future's first poll.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a payload longer than
    /// [`max_record_len`](AppendLogOptions::max_record_len); an error
    /// after [`close`](Self::close); the write's or `fdatasync`'s error
    /// (its errno) for a failure covering the record, and an error naming
    /// that failure for every append after it.
    pub fn append(&self, payload: impl AsRef<[u8]> + Send + 'static) -> AppendFuture {
        let inner = self.inner.clone();
        AppendFuture {
            runtime: inner.runtime.clone(),
            fut: Some(Box::pin(append(inner, payload))),
            polled: false,
        }
    }

    /// Refuses later appends, then waits until every record appended so
    /// far is durable (or has failed).
    ///
    /// # Errors
    ///
    /// The failure that poisoned the log, if one did.
    pub async fn close(&self) -> io::Result<()> {
        let (rx, start) = {
            let mut st = self.inner.lock();
            st.closed = true;
            if let Some(p) = &st.poisoned {
                return Err(p.later());
            }
            if st.durable >= st.tail {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            let tail = st.tail;
            st.barriers.push((tail, tx));
            (rx, st.kick())
        };
        if start {
            self.inner.start_sync();
        }
        rx.await
            .map_err(|_| io::Error::other("append log: the sync task stopped"))?
    }

    /// Where the next record goes: the end of the records reserved so far.
    #[must_use]
    pub fn tail(&self) -> u64 {
        self.inner.lock().tail
    }

    /// The end of the durable records: every record below is acknowledged
    /// or can be. 0 after opening until the first commit: the records
    /// recovered may be in the page cache only (written by a process that
    /// died before its sync), and the first commit is an `fdatasync` that
    /// covers them.
    #[must_use]
    pub fn durable(&self) -> u64 {
        self.inner.lock().durable
    }

    /// The epoch of this opening's records (see the module's format).
    #[must_use]
    pub fn epoch(&self) -> u32 {
        self.inner.epoch
    }

    /// `fdatasync` calls made so far (also in [`stats`](Self::stats), with
    /// the durable writes: records per commit measure the group commit).
    #[must_use]
    pub fn syncs(&self) -> u64 {
        self.inner.lock().stats.syncs
    }

    /// What the log has done since it was opened: records, writes (groups
    /// and records written alone), syncs, bytes written, and whether it
    /// preallocates.
    #[must_use]
    pub fn stats(&self) -> AppendLogStats {
        self.inner.lock().stats
    }

    /// The file the log is in.
    #[must_use]
    pub fn file(&self) -> &UringFile {
        &self.inner.file
    }
}

async fn append(inner: Arc<Inner>, payload: impl AsRef<[u8]>) -> io::Result<u64> {
    let payload = payload.as_ref();
    if payload.len() > inner.max_record_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "append log: a record of {} bytes, more than the {} allowed",
                payload.len(),
                inner.max_record_len
            ),
        ));
    }
    // max_record_len keeps it within u32 less the header.
    let len =
        u32::try_from(payload.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let frame_len = RECORD_HEADER_LEN + payload.len();
    let alone = frame_len > inner.max_group_len;
    // A long payload's CRC is computed here, not under the lock.
    let body = (alone || payload.len() > CRC_UNDER_LOCK).then(|| {
        let mut h = crc32fast::Hasher::new();
        h.update(payload);
        h
    });
    let head = (inner.epoch, len);
    // Reserve the offset; join the pending group, or write at once.
    let mut start_sync = false;
    let (offset, rx, before, own, durable) = {
        let mut st = inner.lock();
        if let Some(p) = &st.poisoned {
            return Err(p.later());
        }
        if st.closed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "append log: closed, it takes no more appends",
            ));
        }
        let offset = st.tail;
        st.tail += frame_len as u64;
        st.stats.records += 1;
        let (tx, rx) = oneshot::channel();
        st.waiters.insert(offset + frame_len as u64, tx);
        let joins = st.pending.as_ref().is_some_and(|g| {
            g.start + g.buf.len() as u64 == offset && g.buf.len() + frame_len <= inner.max_group_len
        });
        let mut before = None;
        let mut own = None;
        let mut durable = false;
        if alone {
            // Written alone, at once; a pending group before it can grow
            // no more: this append writes it first.
            before = st.take_pending_group();
            st.writing += 1;
            st.stats.writes += 1;
            own = Some(Vec::new());
            durable = before.is_none() && st.durable_write(offset);
        } else if joins {
            let g = st.pending.as_mut().expect("joins a pending group");
            encode_frame(&mut g.buf, offset, head, payload, body.as_ref());
        } else if st.pending.is_some() || st.writing > 0 || st.syncing {
            // A new group (the one before it, full, is written by this
            // append); whoever finishes last writes it.
            before = st.take_pending_group();
            let mut buf = std::mem::take(&mut st.spare);
            encode_frame(&mut buf, offset, head, payload, body.as_ref());
            st.pending = Some(Group { start: offset, buf });
            start_sync = st.kick();
        } else {
            // An idle log: written at once, and durable if all before it
            // is (as it is on an idle log) — unless a preallocation is
            // due, which the sync task makes before it syncs this write.
            st.writing += 1;
            st.stats.writes += 1;
            own = Some(std::mem::take(&mut st.spare));
            durable = st.durable_write(offset);
        }
        (offset, rx, before, own, durable)
    };
    if start_sync {
        inner.start_sync();
    }
    if let Some((group, durable)) = before {
        inner.write_group(group, durable).await;
    }
    if let Some(mut buf) = own {
        encode_frame(&mut buf, offset, head, payload, body.as_ref());
        inner
            .write_group(Group { start: offset, buf }, durable)
            .await;
    }
    match rx.await {
        Ok(Ok(())) => Ok(offset),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::other("append log: the sync task stopped")),
    }
}

/// The future of [`AppendLog::append`]: `'static`; resolves to the
/// record's position once it is durable. Dropped after its first poll, the
/// append goes on in the background (see [`AppendLog`]).
#[must_use = "futures do nothing unless polled"]
pub struct AppendFuture {
    fut: Option<Pin<Box<dyn Future<Output = io::Result<u64>> + Send>>>,
    /// Polled once: its offset is reserved (an unpolled one reserved
    /// nothing and is just dropped).
    polled: bool,
    runtime: tokio::runtime::Handle,
}

impl Drop for AppendFuture {
    fn drop(&mut self) {
        // A reserved record must be written and take its place in a sync,
        // or every later record would wait behind its hole forever.
        if let (true, Some(fut)) = (self.polled, self.fut.take()) {
            self.runtime.spawn(fut);
        }
    }
}

impl Future for AppendFuture {
    type Output = io::Result<u64>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let fut = this
            .fut
            .as_mut()
            .expect("AppendFuture polled after completion");
        this.polled = true;
        let out = fut.as_mut().poll(cx);
        if out.is_ready() {
            this.fut = None;
        }
        out
    }
}

impl fmt::Debug for AppendFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppendFuture")
            .field("done", &self.fut.is_none())
            .finish_non_exhaustive()
    }
}
