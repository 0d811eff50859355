//! Adapters: `UringFileCursor` (tokio's `AsyncRead`, `AsyncSeek`,
//! `AsyncWrite`) against `tokio::fs::File` and `std` as oracles, and
//! (feature `bytes`) reads into `bytes::Bytes` against `std`.

use crate::common;

use std::io::{self, ErrorKind, SeekFrom};
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use common::{Flavor, Rng};
use tokio::io::{
    AsyncBufReadExt, AsyncReadExt, AsyncSeek, AsyncSeekExt, AsyncWriteExt, BufReader, ReadBuf,
};
use uring_positioned_io::{os_error, BackendChoice, UringContext, UringFile};

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    common::fill_pattern(seed, 0, &mut v);
    v
}

use common::open_rw as rw;

/// A context of `choice` over the file at `path` (read and write), and its handle.
fn open(choice: BackendChoice, path: &Path) -> (UringContext, UringFile) {
    let ctx = common::build_ctx(choice, vec![rw(path)], |b| b);
    let file = ctx.file(0).unwrap();
    (ctx, file)
}

/// Both outcomes equal, or both errors of the same kind.
fn same<T: PartialEq + std::fmt::Debug>(ours: &io::Result<T>, oracle: &io::Result<T>, what: &str) {
    match (ours, oracle) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}"),
        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind(), "{what}: ours {a}, oracle {b}"),
        (a, b) => panic!("{what}: ours {a:?}, oracle {b:?}"),
    }
}

/// Random partial reads (tiny to large `ReadBuf`s) and seeks of every kind
/// on a cursor and on `tokio::fs::File`: the same bytes, positions, EOFs
/// and errors.
fn cursor_against_tokio_file(choice: BackendChoice) {
    for flavor in [Flavor::Multi, Flavor::Current] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let len = 300_001usize;
        std::fs::write(&path, bytes(3, len)).unwrap();
        common::run("cursor_vs_tokio", flavor, 120, move || async move {
            let (_ctx, file) = open(choice, &path);
            let mut ours = file.cursor();
            let mut oracle = tokio::fs::File::open(&path).await.unwrap();
            let mut rng = Rng::new(0xC0 + flavor as u64);
            for step in 0..2000 {
                let what = format!("step {step}");
                match rng.below(10) {
                    0..=6 => {
                        let k = match rng.below(4) {
                            0 => 1 + rng.below(8) as usize,
                            1 => 1 + rng.below(4096) as usize,
                            2 => 4096 + rng.below(8192) as usize,
                            _ => 1 + rng.below(200_000) as usize,
                        };
                        let mut got = vec![0u8; k];
                        let n = ours.read(&mut got).await.unwrap();
                        assert!(n <= k, "{what}");
                        // As many bytes from the oracle: the same ones.
                        let mut want = vec![0u8; n.max(1)];
                        let m = oracle.read(&mut want[..n.max(1)]).await.unwrap();
                        if n == 0 {
                            assert_eq!(m, 0, "{what}: ours at EOF, the oracle is not");
                        } else {
                            oracle.read_exact(&mut want[m..n]).await.unwrap();
                            assert_eq!(got[..n], want[..n], "{what}: {n} bytes");
                        }
                    }
                    7 => {
                        let to = SeekFrom::Start(rng.below(len as u64 + 5000));
                        same(&ours.seek(to).await, &oracle.seek(to).await, &what);
                    }
                    8 => {
                        let d = rng.below(400_000) as i64 - 200_000;
                        let to = SeekFrom::Current(d);
                        same(&ours.seek(to).await, &oracle.seek(to).await, &what);
                    }
                    _ => {
                        let d = rng.below(400_000) as i64 - 390_000;
                        let to = SeekFrom::End(d);
                        same(&ours.seek(to).await, &oracle.seek(to).await, &what);
                    }
                }
                assert_eq!(
                    ours.position(),
                    oracle.stream_position().await.unwrap(),
                    "{what}"
                );
            }
            // The whole file, from the start, equals std's.
            ours.seek(SeekFrom::Start(0)).await.unwrap();
            let mut all = Vec::new();
            ours.read_to_end(&mut all).await.unwrap();
            assert!(all == std::fs::read(&path).unwrap(), "read_to_end");
            assert_eq!(ours.position(), len as u64);
            // From a fresh cursor too, 1 byte at a time for a stretch.
            let mut c = file.cursor();
            let mut one = [0u8; 1];
            let want = std::fs::read(&path).unwrap();
            for (i, w) in want.iter().take(10_000).enumerate() {
                assert_eq!(c.read(&mut one).await.unwrap(), 1);
                assert_eq!(one[0], *w, "byte {i}");
            }
        });
    }
}

/// Seeks: negative and overflowing ones are `InvalidInput` and leave the
/// position; past the end, reads return 0; two `start_seek`s without
/// `poll_complete` are refused; a seek while a read is in flight.
fn cursor_seek_edges(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let data = bytes(5, 10_000);
    std::fs::write(&path, &data).unwrap();
    common::run("cursor_seek_edges", Flavor::Multi, 60, move || async move {
        let (ctx, file) = open(choice, &path);
        let mut c = file.cursor();
        c.seek(SeekFrom::Start(100)).await.unwrap();
        for to in [
            SeekFrom::Current(-101),
            SeekFrom::End(-10_001),
            SeekFrom::Current(i64::MAX), // beyond i64::MAX, as lseek(2) refuses
            SeekFrom::Start(i64::MAX as u64 + 1),
            SeekFrom::End(i64::MAX),
        ] {
            let err = c.seek(to).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{to:?}: {err}");
            assert_eq!(c.position(), 100, "{to:?} moved the cursor");
        }
        // The largest offset: reads there return 0.
        assert_eq!(
            c.seek(SeekFrom::Start(i64::MAX as u64)).await.unwrap(),
            i64::MAX as u64
        );
        let mut eight = [0u8; 8];
        assert_eq!(c.read(&mut eight).await.unwrap(), 0, "far past the end");
        // Past the end: reads return 0, the position stays.
        assert_eq!(c.seek(SeekFrom::End(50)).await.unwrap(), 10_050);
        let mut buf = vec![0u8; 100];
        assert_eq!(c.read(&mut buf).await.unwrap(), 0);
        assert_eq!(c.position(), 10_050);
        // The last byte.
        c.seek(SeekFrom::End(-1)).await.unwrap();
        assert_eq!(c.read(&mut buf).await.unwrap(), 1);
        assert_eq!(buf[0], data[9_999]);

        // Two start_seeks: the second is refused; the first completes.
        let mut c = file.cursor();
        Pin::new(&mut c).start_seek(SeekFrom::Start(7)).unwrap();
        let err = Pin::new(&mut c).start_seek(SeekFrom::Start(9)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Other, "{err}");
        let pos = std::future::poll_fn(|cx| Pin::new(&mut c).poll_complete(cx)).await;
        assert_eq!(pos.unwrap(), 7);
        // poll_complete without a seek: the position.
        let pos = std::future::poll_fn(|cx| Pin::new(&mut c).poll_complete(cx)).await;
        assert_eq!(pos.unwrap(), 7);

        // A read left in flight (polled once), then a seek: the read's bytes
        // were never handed over, so Current is from where the caller is.
        for rel in [
            SeekFrom::Current(10),
            SeekFrom::Start(4000),
            SeekFrom::End(-3),
        ] {
            let mut c = file.cursor();
            c.seek(SeekFrom::Start(1000)).await.unwrap();
            let mut small = [0u8; 16];
            let first = {
                let mut rb = ReadBuf::new(&mut small);
                let polled = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(tokio::io::AsyncRead::poll_read(
                        Pin::new(&mut c),
                        cx,
                        &mut rb,
                    ))
                })
                .await;
                match polled {
                    std::task::Poll::Ready(r) => {
                        r.unwrap();
                        rb.filled().len()
                    }
                    std::task::Poll::Pending => 0,
                }
            };
            let want = match rel {
                SeekFrom::Current(d) => 1000 + first as u64 + d as u64,
                SeekFrom::Start(p) => p,
                SeekFrom::End(d) => (10_000 + d) as u64,
            };
            assert_eq!(c.seek(rel).await.unwrap(), want, "{rel:?} after {first}");
            let n = c.read(&mut small).await.unwrap();
            assert!(n > 0);
            assert_eq!(
                small[..n],
                data[want as usize..want as usize + n],
                "{rel:?}"
            );
        }

        // A cursor dropped with a read in flight: sound, nothing leaks.
        for _ in 0..20 {
            let mut c = file.cursor();
            let mut big = vec![0u8; 65536];
            let mut rb = ReadBuf::new(&mut big);
            let _ = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(tokio::io::AsyncRead::poll_read(
                    Pin::new(&mut c),
                    cx,
                    &mut rb,
                ))
            })
            .await;
            drop(c);
        }
        assert_eq!(
            common::wait_in_flight_zero(&ctx, Duration::from_secs(10)).await,
            0
        );
    });
}

/// `BufReader` over a cursor: `read_line` and `lines()` of a text file as
/// std reads them.
fn cursor_bufreader_lines(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text");
    let mut text = String::new();
    let mut rng = Rng::new(11);
    for i in 0..5000 {
        let width = rng.below(200) as usize;
        text.push_str(&format!("line {i}: {}\n", "x".repeat(width)));
    }
    text.push_str("no newline at the end");
    std::fs::write(&path, &text).unwrap();
    common::run("cursor_lines", Flavor::Multi, 60, move || async move {
        let (_ctx, file) = open(choice, &path);
        let want: Vec<String> =
            std::io::BufRead::lines(std::io::BufReader::new(std::fs::File::open(&path).unwrap()))
                .collect::<io::Result<_>>()
                .unwrap();
        // Small BufReader capacity: lines cross many reads.
        for cap in [7, 100, 8192] {
            let mut lines = BufReader::with_capacity(cap, file.cursor()).lines();
            let mut got = Vec::new();
            while let Some(line) = lines.next_line().await.unwrap() {
                got.push(line);
            }
            assert_eq!(got, want, "capacity {cap}");
        }
        let mut r = BufReader::new(file.cursor());
        let mut line = String::new();
        assert!(r.read_line(&mut line).await.unwrap() > 0);
        assert_eq!(line, format!("{}\n", want[0]));
        // A seek through the BufReader discards its buffer.
        r.seek(SeekFrom::End(-21)).await.unwrap();
        line.clear();
        r.read_line(&mut line).await.unwrap();
        assert_eq!(line, "no newline at the end");
    });
}

/// `tokio::io::copy` from a cursor into a `Vec`, and from a slice into a
/// cursor over a writable file (then compared with std); writes read back
/// through the same cursor without a flush; a write error reaches the
/// caller; a cursor dropped with a write in flight still writes it.
fn cursor_copy_and_writes(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let src = bytes(9, 500_000);
    std::fs::write(&path, &src).unwrap();
    let ro_path = dir.path().join("read-only");
    std::fs::write(&ro_path, b"abc").unwrap();
    let ro = std::fs::File::open(&ro_path).unwrap();
    common::run("cursor_copy", Flavor::Multi, 60, move || async move {
        let (ctx, file) = open(choice, &path);
        let mut out = Vec::new();
        let n = tokio::io::copy(&mut file.cursor(), &mut out).await.unwrap();
        assert_eq!(n, 500_000);
        assert!(out == src, "copy out");

        // Copy in at 1000, over and past the end.
        let patch = bytes(10, 600_000);
        let mut c = file.cursor();
        c.seek(SeekFrom::Start(1000)).await.unwrap();
        let n = tokio::io::copy(&mut &patch[..], &mut c).await.unwrap();
        assert_eq!(n, 600_000);
        c.flush().await.unwrap();
        assert_eq!(c.position(), 601_000);
        let mut want = src.clone();
        want.resize(601_000, 0);
        want[1000..].copy_from_slice(&patch);
        assert!(std::fs::read(&path).unwrap() == want, "copy in");

        // Read your writes, no flush in between.
        let mut c = file.cursor();
        c.write_all(b"hello").await.unwrap();
        c.seek(SeekFrom::Start(0)).await.unwrap();
        let mut five = [0u8; 5];
        c.read_exact(&mut five).await.unwrap();
        assert_eq!(&five, b"hello");
        // A read buffers more than it hands over; a write at the position
        // then replaces what is buffered.
        c.write_all(b"WORLD").await.unwrap();
        c.seek(SeekFrom::Start(3)).await.unwrap();
        let mut four = [0u8; 4];
        c.read_exact(&mut four).await.unwrap();
        assert_eq!(&four, b"loWO");
        c.write_all(b"!!").await.unwrap();
        let mut two = [0u8; 2];
        c.seek(SeekFrom::Start(7)).await.unwrap();
        c.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"!!");
        c.shutdown().await.unwrap();

        // A write past the end leaves a hole, as std.
        let mut c = file.cursor();
        c.seek(SeekFrom::End(10)).await.unwrap();
        c.write_all(b"tail").await.unwrap();
        c.flush().await.unwrap();
        let now = std::fs::read(&path).unwrap();
        assert_eq!(now.len(), 601_014);
        assert_eq!(&now[601_000..], b"\0\0\0\0\0\0\0\0\0\0tail");

        // After a flush, no write of the cursor is in flight.
        let mut c = file.cursor();
        for i in 0..100u8 {
            c.write_all(&[i; 40_000]).await.unwrap();
            c.flush().await.unwrap();
            let stats = ctx.stats();
            assert_eq!(stats.in_flight, 0, "write {i} still in flight after flush");
        }
        drop(c);
        let now = std::fs::read(&path).unwrap();
        assert!(now[..4_000_000]
            .chunks(40_000)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == i as u8)));

        // A cursor dropped with a write in flight: the write still lands.
        let mut c = file.cursor();
        c.write_all(&[0xEE; 70_000]).await.unwrap();
        drop(c);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = std::fs::read(&path).unwrap();
            if now[..70_000].iter().all(|&b| b == 0xEE) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the dropped write never landed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // A write to a file opened read-only: an error, at the write or at
        // the flush, never lost.
        let ro = ctx.register_file(ro).unwrap();
        let mut c = ctx.file(ro).unwrap().cursor();
        let res = async {
            c.write_all(b"xyz").await?;
            c.flush().await
        }
        .await;
        let err = res.unwrap_err();
        assert_eq!(os_error(&err), Some(libc::EBADF), "{err}");
        // Reported once; the cursor goes on.
        c.flush().await.unwrap();
        let mut all = String::new();
        c.seek(SeekFrom::Start(0)).await.unwrap();
        c.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "abc");
    });
}

/// On a file opened `O_DIRECT`: reads at any position and length (the
/// cursor widens them to aligned blocks) give std's bytes, EOF included,
/// and `BufReader` works over it; an aligned write goes through, an
/// unaligned one fails with `InvalidInput`.
fn cursor_on_o_direct_file(choice: BackendChoice) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("direct");
    let len = 200_003usize;
    let data = bytes(9, len);
    std::fs::write(&path, &data).unwrap();
    let Some(f) = common::open_direct(&path) else {
        return;
    };
    common::run("cursor_o_direct", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, vec![f], |b| b);
        let file = ctx.file(0u32).unwrap();
        let mut c = file.cursor();
        let mut rng = Rng::new(0xD1);
        for step in 0..400 {
            let at = rng.below(len as u64 + 100);
            assert_eq!(c.seek(SeekFrom::Start(at)).await.unwrap(), at);
            let k = 1 + rng.below(if step % 2 == 0 { 700 } else { 100_000 }) as usize;
            let mut got = vec![0u8; k];
            let n = c.read(&mut got).await.unwrap();
            let from = (at as usize).min(len);
            let want = &data[from..(from + k).min(len)];
            assert!(
                n <= want.len() && (n > 0 || want.is_empty()),
                "step {step}: {n}"
            );
            assert!(got[..n] == want[..n], "step {step}: {n} bytes at {at}");
            assert_eq!(c.position(), at + n as u64);
        }
        c.seek(SeekFrom::Start(0)).await.unwrap();
        let mut all = Vec::new();
        c.read_to_end(&mut all).await.unwrap();
        assert!(all == data, "read_to_end");
        let mut r = BufReader::new(file.cursor());
        let mut first = Vec::new();
        r.read_until(data[1000], &mut first).await.unwrap();
        let end = data.iter().position(|&b| b == data[1000]).unwrap() + 1;
        assert!(first == data[..end], "read_until");

        // Writes: aligned ones go through, others are refused.
        let block = bytes(10, 4096);
        c.seek(SeekFrom::Start(8192)).await.unwrap();
        c.write_all(&block).await.unwrap();
        c.flush().await.unwrap();
        let mut back = vec![0u8; 4096];
        c.seek(SeekFrom::Start(8192)).await.unwrap();
        c.read_exact(&mut back).await.unwrap();
        assert!(back == block, "an aligned write through the cursor");
        c.seek(SeekFrom::Start(100)).await.unwrap();
        let res = match c.write_all(b"not aligned").await {
            Ok(()) => c.flush().await,
            Err(e) => Err(e),
        };
        let e = res.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("O_DIRECT"), "{e}");
    });
}

backend_tests!(
    cursor_on_o_direct_file,
    cursor_against_tokio_file,
    cursor_seek_edges,
    cursor_bufreader_lines,
    cursor_copy_and_writes,
);

#[cfg(feature = "bytes")]
mod bytes_reads {
    use super::*;
    use futures::TryStreamExt;
    use uring_positioned_io::ScanOptions;

    /// Exact reads and batches of ranges into `Bytes` against std's bytes;
    /// zero lengths, the end of the file, bad ranges.
    fn bytes_against_std(choice: BackendChoice) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let data = bytes(21, 200_000);
        std::fs::write(&path, &data).unwrap();
        common::run("bytes_vs_std", Flavor::Multi, 60, move || async move {
            let (_ctx, file) = open(choice, &path);
            let mut rng = Rng::new(77);
            for _ in 0..200 {
                let off = rng.below(200_000);
                let len = rng.below(200_000 - off + 1) as usize;
                let b = file.read_exact_at_bytes(len, off).await.unwrap();
                assert!(
                    b[..] == data[off as usize..off as usize + len],
                    "{len} @ {off}"
                );
            }
            // Zero lengths, anywhere.
            for off in [0, 200_000, 300_000] {
                assert!(file.read_exact_at_bytes(0, off).await.unwrap().is_empty());
            }
            // Ending past the end, or starting there.
            for (len, off) in [(1, 200_000), (2, 199_999), (200_001, 0), (5, 1 << 40)] {
                let err = file.read_exact_at_bytes(len, off).await.unwrap_err();
                assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{len} @ {off}: {err}");
            }
            // Too long to allocate: an error, not an abort.
            let err = file.read_exact_at_bytes(usize::MAX, 0).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::OutOfMemory, "{err}");

            // Batches of random ranges, overlapping, empty, to the very end.
            for _ in 0..50 {
                let count = rng.below(40) as usize;
                let ranges: Vec<_> = (0..count)
                    .map(|_| {
                        let a = rng.below(200_001);
                        let b = a + rng.below(200_001 - a).min(70_000);
                        a..b
                    })
                    .chain([199_990..200_000, 5..5])
                    .collect();
                let got = file.read_ranges_bytes(ranges.clone()).await.unwrap();
                assert_eq!(got.len(), ranges.len());
                for (r, b) in ranges.iter().zip(&got) {
                    assert!(b[..] == data[r.start as usize..r.end as usize], "{r:?}");
                }
            }
            assert!(file.read_ranges_bytes([]).await.unwrap().is_empty());
            let err = file
                .read_ranges_bytes([0..10, 199_999..200_001])
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{err}");
            #[allow(clippy::reversed_empty_ranges, reason = "the bad input under test")]
            let err = file.read_ranges_bytes([0..10, 20..10]).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains("20..10"), "{err}");
        });
    }

    /// `Bytes` outlive the handle, the context and (for chunks) the scan;
    /// a chunk becomes `Bytes` without a copy.
    fn bytes_outlive_their_context(choice: BackendChoice) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let data = bytes(22, 100_000);
        std::fs::write(&path, &data).unwrap();
        common::run("bytes_outlive", Flavor::Multi, 60, move || async move {
            let (ctx, file) = open(choice, &path);
            let one = tokio::spawn(file.read_exact_at_bytes(1000, 5))
                .await
                .unwrap()
                .unwrap();
            let many = file
                .read_ranges_bytes([0..10, 50_000..100_000])
                .await
                .unwrap();
            let mut scan = file
                .scan_with(&ScanOptions::new().chunk_size(16 << 10), ..)
                .unwrap();
            let chunk = scan.try_next().await.unwrap().unwrap();
            let second = scan.try_next().await.unwrap().unwrap();
            let (ptr, len) = (chunk.as_ptr(), chunk.len());
            let from_chunk = bytes::Bytes::from(chunk);
            assert_eq!(
                (from_chunk.as_ptr(), from_chunk.len()),
                (ptr, len),
                "no copy"
            );
            let tail = bytes::Bytes::from(second).slice(100..);
            drop((scan, file));
            ctx.shutdown().await;
            drop(ctx);
            assert!(one[..] == data[5..1005]);
            assert!(many[0][..] == data[..10] && many[1][..] == data[50_000..]);
            assert!(from_chunk[..] == data[..16 << 10]);
            assert!(tail[..] == data[(16 << 10) + 100..32 << 10]);
        });
    }

    backend_tests!(bytes_against_std, bytes_outlive_their_context);
}

#[cfg(feature = "parquet")]
mod parquet_reads {
    use super::*;
    use std::sync::Arc;

    use futures::TryStreamExt;
    use parquet::arrow::async_reader::AsyncFileReader;
    use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use uring_positioned_io::ParquetFileReader;

    /// A Parquet file of `groups` row groups of `rows` rows: an `int64`
    /// column and a string column, both derived from the row number.
    fn write_parquet(path: &Path, groups: i64, rows: i64) {
        let schema = parquet::schema::parser::parse_message_type(
            "message m { required int64 n; required binary s (UTF8); }",
        )
        .unwrap();
        let props = Arc::new(WriterProperties::default());
        let file = std::fs::File::create(path).unwrap();
        let mut writer = SerializedFileWriter::new(file, Arc::new(schema), props).unwrap();
        for g in 0..groups {
            let ns: Vec<i64> = (g * rows..(g + 1) * rows).map(|i| i * 7 - 3).collect();
            let ss: Vec<ByteArray> = (g * rows..(g + 1) * rows)
                .map(|i| {
                    ByteArray::from(format!("row {i} {}", "s".repeat((i % 13) as usize)).as_str())
                })
                .collect();
            let mut group = writer.next_row_group().unwrap();
            let mut col = group.next_column().unwrap().unwrap();
            col.typed::<Int64Type>()
                .write_batch(&ns, None, None)
                .unwrap();
            col.close().unwrap();
            let mut col = group.next_column().unwrap().unwrap();
            col.typed::<ByteArrayType>()
                .write_batch(&ss, None, None)
                .unwrap();
            col.close().unwrap();
            group.close().unwrap();
        }
        writer.close().unwrap();
    }

    /// Rows read through `ParquetFileReader` equal those read through
    /// `tokio::fs::File` (the parquet crate's own `AsyncRead` path): whole
    /// file, a projection, a row-group selection; then the reader's edges.
    fn parquet_against_tokio_file(choice: BackendChoice) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        write_parquet(&path, 4, 5000);
        common::run("parquet_vs_tokio", Flavor::Multi, 120, move || async move {
            let (_ctx, file) = open(choice, &path);
            let size = std::fs::metadata(&path).unwrap().len();
            for (case, reader) in [
                ("statx", ParquetFileReader::new(file.clone())),
                (
                    "sized",
                    ParquetFileReader::new(file.clone()).with_file_size(size),
                ),
                (
                    "hint",
                    ParquetFileReader::new(file.clone()).with_metadata_size_hint(1 << 16),
                ),
            ] {
                let ours = ParquetRecordBatchStreamBuilder::new(reader).await.unwrap();
                let oracle = ParquetRecordBatchStreamBuilder::new(
                    tokio::fs::File::open(&path).await.unwrap(),
                )
                .await
                .unwrap();
                assert_eq!(ours.metadata().num_row_groups(), 4, "{case}");
                assert_eq!(ours.schema(), oracle.schema(), "{case}");
                let a: Vec<_> = ours
                    .with_batch_size(1234)
                    .build()
                    .unwrap()
                    .try_collect()
                    .await
                    .unwrap();
                let b: Vec<_> = oracle
                    .with_batch_size(1234)
                    .build()
                    .unwrap()
                    .try_collect()
                    .await
                    .unwrap();
                assert_eq!(a.iter().fold(0, |n, b| n + b.num_rows()), 20_000, "{case}");
                assert!(a == b, "{case}: rows differ");
            }
            // A projection of the string column, row groups 1 and 3.
            let ours = ParquetRecordBatchStreamBuilder::new(ParquetFileReader::new(file.clone()))
                .await
                .unwrap();
            let mask = ProjectionMask::leaves(ours.parquet_schema(), [1]);
            let a: Vec<_> = ours
                .with_projection(mask.clone())
                .with_row_groups(vec![1, 3])
                .build()
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            let oracle =
                ParquetRecordBatchStreamBuilder::new(tokio::fs::File::open(&path).await.unwrap())
                    .await
                    .unwrap();
            let b: Vec<_> = oracle
                .with_projection(mask)
                .with_row_groups(vec![1, 3])
                .build()
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            assert_eq!(a.iter().fold(0, |n, b| n + b.num_rows()), 10_000);
            assert!(a == b, "projection: rows differ");

            // The reader's own ranges, against std's bytes; its errors.
            let data = std::fs::read(&path).unwrap();
            let mut r = ParquetFileReader::new(file.clone());
            let one = r.get_bytes(4..size).await.unwrap();
            assert!(one[..] == data[4..]);
            let many = r
                .get_byte_ranges(vec![0..4, size - 4..size, 10..10])
                .await
                .unwrap();
            assert_eq!(
                (&many[0][..], &many[1][..], many[2].len()),
                (&b"PAR1"[..], &b"PAR1"[..], 0)
            );
            let kind = |e: &parquet::errors::ParquetError| match e {
                parquet::errors::ParquetError::External(e) => {
                    e.downcast_ref::<io::Error>().map(io::Error::kind)
                }
                _ => None,
            };
            let err = r.get_bytes(size - 1..size + 1).await.unwrap_err();
            assert_eq!(kind(&err), Some(ErrorKind::UnexpectedEof), "{err}");
            let err = r
                .get_byte_ranges(vec![0..4, size..size + 1])
                .await
                .unwrap_err();
            assert_eq!(kind(&err), Some(ErrorKind::UnexpectedEof), "{err}");
            #[allow(clippy::reversed_empty_ranges, reason = "the bad input under test")]
            let err = r.get_bytes(9..3).await.unwrap_err();
            assert_eq!(kind(&err), Some(ErrorKind::InvalidInput), "{err}");
            assert!(err.to_string().contains("9..3"), "{err}");
            // A wrong size: the footer is not found, an error.
            let mut wrong = ParquetFileReader::new(file.clone()).with_file_size(size - 1);
            assert!(wrong.get_metadata(None).await.is_err());
        });
    }

    backend_tests!(parquet_against_tokio_file);
}
