//! Differential tests: every read path of the library (`read`, `read_exact`,
//! `read_owned` into a `Vec`'s capacity over a few bytes already there (the
//! read writes from its start) and into a window of a full buffer, `read_exact_owned`, `read_owned_static`)
//! against `pread(2)` (std's `FileExt::read_at`) and against the
//! known position-derived file content, on random files, offsets and lengths
//! (EOF edges, past EOF, empty buffers), for both backends and both runtime
//! flavours; plus large reads bigger than any internal bounce buffer, reads
//! over partly cached files (inline prefix + ring remainder), and reads
//! larger than the kernel's per-call limit (0x7ffff000) on a sparse file.

use crate::common;

use std::io;

use common::{Flavor, TestFile};
use futures::future::join_all;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use uring_positioned_io::{BackendChoice, IoBufMut, UringContext};

const FILL: u8 = 0xEE;

#[derive(Clone, Copy, Debug)]
enum Method {
    Read,
    ReadExact,
    /// Into a `Vec`'s capacity, from its start, over a few bytes already
    /// there.
    ReadOwned,
    /// Into a window of a full `Vec` (`slice(..)`): written from its start.
    ReadOwnedSlice,
    ReadExactOwned,
    /// The `'static` future, spawned.
    ReadOwnedStatic,
}

#[derive(Clone, Copy, Debug)]
enum Off {
    Zero,
    /// uniformly inside `0..=len`
    Inside(u64),
    /// `len - k` (saturating)
    BeforeEof(u64),
    Eof,
    /// `len + k`
    PastEof(u64),
}

#[derive(Clone, Copy, Debug)]
enum Len {
    Fixed(usize),
    Random(usize),
    /// exactly up to EOF
    ToEof,
    /// EOF + k
    BeyondEof(usize),
}

#[derive(Clone, Debug)]
struct Op {
    file: usize,
    off: Off,
    len: Len,
    method: Method,
}

#[derive(Clone, Debug)]
struct Case {
    sizes: Vec<u64>,
    ops: Vec<Op>,
    concurrent: bool,
    ring_entries: u32,
    inline_nowait: bool,
    pool: Option<(usize, usize)>,
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(4095),
        Just(4096),
        Just(4097),
        Just(8191),
        Just(65536 + 1),
        1u64..9000,
        1u64..300 * 1024,
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let off = prop_oneof![
        Just(Off::Zero),
        any::<u64>().prop_map(Off::Inside),
        any::<u64>().prop_map(Off::Inside),
        (1u64..5000).prop_map(Off::BeforeEof),
        Just(Off::Eof),
        prop_oneof![Just(1u64), 1u64..10_000, Just(1 << 40)].prop_map(Off::PastEof),
    ];
    let len = prop_oneof![
        prop_oneof![
            Just(0usize),
            Just(1),
            Just(7),
            Just(4095),
            Just(4096),
            Just(4097),
            Just(65536),
            Just(65537)
        ]
        .prop_map(Len::Fixed),
        (0usize..70_000).prop_map(Len::Random),
        Just(Len::ToEof),
        (1usize..10_000).prop_map(Len::BeyondEof),
    ];
    let method = prop_oneof![
        Just(Method::Read),
        Just(Method::ReadExact),
        Just(Method::ReadOwned),
        Just(Method::ReadOwnedSlice),
        Just(Method::ReadExactOwned),
        Just(Method::ReadOwnedStatic),
    ];
    (0usize..4, off, len, method).prop_map(|(file, off, len, method)| Op {
        file,
        off,
        len,
        method,
    })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(size_strategy(), 1..4),
        prop::collection::vec(op_strategy(), 1..24),
        any::<bool>(),
        prop_oneof![Just(2u32), Just(8), Just(256)],
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some((2usize, 4096usize))),
            Just(Some((16, 65536)))
        ],
    )
        .prop_map(
            |(sizes, ops, concurrent, ring_entries, inline_nowait, pool)| Case {
                sizes,
                ops,
                concurrent,
                ring_entries,
                inline_nowait,
                pool,
            },
        )
}

/// Resolve an op against the actual file: (file index, offset, length).
fn resolve(op: &Op, files: &[TestFile]) -> (usize, u64, usize) {
    let fi = op.file % files.len();
    let size = files[fi].len;
    let off = match op.off {
        Off::Zero => 0,
        Off::Inside(x) => x % (size + 1),
        Off::BeforeEof(k) => size.saturating_sub(k),
        Off::Eof => size,
        Off::PastEof(k) => size + k,
    };
    let to_eof = size.saturating_sub(off) as usize;
    let len = match op.len {
        Len::Fixed(n) | Len::Random(n) => n,
        Len::ToEof => to_eof,
        Len::BeyondEof(k) => to_eof + k,
    };
    (fi, off, len)
}

/// Execute one read through `ctx` and compare it with pread and the pattern.
async fn run_op(
    ctx: &UringContext,
    file: &TestFile,
    fid: u32,
    method: Method,
    off: u64,
    len: usize,
) -> Result<(), String> {
    let want = file.expected(off, len);
    let reference = file.pread(off, len);
    if reference != want {
        return Err(format!(
            "reference pread disagrees with pattern (test bug?) @{off}+{len}"
        ));
    }
    let what = format!("{method:?} fid {fid} size {} off {off} len {len}", file.len);
    match method {
        Method::Read => {
            let mut buf = vec![FILL; len];
            let n = ctx
                .read(fid, off, &mut buf)
                .await
                .map_err(|e| format!("{what}: unexpected error {e}"))?;
            check_returned(&what, file, off, n, &want, &buf)?;
        }
        Method::ReadExact => {
            let mut buf = vec![FILL; len];
            let r = ctx.read_exact(fid, off, &mut buf).await;
            if want.len() == len {
                r.map_err(|e| format!("{what}: read_exact failed: {e}"))?;
                if buf != want {
                    return Err(format!(
                        "{what}: {}",
                        common::check_pattern(file.seed, off, &buf).unwrap_err()
                    ));
                }
            } else {
                match r {
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
                    other => {
                        return Err(format!(
                            "{what}: read_exact crossing EOF ({} available) gave {other:?}, want UnexpectedEof",
                            want.len()
                        ))
                    }
                }
            }
        }
        Method::ReadOwned | Method::ReadOwnedStatic => {
            // Bytes already in the buffer are overwritten from its start;
            // the read's length is the capacity.
            let mut buf = Vec::with_capacity(len);
            buf.extend(std::iter::repeat_n(FILL, len.min(3)));
            let (pre, cap) = (buf.len(), buf.capacity());
            let want = file.expected(off, cap);
            let (r, buf) = if matches!(method, Method::ReadOwned) {
                ctx.read_owned(fid, off, buf).await
            } else {
                tokio::spawn(ctx.read_owned_static(fid, off, buf))
                    .await
                    .map_err(|e| format!("{what}: task failed: {e}"))?
            };
            if cap == 0 {
                return refused(&what, r);
            }
            let n = r.map_err(|e| format!("{what}: unexpected error {e}"))?;
            if n != want.len() || buf.len() != pre.max(n) {
                return Err(format!(
                    "{what}: returned {n} (pread: {}), buffer len {} (want max({pre}, {n}))",
                    want.len(),
                    buf.len(),
                ));
            }
            check_returned(&what, file, off, n, &want, &buf)?;
        }
        Method::ReadOwnedSlice => {
            let (r, buf) = ctx.read_owned(fid, off, vec![FILL; len].slice(..)).await;
            if len == 0 {
                return refused(&what, r);
            }
            let n = r.map_err(|e| format!("{what}: unexpected error {e}"))?;
            let buf = buf.into_inner();
            if buf.len() != len {
                return Err(format!("{what}: returned buffer has len {}", buf.len()));
            }
            check_returned(&what, file, off, n, &want, &buf)?;
        }
        Method::ReadExactOwned => {
            let (r, buf) = ctx
                .read_exact_owned(fid, off, Vec::with_capacity(len))
                .await;
            let room = buf.capacity();
            if room == 0 {
                return refused(&what, r);
            }
            let want = file.expected(off, room);
            match r {
                Ok(()) if want.len() == room => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && want.len() < room => {}
                other => {
                    return Err(format!(
                        "{what}: read_exact_owned of {room} ({} available) gave {other:?}",
                        want.len()
                    ))
                }
            }
            // Either way the buffer holds every byte up to the end of file.
            check_returned(&what, file, off, buf.len(), &want, &buf)?;
        }
    }
    Ok(())
}

fn run_case(
    choice: BackendChoice,
    rt: &tokio::runtime::Runtime,
    case: &Case,
) -> Result<(), String> {
    let set = common::FileSet::new(
        common::mix64(case.sizes.len() as u64 ^ case.ops.len() as u64),
        &case.sizes,
    );
    let files = set.files.clone();
    rt.block_on(async {
        let ctx = common::build_ctx(choice, set.open_all(), |b| {
            let b = b
                .ring_entries(case.ring_entries)
                .inline_nowait(case.inline_nowait);
            match case.pool {
                Some((count, size)) => b.buffer_pool(count, size),
                None => b,
            }
        });
        let ops: Vec<_> = case
            .ops
            .iter()
            .map(|op| {
                let (fi, off, len) = resolve(op, &files);
                (fi, op.method, off, len)
            })
            .collect();
        let fut = async {
            if case.concurrent {
                let results =
                    join_all(ops.iter().map(|&(fi, m, off, len)| {
                        run_op(&ctx, &files[fi], fi as u32, m, off, len)
                    }))
                    .await;
                results.into_iter().collect::<Result<Vec<()>, String>>()?;
            } else {
                for &(fi, m, off, len) in &ops {
                    run_op(&ctx, &files[fi], fi as u32, m, off, len).await?;
                }
            }
            Ok::<(), String>(())
        };
        let r = tokio::time::timeout(std::time::Duration::from_secs(30), fut)
            .await
            .map_err(|_| "case timed out after 30 s (hang?)".to_string())?;
        r?;
        let left = common::wait_in_flight_zero(&ctx, std::time::Duration::from_secs(5)).await;
        if left != 0 {
            return Err(format!(
                "stats().in_flight = {left} after all reads completed"
            ));
        }
        Ok(())
    })
}

fn differential(choice: BackendChoice, flavor: Flavor, cases: u32) {
    common::watchdog(
        &format!("differential/{choice:?}/{flavor:?}"),
        150,
        move || {
            let rt = common::runtime(flavor);
            let config = Config {
                cases,
                failure_persistence: None,
                max_shrink_iters: 200,
                ..Config::default()
            };
            let mut runner = TestRunner::new(config);
            let result = runner.run(&case_strategy(), |case| {
                run_case(choice, &rt, &case).map_err(TestCaseError::fail)
            });
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
            if let Err(e) = result {
                panic!("{choice:?}/{flavor:?}: {e}");
            }
        },
    );
}

fn differential_multi_thread(choice: BackendChoice) {
    differential(choice, Flavor::Multi, 96);
}

fn differential_current_thread(choice: BackendChoice) {
    differential(choice, Flavor::Current, 64);
}

/// Reads of several MiB (bigger than any internal bounce / pool buffer),
/// at aligned and unaligned offsets, including ones that hit EOF.
fn large_reads(choice: BackendChoice) {
    let set = common::FileSet::new(0x1a3, &[5 << 20, (5 << 20) + 123]);
    let files = set.files.clone();
    let opened = set.open_all();
    common::run("large_reads", Flavor::Multi, 60, move || async move {
        let ctx = common::build_ctx(choice, opened, |b| b.buffer_pool(4, 65536));
        const LEN: usize = 3 << 20;
        for (fid, file) in files.iter().enumerate() {
            let fid = fid as u32;
            for off in [
                0,
                1,
                4095,
                4096,
                12345,
                file.len - LEN as u64,
                file.len - (1 << 20),
                file.len - 1,
                file.len,
            ] {
                let want = file.expected(off, LEN);
                assert_eq!(want, file.pread(off, LEN));

                let mut buf = vec![FILL; LEN];
                let n = ctx.read(fid, off, &mut buf).await.expect("large read");
                assert_eq!(
                    n,
                    want.len(),
                    "read fid {fid} @ {off}: length differs from pread"
                );
                assert!(buf[..n] == want[..], "read fid {fid} @ {off}: data differs");

                let (r, obuf) = ctx.read_owned(fid, off, vec![FILL; LEN].slice(..)).await;
                let n = r.expect("large read_owned");
                assert_eq!(
                    n,
                    want.len(),
                    "read_owned fid {fid} @ {off}: length differs from pread"
                );
                assert!(
                    obuf[..n] == want[..],
                    "read_owned fid {fid} @ {off}: data differs"
                );

                let mut ebuf = vec![FILL; LEN];
                let r = ctx.read_exact(fid, off, &mut ebuf).await;
                if want.len() == LEN {
                    r.expect("large read_exact");
                    assert!(ebuf == want, "read_exact fid {fid} @ {off}: data differs");
                } else {
                    assert_eq!(
                        r.expect_err("read_exact across EOF").kind(),
                        io::ErrorKind::UnexpectedEof
                    );
                }
            }
        }
        // A few of them concurrently.
        let futs = (0..8u64).map(|i| {
            let ctx = &ctx;
            let file = &files[(i % 2) as usize];
            async move {
                let off = i * 250_001;
                let mut buf = vec![0u8; LEN];
                ctx.read_exact((i % 2) as u32, off, &mut buf)
                    .await
                    .expect("concurrent large read_exact");
                common::check_pattern(file.seed, off, &buf).unwrap();
            }
        });
        join_all(futs).await;
        assert_eq!(
            common::wait_in_flight_zero(&ctx, std::time::Duration::from_secs(5)).await,
            0
        );
    });
}

/// Reads over files that are only partly in the page cache: the inline
/// RWF_NOWAIT fast path may return a prefix, and the rest must come from the
/// ring / blocking pool and land at the right place.
fn partially_cached_reads(choice: BackendChoice) {
    let set = common::FileSet::new(0x9a7, &[(2 << 20) + 777]);
    set.sync_all();
    let file = set.files[0].clone();
    let opened = set.open_all();
    common::run(
        "partially_cached_reads",
        Flavor::Multi,
        60,
        move || async move {
            let ctx = common::build_ctx(choice, opened, |b| {
                b.inline_nowait(true).buffer_pool(8, 16384)
            });
            let mut rng = common::Rng::new(0x9a7);
            for i in 0..300u64 {
                if i % 10 == 0 {
                    file.drop_cache();
                    // Warm a few random runs of pages.
                    for _ in 0..8 {
                        let off = rng.below(file.len / 4096) * 4096;
                        let _ = file.pread(off, rng.range(1, 16) as usize * 4096);
                    }
                }
                let off = if rng.chance(50) {
                    rng.below(file.len / 4096) * 4096
                } else {
                    rng.below(file.len)
                };
                let len = rng.range(1, 256 * 1024) as usize;
                let what = format!("iter {i} @ {off}+{len}");
                match i % 3 {
                    0 => {
                        let mut buf = vec![FILL; len];
                        let n = ctx
                            .read(0u32, off, &mut buf)
                            .await
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(n, file.expected(off, len).len(), "{what}: length");
                        if let Err(m) = common::check_pattern(file.seed, off, &buf[..n]) {
                            panic!("{what}: {m}");
                        }
                        assert!(
                            buf[n..].iter().all(|&b| b == FILL),
                            "{what}: wrote past the returned length"
                        );
                    }
                    1 => {
                        let (r, buf) = ctx.read_owned(0u32, off, Vec::with_capacity(len)).await;
                        let n = r.unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(n, file.expected(off, len).len(), "{what}: length");
                        if let Err(m) = common::check_pattern(file.seed, off, &buf[..n]) {
                            panic!("{what}: {m}");
                        }
                    }
                    _ => {
                        let mut buf = vec![FILL; len];
                        let r = ctx.read_exact(0u32, off, &mut buf).await;
                        if off + len as u64 <= file.len {
                            r.unwrap_or_else(|e| panic!("{what}: {e}"));
                            if let Err(m) = common::check_pattern(file.seed, off, &buf) {
                                panic!("{what}: {m}");
                            }
                        } else {
                            assert_eq!(
                                r.unwrap_err().kind(),
                                io::ErrorKind::UnexpectedEof,
                                "{what}"
                            );
                        }
                    }
                }
            }
            eprintln!("{choice:?}: {:?}", ctx.stats());
            assert_eq!(
                common::wait_in_flight_zero(&ctx, std::time::Duration::from_secs(5)).await,
                0
            );
            drop(set);
        },
    );
}

/// Linux transfers at most 0x7ffff000 bytes per read call, so a read bigger
/// than that is the one deterministic way to get a short read that is not at
/// EOF: `read` may return a prefix, `read_exact` must loop and fill it all.
/// Uses a sparse file (zeros) with patterned islands around the boundary.
/// Both backends run in one test, over one file, so the second run finds
/// the (zero) pages of the holes already cached.
#[test]
fn huge_read_sparse() {
    let _shared = common::shared();
    const MAX_RW: u64 = 0x7fff_f000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse");
    let len = (2u64 << 30) + 65536;
    let islands = [0u64, MAX_RW - 4096, MAX_RW - 3, len - 5000];
    let seed = 0xb16;
    {
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(len).unwrap();
        for &at in &islands {
            let mut chunk = vec![0u8; 4096.min((len - at) as usize)];
            common::fill_pattern(seed, at, &mut chunk);
            f.write_all_at(&chunk, at).unwrap();
        }
    }
    let byte_at = move |pos: u64| -> u8 {
        if islands.iter().any(|&at| pos >= at && pos < at + 4096) {
            common::pattern_byte(seed, pos)
        } else {
            0
        }
    };
    for choice in [BackendChoice::IoUring, BackendChoice::Fallback] {
        let file = std::fs::File::open(&path).unwrap();
        common::run("huge_read_sparse", Flavor::Multi, 120, move || async move {
            let ctx = common::build_ctx(choice, vec![file], |b| b);
            let check = |buf: &[u8], off: u64, n: usize, what: &str| {
                let mut positions: Vec<u64> = (0..n as u64).step_by(4093).collect();
                for &at in &islands {
                    positions.extend(
                        (at.saturating_sub(8)..at + 4104)
                            .filter(|p| *p >= off && *p < off + n as u64)
                            .map(|p| p - off),
                    );
                }
                positions.extend((n as u64).saturating_sub(16)..n as u64);
                for p in positions {
                    let got = buf[p as usize];
                    let want = byte_at(off + p);
                    assert_eq!(got, want, "{what}: byte at file offset {}", off + p);
                }
            };
            let size = (MAX_RW + 8192) as usize;
            let mut buf = vec![FILL; size];
            let n = ctx.read(0u32, 0, &mut buf).await.expect("huge read");
            assert!(n > 0 && n <= size, "huge read returned {n}");
            eprintln!("{choice:?}: read of {size} bytes returned {n}");
            check(&buf, 0, n, "read");
            if let Some(i) = buf[n..].iter().take(1 << 20).position(|&b| b != FILL) {
                panic!(
                    "huge read: byte {} past the returned {n} was modified",
                    n + i
                );
            }
            drop(buf);
            let mut buf = vec![FILL; size];
            ctx.read_exact(0u32, 1000, &mut buf)
                .await
                .expect("huge read_exact");
            check(&buf, 1000, size, "read_exact");
        });
    }
    drop(dir);
}

backend_tests!(
    differential_multi_thread,
    differential_current_thread,
    large_reads,
    partially_cached_reads
);

/// A read that returned `n` must equal pread's `want` exactly, and must not
/// have touched the buffer (pre-filled with `FILL`) past `n`.
/// An owned read into 0 bytes: `InvalidInput`, not a read of nothing.
fn refused<T: std::fmt::Debug>(what: &str, r: io::Result<T>) -> Result<(), String> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(()),
        other => Err(format!(
            "{what}: an owned read into 0 bytes gave {other:?}, want InvalidInput"
        )),
    }
}

fn check_returned(
    what: &str,
    file: &common::TestFile,
    off: u64,
    n: usize,
    want: &[u8],
    buf: &[u8],
) -> Result<(), String> {
    if n != want.len() {
        return Err(format!(
            "{what}: returned {n}, pread returned {}",
            want.len()
        ));
    }
    if buf[..n] != want[..] {
        return Err(format!(
            "{what}: {}",
            common::check_pattern(file.seed, off, &buf[..n]).unwrap_err()
        ));
    }
    if let Some(i) = buf[n..].iter().position(|&b| b != FILL) {
        return Err(format!(
            "{what}: byte {} past the returned length was modified",
            n + i
        ));
    }
    Ok(())
}
