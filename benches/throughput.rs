//! Throughput and memory of the engine, in one run so the figures compare as ratios.
//!
//! ```text
//! cargo bench --bench throughput            # full run
//! IDEM_BENCH_SCALE=0.1 cargo bench --bench throughput   # a quick look
//! ```
//!
//! Everything runs on one core (a current-thread tokio runtime). "first" = a new key per call
//! (claim, run, mark); "replay" = the same key again (claim finds SUCCEEDED, decode snapshot).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use idem::{Call, IdemError, MemoryStore, SqliteStore, idempotent};

/// Counts live heap bytes, to report memory per stored record.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[idempotent(biz = "BENCH", key = "k", store = store)]
async fn via_macro(store: &MemoryStore, k: u64) -> Result<u64, IdemError> {
    Ok(black_box(k))
}

#[idempotent(biz = "BENCH", key = "k", store = "bench_mem")]
async fn via_macro_named(k: u64) -> Result<u64, IdemError> {
    Ok(black_box(k))
}

async fn by_hand(store: &MemoryStore, k: u64) -> Result<u64, IdemError> {
    Call::new("BENCH", &k)
        .ttl(idem::DEFAULT_TTL)
        .lease(idem::DEFAULT_LEASE)
        .run(store, async { Ok(black_box(k)) })
        .await
}

fn ops_per_sec(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let scale: f64 = std::env::var("IDEM_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let n = |base: u64| ((base as f64 * scale) as u64).max(100);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rounds = 7;
    println!("idem throughput (one core, {rounds} rounds, median; scale {scale})\n");
    println!("{:<44} {:>14}", "scenario", "calls/s");

    rt.block_on(async {
        // Memory store: first executions and replays, by hand.
        let calls = n(1_000_000);
        let mut first = Vec::new();
        let mut replay = Vec::new();
        for _ in 0..rounds {
            let store = MemoryStore::new();
            let t = Instant::now();
            for k in 0..calls {
                by_hand(&store, k).await.unwrap();
            }
            first.push(ops_per_sec(calls, t.elapsed()));
            let t = Instant::now();
            for k in 0..calls {
                by_hand(&store, k % 1024).await.unwrap();
            }
            replay.push(ops_per_sec(calls, t.elapsed()));
        }
        println!("{:<44} {:>14.0}", "memory: first execution", median(first));
        println!("{:<44} {:>14.0}", "memory: replay", median(replay));

        // Macro path against the same engine call written by hand, interleaved.
        let calls = n(500_000);
        let (mut hand, mut mac, mut named) = (Vec::new(), Vec::new(), Vec::new());
        idem::register_store("bench_mem", MemoryStore::new());
        for round in 0..rounds {
            let base = round as u64 * calls * 10;
            let store = MemoryStore::new();
            let t = Instant::now();
            for k in base..base + calls {
                by_hand(&store, k).await.unwrap();
            }
            hand.push(ops_per_sec(calls, t.elapsed()));
            let store = MemoryStore::new();
            let t = Instant::now();
            for k in base..base + calls {
                via_macro(&store, k).await.unwrap();
            }
            mac.push(ops_per_sec(calls, t.elapsed()));
            let t = Instant::now();
            for k in base..base + calls {
                via_macro_named(k).await.unwrap();
            }
            named.push(ops_per_sec(calls, t.elapsed()));
        }
        let (hand, mac, named) = (median(hand), median(mac), median(named));
        println!("{:<44} {:>14.0}", "memory: first execution, by hand", hand);
        println!(
            "{:<44} {:>14.0}",
            "memory: first execution, #[idempotent]", mac
        );
        println!(
            "{:<44} {:>14.0}",
            "memory: first execution, #[idempotent] by name", named
        );
        println!("{:<44} {:>14.3}", "ratio macro / hand", mac / hand);
        println!(
            "{:<44} {:>14.3}",
            "ratio macro by name / hand",
            named / hand
        );

        // SQLite file store (WAL, synchronous=NORMAL).
        let calls = n(20_000);
        let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut first, mut replay) = (Vec::new(), Vec::new());
        for round in 0..3 {
            let store = SqliteStore::open(dir.join(format!("b{round}.db")))
                .await
                .unwrap();
            store.migrate().await.unwrap();
            let t = Instant::now();
            for k in 0..calls {
                let r: Result<u64, IdemError> =
                    Call::new("BENCH", &k).run(&store, async { Ok(k) }).await;
                r.unwrap();
            }
            first.push(ops_per_sec(calls, t.elapsed()));
            let t = Instant::now();
            for k in 0..calls {
                let r: Result<u64, IdemError> = Call::new("BENCH", &(k % 1024))
                    .run(&store, async { Ok(k) })
                    .await;
                r.unwrap();
            }
            replay.push(ops_per_sec(calls, t.elapsed()));
        }
        let _ = std::fs::remove_dir_all(&dir);
        println!(
            "{:<44} {:>14.0}",
            "sqlite file: first execution",
            median(first)
        );
        println!("{:<44} {:>14.0}", "sqlite file: replay", median(replay));

        // Memory per record in the memory store.
        let records = n(200_000);
        let store = MemoryStore::new();
        let before = LIVE.load(Ordering::Relaxed);
        for k in 0..records {
            by_hand(&store, 1_000_000_000 + k).await.unwrap();
        }
        let bytes = LIVE.load(Ordering::Relaxed) - before;
        println!(
            "{:<44} {:>14.0}",
            "memory store: heap bytes per record",
            bytes as f64 / records as f64
        );
        drop(store);
    });
}
