//! `uring`: this crate (uring-positioned-io) on a multi-thread tokio runtime
//! with `workers` workers (or a current_thread runtime) and `depth` tasks
//! awaiting `ctx.read`.

use super::{read_loop, run_tokio_tasks, tokio_runtime, CellSpec, Measured};
use crate::cli::OnOff;
use uring_positioned_io::UringContext;

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let files = spec.open_files()?;
    let o = &spec.uring;
    let rt = tokio_runtime((!o.current_thread).then_some(spec.workers), 64)?;
    let ctx = {
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
        b.build(files)
            .map_err(|e| format!("uring: cannot build UringContext: {e}"))?
    };
    let backend = ctx.backend().clone();
    let s0 = ctx.stats();
    let res = run_tokio_tasks(spec, &rt, |w, stop| {
        let ctx = ctx.clone();
        async move {
            let ctx = &ctx;
            let read = |t: super::Target, mut buf: crate::buf::AlignedBlock| async move {
                let r = ctx.read(t.file, t.offset(), &mut buf[..]).await;
                (r, buf)
            };
            read_loop(read, w, &stop).await
        }
    });
    let s1 = ctx.stats();
    rt.block_on(ctx.shutdown());
    drop(ctx);
    rt.shutdown_background();
    let mut m = res?;
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
