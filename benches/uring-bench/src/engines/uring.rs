//! `uring`: this crate (uring-positioned-io) on a multi-thread tokio runtime
//! with `workers` workers (or a current_thread runtime) and `depth` tasks
//! awaiting `ctx.read`.

use super::{read_loop, run_tokio_tasks, tokio_runtime, AtEnd, CellSpec, Measured};
use crate::kinds::OnOff;
use std::sync::{Arc, Mutex, PoisonError};
use uring_positioned_io::UringContext;

/// The `uring` engine's context over `files` (its options from
/// `spec.uring`), built inside `rt`; `name` prefixes the error.
pub fn build_context(
    spec: &CellSpec<'_>,
    rt: &tokio::runtime::Runtime,
    files: Vec<std::fs::File>,
    name: &str,
) -> Result<UringContext, String> {
    let o = &spec.uring;
    let _guard = rt.enter();
    let mut b = UringContext::builder()
        .ring_entries(o.entries)
        .max_in_flight(o.max_in_flight.unwrap_or(spec.depth.max(1024)));
    if let Some(r) = o.rings {
        b = b.rings(r);
    }
    if let Some(i) = o.inline {
        b = b.inline_nowait(i == OnOff::On);
    }
    if let Some(s) = o.inline_stretch {
        b = b.inline_stretch(s);
    }
    if let Some(n) = o.shallow_batch {
        b = b.shallow_batch(n);
    }
    b.build(files)
        .map_err(|e| format!("{name}: cannot build UringContext: {e}"))
}

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let files = spec.open_files()?;
    let o = &spec.uring;
    let rt = tokio_runtime((!o.current_thread).then_some(spec.workers), 64)?;
    let ctx = build_context(spec, &rt, files, "uring")?;
    let backend = ctx.backend().clone();
    let s0 = ctx.stats();
    // the context's counters when the measured window ends (taken by the
    // cell's watchdog thread; the syscall window, if any, comes after)
    let at_window_end = Arc::new(Mutex::new(None));
    let at_end: AtEnd = {
        let (ctx, slot) = (ctx.clone(), at_window_end.clone());
        Box::new(move || *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(ctx.stats()))
    };
    let res = run_tokio_tasks(
        spec,
        &rt,
        super::WindowHooks {
            at_start: None,
            at_end: Some(at_end),
        },
        |w, stop| {
            let ctx = ctx.clone();
            async move {
                let ctx = &ctx;
                let read = |t: super::Target, mut buf: crate::buf::AlignedBlock| async move {
                    let r = ctx.read(t.file, t.offset(), &mut buf[..]).await;
                    (r, buf)
                };
                read_loop(read, w, &stop).await
            }
        },
    );
    rt.block_on(ctx.shutdown());
    drop(ctx);
    rt.shutdown_background();
    let mut m = res?;
    let s1 = at_window_end
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .ok_or("uring: the measured window ended without the context's stats")?;
    let enters = s1.enters.saturating_sub(s0.enters);
    let submitted = s1.submitted.saturating_sub(s0.submitted);
    let inline = s1.inline_completed.saturating_sub(s0.inline_completed);
    m.enters = Some(enters);
    m.driver_polls = Some(s1.driver_polls.saturating_sub(s0.driver_polls));
    if enters > 0 {
        m.reads_per_enter = Some(submitted as f64 / enters as f64);
    }
    m.inline_completed = Some(inline);
    m.notes.push(format!("backend {:?}", backend.kind));
    if let Some(why) = backend.reason {
        m.notes.push(format!("backend reason: {why}"));
    }
    m.notes.push(format!(
        "ring: {submitted} submitted, {enters} io_uring_enter calls, {inline} completed inline"
    ));
    Ok(m)
}
