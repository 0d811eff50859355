//! Batches of owned reads submitted together ([`UringContext::read_batch`]).
//!
//! A batch is its reads' own futures (the `read_owned` state machine, so the
//! page-cache fast path, chunking, routing and cancellation are the same),
//! polled together under a [`Deferral`]: while they are polled, a read that
//! needs the kernel only queues its SQE; when all have been polled, each
//! ring with queued SQEs submits them at once — one `io_uring_enter` (or one
//! driver wake-up) per ring for the whole batch instead of one per read.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::buf::IoBufMut;
use crate::context::{Backend, UringContext};
use crate::read::UringReadOwnedFuture;
use crate::ring::Deferral;

/// The future of [`UringContext::read_batch`]: every read's result and
/// buffer, in the order the reads were given.
///
/// Dropping it drops every read not yet complete, as dropping each
/// `read_owned` future would (their buffers stay with the context until the
/// kernel is done with them, and their reads are cancelled).
#[must_use = "futures do nothing unless polled"]
pub struct ReadBatch<'a, B: IoBufMut> {
    ctx: &'a UringContext,
    reads: Vec<Option<UringReadOwnedFuture<'a, B>>>,
    done: Vec<Option<(io::Result<usize>, B)>>,
    left: usize,
}

impl<'a, B: IoBufMut> ReadBatch<'a, B> {
    pub(crate) fn new(ctx: &'a UringContext, reads: Vec<UringReadOwnedFuture<'a, B>>) -> Self {
        let left = reads.len();
        ReadBatch {
            ctx,
            done: reads.iter().map(|_| None).collect(),
            reads: reads.into_iter().map(Some).collect(),
            left,
        }
    }
}

impl<B: IoBufMut> fmt::Debug for ReadBatch<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadBatch")
            .field("reads", &self.reads.len())
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl<B: IoBufMut> Future for ReadBatch<'_, B> {
    type Output = Vec<(io::Result<usize>, B)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        {
            // Reads queued while this is alive are submitted together when
            // it drops (also if a read's poll panics).
            let _together = match &this.ctx.inner.backend {
                Backend::Uring(rings) => Some(Deferral::new(rings)),
                Backend::Fallback => None,
            };
            for (slot, out) in this.reads.iter_mut().zip(this.done.iter_mut()) {
                let Some(read) = slot else { continue };
                if let Poll::Ready(r) = Pin::new(read).poll(cx) {
                    *out = Some(r);
                    *slot = None;
                    this.left -= 1;
                }
            }
        }
        if this.left > 0 {
            return Poll::Pending;
        }
        Poll::Ready(
            this.done
                .iter_mut()
                .map(|r| r.take().expect("every read of the batch is done"))
                .collect(),
        )
    }
}
