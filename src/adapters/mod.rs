//! Adapters from a [`UringFile`](crate::UringFile) to the I/O traits of the
//! ecosystem: a cursor implementing `tokio::io::{AsyncRead, AsyncSeek,
//! AsyncWrite}` ([`UringFileCursor`]), and, with the `bytes` feature,
//! exact-length reads into `bytes::Bytes` without a copy, and, with the
//! `parquet` feature, the `parquet` crate's `AsyncFileReader`
//! ([`ParquetFileReader`]).
//!
//! # Files
//!
//! | file | what |
//! |---|---|
//! | `cursor.rs` | [`UringFileCursor`]: one owned op in flight across polls, its buffer reused |
//! | `bytes_reads.rs` | `UringFile::read_exact_at_bytes` and `read_ranges_bytes` (feature `bytes`) |
//! | `parquet_reader.rs` | [`ParquetFileReader`]: the `parquet` crate's `AsyncFileReader` (feature `parquet`) |

#[cfg(feature = "bytes")]
mod bytes_reads;
mod cursor;
#[cfg(feature = "parquet")]
mod parquet_reader;

pub use cursor::UringFileCursor;
#[cfg(feature = "parquet")]
pub use parquet_reader::ParquetFileReader;
