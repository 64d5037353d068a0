//! The MySQL store against the floor, side by side in one process, on the local MariaDB / MySQL.
//!
//! ```text
//! cargo bench -p idem-suite --bench mysql --features mysql                  # on mysql://root@127.0.0.1:3306/test
//! IDEM_MYSQL_URL=mysql://user:pass@host:3306/db cargo bench -p idem-suite --bench mysql --features mysql
//! IDEM_BENCH_ROUNDS=3 IDEM_BENCH_SCALE=0.2 cargo bench -p idem-suite --bench mysql --features mysql   # a quick look
//! IDEM_BENCH_ONLY=tx cargo bench -p idem-suite --bench mysql --features mysql   # one mode (tx or lease)
//! ```
//!
//! Workload: a small serde result (`Receipt`: a string and two integers).
//! - `lease first`: a new key per call: the claim `INSERT` (its fence back in the OK packet), the
//!   body, the mark `UPDATE` with the stored result: 2 round trips.
//! - `lease replay`: the same keys again: the `INSERT` refused with 1062, the read of the stored
//!   result, decoding: 2 round trips.
//! - `tx first` / `tx replay`: the same inside a transaction (`SET SESSION innodb_lock_wait_timeout
//!   = 2; BEGIN`, `SAVEPOINT`, claim, mark, `RELEASE SAVEPOINT`, `COMMIT`; the replay's read is
//!   `LOCK IN SHARE MODE`): 6 round trips.
//!
//! Contenders: `idem` (`Call::run` on a `MySqlStore`, `Call::run_in_tx` on its `MySqlTx`) and
//! `floor`, the same statements hand-written in plain sqlx with no framework, on a pool of the
//! same kind (no ping before acquire, one connection per statement in lease mode, one per
//! transaction in tx mode). Each round runs both contenders on every workload, with 1 caller and
//! with 32 concurrent callers (a multi-thread runtime, 2 workers), in 10 alternating slices each
//! (the machine's speed drifts); a ratio is taken within a round, and the median over rounds is
//! reported.

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::sqlx::mysql::MySqlPool;
use idem::sqlx::{self, AssertSqlSafe, Row};
use idem::{Call, IdemError, MySqlStore};
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

/// The stored form idem writes (`{"Ok": …}`), written and read by the floor as well.
#[derive(Serialize)]
enum SnapRef<'a> {
    Ok(&'a Receipt),
}

#[derive(Deserialize)]
enum Snap {
    Ok(Receipt),
}

const BIZ: &str = "BENCH";
const LEASE_MS: i64 = 30_000;
const TTL_MS: i64 = 3_600_000;

macro_rules! now_us {
    () => {
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) + ?)"
    };
}
macro_rules! now_ms {
    () => {
        concat!("(", now_us!(), " DIV 1000)")
    };
}

/// The statements the store runs, written out for the floor.
struct Sql {
    insert: String,
    read: String,
    read_locking: String,
    complete: String,
}

impl Sql {
    fn new(t: &str) -> Self {
        let read = format!(
            "SELECT status, attempt, fence, fingerprint, result, lease_until, expire_at, {} AS now_ms \
             FROM `{t}` WHERE biz_type = ? AND idem_key = ?",
            now_ms!()
        );
        Sql {
            insert: format!(
                "INSERT INTO `{t}` (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
                 lease_until, created_at, updated_at, expire_at) VALUES (?, ?, 'PROCESSING', 1, \
                 LAST_INSERT_ID({}), ?, NULL, {n} + ?, {n}, {n}, {n} + ?)",
                now_us!(),
                n = now_ms!()
            ),
            read_locking: format!("{read} LOCK IN SHARE MODE"),
            read,
            complete: format!(
                "UPDATE `{t}` SET result = IF(status = 'PROCESSING', ?, result), \
                 expire_at = IF(status = 'PROCESSING', GREATEST(expire_at, {n} + ?), expire_at), \
                 status = 'SUCCEEDED', updated_at = {n} \
                 WHERE biz_type = ? AND idem_key = ? AND fence = ? AND status IN ('PROCESSING', 'SUCCEEDED')",
                n = now_ms!()
            ),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    LeaseFirst,
    LeaseReplay,
    TxFirst,
    TxReplay,
}

impl Workload {
    const ALL: [Workload; 4] = [
        Workload::LeaseFirst,
        Workload::LeaseReplay,
        Workload::TxFirst,
        Workload::TxReplay,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::LeaseFirst => "lease first",
            Workload::LeaseReplay => "lease replay",
            Workload::TxFirst => "tx first",
            Workload::TxReplay => "tx replay",
        }
    }

    fn in_tx(self) -> bool {
        matches!(self, Workload::TxFirst | Workload::TxReplay)
    }
}

trait Contender: Send + Sync + 'static {
    fn call(&self, key: String, k: u64, tx: bool) -> impl Future<Output = Receipt> + Send;
}

struct Idem(MySqlStore);

impl Contender for Idem {
    async fn call(&self, key: String, k: u64, tx: bool) -> Receipt {
        let call = Call::new(BIZ, &key).ttl(Duration::from_millis(TTL_MS as u64));
        let r: Result<Receipt, IdemError> = if tx {
            let mut t = self.0.begin().await.unwrap();
            let r = call
                .run_in_tx(&mut t, async |_t: &mut idem::MySqlTx| Ok(receipt(k)))
                .await;
            t.commit().await.unwrap();
            r
        } else {
            call.run(&self.0, async move { Ok(receipt(k)) }).await
        };
        r.unwrap()
    }
}

struct Floor {
    pool: MySqlPool,
    sql: Sql,
    savepoints: AtomicU64,
}

fn is_duplicate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|e| e.number()) == Some(1062))
}

/// What the floor's claim found.
enum Claimed {
    New(u64),
    Done(Receipt),
}

impl Floor {
    /// The claim on one connection: the `INSERT`, and on 1062 the read of the stored result.
    async fn claim(&self, c: &mut sqlx::MySqlConnection, key: &str, locking: bool) -> Claimed {
        let inserted = sqlx::query(AssertSqlSafe(self.sql.insert.as_str()))
            .bind(BIZ)
            .bind(key)
            .bind(0i64)
            .bind(None::<&str>)
            .bind(0i64)
            .bind(LEASE_MS)
            .bind(0i64)
            .bind(0i64)
            .bind(0i64)
            .bind(TTL_MS)
            .execute(&mut *c)
            .await;
        match inserted {
            Ok(done) => Claimed::New(done.last_insert_id()),
            Err(e) if is_duplicate(&e) => {
                let read = if locking {
                    &self.sql.read_locking
                } else {
                    &self.sql.read
                };
                let row = sqlx::query(AssertSqlSafe(read.as_str()))
                    .bind(0i64)
                    .bind(BIZ)
                    .bind(key)
                    .fetch_one(&mut *c)
                    .await
                    .unwrap();
                let status: String = row.get("status");
                assert_eq!(status, "SUCCEEDED");
                let bytes: Vec<u8> = row.get("result");
                let Snap::Ok(value) = serde_json::from_slice(&bytes).unwrap();
                Claimed::Done(value)
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// The body and the mark.
    async fn mark<'c>(
        &self,
        exec: impl sqlx::Executor<'c, Database = sqlx::MySql>,
        key: &str,
        k: u64,
        fence: u64,
    ) -> Receipt {
        let value = receipt(k);
        let snapshot = serde_json::to_vec(&SnapRef::Ok(&value)).unwrap();
        let marked = sqlx::query(AssertSqlSafe(self.sql.complete.as_str()))
            .bind(&snapshot)
            .bind(0i64)
            .bind(TTL_MS)
            .bind(0i64)
            .bind(BIZ)
            .bind(key)
            .bind(fence)
            .execute(exec)
            .await
            .unwrap();
        assert_eq!(marked.rows_affected(), 1);
        value
    }
}

impl Contender for Floor {
    async fn call(&self, key: String, k: u64, tx: bool) -> Receipt {
        if !tx {
            // As the store does: the claim on one pool connection, the mark on the next.
            let mut conn = self.pool.acquire().await.unwrap();
            let claimed = self.claim(&mut conn, &key, false).await;
            drop(conn);
            return match claimed {
                Claimed::New(fence) => self.mark(&self.pool, &key, k, fence).await,
                Claimed::Done(value) => value,
            };
        }
        let mut t = self
            .pool
            .begin_with("SET SESSION innodb_lock_wait_timeout = 2; BEGIN")
            .await
            .unwrap();
        let n = self.savepoints.fetch_add(1, Ordering::Relaxed);
        sqlx::raw_sql(AssertSqlSafe(format!("SAVEPOINT floor_{n}")))
            .execute(&mut *t)
            .await
            .unwrap();
        let value = match self.claim(&mut t, &key, true).await {
            Claimed::New(fence) => self.mark(&mut *t, &key, k, fence).await,
            Claimed::Done(value) => value,
        };
        sqlx::raw_sql(AssertSqlSafe(format!("RELEASE SAVEPOINT floor_{n}")))
            .execute(&mut *t)
            .await
            .unwrap();
        t.commit().await.unwrap();
        value
    }
}

/// Runs calls `from..to` of `workload` from `callers` tasks; the time they took.
async fn measure<C: Contender>(
    c: &Arc<C>,
    prefix: &str,
    workload: Workload,
    callers: usize,
    (from, calls): (u64, u64),
) -> Duration {
    let next = Arc::new(AtomicU64::new(from));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (c, next, prefix) = (c.clone(), next.clone(), prefix.to_owned());
            tokio::spawn(async move {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= calls {
                        return;
                    }
                    black_box(c.call(format!("{prefix}-{k}"), k, workload.in_tx()).await);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

/// The machine's speed drifts from minute to minute: each contender runs in slices of
/// `calls / SLICES` calls, alternating with the other, and the times add up.
const SLICES: u64 = 10;

/// (workload, callers) and the (idem, floor) calls/s of every round.
type Measured = ((Workload, usize), Vec<(f64, f64)>);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let url = std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let rounds: usize = std::env::var("IDEM_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let scale: f64 = std::env::var("IDEM_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    // IDEM_BENCH_ONLY=tx (or lease) runs one mode's workloads.
    let only = std::env::var("IDEM_BENCH_ONLY").unwrap_or_default();
    let wanted = |w: Workload| match only.as_str() {
        "tx" => w.in_tx(),
        "lease" => !w.in_tx(),
        _ => true,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = rt.block_on(async {
        let store = match MySqlStore::connect_with(&url, 34, Duration::from_secs(2)).await {
            Ok(store) => store,
            Err(e) => {
                eprintln!("skipped: MySQL at {url} is unreachable ({e})");
                return None;
            }
        };
        let table = format!("idem_bench_{}", std::process::id());
        let store = store.with_table(&table).unwrap();
        store.migrate().await.unwrap();
        let floor = Floor {
            pool: store.pool().clone(),
            sql: Sql::new(&table),
            savepoints: AtomicU64::new(0),
        };
        Some((Arc::new(Idem(store)), Arc::new(floor), table))
    });
    let Some((idem, floor, table)) = setup else {
        return;
    };
    println!(
        "MySqlStore vs the same statements in plain sqlx; {rounds} rounds, median ratio (idem / floor)"
    );
    let mut results: Vec<Measured> = Vec::new();
    for callers in [1usize, 32] {
        for w in Workload::ALL.into_iter().filter(|w| wanted(*w)) {
            results.push(((w, callers), Vec::new()));
        }
    }
    for round in 0..rounds {
        for callers in [1usize, 32] {
            let calls = ((if callers == 1 { 1_000.0 } else { 4_000.0 }) * scale).max(50.0) as u64;
            for w in Workload::ALL.into_iter().filter(|w| wanted(*w)) {
                // A replay reads the keys its contender's "first" run wrote in this round.
                let key_round = match w {
                    Workload::LeaseFirst | Workload::LeaseReplay => "l",
                    Workload::TxFirst | Workload::TxReplay => "t",
                };
                let pi = format!("i{round}{key_round}{callers}");
                let pf = format!("f{round}{key_round}{callers}");
                let (i, f) = rt.block_on(async {
                    let (mut ti, mut tf) = (Duration::ZERO, Duration::ZERO);
                    for slice in 0..SLICES {
                        let range = (calls * slice / SLICES, calls * (slice + 1) / SLICES);
                        if (round as u64 + slice).is_multiple_of(2) {
                            ti += measure(&idem, &pi, w, callers, range).await;
                            tf += measure(&floor, &pf, w, callers, range).await;
                        } else {
                            tf += measure(&floor, &pf, w, callers, range).await;
                            ti += measure(&idem, &pi, w, callers, range).await;
                        }
                    }
                    let rate = |t: Duration| calls as f64 / t.as_secs_f64();
                    (rate(ti), rate(tf))
                });
                let slot = results
                    .iter_mut()
                    .find(|(key, _)| *key == (w, callers))
                    .unwrap();
                slot.1.push((i, f));
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!(
        "{:<14} {:>7} {:>12} {:>12} {:>7}",
        "workload", "callers", "idem/s", "floor/s", "ratio"
    );
    for ((w, callers), runs) in &results {
        let ratio = median(runs.iter().map(|(i, f)| i / f).collect());
        let i = median(runs.iter().map(|(i, _)| *i).collect());
        let f = median(runs.iter().map(|(_, f)| *f).collect());
        println!(
            "{:<14} {:>7} {:>12.0} {:>12.0} {:>7.3}",
            w.name(),
            callers,
            i,
            f,
            ratio
        );
    }
    rt.block_on(async {
        let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE `{table}`")))
            .execute(&floor.pool)
            .await;
    });
}
