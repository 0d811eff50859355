//! A write-ahead log with the crate's [`AppendLog`] (feature `append-log`):
//! the write path of a storage engine.
//!
//! - **Append**: many writer tasks each append records and wait for each
//!   one to be durable; the log reserves its offset and frames it (length,
//!   epoch, CRC-32); records appended while earlier writes or a sync are
//!   in flight are gathered into one write.
//! - **Group commit**: a group written when everything before it is
//!   durable is a durable write, which commits it; otherwise one
//!   `fdatasync` at a time covers every record written so far. An append
//!   resolves only once it and every earlier record are durable.
//! - **`O_DIRECT`** where the file system takes it: the faster log (whole
//!   blocks written, no page-cache write-back before the flush); the
//!   buffered file otherwise, with the same format.
//! - **Recovery**: reopening reads the log back, verifying every record,
//!   and stops at the first torn or missing one (the tail a crash may
//!   leave); every acknowledged record must be among those recovered, byte
//!   for byte.
//!
//! Run: `cargo run --release --example wal [writers] [records per writer]`
//! (default 32 × 500).

use std::collections::HashMap;
use std::io;
use std::time::Instant;

use uring_positioned_io::{AppendLogOptions, OpenOptions, UringContext};

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
        let mut opts = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .direct(true)
            .clone();
        let mut direct = true;
        let file = match ctx.open_file(&path, &opts).await {
            Ok(f) => f,
            // A file system without O_DIRECT (tmpfs on older kernels).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                direct = false;
                opts.direct(false);
                ctx.open_file(&path, &opts).await?
            }
            Err(e) => return Err(e),
        };
        println!("backend: {}, O_DIRECT: {direct}", ctx.backend());

        // Preallocate 4 MiB at a time: fewer size updates for fdatasync.
        let options = AppendLogOptions::new().preallocate(4 << 20);
        let (log, recovered) = options.open(file).await?;
        assert!(recovered.is_empty(), "a new log");

        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..writers {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..per_writer {
                    let payload = payload_of(w, i);
                    // Resolves once the record is durable: its position.
                    let lsn = log.append(payload.clone()).await?;
                    acked.push((lsn, payload));
                }
                io::Result::Ok(acked)
            }));
        }
        let mut acked = Vec::new();
        for t in tasks {
            acked.extend(t.await.map_err(io::Error::other)??);
        }
        let elapsed = started.elapsed();
        log.close().await?;
        let st = log.stats();
        println!(
            "appended {} records in {:.2?} ({:.0} commits/s): {} writes ({} of them durable \
             writes, each a commit) and {} fdatasyncs; {:.1} records per write and {:.1} per \
             commit on average, {} bytes",
            acked.len(),
            elapsed,
            acked.len() as f64 / elapsed.as_secs_f64(),
            st.writes,
            st.durable_writes,
            st.syncs,
            st.records as f64 / st.writes.max(1) as f64,
            st.records as f64 / (st.syncs + st.durable_writes).max(1) as f64,
            st.bytes
        );
        drop(log);

        // Recovery, through a fresh context, as after a restart.
        drop(ctx);
        let ctx = UringContext::new(vec![])?;
        let file = ctx.open_file(&path, &opts).await?;
        let (_log, recovered) = AppendLogOptions::new().open(file).await?;
        let recovered: HashMap<u64, Vec<u8>> = recovered
            .into_iter()
            .map(|r| (r.offset, r.payload))
            .collect();
        assert_eq!(
            recovered.len() as u64,
            writers * per_writer,
            "records recovered"
        );
        for (lsn, payload) in &acked {
            assert_eq!(
                recovered.get(lsn),
                Some(payload),
                "acknowledged record at {lsn} did not come back"
            );
        }
        println!(
            "recovered {} records; every acknowledged record checked",
            recovered.len()
        );
        io::Result::Ok(())
    })
}
