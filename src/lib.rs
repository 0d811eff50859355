//! API skeleton; the implementation lands in the following commits.
#![allow(missing_docs, unused_variables, dead_code)]
use std::fs::File;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u32);
impl From<u32> for FileId {
    fn from(v: u32) -> Self {
        FileId(v)
    }
}
impl FileId {
    pub fn index(self) -> u32 {
        self.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    IoUring,
    Fallback,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    #[default]
    Auto,
    IoUring,
    Fallback,
}
#[derive(Debug, Clone)]
pub struct BackendInfo {
    pub kind: BackendKind,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub submitted: u64,
    pub completed: u64,
    pub enters: u64,
    pub inline_completed: u64,
    pub in_flight: u64,
}
impl Stats {
    pub fn reads_per_enter(&self) -> f64 {
        0.0
    }
}

/// # Safety
/// The pointer must stay valid and stable for `bytes_total` bytes while the value lives, even if moved.
pub unsafe trait IoBufMut: Send + 'static {
    fn stable_mut_ptr(&mut self) -> *mut u8;
    fn bytes_total(&self) -> usize;
}
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

#[derive(Debug)]
pub struct AlignedBuf;
impl AlignedBuf {
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        todo!()
    }
}

#[derive(Debug, Default)]
pub struct Builder;
impl Builder {
    pub fn ring_entries(self, n: u32) -> Self {
        self
    }
    pub fn rings(self, n: usize) -> Self {
        self
    }
    pub fn max_in_flight(self, n: usize) -> Self {
        self
    }
    pub fn sqpoll(self, idle: Option<Duration>) -> Self {
        self
    }
    pub fn coop_taskrun(self, on: bool) -> Self {
        self
    }
    pub fn buffer_pool(self, count: usize, size: usize) -> Self {
        self
    }
    pub fn inline_nowait(self, on: bool) -> Self {
        self
    }
    pub fn backend(self, b: BackendChoice) -> Self {
        self
    }
    pub fn build(self, files: Vec<File>) -> io::Result<UringContext> {
        todo!()
    }
}

#[derive(Debug, Clone)]
pub struct UringContext;
impl UringContext {
    pub fn new(files: Vec<File>) -> io::Result<Self> {
        todo!()
    }
    pub fn builder() -> Builder {
        Builder
    }
    pub fn read<'a>(
        &'a self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &'a mut [u8],
    ) -> UringReadFuture<'a> {
        todo!()
    }
    pub async fn read_exact(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        todo!()
    }
    pub async fn read_owned<B: IoBufMut>(
        &self,
        fid: impl Into<FileId>,
        offset: u64,
        buf: B,
    ) -> (io::Result<usize>, B) {
        todo!()
    }
    pub fn register_file(&self, file: File) -> io::Result<FileId> {
        todo!()
    }
    pub fn unregister_file(&self, fid: impl Into<FileId>) -> io::Result<()> {
        todo!()
    }
    pub fn backend(&self) -> &BackendInfo {
        todo!()
    }
    pub fn stats(&self) -> Stats {
        todo!()
    }
    pub async fn shutdown(&self) {
        todo!()
    }
}

#[derive(Debug)]
pub struct UringReadFuture<'a>(std::marker::PhantomData<&'a ()>);
impl Future for UringReadFuture<'_> {
    type Output = io::Result<usize>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        todo!()
    }
}
