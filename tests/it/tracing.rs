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
