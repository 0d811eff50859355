//! Exact-length reads into `bytes::Bytes` (feature `bytes`): the kernel
//! reads into a `Vec`'s storage, which becomes the `Bytes` without a copy.

use std::future::Future;
use std::io;
use std::ops::Range;

use bytes::Bytes;

use crate::buf::{IoBufMut, Slice};
use crate::file::UringFile;

/// A window of exactly `len` bytes of a new `Vec` (an owned read fills
/// exactly its window), or an error saying why there is none.
fn window(len: u64, offset: u64) -> io::Result<Slice<Vec<u8>>> {
    let too_long = || {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("a read of {len} bytes at {offset}: cannot allocate its buffer"),
        )
    };
    let len = usize::try_from(len).map_err(|_| too_long())?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len).map_err(|_| too_long())?;
    Ok(buf.slice(..len))
}

impl UringFile {
    /// Reads exactly `len` bytes at `offset` into a new `bytes::Bytes`
    /// (feature `bytes`): one owned read (continued if short) into a
    /// buffer of exactly `len` bytes, which becomes the `Bytes` without a
    /// copy. The future is `'static` (it holds the handle); the `Bytes`
    /// owns its memory and outlives the handle and the context.
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` if the file ends before `offset + len`;
    /// `OutOfMemory` if `len` bytes cannot be allocated; otherwise as
    /// [`read_exact_at_owned`](Self::read_exact_at_owned).
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"header|payload", 0).await?;
    /// let payload: bytes::Bytes = tokio::spawn(file.read_exact_at_bytes(7, 7)).await??;
    /// assert_eq!(payload, "payload");
    /// let err = file.read_exact_at_bytes(8, 7).await.unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_exact_at_bytes(
        &self,
        len: usize,
        offset: u64,
    ) -> impl Future<Output = io::Result<Bytes>> + Send + 'static {
        let file = self.clone();
        async move {
            if len == 0 {
                // Nothing to read (an owned read of 0 bytes is refused).
                return Ok(Bytes::new());
            }
            let win = window(len as u64, offset)?;
            let (res, win) = file.read_exact_at_owned(win, offset).await;
            res?;
            Ok(Bytes::from(win.into_inner()))
        }
    }

    /// Reads every byte range of `ranges` into its own `bytes::Bytes`
    /// (feature `bytes`), all in one batch ([`read_batch`](Self::read_batch):
    /// one submission for them all), each without a copy, in the order
    /// given; a read the kernel returns short is continued. Ranges may
    /// overlap or repeat. The future is `'static`.
    ///
    /// # Errors
    ///
    /// The first error in range order: `InvalidInput` for a range that ends
    /// before it starts (before any read), `UnexpectedEof` for a range the
    /// file ends inside, `OutOfMemory` for a range too long to allocate;
    /// otherwise as [`read_batch`](Self::read_batch).
    ///
    /// ```
    /// # use uring_positioned_io::UringContext;
    /// # fn main() -> std::io::Result<()> {
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// let file = UringContext::new(vec![tempfile::tempfile()?])?.file(0)?;
    /// file.write_all_at(b"0123456789", 0).await?;
    /// let parts = file.read_ranges_bytes([0..2, 5..9, 3..3]).await?;
    /// assert_eq!(parts, ["01", "5678", ""]);
    /// let err = file.read_ranges_bytes([0..2, 8..11]).await.unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    /// # Ok(())
    /// # })
    /// # }
    /// ```
    pub fn read_ranges_bytes(
        &self,
        ranges: impl IntoIterator<Item = Range<u64>>,
    ) -> impl Future<Output = io::Result<Vec<Bytes>>> + Send + 'static {
        let file = self.clone();
        let ranges: Vec<Range<u64>> = ranges.into_iter().collect();
        async move {
            let mut reads = Vec::with_capacity(ranges.len());
            for r in &ranges {
                let len = r.end.checked_sub(r.start).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("read_ranges_bytes: the range {r:?} ends before it starts"),
                    )
                })?;
                // Empty ranges are not read (an owned read of 0 bytes is
                // refused): they are empty `Bytes`.
                if len > 0 {
                    reads.push((window(len, r.start)?, r.start));
                }
            }
            let mut done = file.read_batch(reads).await.into_iter();
            let mut out = Vec::with_capacity(ranges.len());
            for r in ranges {
                if r.is_empty() {
                    out.push(Bytes::new());
                    continue;
                }
                let Some((res, win)) = done.next() else {
                    return Err(io::Error::other(
                        "read_ranges_bytes: a range has no read (a bug in the crate)",
                    ));
                };
                let n = res?;
                let len = win.end();
                let mut buf = win.into_inner();
                if n < len {
                    // Short (or the end of the file, which this says).
                    let rest = buf.slice(n..len);
                    let (res, rest) = file.read_exact_at_owned(rest, r.start + n as u64).await;
                    res?;
                    buf = rest.into_inner();
                }
                out.push(Bytes::from(buf));
            }
            Ok(out)
        }
    }
}
