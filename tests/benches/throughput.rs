//! Throughput and memory of the engine, in one run so the figures compare as ratios.
//!
//! ```text
//! cargo bench -p idem-suite --bench throughput            # full run
//! IDEM_BENCH_SCALE=0.1 cargo bench -p idem-suite --bench throughput   # a quick look
//! ```
//!
//! Everything runs on one core (a current-thread tokio runtime). "first" = a new key per call
//! (claim, run, mark); "replay" = the same key again (claim finds SUCCEEDED, decode snapshot).

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use idem::{Call, IdemError, MemoryStore, SqliteStore, idempotent};

mod support;
use support::{Table, median, r3, rate};

/// The allocator underneath: mimalloc, as high-throughput services commonly link; build with
/// `RUSTFLAGS="--cfg idem_bench_system_alloc"` to measure on the platform's malloc instead.
#[cfg(not(idem_bench_system_alloc))]
use mimalloc::MiMalloc as Inner;
#[cfg(idem_bench_system_alloc)]
use std::alloc::System as Inner;

/// Counts live heap bytes, to report memory per stored record.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { Inner.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { Inner.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { Inner.realloc(ptr, layout, new_size) }
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

/// `by_hand` with the heartbeat off: what the default heartbeat (a timer beside the body) costs.
async fn by_hand_no_heartbeat(store: &MemoryStore, k: u64) -> Result<u64, IdemError> {
    Call::new("BENCH", &k)
        .ttl(idem::DEFAULT_TTL)
        .lease(idem::DEFAULT_LEASE)
        .no_heartbeat()
        .run(store, async { Ok(black_box(k)) })
        .await
}

/// The memory store's design floor: what a hand-written in-process dedup table does per call, with
/// no lease, expiry, fence, fingerprint, span or metric. A first execution inserts a pending slot
/// under the lock, runs the body, encodes its value as JSON and stores it; a replay finds the slot
/// and decodes the JSON.
#[derive(Default)]
struct DedupMap(std::sync::Mutex<std::collections::HashMap<String, Option<Vec<u8>>>>);

async fn by_floor(map: &DedupMap, k: u64) -> Result<u64, IdemError> {
    let key = k.to_string();
    {
        let mut slots = map.0.lock().unwrap();
        match slots.get(&key) {
            Some(Some(json)) => return Ok(serde_json::from_slice(json).unwrap()),
            Some(None) => {
                return Err(IdemError::InProgress {
                    retry_after: Duration::ZERO,
                });
            }
            None => slots.insert(key.clone(), None),
        };
    }
    let value = async { black_box(k) }.await;
    let json = serde_json::to_vec(&value).unwrap();
    map.0.lock().unwrap().insert(key, Some(json));
    Ok(value)
}

/// The memory store's restated floor: a hand-written in-process dedup table that keeps the
/// contract's minimum and nothing more: a record has a status, a fence (one more per claim of
/// the key, never repeated), a lease end and an expiry, read against a clock on every call (the
/// wall clock at start plus a monotonic clock since, as the memory store reads it). A first
/// execution claims under the lock (a missing or expired record, or a FAILED one, or a PROCESSING
/// one whose lease ended), runs the body, encodes its value as JSON and marks the record under the
/// lock only if its fence is still the claim's; a replay finds a live SUCCEEDED record and decodes
/// its JSON. No span, metric, fingerprint, key validation, envelope, heartbeat or recovery points.
struct LeasedMap {
    slots: std::sync::Mutex<std::collections::HashMap<String, Leased>>,
    epoch: Instant,
    epoch_ms: i64,
}

struct Leased {
    done: bool,
    fence: u64,
    lease_until: i64,
    expire_at: i64,
    json: Vec<u8>,
}

impl Default for LeasedMap {
    fn default() -> Self {
        LeasedMap {
            slots: Default::default(),
            epoch: Instant::now(),
            epoch_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64,
        }
    }
}

impl LeasedMap {
    fn now_ms(&self) -> i64 {
        self.epoch_ms + self.epoch.elapsed().as_millis() as i64
    }
}

async fn by_restated(map: &LeasedMap, k: u64) -> Result<u64, IdemError> {
    const LEASE_MS: i64 = 30_000;
    const TTL_MS: i64 = 86_400_000;
    let key = k.to_string();
    let fence = {
        let now = map.now_ms();
        let mut slots = map.slots.lock().unwrap();
        match slots.get_mut(&key) {
            Some(r) if r.expire_at > now || r.lease_until > now => {
                if r.done {
                    return Ok(serde_json::from_slice(&r.json).unwrap());
                }
                if r.lease_until > now {
                    return Err(IdemError::InProgress {
                        retry_after: Duration::from_millis((r.lease_until - now) as u64),
                    });
                }
                r.fence += 1;
                r.lease_until = now + LEASE_MS;
                r.expire_at = r.expire_at.max(r.lease_until);
                r.fence
            }
            Some(r) => {
                r.fence += 1;
                r.done = false;
                r.lease_until = now + LEASE_MS;
                r.expire_at = now + TTL_MS;
                r.json.clear();
                r.fence
            }
            None => {
                slots.insert(
                    key.clone(),
                    Leased {
                        done: false,
                        fence: 1,
                        lease_until: now + LEASE_MS,
                        expire_at: now + TTL_MS,
                        json: Vec::new(),
                    },
                );
                1
            }
        }
    };
    let value = async { black_box(k) }.await;
    let json = serde_json::to_vec(&value).unwrap();
    let now = map.now_ms();
    let mut slots = map.slots.lock().unwrap();
    match slots.get_mut(&key) {
        Some(r) if r.fence == fence && !r.done => {
            r.done = true;
            r.json = json;
            r.expire_at = r.expire_at.max(now + TTL_MS);
            Ok(value)
        }
        _ => Err(IdemError::LeaseLost { attempt: 1 }),
    }
}

/// The raw loop: one connection, the statements of a hand-written dedup table, no idem. Returns
/// (INSERT + UPDATE per key, one SELECT per key) in calls/s.
async fn raw_sqlite(path: std::path::PathBuf, calls: u64) -> (f64, f64) {
    use idem::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use idem::sqlx::{self, ConnectOptions, Row};
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .connect()
        .await
        .unwrap();
    for ddl in SqliteStore::MIGRATIONS {
        sqlx::raw_sql(ddl).execute(&mut conn).await.unwrap();
    }
    let t = Instant::now();
    for k in 0..calls {
        let key = k.to_string();
        sqlx::query(
            "INSERT INTO idem_record (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
             lease_until, created_at, updated_at, expire_at) VALUES (?1, ?2, 'PROCESSING', 1, ?3, NULL, \
             NULL, ?3, ?3, ?3, ?3)",
        )
        .bind("BENCH")
        .bind(&key)
        .bind(k as i64)
        .execute(&mut conn)
        .await
        .unwrap();
        let snapshot = serde_json::to_vec(&k).unwrap();
        sqlx::query(
            "UPDATE idem_record SET status = 'SUCCEEDED', result = ?3 WHERE biz_type = ?1 AND idem_key = ?2",
        )
        .bind("BENCH")
        .bind(&key)
        .bind(snapshot)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let first = ops_per_sec(calls, t.elapsed());
    let t = Instant::now();
    for k in 0..calls {
        let row = sqlx::query(
            "SELECT status, result FROM idem_record WHERE biz_type = ?1 AND idem_key = ?2",
        )
        .bind("BENCH")
        .bind((k % 1024).to_string())
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let value: Vec<u8> = row.get(1);
        black_box(serde_json::from_slice::<u64>(&value).unwrap());
    }
    (first, ops_per_sec(calls, t.elapsed()))
}

/// Times `calls` first executions (keys `0..calls`), then `calls` replays on 1,024 of those keys:
/// `(first, replay)` in calls/s.
async fn first_then_replays(calls: u64, call: impl AsyncFn(u64) -> u64) -> (f64, f64) {
    let t = Instant::now();
    for k in 0..calls {
        black_box(call(k).await);
    }
    let first = ops_per_sec(calls, t.elapsed());
    let t = Instant::now();
    for k in 0..calls {
        black_box(call(k % 1024).await);
    }
    (first, ops_per_sec(calls, t.elapsed()))
}

fn ops_per_sec(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64()
}

fn main() {
    let scale = support::scale();
    let n = |base: u64| ((base as f64 * scale) as u64).max(100);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rounds = 7;
    let allocator = if cfg!(idem_bench_system_alloc) {
        "system malloc"
    } else {
        "mimalloc"
    };
    println!("idem throughput (one core, median of rounds; scale {scale}; {allocator})\n");
    let mut memory = Table::new(
        "memory",
        &["memory store, one core", "calls/s, ratio or bytes"],
    );
    let mut sqlite = Table::new(
        "sqlite",
        &["SQLite file, one connection", "calls/s or ratio"],
    );

    // IDEM_BENCH_ONLY=macro|named|hand|hand-nobeat|floor|restated: one loop of 100k first executions, for
    // instruction counting under `valgrind --tool=callgrind` (`…-replay`: 100k calls on 1,024 keys);
    // IDEM_BENCH_ONLY=sqlite: the SQLite rows only (`sqlite-idem`, `sqlite-raw`: one side, for callgrind).
    let only = std::env::var("IDEM_BENCH_ONLY").ok();
    let sqlite_only = only.as_deref() == Some("sqlite");
    if let Some(side) = only.as_deref().and_then(|o| o.strip_prefix("sqlite-")) {
        // IDEM_BENCH_ONLY=sqlite-idem|sqlite-raw: 2,000 first executions then 2,000 replays on a
        // fresh SQLite file, one side only, for instruction counting.
        let path = std::env::temp_dir().join(format!("idem-bench-{}.db", std::process::id()));
        rt.block_on(async {
            if side == "raw" {
                raw_sqlite(path.clone(), 2_000).await;
            } else {
                let store = SqliteStore::open(&path).await.unwrap();
                store.migrate().await.unwrap();
                for k in 0..4_000u64 {
                    let r: Result<u64, IdemError> = Call::new("BENCH", &(k % 2_000))
                        .run(&store, async { Ok(k) })
                        .await;
                    r.unwrap();
                }
            }
        });
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        return;
    }
    if let Some(only) = only.filter(|o| o != "sqlite") {
        rt.block_on(async {
            let store = MemoryStore::new();
            let floor = DedupMap::default();
            let restated = LeasedMap::default();
            idem::register_store("bench_mem", MemoryStore::new());
            // `…-replay`: the same loop on 1,024 keys, so all but the first 1,024 calls replay.
            let (only, keys) = match only.strip_suffix("-replay") {
                Some(mode) => (mode, 1024),
                None => (only.as_str(), u64::MAX),
            };
            for k in 0..100_000u64 {
                let k = k % keys;
                match only {
                    "macro" => via_macro(&store, k).await.unwrap(),
                    "named" => via_macro_named(k).await.unwrap(),
                    "hand-nobeat" => by_hand_no_heartbeat(&store, k).await.unwrap(),
                    "floor" => by_floor(&floor, k).await.unwrap(),
                    "restated" => by_restated(&restated, k).await.unwrap(),
                    _ => by_hand(&store, k).await.unwrap(),
                };
            }
        });
        return;
    }
    rt.block_on(async {
        if !sqlite_only {
            // Memory store: first executions and replays, by hand.
            let calls = n(1_000_000);
            let mut first = Vec::new();
            let mut replay = Vec::new();
            let mut presized = Vec::new();
            for _ in 0..rounds {
                let store = MemoryStore::new().with_capacity(calls as usize);
                let t = Instant::now();
                for k in 0..calls {
                    by_hand(&store, k).await.unwrap();
                }
                presized.push(ops_per_sec(calls, t.elapsed()));
            }
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
            memory.row(["memory: first execution".to_owned(), rate(median(first))]);
            memory.row([
                "memory: first execution, map pre-sized".to_owned(),
                rate(median(presized)),
            ]);
            memory.row(["memory: replay".to_owned(), rate(median(replay))]);

            // Against the design floor (`by_floor`): rounds alternate which runs first, the ratio
            // is taken per round, then the median.
            let calls = n(200_000);
            let (mut first_ratio, mut replay_ratio) = (Vec::new(), Vec::new());
            let (mut floor_first, mut floor_replay) = (Vec::new(), Vec::new());
            for round in 0..rounds * 2 {
                let time_floor = async || {
                    let map = DedupMap::default();
                    first_then_replays(calls, async |k| by_floor(&map, k).await.unwrap()).await
                };
                let time_idem = async || {
                    let store = MemoryStore::new();
                    first_then_replays(calls, async |k| by_hand(&store, k).await.unwrap()).await
                };
                let (i, f) = if round % 2 == 0 {
                    let i = time_idem().await;
                    (i, time_floor().await)
                } else {
                    let f = time_floor().await;
                    (time_idem().await, f)
                };
                first_ratio.push(i.0 / f.0);
                replay_ratio.push(i.1 / f.1);
                floor_first.push(f.0);
                floor_replay.push(f.1);
            }
            memory.row([
                "memory floor: first execution".to_owned(),
                rate(median(floor_first)),
            ]);
            memory.row([
                "memory floor: replay".to_owned(),
                rate(median(floor_replay)),
            ]);
            memory.row([
                "ratio memory first execution / floor".to_owned(),
                r3(median(first_ratio)),
            ]);
            memory.row([
                "ratio memory replay / floor".to_owned(),
                r3(median(replay_ratio)),
            ]);

            // Against the restated floor (`by_restated`: the contract's minimum of expiry, lease
            // and fence), the same way.
            let (mut first_ratio, mut replay_ratio) = (Vec::new(), Vec::new());
            let (mut restated_first, mut restated_replay) = (Vec::new(), Vec::new());
            for round in 0..rounds * 2 {
                let time_restated = async || {
                    let map = LeasedMap::default();
                    first_then_replays(calls, async |k| by_restated(&map, k).await.unwrap()).await
                };
                let time_idem = async || {
                    let store = MemoryStore::new();
                    first_then_replays(calls, async |k| via_macro(&store, k).await.unwrap()).await
                };
                let (i, f) = if round % 2 == 0 {
                    let i = time_idem().await;
                    (i, time_restated().await)
                } else {
                    let f = time_restated().await;
                    (time_idem().await, f)
                };
                first_ratio.push(i.0 / f.0);
                replay_ratio.push(i.1 / f.1);
                restated_first.push(f.0);
                restated_replay.push(f.1);
            }
            memory.row([
                "restated floor: first execution".to_owned(),
                rate(median(restated_first)),
            ]);
            memory.row([
                "restated floor: replay".to_owned(),
                rate(median(restated_replay)),
            ]);
            memory.row([
                "ratio #[idempotent] first / restated floor".to_owned(),
                r3(median(first_ratio)),
            ]);
            memory.row([
                "ratio #[idempotent] replay / restated floor".to_owned(),
                r3(median(replay_ratio)),
            ]);

            // Macro path against the same engine call written by hand: many short rounds, the order
            // alternating, each round's ratio taken on its own, then the median of the ratios.
            let calls = n(100_000);
            let ratio_rounds = 21;
            let (mut first_ratio, mut replay_ratio, mut named_ratio) =
                (Vec::new(), Vec::new(), Vec::new());
            let (mut hand_ops, mut macro_ops) = (Vec::new(), Vec::new());
            for round in 0..ratio_rounds {
                let base = 10_000_000 + round as u64 * calls;
                let time_hand = |keys: std::ops::Range<u64>| async move {
                    let store = MemoryStore::new();
                    let t = Instant::now();
                    for k in keys.clone() {
                        by_hand(&store, k).await.unwrap();
                    }
                    let first = ops_per_sec(calls, t.elapsed());
                    let t = Instant::now();
                    for k in keys {
                        by_hand(&store, k).await.unwrap();
                    }
                    (first, ops_per_sec(calls, t.elapsed()))
                };
                let time_macro = |keys: std::ops::Range<u64>| async move {
                    let store = MemoryStore::new();
                    let t = Instant::now();
                    for k in keys.clone() {
                        via_macro(&store, k).await.unwrap();
                    }
                    let first = ops_per_sec(calls, t.elapsed());
                    let t = Instant::now();
                    for k in keys {
                        via_macro(&store, k).await.unwrap();
                    }
                    (first, ops_per_sec(calls, t.elapsed()))
                };
                let keys = base..base + calls;
                let (hand, mac) = if round % 2 == 0 {
                    let h = time_hand(keys.clone()).await;
                    (h, time_macro(keys).await)
                } else {
                    let m = time_macro(keys.clone()).await;
                    (time_hand(keys).await, m)
                };
                first_ratio.push(mac.0 / hand.0);
                replay_ratio.push(mac.1 / hand.1);
                hand_ops.push(hand.0);
                macro_ops.push(mac.0);
                idem::register_store("bench_mem", MemoryStore::new());
                // Look the new store up once, so the previous round's store is dropped (from this
                // thread's lookup cache) before the clock starts.
                drop(idem::store("bench_mem"));
                let t = Instant::now();
                for k in base..base + calls {
                    via_macro_named(k).await.unwrap();
                }
                named_ratio.push(ops_per_sec(calls, t.elapsed()) / hand.0);
            }
            memory.row([
                "memory: first execution, by hand".to_owned(),
                rate(median(hand_ops)),
            ]);
            memory.row([
                "memory: first execution, #[idempotent]".to_owned(),
                rate(median(macro_ops)),
            ]);
            memory.row([
                "ratio macro / hand, first execution".to_owned(),
                r3(median(first_ratio)),
            ]);
            memory.row([
                "ratio macro / hand, replay".to_owned(),
                r3(median(replay_ratio)),
            ]);
            memory.row([
                "ratio macro (store by name) / hand, first".to_owned(),
                r3(median(named_ratio)),
            ]);
        }
        // SQLite file store (WAL, synchronous=NORMAL) against a raw sqlx loop of the statements a
        // hand-written dedup table would run, on one connection to a file with the same settings:
        // first execution = INSERT + UPDATE, replay = one SELECT. Rounds alternate which runs
        // first; the ratio is taken per round, then the median.
        let calls = n(20_000);
        let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut first, mut replay) = (Vec::new(), Vec::new());
        let (mut raw_first, mut raw_replay) = (Vec::new(), Vec::new());
        let (mut first_ratio, mut replay_ratio) = (Vec::new(), Vec::new());
        for round in 0..7 {
            let time_idem = async |path: std::path::PathBuf| {
                let store = SqliteStore::open(path).await.unwrap();
                store.migrate().await.unwrap();
                let t = Instant::now();
                for k in 0..calls {
                    let r: Result<u64, IdemError> =
                        Call::new("BENCH", &k).run(&store, async { Ok(k) }).await;
                    r.unwrap();
                }
                let first = ops_per_sec(calls, t.elapsed());
                let t = Instant::now();
                for k in 0..calls {
                    let r: Result<u64, IdemError> = Call::new("BENCH", &(k % 1024))
                        .run(&store, async { Ok(k) })
                        .await;
                    r.unwrap();
                }
                (first, ops_per_sec(calls, t.elapsed()))
            };
            let idem_path = dir.join(format!("idem{round}.db"));
            let raw_path = dir.join(format!("raw{round}.db"));
            let (i, r) = if round % 2 == 0 {
                let i = time_idem(idem_path).await;
                (i, raw_sqlite(raw_path, calls).await)
            } else {
                let r = raw_sqlite(raw_path, calls).await;
                (time_idem(idem_path).await, r)
            };
            first.push(i.0);
            replay.push(i.1);
            raw_first.push(r.0);
            raw_replay.push(r.1);
            first_ratio.push(i.0 / r.0);
            replay_ratio.push(i.1 / r.1);
        }
        let _ = std::fs::remove_dir_all(&dir);
        sqlite.row([
            "sqlite file: first execution".to_owned(),
            rate(median(first)),
        ]);
        sqlite.row(["sqlite file: replay".to_owned(), rate(median(replay))]);
        sqlite.row([
            "raw sqlx: INSERT + UPDATE".to_owned(),
            rate(median(raw_first)),
        ]);
        sqlite.row(["raw sqlx: one SELECT".to_owned(), rate(median(raw_replay))]);
        sqlite.row([
            "ratio sqlite first execution / raw".to_owned(),
            r3(median(first_ratio)),
        ]);
        sqlite.row([
            "ratio sqlite replay / raw".to_owned(),
            r3(median(replay_ratio)),
        ]);

        sqlite.emit();
        if sqlite_only {
            return;
        }
        // Memory per record in the memory store.
        let records = n(200_000);
        let store = MemoryStore::new();
        let before = LIVE.load(Ordering::Relaxed);
        for k in 0..records {
            by_hand(&store, 1_000_000_000 + k).await.unwrap();
        }
        let bytes = LIVE.load(Ordering::Relaxed) - before;
        memory.row([
            "memory store: heap bytes per record".to_owned(),
            rate(bytes as f64 / records as f64),
        ]);
        drop(store);
        memory.emit();
    });
}
