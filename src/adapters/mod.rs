//! Adapters from a [`UringFile`](crate::UringFile) to the I/O traits of the
//! ecosystem: a cursor implementing `tokio::io::{AsyncRead, AsyncSeek,
//! AsyncWrite}` ([`UringFileCursor`]).
//!
//! # Files
//!
//! | file | what |
//! |---|---|
//! | `cursor.rs` | [`UringFileCursor`]: one owned op in flight across polls, its buffer reused |
//! 
mod cursor;

pub use cursor::UringFileCursor;
