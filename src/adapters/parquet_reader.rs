//! [`ParquetFileReader`] (feature `parquet`): the `parquet` crate's
//! `AsyncFileReader` over a [`UringFile`], each range one exact-length read
//! into `Bytes`, the ranges of a request in one batch.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, TryFutureExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use crate::file::UringFile;

/// A [`UringFile`] as the `parquet` crate's
/// [`AsyncFileReader`] (feature `parquet`), for
/// `ParquetRecordBatchStreamBuilder` and the rest of its async reader:
/// `get_bytes` is one exact-length read into `Bytes`
/// ([`UringFile::read_exact_at_bytes`]), `get_byte_ranges` one batch
/// ([`UringFile::read_ranges_bytes`]), `get_metadata` the footer through
/// `ParquetMetaDataReader`, with the file's size from `statx` unless
/// given ([`with_file_size`](Self::with_file_size)). A file that ends
/// inside a requested range is an error (`UnexpectedEof` inside the
/// `ParquetError`), as a range ending before it starts is.
///
/// ```
/// use futures::TryStreamExt;
/// use parquet::arrow::ParquetRecordBatchStreamBuilder;
/// use uring_positioned_io::{ParquetFileReader, UringContext};
/// # use std::sync::Arc;
/// # use parquet::data_type::Int64Type;
/// # use parquet::file::{properties::WriterProperties, writer::SerializedFileWriter};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// # let mut data = tempfile::tempfile()?;
/// # let schema = parquet::schema::parser::parse_message_type("message m { required int64 n; }")?;
/// # let props = Arc::new(WriterProperties::default());
/// # let mut writer = SerializedFileWriter::new(&mut data, Arc::new(schema), props)?;
/// # let mut group = writer.next_row_group()?;
/// # let mut column = group.next_column()?.expect("one column");
/// # column.typed::<Int64Type>().write_batch(&(0..1000).collect::<Vec<i64>>(), None, None)?;
/// # column.close()?;
/// # group.close()?;
/// # writer.close()?;
/// // `data`: a Parquet file of 1000 rows.
/// let file = UringContext::new(vec![data])?.file(0)?;
/// let stream = ParquetRecordBatchStreamBuilder::new(ParquetFileReader::new(file))
///     .await?
///     .with_batch_size(256)
///     .build()?;
/// let batches: Vec<_> = stream.try_collect().await?;
/// assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1000);
/// # Ok(())
/// # })
/// # }
/// ```
#[derive(Clone)]
pub struct ParquetFileReader {
    file: UringFile,
    size: Option<u64>,
    metadata_size_hint: Option<usize>,
}

impl ParquetFileReader {
    /// A reader of `file`, whose size is asked (`statx`) when the
    /// metadata is first read.
    ///
    /// ```
    /// use uring_positioned_io::{ParquetFileReader, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// let reader = ParquetFileReader::new(file.clone());
    /// assert_eq!(reader.file().fid(), file.fid());
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn new(file: UringFile) -> ParquetFileReader {
        ParquetFileReader {
            file,
            size: None,
            metadata_size_hint: None,
        }
    }

    /// The file's size, known already: the metadata is then read without
    /// a `statx`. A wrong size gives a wrong footer, hence an error.
    ///
    /// ```
    /// use uring_positioned_io::{ParquetFileReader, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// let size = file.len().await?;
    /// let _reader = ParquetFileReader::new(file).with_file_size(size);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn with_file_size(mut self, size: u64) -> ParquetFileReader {
        self.size = Some(size);
        self
    }

    /// How many bytes of the file's end to read first when reading the
    /// metadata (`ParquetMetaDataReader::with_prefetch_hint`): large
    /// enough for the footer, one read instead of two.
    ///
    /// ```
    /// use uring_positioned_io::{ParquetFileReader, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// let _reader = ParquetFileReader::new(file).with_metadata_size_hint(64 << 10);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn with_metadata_size_hint(mut self, hint: usize) -> ParquetFileReader {
        self.metadata_size_hint = Some(hint);
        self
    }

    /// The file handle.
    ///
    /// ```
    /// use uring_positioned_io::{ParquetFileReader, UringContext};
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let ctx = UringContext::new(vec![tempfile::tempfile()?])?;
    /// assert_eq!(ParquetFileReader::new(ctx.file(0)?).file().fid(), ctx.file_id(0)?);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    #[must_use]
    pub fn file(&self) -> &UringFile {
        &self.file
    }
}

fn range_len(range: &Range<u64>) -> io::Result<usize> {
    let len = range.end.checked_sub(range.start).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("ParquetFileReader: the range {range:?} ends before it starts"),
        )
    })?;
    usize::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("ParquetFileReader: the range {range:?} is too long to read into memory"),
        )
    })
}

impl AsyncFileReader for ParquetFileReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        match range_len(&range) {
            Ok(len) => self
                .file
                .read_exact_at_bytes(len, range.start)
                .map_err(ParquetError::from)
                .boxed(),
            Err(e) => futures::future::ready(Err(e.into())).boxed(),
        }
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        self.file
            .read_ranges_bytes(ranges)
            .map_err(ParquetError::from)
            .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        async move {
            let size = match self.size {
                Some(size) => size,
                None => self.file.len().await?,
            };
            let metadata = ParquetMetaDataReader::new()
                .with_prefetch_hint(self.metadata_size_hint)
                .with_arrow_reader_options(options)
                .load_and_finish(&mut *self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

impl fmt::Debug for ParquetFileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParquetFileReader")
            .field("file", &self.file)
            .field("size", &self.size)
            .field("metadata_size_hint", &self.metadata_size_hint)
            .finish()
    }
}
