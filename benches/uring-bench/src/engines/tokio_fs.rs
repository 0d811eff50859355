//! `tokio-fs`: what tokio users do today — `spawn_blocking` + pread, which is
//! how `tokio::fs` performs file I/O — from `depth` tasks on a multi-thread
//! runtime with `workers` workers (blocking pool sized to `depth`).

use super::{read_loop, run_tokio_tasks, tokio_runtime, CellSpec, Measured};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let files = Arc::new(spec.open_files()?);
    let rt = tokio_runtime(Some(spec.workers), spec.depth)?;
    let m = run_tokio_tasks(spec, &rt, super::WindowHooks::default(), |w, stop| {
        let files = files.clone();
        async move {
            let read = |t: super::Target, mut buf: crate::buf::AlignedBlock| {
                let files = files.clone();
                async move {
                    tokio::task::spawn_blocking(move || {
                        let r = files[t.file as usize].read_at(&mut buf[..], t.offset());
                        (r, buf)
                    })
                    .await
                    .unwrap_or_else(|e| {
                        (
                            Err(std::io::Error::other(e)),
                            crate::buf::AlignedBlock::new(),
                        )
                    })
                }
            };
            read_loop(read, w, &stop).await
        }
    });
    rt.shutdown_background();
    m
}
