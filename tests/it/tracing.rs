//! One-time decisions are logged through `tracing` (feature `tracing`):
//! `cargo test --features tracing --test it tracing::`.

use crate::common;

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use uring_positioned_io::{BackendChoice, UringContext};

/// Keeps (level, target, message and fields) of every event.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(Level, String, String)>>>);

struct Text(String);
impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        let meta = event.metadata();
        self.0
            .lock()
            .unwrap()
            .push((*meta.level(), meta.target().to_owned(), text.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn the_fallback_is_logged() {
    let _shared = common::shared();
    let capture = Capture::default();
    let file = tempfile::tempfile().unwrap();
    tracing::subscriber::with_default(capture.clone(), || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ctx = UringContext::builder()
                .backend(BackendChoice::Fallback)
                .build(vec![file])
                .unwrap();
            ctx.shutdown().await;
        });
    });
    let events = capture.0.lock().unwrap().clone();
    assert!(
        events
            .iter()
            .any(|(level, target, text)| *level == Level::INFO
                && target == "uring_positioned_io"
                && text.contains("pread fallback")),
        "no fallback event in {events:?}"
    );
}

/// Keeps every span's name, fields at creation and fields recorded later.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(String, String)>>>);

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut text = Text(String::new());
        attrs.record(&mut text);
        let mut spans = self.0.lock().unwrap();
        spans.push((attrs.metadata().name().to_owned(), text.0));
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, id: &Id, values: &Record<'_>) {
        let mut text = Text(String::new());
        values.record(&mut text);
        let mut spans = self.0.lock().unwrap();
        if let Some(s) = spans.get_mut(id.into_u64() as usize - 1) {
            s.1.push_str(&text.0);
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Every op gets a `TRACE` span `op` with its name, file, offset, length
/// and priority, and at its end the bytes it moved or its error: a read,
/// a write, an fdatasync, a read past a bad id, on both backends.
#[test]
fn every_op_has_a_span() {
    let _shared = common::shared();
    for backend in [BackendChoice::IoUring, BackendChoice::Fallback] {
        // tracing caches each callsite's interest process-wide: a callsite
        // that another test's thread registers while this subscriber is
        // being installed can keep the interest of the subscribers it saw
        // before (none), and then no span is made at all. That is tracing's
        // race, not the crate's: a run that made no `op` span is repeated.
        let mut spans = Vec::new();
        for _ in 0..5 {
            spans = run_ops(backend);
            if spans.iter().any(|(n, _)| n == "op") {
                break;
            }
        }
        let ops: Vec<&(String, String)> = spans.iter().filter(|(n, _)| n == "op").collect();
        let find = |what: &str| {
            ops.iter()
                .find(|(_, f)| f.contains(what))
                .unwrap_or_else(|| panic!("{backend:?}: no span with {what} in {ops:?}"))
                .1
                .clone()
        };
        let read = find("op=\"read\"");
        for field in [
            "fid=0",
            "offset=4000",
            "len=100",
            "priority=Latency",
            "bytes=100",
        ] {
            assert!(
                read.contains(field),
                "{backend:?}: read span {read} lacks {field}"
            );
        }
        let write = find("op=\"write\"");
        for field in ["offset=8192", "len=10", "priority=Background", "bytes=10"] {
            assert!(
                write.contains(field),
                "{backend:?}: write span {write} lacks {field}"
            );
        }
        assert!(find("op=\"fdatasync\"").contains("bytes=0"), "{backend:?}");
        let bad = find("fid=7 ");
        assert!(bad.contains("error="), "{backend:?}: {bad}");
    }
}

/// Runs a read, a write, an fdatasync and a read past a bad id on
/// `backend` under a [`Spans`] subscriber: the spans it kept.
fn run_ops(backend: BackendChoice) -> Vec<(String, String)> {
    use uring_positioned_io::Priority;
    let spans = Spans::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, vec![3u8; 8192]).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    tracing::subscriber::with_default(spans.clone(), || {
        // Another test's thread may have cached this crate's callsites
        // as uninteresting while this subscriber was being set up.
        tracing::callsite::rebuild_interest_cache();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let Ok(ctx) = UringContext::builder().backend(backend).build(vec![file]) else {
                println!("SKIPPED: no io_uring here");
                return;
            };
            let mut buf = [0u8; 100];
            assert_eq!(ctx.read(0, 4000, &mut buf).await.unwrap(), 100);
            let f = ctx.file(0).unwrap().with_priority(Priority::Background);
            f.write_all_at(&[9u8; 10], 8192).await.unwrap();
            f.sync_data().await.unwrap();
            assert!(ctx.read(7, 0, &mut buf).await.is_err());
            ctx.shutdown().await;
        });
    });
    let kept = spans.0.lock().unwrap().clone();
    kept
}
