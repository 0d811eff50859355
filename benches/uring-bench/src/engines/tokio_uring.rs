//! `tokio-uring`: the tokio-uring 0.5 crate on its own (single-thread)
//! runtime, `depth` tasks calling `read_at` with owned aligned buffers. Its
//! runtime is a current_thread tokio runtime with the time driver, so the
//! timer probe runs on it too.

use super::{read_loop, CellSpec, Clock, Measured, Worker};
use crate::probes;
use crate::stop::Stop;
use std::rc::Rc;
use std::sync::Arc;

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let std_files = spec.open_files()?;
    let wl = spec.workload();
    let entries = (spec.depth.next_power_of_two() as u32).clamp(256, 4096);
    let depth = spec.depth;
    // tokio_uring::start takes over the thread; run it on its own thread.
    std::thread::scope(|s| {
        s.spawn(move || {
            tokio_uring::builder().entries(entries).start(async move {
                let files: Rc<Vec<tokio_uring::fs::File>> =
                    Rc::new(std_files.into_iter().map(tokio_uring::fs::File::from_std).collect());
                let stop = Arc::new(Stop::default());
                let clock = Clock::start(spec, &stop);
                let probe = spec
                    .probes
                    .timer
                    .then(|| tokio_uring::spawn(probes::timer_probe(stop.clone())));
                let handles: Vec<_> = (0..depth)
                    .map(|id| {
                        let files = files.clone();
                        let stop = stop.clone();
                        tokio_uring::spawn(async move {
                            let files = &files;
                            let read = |t: super::Target, buf: crate::buf::AlignedBlock| async move {
                                files[t.file as usize].read_at(buf, t.offset()).await
                            };
                            read_loop(read, Worker::new(wl, id as u64), &stop).await
                        })
                    })
                    .collect();
                let mut workers = Vec::with_capacity(depth);
                for h in handles {
                    match h.await {
                        Ok(w) => workers.push(w),
                        Err(e) => stop.fail(format!("engine tokio-uring: task failed: {e}")),
                    }
                }
                let m = clock.finish(workers, &stop);
                let lateness = match probe {
                    Some(p) => p.await.ok(),
                    None => None,
                };
                let mut m = m?;
                m.timer_lateness = lateness;
                Ok(m)
            })
        })
        .join()
        .map_err(|_| "engine tokio-uring: runtime thread panicked".to_string())?
    })
}
