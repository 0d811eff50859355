//! A small write-ahead log on top of the crate: the write path of a
//! storage engine.
//!
//! - **Append**: many writer tasks each hand a record to the log and wait
//!   for its commit.
//! - **Group commit**: one committer task takes every record waiting, lays
//!   them out back to back at the log's tail, writes the group with one
//!   owned write (`write_all_owned`), makes it durable with one
//!   `fdatasync`, and only then acknowledges each record of the group —
//!   so an acknowledged record is on stable storage, and a record is never
//!   acknowledged before every earlier one is.
//! - **Recovery**: the log is read back through the context record by
//!   record; each record's checksum and sequence number are checked, the
//!   scan stops at the first torn or missing record (the tail a crash may
//!   leave), and every acknowledged record must be among those recovered,
//!   byte for byte.
//!
//! Record: `[len u32][crc32 u32][seq u64][payload]`, little-endian; the crc
//! covers `seq` and the payload.
//! Run: `cargo run --release --example wal [writers] [records per writer]`
//! (default 32 × 500).

use std::collections::HashMap;
use std::io;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};
use uring_positioned_io::{FileId, OpenOptions, UringContext};

const HEADER: usize = 16;

/// CRC-32 (IEEE), bit by bit: small, and fast enough for an example.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for part in parts {
        for &b in *part {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
    }
    !crc
}

fn encode(seq: u64, payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).expect("record too large");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32(&[&seq.to_le_bytes(), payload]).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
}

/// A record waiting for its commit.
struct Pending {
    payload: Vec<u8>,
    /// The sequence number it was committed under, once durable.
    done: oneshot::Sender<io::Result<u64>>,
}

#[derive(Clone)]
struct Wal {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Wal {
    /// Appends `payload`; resolves once it is durable, to its sequence number.
    async fn append(&self, payload: Vec<u8>) -> io::Result<u64> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(Pending { payload, done })
            .map_err(|_| io::Error::other("the log is closed"))?;
        rx.await
            .map_err(|_| io::Error::other("the committer stopped"))?
    }
}

#[derive(Debug, Default)]
struct CommitStats {
    groups: u64,
    records: u64,
    bytes: u64,
}

/// The committer: one group per round — every record waiting is written
/// with one write, then one fdatasync, then acknowledged.
async fn committer(
    ctx: UringContext,
    fid: FileId,
    mut rx: mpsc::UnboundedReceiver<Pending>,
) -> io::Result<CommitStats> {
    let mut stats = CommitStats::default();
    let (mut tail, mut seq) = (0u64, 0u64);
    let mut buf = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut group = vec![first];
        while let Ok(more) = rx.try_recv() {
            group.push(more);
        }
        buf.clear();
        let first_seq = seq;
        for p in &group {
            encode(seq, &p.payload, &mut buf);
            seq += 1;
        }
        let (res, back) = ctx
            .write_all_owned(fid, tail, std::mem::take(&mut buf))
            .await;
        buf = back;
        // Durable only once the fdatasync that started after the write
        // completed has completed: then, and only then, acknowledge.
        let res = match res {
            Ok(()) => ctx.fdatasync(fid).await,
            Err(e) => Err(e),
        };
        if let Err(e) = res {
            // The group's bytes may or may not be in the file: fail every
            // record of it, and stop (a real log would also stop taking
            // writes until it has rewritten or truncated the tail).
            for p in group {
                let _ = p.done.send(Err(io::Error::new(e.kind(), e.to_string())));
            }
            return Err(e);
        }
        tail += buf.len() as u64;
        stats.groups += 1;
        stats.records += group.len() as u64;
        stats.bytes += buf.len() as u64;
        for (k, p) in group.into_iter().enumerate() {
            let _ = p.done.send(Ok(first_seq + k as u64));
        }
    }
    Ok(stats)
}

/// Reads the log back through the context, record by record, checking each
/// one; stops at the first torn or missing record. Returns seq → payload.
async fn recover(ctx: &UringContext, fid: FileId) -> io::Result<HashMap<u64, Vec<u8>>> {
    let size = ctx.file_size(fid).await?;
    let mut records = HashMap::new();
    let (mut at, mut expect) = (0u64, 0u64);
    while at + HEADER as u64 <= size {
        let mut header = [0u8; HEADER];
        ctx.read(fid, at, &mut header).await?;
        let len = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().unwrap());
        let seq = u64::from_le_bytes(header[8..16].try_into().unwrap());
        if at + (HEADER + len) as u64 > size || seq != expect {
            break; // torn tail
        }
        let (res, payload) = ctx
            .read_exact_owned(fid, at + HEADER as u64, Vec::with_capacity(len))
            .await;
        res?;
        if crc32(&[&seq.to_le_bytes(), &payload]) != crc {
            break; // torn tail
        }
        records.insert(seq, payload);
        at += (HEADER + len) as u64;
        expect += 1;
    }
    Ok(records)
}

fn payload_of(writer: u64, i: u64) -> Vec<u8> {
    let len = 20 + ((writer * 31 + i * 7) % 300) as usize;
    (0..len)
        .map(|k| (writer as u8) ^ (i as u8).wrapping_mul(3) ^ (k as u8))
        .collect()
}

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let writers: u64 = args.next().map_or(32, |a| a.parse().expect("writers"));
    let per_writer: u64 = args.next().map_or(500, |a| a.parse().expect("records"));
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("wal.log");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let ctx = UringContext::new(vec![])?;
        let opts = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .clone();
        let fid = ctx.open(&path, &opts).await?;
        println!("backend: {}", ctx.backend());

        let (tx, rx) = mpsc::unbounded_channel();
        let wal = Wal { tx };
        let commit = tokio::spawn(committer(ctx.clone(), fid, rx));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..writers {
            let wal = wal.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..per_writer {
                    let payload = payload_of(w, i);
                    let seq = wal.append(payload.clone()).await?;
                    acked.push((seq, payload));
                }
                io::Result::Ok(acked)
            }));
        }
        let mut acked = Vec::new();
        for t in tasks {
            acked.extend(t.await.map_err(io::Error::other)??);
        }
        let elapsed = started.elapsed();
        drop(wal);
        let stats = commit.await.map_err(io::Error::other)??;
        println!(
            "appended {} records in {:.2?} ({:.0} commits/s): {} groups of {:.1} records \
             on average, {} bytes",
            stats.records,
            elapsed,
            stats.records as f64 / elapsed.as_secs_f64(),
            stats.groups,
            stats.records as f64 / stats.groups as f64,
            stats.bytes
        );

        // Recovery, through a fresh context, as after a restart.
        drop(ctx);
        let ctx = UringContext::new(vec![])?;
        let fid = ctx.open(&path, OpenOptions::new().read(true)).await?;
        let recovered = recover(&ctx, fid).await?;
        assert_eq!(
            recovered.len() as u64,
            writers * per_writer,
            "records recovered"
        );
        for (seq, payload) in &acked {
            assert_eq!(
                recovered.get(seq),
                Some(payload),
                "acknowledged record {seq} did not come back"
            );
        }
        println!(
            "recovered {} records; every acknowledged record checked",
            recovered.len()
        );
        io::Result::Ok(())
    })
}
