//! `uring-raw`: the lower bound for ring overhead. One thread, one ring
//! (io-uring crate), registered (fixed) files, `depth` reads kept in flight:
//! reap every completion, verify it, refill its slot, and submit the whole
//! batch with a single io_uring_enter that also waits for the next completion.

use super::{CellSpec, Clock, Measured, Target, Worker};
use crate::buf::AlignedBlock;
use crate::stop::{Phase, Stop};
use crate::verify::BLOCK;
use io_uring::{opcode, types, IoUring};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

struct Slot {
    buf: AlignedBlock,
    target: Target,
    started: Instant,
}

pub fn run(spec: &CellSpec<'_>) -> Result<Measured, String> {
    let err = |what: &str, e: std::io::Error| format!("engine uring-raw: {what}: {e}");
    let files = spec.open_files()?;
    let entries = (spec.depth.next_power_of_two() as u32).clamp(8, 32768);
    let mut ring = IoUring::new(entries).map_err(|e| err("io_uring_setup", e))?;
    let fds: Vec<i32> = files.iter().map(AsRawFd::as_raw_fd).collect();
    ring.submitter()
        .register_files(&fds)
        .map_err(|e| err("register_files", e))?;

    let mut w = Worker::new(spec.workload(), 0);
    let stop = Arc::new(Stop::default());
    let mut slots: Vec<Slot> = (0..spec.depth)
        .map(|_| Slot {
            buf: AlignedBlock::new(),
            target: Target { file: 0, block: 0 },
            started: Instant::now(),
        })
        .collect();
    let (submitter, mut sq, mut cq) = ring.split();
    let push = |sq: &mut io_uring::SubmissionQueue<'_>, slot: &mut Slot, idx: usize, t: Target| {
        slot.target = t;
        slot.started = Instant::now();
        let e = opcode::Read::new(types::Fixed(t.file), slot.buf.as_mut_ptr(), BLOCK as u32)
            .offset(t.offset())
            .build()
            .user_data(idx as u64);
        // SAFETY: the buffer belongs to the slot, which is neither reused nor
        // dropped until this entry's completion has been reaped (we drain all
        // in-flight reads before returning); the fixed file stays registered.
        unsafe { sq.push(&e) }.expect("submission queue has room for every slot");
    };

    let clock = Clock::start(spec, &stop);
    for (i, slot) in slots.iter_mut().enumerate() {
        let t = w.next();
        push(&mut sq, slot, i, t);
    }
    sq.sync();
    let mut in_flight = spec.depth;
    let mut enters = 0u64;
    let mut failure = None;
    while in_flight > 0 {
        match submitter.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                // Reads may still be in flight: the kernel owns their buffers,
                // so we must not free them. Fail loudly instead.
                panic!("engine uring-raw: io_uring_enter failed with reads in flight: {e}");
            }
        }
        // reads/enter is a figure of the measured window
        if stop.phase() == Phase::Measure {
            enters += 1;
        }
        // learn how far the kernel consumed the SQ before refilling it
        sq.sync();
        cq.sync();
        for cqe in &mut cq {
            let idx = cqe.user_data() as usize;
            let res = cqe.result();
            let slot = &mut slots[idx];
            let r = if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res))
            } else {
                Ok(res as usize)
            };
            if failure.is_none() {
                if let Err(e) = w.complete(slot.target, r, &slot.buf, slot.started, stop.phase()) {
                    failure = Some(e.clone());
                    stop.fail(e);
                }
            }
            if stop.stopped() {
                in_flight -= 1;
            } else {
                let t = w.next();
                push(&mut sq, slot, idx, t);
            }
        }
        sq.sync();
    }
    let mut m = clock.finish(vec![w], &stop)?;
    if enters > 0 {
        m.reads_per_enter = Some(m.reads as f64 / enters as f64);
    }
    m.notes.push(format!(
        "{enters} io_uring_enter calls in the measured window, ring of {entries} entries"
    ));
    drop(files);
    Ok(m)
}
