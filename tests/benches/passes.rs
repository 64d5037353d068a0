//! Background passes at size: a sweep pass and a reconciler pass with 10^6 records present, of
//! which 1% are due (expired, or on Redis past their result ttl: Redis deletes expired records by
//! itself) and 1% stuck (PROCESSING with an ended lease), against the same passes over the due and
//! stuck records alone. A pass that costs what it finds takes about the same time and memory in
//! both; one that walks the store takes about 50 times more with the live records present.
//!
//! ```text
//! cargo bench -p idem-suite --bench passes --features sqlite,mysql,postgres,redis
//! IDEM_BENCH_RECORDS=100000 cargo bench -p idem-suite --bench passes --features sqlite,mysql,postgres,redis
//! IDEM_BENCH_ONLY=redis,memory cargo bench -p idem-suite --bench passes --features sqlite,mysql,postgres,redis
//! ```
//!
//! Stores: `memory`, `sqlite` (a file under the temp dir), `mariadb` (`IDEM_MYSQL_URL`),
//! `postgres` (`IDEM_PG_URL`), `redis` (`IDEM_REDIS_URL`); one that cannot be reached is skipped
//! with one line. The SQL tables and Redis keys are written directly (one statement or script per
//! chunk: 10^6 records through the API would take longer than the passes), in the layout the
//! stores write, and a table is `ANALYZE`d before its passes, as a production table is. The
//! memory store is filled through its API, under a test clock that moves past a lease every 1,000
//! records (they arrive over time) and past the due records at the end.
//!
//! A pass: the sweeper's `sweep_once` (batches of 1,000 until one is short), then
//! `Reconciler::reconcile_once` with a recover fn that answers "did not happen" (each stuck record
//! is taken over and marked FAILED: 2 store calls). Time is wall-clock; memory is the peak of
//! this process's live heap during the pass above what it held when the pass began (a counting
//! allocator), so a pass that collects keys shows it. Redis's and the databases' own memory is
//! not counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::sqlx::{self, AssertSqlSafe};
use idem::{Reconciler, Store, Sweeper};

mod support;
use support::{Table, now_ms};

/// Counts the live heap and its peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let grown = new_size - layout.size();
                let live = LIVE.fetch_add(grown, Ordering::Relaxed) + grown;
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const BIZ: &str = "BIG";
const SWEEP_BATCH: usize = 1000;
const RECONCILE_BATCH: usize = 200;

/// The shape of one run: how many records in all, how many due, how many stuck.
#[derive(Clone, Copy)]
struct Shape {
    live: u64,
    due: u64,
    stuck: u64,
}

/// What one pass cost.
struct Cost {
    time: Duration,
    peak: usize,
    done: u64,
}

async fn measured<F: Future<Output = u64>>(pass: F) -> Cost {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    let done = pass.await;
    let time = start.elapsed();
    Cost {
        time,
        peak: PEAK.load(Ordering::Relaxed).saturating_sub(base),
        done,
    }
}

async fn passes(store: Arc<dyn Store>, shape: Shape) -> (Cost, Cost) {
    // A connection in the pool first, as a running service has.
    store.load(BIZ, "none").await.unwrap();
    let sweeper = Sweeper::new(store.clone(), SWEEP_BATCH);
    let sweep = measured(async { sweeper.sweep_once().await.unwrap() }).await;
    let reconciler = Reconciler::new(store, RECONCILE_BATCH)
        .recover(BIZ, |_key: String| async { Ok::<Option<u8>, String>(None) })
        .unwrap();
    let reconcile = measured(async { reconciler.reconcile_once().await.unwrap().found }).await;
    assert_eq!(sweep.done, shape.due, "the sweep found every due record");
    assert_eq!(
        reconcile.done, shape.stuck,
        "the reconciler found every stuck record"
    );
    (sweep, reconcile)
}

fn wanted(name: &str) -> bool {
    std::env::var("IDEM_BENCH_ONLY")
        .map(|only| only.split(',').any(|o| o.trim() == name))
        .unwrap_or(true)
}

fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

// ---- memory -------------------------------------------------------------------------------

async fn memory(shape: Shape) -> Option<Arc<dyn Store>> {
    let clock = idem::TestClock::new();
    let store = idem::MemoryStore::new().with_test_clock(clock.clone());
    let (lease, long, short) = (
        Duration::from_secs(30),
        Duration::from_secs(30 * 24 * 3600),
        Duration::from_secs(30),
    );
    let mut i = 0u64;
    let mut claim = async |ttl: Duration, finish: bool| {
        let key = format!("k-{i}");
        i += 1;
        let req = idem::store::ClaimRequest {
            biz: BIZ,
            key: &key,
            fingerprint: None,
            lease,
            ttl,
        };
        let idem::store::ClaimOutcome::Acquired { claim, .. } = store.claim(&req).await.unwrap()
        else {
            panic!("not acquired");
        };
        if finish {
            store.complete(BIZ, &key, &claim, b"r", ttl).await.unwrap();
        }
    };
    // The live records arrive over time, as in a service: the clock moves past a lease every
    // 1,000 calls (so the lease items of calls long finished are behind, as they would be).
    for n in 0..shape.live {
        claim(long, true).await;
        if n % 1000 == 999 {
            clock.advance(Duration::from_secs(31));
        }
    }
    for _ in 0..shape.due {
        claim(short, true).await;
    }
    for _ in 0..shape.stuck {
        claim(long, false).await;
    }
    clock.advance(Duration::from_secs(60));
    Some(Arc::new(store))
}

// ---- SQL ----------------------------------------------------------------------------------

/// The rows of a shape, as `(from, to, status, lease_until, expire_at)` ranges of `k-<n>` keys.
fn rows(shape: Shape, now: i64) -> [(u64, u64, &'static str, i64, i64); 3] {
    let (past, later) = (now - 60_000, now + 3_600_000);
    let live = shape.live;
    let due = live + shape.due;
    [
        (0, live, "SUCCEEDED", past, later),
        (live, due, "SUCCEEDED", past, past),
        (due, due + shape.stuck, "PROCESSING", past, later),
    ]
}

async fn sqlite(shape: Shape) -> Option<Arc<dyn Store>> {
    let dir = std::env::temp_dir().join(format!("idem-passes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("passes-{}.db", shape.live));
    let _ = std::fs::remove_file(&path);
    let store = idem::SqliteStore::open(&path).await.unwrap();
    store.migrate().await.unwrap();
    let pool = idem::sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    for (from, to, status, lease, expire) in rows(shape, now_ms()) {
        sqlx::query(AssertSqlSafe(format!(
            "WITH RECURSIVE n(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {to}) \
             INSERT INTO idem_record (biz_type, idem_key, status, attempt, fence, fingerprint, \
             result, lease_until, created_at, updated_at, expire_at, result_until) \
             SELECT '{BIZ}', 'k-' || i, '{status}', 1, 1, NULL, X'72', {lease}, 0, 0, {expire}, NULL \
             FROM n WHERE {from} < {to}"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    Some(Arc::new(store))
}

async fn mariadb(shape: Shape) -> Option<Arc<dyn Store>> {
    let url = url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let Ok(store) = idem::MySqlStore::connect(&url).await else {
        println!("mariadb: skipped, {url} unreachable");
        return None;
    };
    let table = format!("idem_passes_{}", shape.live);
    let store = store.with_table(&table).unwrap();
    let pool = idem::sqlx::MySqlPool::connect(&url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{table}`")))
        .execute(&pool)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    for (from, to, status, lease, expire) in rows(shape, now_ms()) {
        if from == to {
            continue;
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO `{table}` (biz_type, idem_key, status, attempt, fence, fingerprint, \
             result, lease_until, created_at, updated_at, expire_at, result_until) \
             SELECT '{BIZ}', CONCAT('k-', seq), '{status}', 1, 1, NULL, 'r', {lease}, 0, 0, \
             {expire}, NULL FROM seq_{from}_to_{last}",
            last = to - 1
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query(AssertSqlSafe(format!("ANALYZE TABLE `{table}`")))
        .execute(&pool)
        .await
        .unwrap();
    Some(Arc::new(store))
}

async fn postgres(shape: Shape) -> Option<Arc<dyn Store>> {
    let url = url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
    let Ok(store) = idem::PgStore::connect(&url).await else {
        println!("postgres: skipped, {url} unreachable");
        return None;
    };
    let table = format!("idem_passes_{}", shape.live);
    let store = store.with_table(&table).unwrap();
    let pool = idem::sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{table}\"")))
        .execute(&pool)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    for (from, to, status, lease, expire) in rows(shape, now_ms()) {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{table}\" (biz_type, idem_key, status, attempt, fence, fingerprint, \
             result, lease_until, created_at, updated_at, expire_at, result_until) \
             SELECT '{BIZ}', 'k-' || i, '{status}', 1, 1, NULL, 'r'::bytea, {lease}, 0, 0, \
             {expire}, NULL FROM generate_series({from}::bigint, {to}::bigint - 1) AS i"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query(AssertSqlSafe(format!("ANALYZE \"{table}\"")))
        .execute(&pool)
        .await
        .unwrap();
    Some(Arc::new(store))
}

// ---- Redis --------------------------------------------------------------------------------

/// Writes records `k-<from>` .. `k-<to>` in the store's layout, a chunk per script: `kind` 0 a
/// live success, 1 a success whose result ttl has passed (in the results index), 2 a PROCESSING
/// record whose lease has ended (in the stuck index).
const FILL: &str = r#"
local from, to, kind, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local prefix, biz = ARGV[5], ARGV[6]
local ex = now + 3600000
for i = from, to - 1 do
  local key = prefix .. '{' .. #biz .. ':' .. biz .. ':k-' .. i .. '}'
  if kind == 2 then
    redis.call('HSET', key, 's', 'PROCESSING', 'a', '1', 'f', '1', 'fp', '', 'lu', now - 60000, 'ex', ex)
    redis.call('ZADD', prefix .. 'stuck:' .. #biz .. ':' .. biz, now - 60000, key)
  else
    redis.call('HSET', key, 's', 'SUCCEEDED', 'a', '1', 'f', '1', 'fp', '', 'lu', now - 60000, 'ex', ex, 'r', 'r')
    if kind == 1 then
      redis.call('HSET', key, 'rx', now - 60000)
      redis.call('ZADD', prefix .. 'results', now - 60000, key)
    end
  end
  redis.call('PEXPIREAT', key, ex)
end
return 0
"#;

async fn redis(shape: Shape) -> Option<Arc<dyn Store>> {
    let url = url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
    let Ok(store) = idem::RedisStore::connect(&url).await else {
        println!("redis: skipped, {url} unreachable");
        return None;
    };
    let prefix = format!("idem_passes_{}_{}:", shape.live, std::process::id());
    let store = store.with_prefix(&prefix).unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let script = redis::Script::new(FILL);
    let now = now_ms();
    let live = shape.live;
    let due = live + shape.due;
    for (from, to, kind) in [(0, live, 0), (live, due, 1), (due, due + shape.stuck, 2)] {
        let mut at = from;
        while at < to {
            let end = (at + 10_000).min(to);
            let _: i64 = script
                .arg(at)
                .arg(end)
                .arg(kind)
                .arg(now)
                .arg(&prefix)
                .arg(BIZ)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            at = end;
        }
    }
    // The registry a claim of this version writes before its first claim of the business type.
    let _: i64 = redis::cmd("SADD")
        .arg(format!("{prefix}indexes"))
        .arg(format!("{prefix}stuck:{}:{BIZ}", BIZ.len()))
        .query_async(&mut conn)
        .await
        .unwrap();
    Some(Arc::new(store))
}

/// Deletes what `redis` wrote, a SCAN reply at a time.
async fn redis_cleanup(shape: Shape) {
    let url = url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
    let Ok(client) = redis::Client::open(url.as_str()) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let prefix = format!("idem_passes_{}_{}:", shape.live, std::process::id());
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(keys)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

/// Drops the tables `mariadb` or `postgres` made.
async fn sql_cleanup(name: &str, shapes: [Shape; 2]) {
    for shape in shapes {
        let table = format!("idem_passes_{}", shape.live);
        if name == "mariadb" {
            let url = url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
            let pool = idem::sqlx::MySqlPool::connect(&url).await.unwrap();
            sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{table}`")))
                .execute(&pool)
                .await
                .unwrap();
        } else {
            let url = url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
            let pool = idem::sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{table}\"")))
                .execute(&pool)
                .await
                .unwrap();
        }
    }
}

// ---- the run ------------------------------------------------------------------------------

fn mib(bytes: usize) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn main() {
    let records: u64 = std::env::var("IDEM_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let due = records / 100;
    let alone = Shape {
        live: 0,
        due,
        stuck: due,
    };
    let full = Shape {
        live: records - 2 * due,
        due,
        stuck: due,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{records} records, {due} due and {due} stuck, against the {due} due and {due} stuck alone"
    );
    let mut table = Table::new(
        "passes",
        &[
            "store, pass",
            "due and stuck alone",
            "with every record",
            "time ratio",
            "peak heap alone",
            "peak heap with every record",
        ],
    );
    runtime.block_on(async {
        type Fill = fn(Shape) -> std::pin::Pin<Box<dyn Future<Output = Option<Arc<dyn Store>>>>>;
        let stores: [(&str, Fill); 5] = [
            ("memory", |s| Box::pin(memory(s))),
            ("sqlite", |s| Box::pin(sqlite(s))),
            ("mariadb", |s| Box::pin(mariadb(s))),
            ("postgres", |s| Box::pin(postgres(s))),
            ("redis", |s| Box::pin(redis(s))),
        ];
        for (name, fill) in stores {
            if !wanted(name) {
                continue;
            }
            let Some(small) = fill(alone).await else {
                continue;
            };
            let (sweep_a, rec_a) = passes(small, alone).await;
            let big = fill(full).await.expect("reached a moment ago");
            let (sweep_b, rec_b) = passes(big, full).await;
            for (pass, a, b) in [("sweep", &sweep_a, &sweep_b), ("reconcile", &rec_a, &rec_b)] {
                table.row([
                    format!("{name}, {pass}"),
                    format!("{:.1} ms", a.time.as_secs_f64() * 1e3),
                    format!("{:.1} ms", b.time.as_secs_f64() * 1e3),
                    format!("{:.2}", b.time.as_secs_f64() / a.time.as_secs_f64()),
                    mib(a.peak),
                    mib(b.peak),
                ]);
            }
            match name {
                "redis" => {
                    redis_cleanup(alone).await;
                    redis_cleanup(full).await;
                }
                "mariadb" | "postgres" => sql_cleanup(name, [alone, full]).await,
                _ => {}
            }
        }
    });
    table.emit();
}
