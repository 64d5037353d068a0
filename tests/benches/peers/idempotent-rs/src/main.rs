//! The `idempotent` crate (0.3.0) on the workload of idem's `benches/redis.rs`: its `ValkeyStore`
//! on the same Redis, a small serde result (a string and two integers), sequentially (one task on
//! a current-thread runtime) and with 64 tasks (multi-thread runtime, 2 workers), one
//! `ConnectionManager` (the store's) shared by the tasks.
//!
//! "first" = a new key per call: `try_insert` (Processing, with a fingerprint) answers `Claimed`,
//! the body runs, `complete` stores the serialized result under the fencing token (two round
//! trips). "replay" = the same keys again: `try_insert` answers `Exists(Completed)`, the
//! fingerprint is checked and the cached response decoded (one round trip).
//!
//! Prints `calls/s idempotent-rs <mode> <workload> <value>` (median over rounds), as idem's bench
//! does. Environment: IDEM_REDIS_URL, IDEM_BENCH_ROUNDS, IDEM_BENCH_SCALE, IDEM_BENCH_ONLY=seq|c64.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idempotent::entry::ExistingEntry;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::valkey::ValkeyStore;
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    id: String,
    amount: u64,
    seq: u64,
}

fn receipt(k: u64) -> Receipt {
    Receipt {
        id: format!("order-{k}"),
        amount: k * 100 + 7,
        seq: k,
    }
}

const TTL: Duration = Duration::from_secs(3600);

/// One call for key `k`: claim, or replay what is stored.
async fn call(store: &ValkeyStore, k: u64) -> Receipt {
    let raw = k.to_string();
    let key = IdempotencyKey::new(format!("BENCH:{raw}")).unwrap();
    let fingerprint = DefaultFingerprintStrategy.compute("BENCH", raw.as_bytes());
    let entry = IdempotencyEntry::new(fingerprint, TTL);
    match store.try_insert(&key, entry.clone()).await.unwrap() {
        InsertResult::Claimed { fencing_token } => {
            let receipt = receipt(k);
            let response = CachedResponse {
                status_code: 200,
                metadata: Metadata::default(),
                body: Bytes::from(serde_json::to_vec(&receipt).unwrap()),
            };
            store
                .complete(&key, entry.complete(response), fencing_token)
                .await
                .unwrap();
            receipt
        }
        InsertResult::Exists(ExistingEntry::Completed(done)) => {
            assert!(done.fingerprint_matches(fingerprint), "payload mismatch");
            serde_json::from_slice(&done.response().body).unwrap()
        }
        InsertResult::Exists(ExistingEntry::Processing(_)) => panic!("key {k} in progress"),
    }
}

/// Calls `keys` split over `tasks` tasks, all at once; calls/s.
async fn timed(store: &Arc<ValkeyStore>, keys: std::ops::Range<u64>, tasks: u64) -> f64 {
    let per = (keys.end - keys.start) / tasks;
    let t = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let store = store.clone();
            let start = keys.start + i * per;
            tokio::spawn(async move {
                for k in start..start + per {
                    let r = call(&store, k).await;
                    assert_eq!(black_box(r).seq, k);
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    (per * tasks) as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

async fn measure(url: &str, prefix: &str, tasks: u64, calls: u64, rounds: usize) -> (f64, f64) {
    let client = redis::Client::open(url).unwrap();
    let store = Arc::new(
        ValkeyStore::with_prefix(client.clone(), Some(prefix))
            .await
            .unwrap(),
    );
    let warm = (calls / 5).max(tasks);
    timed(&store, 1_000_000_000..1_000_000_000 + warm, tasks).await;
    let (mut first, mut replay) = (Vec::new(), Vec::new());
    for round in 0..rounds as u64 {
        let keys = round * calls..(round + 1) * calls;
        first.push(timed(&store, keys.clone(), tasks).await);
        replay.push(timed(&store, keys, tasks).await);
    }
    // Leave nothing behind (the records would expire within the TTL anyway).
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pattern = format!("{prefix}-*");
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !batch.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&batch)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    (median(first), median(replay))
}

fn main() {
    let url =
        std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let env = |name: &str| std::env::var(name).ok();
    let scale: f64 = env("IDEM_BENCH_SCALE")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rounds: usize = env("IDEM_BENCH_ROUNDS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(9);
    let only = env("IDEM_BENCH_ONLY");
    let calls = |base: u64| ((base as f64 * scale) as u64).max(64) / 64 * 64;
    let run_id = std::process::id();

    let seq_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reachable = seq_rt.block_on(async {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let ping = async {
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(2), ping).await {
            Ok(r) => r.map(drop),
            Err(_) => Err("no answer within 2 s".to_owned()),
        }
    });
    if let Err(e) = reachable {
        println!("skipped: Redis at {url} is unreachable ({e})");
        return;
    }
    if only.as_deref() != Some("c64") {
        let (first, replay) = seq_rt.block_on(measure(
            &url,
            &format!("rbp{run_id}seq"),
            1,
            calls(5_000),
            rounds,
        ));
        println!("calls/s idempotent-rs seq first {first:.0}");
        println!("calls/s idempotent-rs seq replay {replay:.0}");
    }
    drop(seq_rt);
    if only.as_deref() != Some("seq") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (first, replay) = rt.block_on(measure(
            &url,
            &format!("rbp{run_id}c64"),
            64,
            calls(20_000),
            rounds,
        ));
        println!("calls/s idempotent-rs c64 first {first:.0}");
        println!("calls/s idempotent-rs c64 replay {replay:.0}");
    }
}
