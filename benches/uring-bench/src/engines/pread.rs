//! `pread`: one OS thread per read in flight, each calling pread(2).

use super::{run_threads, CellSpec, Measured};
use std::os::unix::fs::FileExt;

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let files = spec.open_files()?;
    run_threads(spec, |t, buf| {
        files[t.file as usize].read_at(&mut buf[..], t.offset())
    })
}
