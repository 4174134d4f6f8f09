//! A measurement, not a check: memory, snapshot size, WAL size and restart time of the engine
//! as operations accumulate over a fixed set of accounts while the horizon keeps only the newest
//! keys. Prints figures; asserts nothing about time. Run with
//! `cargo test --release -p spot-core --test growth -- --ignored --nocapture`
//! (`GROWTH_OPS`, default 2000000; `GROWTH_ACCOUNTS`, default 100000; `GROWTH_KEEP`, default
//! 500000 newest keys kept by the horizon).

use std::time::Instant;

use rust_decimal::Decimal;
use spot_core::assets::Assets;
use spot_core::protocol::{Request, Response};
use spot_core::storage::FailPoints;
use spot_core::ulid;
use spot_core::wal::{self, StorageOptions};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_mib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096 / (1 << 20)
}

#[test]
#[ignore = "a measurement; run explicitly"]
fn growth_figures() {
    spot_core::init_tracing();
    let ops = env("GROWTH_OPS", 2_000_000);
    let accounts = env("GROWTH_ACCOUNTS", 100_000);
    let keep = env("GROWTH_KEEP", 500_000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let opts = StorageOptions::default();
    // Keys are one ms apart, starting far enough back that the newest is not in the future.
    let t0 = ulid::now_ms() - ops - 1000;
    let (engine, w) = spot_core::open_engine_with(Assets::builtin(), &dir, &opts).unwrap();
    let (handle, thread) = wal::spawn_committer(engine, w, FailPoints::default()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let started = Instant::now();
        let mut i = 0u64;
        while i < ops {
            let mut pending = Vec::with_capacity(4096);
            for _ in 0..4096.min(ops - i) {
                let key = ulid::format(ulid::from_parts(t0 + i, u128::from(i)));
                pending.push(
                    handle
                        .submit(Request::deposit(
                            key,
                            1 + i % accounts,
                            "USDT",
                            Decimal::ONE,
                        ))
                        .await
                        .unwrap(),
                );
                i += 1;
            }
            for p in pending {
                assert!(matches!(p.await.unwrap(), Response::Applied { .. }));
            }
            if i % 100_000 < 4096 {
                handle
                    .call(Request::AdvanceHorizon {
                        before_ms: (t0 + i).saturating_sub(keep),
                    })
                    .await
                    .unwrap();
                let last = match handle.call(Request::Status {}).await.unwrap() {
                    Response::Ok { core: Some(c), .. } => c.last_seq,
                    other => panic!("{other:?}"),
                };
                handle
                    .call(Request::Retain { after_seq: last })
                    .await
                    .unwrap();
            }
            if i % 1_000_000 < 4096 || i == ops {
                let s = match handle.call(Request::Status {}).await.unwrap() {
                    Response::Ok { core: Some(c), .. } => c,
                    other => panic!("{other:?}"),
                };
                println!(
                    "ops={i} rss_mib={} remembered={} accounts={} snapshot_bytes={} wal_bytes={} \
                     wal_segments={} elapsed_s={}",
                    rss_mib(),
                    s.remembered,
                    s.accounts,
                    s.snapshot_bytes,
                    s.wal_bytes,
                    s.wal_segments,
                    started.elapsed().as_secs()
                );
            }
        }
    });
    drop(handle);
    thread.join().unwrap();
    let started = Instant::now();
    let (engine, _w) = spot_core::open_engine_with(Assets::builtin(), &dir, &opts).unwrap();
    println!(
        "restart_ms={} last_seq={} remembered={}",
        started.elapsed().as_millis(),
        engine.last_seq(),
        engine.remembered()
    );
    // The two halves of a snapshot's cost, on the final state.
    let pos = spot_core::snapshot::WalPosition {
        segment: 1,
        offset: 0,
    };
    let started = Instant::now();
    let bytes = spot_core::snapshot::encode(&engine, pos);
    let encode_ms = started.elapsed().as_millis();
    let started = Instant::now();
    let (decoded, _) = spot_core::snapshot::decode(&bytes, Assets::builtin()).unwrap();
    println!(
        "snapshot_encode_ms={encode_ms} snapshot_decode_ms={} bytes={}",
        started.elapsed().as_millis(),
        bytes.len()
    );
    assert_eq!(decoded, engine);
    let mut reused = bytes;
    let started = Instant::now();
    spot_core::snapshot::encode_into(&engine, pos, &mut reused);
    println!(
        "snapshot_encode_reused_buffer_ms={}",
        started.elapsed().as_millis()
    );
}
