//! `uring-bench parquet` (feature `parquet`): the crate's Parquet reader
//! (`ParquetFileReader` over a `UringFile`) against the two ways async Rust
//! code reads a local Parquet file today: `tokio::fs::File` (the parquet
//! crate's own `AsyncRead + AsyncSeek` reader) and a reader that runs each
//! request's reads in one `spawn_blocking` call (what `object_store`'s
//! local file system does).
//!
//! Two workloads over one file the bench writes itself (an `int64` column
//! and a 40-byte binary column, both derived from the row number, no
//! compression, page index written):
//! - **lookups**: `--depth` tasks each read one random row (a row group,
//!   a row selection of one row, both columns) with the file's metadata
//!   loaded once beforehand, as a query engine with a metadata cache does;
//!   the reader fetches only the pages holding the row.
//! - **scan**: every row of every column, the row groups split over
//!   `--streams` streams read at once, batches of 8192 rows.
//!
//! Every row returned is checked against its row number. Regimes: `hot`
//! (the file read once before the cell) and `cold` (dropped from the page
//! cache before the cell; `POSIX_FADV_RANDOM` on the lookups' file so that
//! readahead does not warm it, and a fixed number of lookups per cell).

use std::fmt::Write as _;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Array, BinaryArray, Int64Array, RecordBatch};
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use futures::StreamExt;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use uring_positioned_io::{ParquetFileReader, UringContext, UringFile};

use crate::cli::{ParquetArgs, ParquetEngine, ParquetRegime};
use crate::dataset::{fadvise, resident_pages};
use crate::machine::{cpu_model, git_commit, kernel, loadavg, meminfo};
use crate::report::{table, Style};

/// Bytes of the binary column of every row.
const PAYLOAD: usize = 40;
/// Rows per batch of the scan (the parquet crate's default is 1024;
/// query engines use 8192).
const SCAN_BATCH: usize = 8192;
/// Tokio worker threads of every cell.
const WORKERS: usize = 2;

/// The `int64` column's value of row `r`.
fn n_of(r: u64) -> i64 {
    r as i64 * 7 - 3
}

/// The binary column's value of row `r`: its number, then a pattern.
fn payload_of(r: u64, out: &mut [u8; PAYLOAD]) {
    out[..8].copy_from_slice(&r.to_le_bytes());
    for (k, b) in out[8..].iter_mut().enumerate() {
        *b = (r as u8).wrapping_mul(31) ^ k as u8;
    }
}

/// The dataset: its path, rows and rows per row group.
struct Data {
    path: PathBuf,
    rows: u64,
    group_rows: u64,
    bytes: u64,
}

fn write_file(path: &Path, rows: u64, group_rows: u64, page_bytes: usize) -> Result<(), String> {
    let schema = parquet::schema::parser::parse_message_type(
        "message m { required int64 n; required binary p; }",
    )
    .map_err(|e| e.to_string())?;
    let props = WriterProperties::builder()
        .set_data_page_size_limit(page_bytes)
        .set_write_batch_size(1024)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_dictionary_enabled(false)
        .set_max_row_group_row_count(Some(group_rows as usize))
        .build();
    let tmp = path.with_extension("partial");
    let file = File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props))
        .map_err(|e| e.to_string())?;
    let mut start = 0;
    while start < rows {
        let end = (start + group_rows).min(rows);
        let ns: Vec<i64> = (start..end).map(n_of).collect();
        let mut p = [0u8; PAYLOAD];
        let ps: Vec<ByteArray> = (start..end)
            .map(|r| {
                payload_of(r, &mut p);
                ByteArray::from(p.to_vec())
            })
            .collect();
        let mut group = writer.next_row_group().map_err(|e| e.to_string())?;
        let mut col = group
            .next_column()
            .map_err(|e| e.to_string())?
            .ok_or("no column n")?;
        col.typed::<Int64Type>()
            .write_batch(&ns, None, None)
            .map_err(|e| e.to_string())?;
        col.close().map_err(|e| e.to_string())?;
        let mut col = group
            .next_column()
            .map_err(|e| e.to_string())?
            .ok_or("no column p")?;
        col.typed::<ByteArrayType>()
            .write_batch(&ps, None, None)
            .map_err(|e| e.to_string())?;
        col.close().map_err(|e| e.to_string())?;
        group.close().map_err(|e| e.to_string())?;
        start = end;
    }
    writer.close().map_err(|e| e.to_string())?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

fn ensure_data(a: &ParquetArgs) -> Result<Data, String> {
    std::fs::create_dir_all(&a.data_dir).map_err(|e| format!("{}: {e}", a.data_dir.display()))?;
    let path = a.data_dir.join(format!(
        "rows-{}-group-{}-page-{}k.parquet",
        a.rows, a.group_rows, a.page_kib
    ));
    if !path.exists() {
        eprintln!("writing {} ({} rows)", path.display(), a.rows);
        write_file(&path, a.rows, a.group_rows, (a.page_kib as usize) << 10)?;
    }
    let bytes = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
    Ok(Data {
        path,
        rows: a.rows,
        group_rows: a.group_rows,
        bytes,
    })
}

/// Drops the file from the page cache, asking again while pages remain
/// (a page the kernel still holds survives one request).
fn drop_cache(path: &Path) -> Result<(), String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    for _ in 0..10 {
        fadvise(&f, libc::POSIX_FADV_DONTNEED).map_err(|e| e.to_string())?;
        if resident_pages(&f).map_err(|e| e.to_string())?.0 == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A reader that runs each request's reads in one `spawn_blocking` call,
/// as `object_store`'s local file system does.
#[derive(Clone)]
struct BlockingReader {
    file: Arc<File>,
    size: u64,
}

fn read_range(file: &File, range: &Range<u64>) -> io::Result<Bytes> {
    let mut v = vec![0u8; (range.end - range.start) as usize];
    file.read_exact_at(&mut v, range.start)?;
    Ok(Bytes::from(v))
}

impl AsyncFileReader for BlockingReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let file = self.file.clone();
        async move {
            tokio::task::spawn_blocking(move || read_range(&file, &range))
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))?
                .map_err(ParquetError::from)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        let file = self.file.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                ranges
                    .iter()
                    .map(|r| read_range(&file, r))
                    .collect::<io::Result<Vec<_>>>()
            })
            .await
            .map_err(|e| ParquetError::External(Box::new(e)))?
            .map_err(ParquetError::from)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(&mut *self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// How an engine gets a reader for one stream.
enum Source {
    Uring(UringFile),
    /// `tokio::fs::File` keeps a position: each stream opens the file (as
    /// a local object store does per request).
    TokioFs(PathBuf),
    Blocking(BlockingReader),
}

/// Runs `f` over a reader of `src`, whatever its type.
macro_rules! with_reader {
    ($src:expr, |$r:ident| $body:expr) => {
        match $src {
            Source::Uring(file) => {
                let $r = ParquetFileReader::new(file.clone());
                $body
            }
            Source::TokioFs(path) => {
                let std = File::open(path).map_err(|e| e.to_string())?;
                let $r = tokio::fs::File::from_std(std);
                $body
            }
            Source::Blocking(b) => {
                let $r = b.clone();
                $body
            }
        }
    };
}

fn options() -> ArrowReaderOptions {
    ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required)
}

/// Checks every row of `batch` against its row number; returns the rows
/// (first row, count).
fn verify(batch: &RecordBatch) -> Result<(u64, usize), String> {
    let ns = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("column n is not int64")?;
    let ps = batch
        .column(1)
        .as_any()
        .downcast_ref::<BinaryArray>()
        .ok_or("column p is not binary")?;
    if ns.is_empty() {
        return Ok((0, 0));
    }
    let first = (ns.value(0) + 3) / 7;
    if first < 0 {
        return Err(format!("row value {} is no row's", ns.value(0)));
    }
    let first = first as u64;
    let mut want = [0u8; PAYLOAD];
    for i in 0..ns.len() {
        let r = first + i as u64;
        payload_of(r, &mut want);
        if ns.value(i) != n_of(r) || ps.value(i) != want {
            return Err(format!("row {r}: wrong values"));
        }
    }
    Ok((first, ns.len()))
}

/// One lookup of row `r` through `reader`.
async fn lookup<R: AsyncFileReader + Unpin + Send + 'static>(
    reader: R,
    meta: &ArrowReaderMetadata,
    data: &Data,
    r: u64,
) -> Result<(), String> {
    let group = (r / data.group_rows) as usize;
    let skip = (r % data.group_rows) as usize;
    let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta.clone())
        .with_row_groups(vec![group])
        .with_row_selection(RowSelection::from(vec![
            RowSelector::skip(skip),
            RowSelector::select(1),
        ]))
        .with_batch_size(16)
        .build()
        .map_err(|e| e.to_string())?;
    let mut got = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| format!("row {r}: {e}"))?;
        let (first, n) = verify(&batch)?;
        if n > 0 && first != r {
            return Err(format!("asked for row {r}, got row {first}"));
        }
        got += n;
    }
    if got == 1 {
        Ok(())
    } else {
        Err(format!("row {r}: {got} rows returned"))
    }
}

/// SplitMix64: the rows looked up.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Fig {
    /// Lookups/s or scanned bytes/s.
    rate: f64,
    /// CPU time of the process (user + system, every thread) per lookup,
    /// or per MiB scanned.
    cpu: Duration,
    /// Length of the measured window, seconds.
    secs: f64,
    /// Median lookup latency (lookups only).
    p50: Option<Duration>,
    p99: Option<Duration>,
}

fn sources(engine: ParquetEngine, data: &Data) -> Result<(Source, Option<UringContext>), String> {
    let file = File::open(&data.path).map_err(|e| e.to_string())?;
    Ok(match engine {
        ParquetEngine::Uring => {
            let ctx = UringContext::new(vec![file]).map_err(|e| e.to_string())?;
            let f = ctx.file(0).map_err(|e| e.to_string())?;
            (Source::Uring(f), Some(ctx))
        }
        ParquetEngine::TokioFs => (Source::TokioFs(data.path.clone()), None),
        ParquetEngine::SpawnBlocking => (
            Source::Blocking(BlockingReader {
                file: Arc::new(file),
                size: data.bytes,
            }),
            None,
        ),
    })
}

async fn load_meta(src: &Source) -> Result<ArrowReaderMetadata, String> {
    with_reader!(src, |r| {
        let mut r = r;
        ArrowReaderMetadata::load_async(&mut r, options())
            .await
            .map_err(|e| e.to_string())
    })
}

async fn lookups_cell(
    src: Arc<Source>,
    data: Arc<Data>,
    depth: usize,
    stop: Stop,
    seed: u64,
) -> Result<Fig, String> {
    let meta = Arc::new(load_meta(&src).await?);
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..depth {
        let (src, data, meta, next) = (src.clone(), data.clone(), meta.clone(), next.clone());
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if stop.done(i, t0) {
                    return Ok::<_, String>(lat);
                }
                let r = mix(seed ^ i) % data.rows;
                let t = Instant::now();
                with_reader!(&*src, |reader| lookup(reader, &meta, &data, r).await)?;
                lat.push(t.elapsed());
            }
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.map_err(|e| e.to_string())??);
    }
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let q = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)));
    Ok(Fig {
        cpu: Duration::ZERO,
        secs,
        rate: lat.len() as f64 / secs,
        p50: q(0.5).copied(),
        p99: q(0.99).copied(),
    })
}

async fn scan_cell(src: Arc<Source>, data: Arc<Data>, streams: usize) -> Result<Fig, String> {
    let meta = load_meta(&src).await?;
    let groups = meta.metadata().num_row_groups();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..streams {
        let mine: Vec<usize> = (s..groups).step_by(streams).collect();
        if mine.is_empty() {
            continue;
        }
        let (src, meta) = (src.clone(), meta.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen: Vec<(u64, usize)> = Vec::new();
            with_reader!(&*src, |reader| {
                let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta)
                    .with_row_groups(mine)
                    .with_batch_size(SCAN_BATCH)
                    .build()
                    .map_err(|e| e.to_string())?;
                while let Some(batch) = stream.next().await {
                    seen.push(verify(&batch.map_err(|e| e.to_string())?)?);
                }
            });
            Ok::<_, String>(seen)
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.extend(t.await.map_err(|e| e.to_string())??);
    }
    let secs = t0.elapsed().as_secs_f64();
    // Every row exactly once.
    seen.sort_unstable();
    let mut at = 0;
    for (first, n) in seen {
        if first != at {
            return Err(format!(
                "scan: rows from {at} to {first} missing or repeated"
            ));
        }
        at += n as u64;
    }
    if at != data.rows {
        return Err(format!("scan: {at} rows of {}", data.rows));
    }
    Ok(Fig {
        cpu: Duration::ZERO,
        secs,
        rate: data.bytes as f64 / secs,
        p50: None,
        p99: None,
    })
}

/// When a lookups cell ends: after a time, or after a number of lookups.
#[derive(Clone)]
enum Stop {
    After(Duration, Arc<AtomicBool>),
    Count(u64),
}

impl Stop {
    fn done(&self, i: u64, t0: Instant) -> bool {
        match self {
            Stop::After(d, flag) => {
                if flag.load(Ordering::Relaxed) {
                    return true;
                }
                if t0.elapsed() >= *d {
                    flag.store(true, Ordering::Relaxed);
                    return true;
                }
                false
            }
            Stop::Count(n) => i >= *n,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Work {
    Lookups,
    Scan,
}

fn cell(
    a: &ParquetArgs,
    data: &Arc<Data>,
    engine: ParquetEngine,
    regime: ParquetRegime,
    work: Work,
    seed: u64,
) -> Result<Fig, String> {
    if regime == ParquetRegime::Cold {
        drop_cache(&data.path)?;
    } else {
        // Hot: the whole file in the page cache.
        let f = File::open(&data.path).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < data.bytes {
            let n = f.read_at(&mut buf, off).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            off += n as u64;
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let data = data.clone();
    let cpu0 = cpu_time();
    let fig = rt.block_on(async {
        let (src, _ctx) = sources(engine, &data)?;
        let src = Arc::new(src);
        match work {
            Work::Lookups => {
                let stop = match regime {
                    ParquetRegime::Hot => Stop::After(
                        Duration::from_secs_f64(a.secs),
                        Arc::new(AtomicBool::new(false)),
                    ),
                    ParquetRegime::Cold => {
                        let f = File::open(&data.path).map_err(|e| e.to_string())?;
                        fadvise(&f, libc::POSIX_FADV_RANDOM).map_err(|e| e.to_string())?;
                        Stop::Count(a.cold_lookups)
                    }
                };
                lookups_cell(src, data.clone(), a.depth as usize, stop, seed).await
            }
            Work::Scan => scan_cell(src, data.clone(), a.streams as usize).await,
        }
    })?;
    let cpu = cpu_time().saturating_sub(cpu0);
    drop(rt);
    // The cell's work: lookups done, or MiB scanned.
    let units = match work {
        Work::Lookups => fig.rate * fig.secs,
        Work::Scan => data.bytes as f64 / f64::from(1u32 << 20),
    };
    Ok(Fig {
        cpu: cpu.div_f64(units.max(1.0)),
        ..fig
    })
}

/// CPU time of this process so far, every thread (`getrusage`).
fn cpu_time() -> Duration {
    // SAFETY: an all-zero `rusage` is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fmt_rate(work: Work, rate: f64) -> String {
    match work {
        Work::Lookups => {
            if rate >= 1e3 {
                format!("{:.1} k/s", rate / 1e3)
            } else {
                format!("{rate:.0} /s")
            }
        }
        Work::Scan => format!("{:.2} GB/s", rate / 1e9),
    }
}

fn fmt_us(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.0} µs", d.as_secs_f64() * 1e6))
}

pub fn run(a: &ParquetArgs) -> Result<bool, String> {
    let data = Arc::new(ensure_data(a)?);
    println!(
        "command: {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!(
        "machine: {}, {} CPUs, {:.0} GiB RAM, kernel {}; load {}; commit {}",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        meminfo("MemTotal:").map_or(0.0, |b| b as f64 / f64::from(1u32 << 30)),
        kernel(),
        loadavg(),
        git_commit(),
    );
    println!(
        "parquet: {} ({:.0} MiB, {} rows, {} per row group, {} KiB pages, uncompressed, page index); \
         {WORKERS} tokio workers; lookups: {} tasks, one random row each (both columns), metadata \
         loaded once; hot {} s per cell, cold {} lookups per cell; scan: all rows, {} streams, \
         batches of {SCAN_BATCH}; every row checked; {} repeats, engines interleaved",
        data.path.display(),
        data.bytes as f64 / f64::from(1u32 << 20),
        data.rows,
        data.group_rows,
        a.page_kib,
        a.depth,
        a.secs,
        a.cold_lookups,
        a.streams,
        a.repeat,
    );
    let works = [Work::Lookups, Work::Scan];
    // figs[(regime, work, engine)] = one value per repeat.
    let mut figs: Vec<((ParquetRegime, Work, ParquetEngine), Vec<Fig>)> = Vec::new();
    for rep in 0..a.repeat {
        for &regime in &a.regimes {
            for &work in &works {
                for &engine in &a.engines {
                    let fig = cell(a, &data, engine, regime, work, a.seed ^ (rep << 32))?;
                    eprintln!(
                        "run {}: {:?} {:?} {:?}: {}",
                        rep + 1,
                        regime,
                        work,
                        engine,
                        fmt_rate(work, fig.rate)
                    );
                    match figs.iter_mut().find(|(k, _)| *k == (regime, work, engine)) {
                        Some((_, v)) => v.push(fig),
                        None => figs.push(((regime, work, engine), vec![fig])),
                    }
                }
            }
        }
    }
    let mut rows = vec![vec![
        "regime".to_string(),
        "workload".into(),
        "engine".into(),
        "median (runs)".into(),
        "× tokio-fs".into(),
        "× spawn-blocking".into(),
        "CPU".into(),
        "p50".into(),
        "p99".into(),
    ]];
    let med = |k: (ParquetRegime, Work, ParquetEngine)| {
        figs.iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| median(v.iter().map(|f| f.rate).collect()))
    };
    for &regime in &a.regimes {
        for &work in &works {
            for &engine in &a.engines {
                let Some((_, v)) = figs.iter().find(|(k, _)| *k == (regime, work, engine)) else {
                    continue;
                };
                let m = median(v.iter().map(|f| f.rate).collect());
                let ratio = |base: ParquetEngine| {
                    med((regime, work, base)).map_or("-".into(), |b| format!("{:.2}×", m / b))
                };
                // Latency of the median run.
                let mid = v
                    .iter()
                    .min_by(|x, y| (x.rate - m).abs().total_cmp(&(y.rate - m).abs()))
                    .expect("one run at least");
                let mut runs = String::new();
                for (i, f) in v.iter().enumerate() {
                    let _ = write!(
                        runs,
                        "{}{}",
                        if i == 0 { "" } else { ", " },
                        fmt_rate(work, f.rate)
                    );
                }
                rows.push(vec![
                    format!("{regime:?}").to_lowercase(),
                    format!("{work:?}").to_lowercase(),
                    engine.name().to_string(),
                    format!("{} ({runs})", fmt_rate(work, m)),
                    ratio(ParquetEngine::TokioFs),
                    ratio(ParquetEngine::SpawnBlocking),
                    format!(
                        "{:.0} µs/{}",
                        mid.cpu.as_secs_f64() * 1e6,
                        if work == Work::Scan { "MiB" } else { "lookup" }
                    ),
                    fmt_us(mid.p50),
                    fmt_us(mid.p99),
                ]);
            }
        }
    }
    print!("{}", table(&rows, Style::Markdown));
    Ok(true)
}
