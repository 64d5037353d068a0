//! The MySQL store against the floor, side by side in one process, on the local MariaDB / MySQL.
//!
//! ```text
//! cargo bench -p idem-suite --bench mysql --features mysql                  # on mysql://root@127.0.0.1:3306/test
//! IDEM_MYSQL_URL=mysql://user:pass@host:3306/db cargo bench -p idem-suite --bench mysql --features mysql
//! IDEM_BENCH_ROUNDS=3 IDEM_BENCH_SCALE=0.2 cargo bench -p idem-suite --bench mysql --features mysql   # a quick look
//! IDEM_BENCH_ONLY=tx cargo bench -p idem-suite --bench mysql --features mysql   # one mode (tx or lease)
//! IDEM_BENCH_ONLY=design cargo bench -p idem-suite --bench mysql --features mysql   # idem and the design floor only
//! IDEM_BENCH_ONLY=lease,floor cargo bench -p idem-suite --bench mysql --features mysql   # a mode and a floor
//! ```
//!
//! `IDEM_BENCH_ONLY` is a comma-separated choice of modes (`lease`, `tx`) and floors (`floor`,
//! `design`, `indexed`); what names neither of a kind runs all of that kind. idem always runs.
//!
//! Workload: a small serde result (`Receipt`: a string and two integers).
//! - `lease first`: a new key per call: the claim `INSERT` (its fence back in the OK packet), the
//!   body, the mark `UPDATE` with the stored result: 2 round trips.
//! - `lease replay`: the same keys again: while repeats prevail (idem's claim order), one read of
//!   the stored result by primary key, then decoding: 1 round trip.
//! - `tx first`: the same inside a transaction: `BEGIN; SAVEPOINT` (one round trip while new keys
//!   prevail; the store's lock wait was set on each session when it connected), the claim, the
//!   mark, `COMMIT` (which releases the savepoint): 5 statements in 4 round trips. `tx replay`:
//!   `BEGIN`, one read, `COMMIT`. (`statement_counts.rs` holds these counts.)
//!
//! Contenders: `idem` (`Call::run` on a `MySqlStore`, `Call::run_in_tx` on its `MySqlTx`) and
//! `floor`, the same statements hand-written in plain sqlx with no framework, on a pool of the
//! same kind (no ping before acquire, one connection per statement in lease mode, one per
//! transaction in tx mode); and `design`, the design floor: what a careful team would
//! hand-write for a dedup table of its own (`biz, idem_key, status, lease_until, expire_at, result`,
//! primary key `(biz, idem_key)`, made and dropped by the bench), with the fewest statements: a
//! first execution = the claim `INSERT` + the `UPDATE` to done with the result; a replay = one
//! `SELECT` by primary key (the floor knows which workload it runs, so it never tries the claim
//! first); tx mode = `BEGIN`, claim `INSERT`, the body's writes (none here: idem's tx body writes
//! nothing either), mark `UPDATE`, `COMMIT`, and a tx replay = `BEGIN`, the `SELECT`, `COMMIT`.
//! Times are the client's clock (`lease_until`, `expire_at` in ms bound as values). `indexed`, the
//! contract floor: the design floor's statements on idem's own table with its migrations' indexes
//! (the claim also writes the attempt, a fence and the times; the status is idem's). Each round runs every contender on every workload, with 1 caller and
//! with 32 concurrent callers (a multi-thread runtime, 2 workers), in 10 slices each, the order of
//! the contenders rotating from slice to slice (the machine's speed drifts); a ratio is taken
//! within a round, and the median over rounds is reported: idem / floor and idem / design.

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::sqlx::mysql::MySqlPool;
use idem::sqlx::{self, AssertSqlSafe, Row};
use idem::{Call, IdemError, MySqlStore};
use serde::{Deserialize, Serialize};

mod support;
use support::{BIZ, Receipt, Table, median, now_ms, r3, rate, receipt};

/// The stored form idem writes (`{"Ok": …}`), written and read by the floor as well.
#[derive(Serialize)]
enum SnapRef<'a> {
    Ok(&'a Receipt),
}

#[derive(Deserialize)]
enum Snap {
    Ok(Receipt),
}

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
    fn call(&self, key: String, k: u64, w: Workload) -> impl Future<Output = Receipt> + Send;
}

struct Idem(MySqlStore);

impl Contender for Idem {
    async fn call(&self, key: String, k: u64, w: Workload) -> Receipt {
        let tx = w.in_tx();
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
    async fn call(&self, key: String, k: u64, w: Workload) -> Receipt {
        let tx = w.in_tx();
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
        // The pool's sessions got the lock wait when they connected, as the store's do: BEGIN
        // and the claim's savepoint in one round trip.
        let n = self.savepoints.fetch_add(1, Ordering::Relaxed);
        let mut t = self
            .pool
            .begin_with(AssertSqlSafe(format!("BEGIN; SAVEPOINT floor_{n}")))
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

/// The design floor: the fewest statements per call, on a dedup table of its own (`design`) or
/// on idem's own table with its migrations' indexes (`indexed`, the contract floor: the same
/// statements, plus the columns and index entries the contract keeps).
struct Design {
    pool: MySqlPool,
    insert: String,
    mark: String,
    read: String,
    /// The status a mark writes.
    done: &'static str,
    /// On idem's table: the claim also writes the attempt, the fence and the times.
    indexed: bool,
}

impl Design {
    fn new(pool: MySqlPool, t: &str) -> Self {
        Design {
            pool,
            insert: format!(
                "INSERT INTO `{t}` (biz, idem_key, status, lease_until, expire_at) VALUES (?, ?, 'P', ?, ?)"
            ),
            mark: format!(
                "UPDATE `{t}` SET status = 'D', result = ?, expire_at = ? WHERE biz = ? AND idem_key = ?"
            ),
            read: format!("SELECT status, result FROM `{t}` WHERE biz = ? AND idem_key = ?"),
            done: "D",
            indexed: false,
        }
    }

    /// The same statements on idem's table `t` (made by `MySqlStore::migrate`).
    fn indexed(pool: MySqlPool, t: &str) -> Self {
        Design {
            pool,
            insert: format!(
                "INSERT INTO `{t}` (biz_type, idem_key, status, attempt, fence, lease_until, \
                 created_at, updated_at, expire_at) VALUES (?, ?, 'PROCESSING', 1, ?, ?, ?, ?, ?)"
            ),
            mark: format!(
                "UPDATE `{t}` SET status = 'SUCCEEDED', result = ?, expire_at = ? \
                 WHERE biz_type = ? AND idem_key = ?"
            ),
            read: format!("SELECT status, result FROM `{t}` WHERE biz_type = ? AND idem_key = ?"),
            done: "SUCCEEDED",
            indexed: true,
        }
    }

    fn create(t: &str) -> String {
        format!(
            "CREATE TABLE `{t}` (biz VARCHAR(64) NOT NULL, idem_key VARCHAR(191) NOT NULL, \
             status CHAR(1) NOT NULL, lease_until BIGINT NOT NULL, expire_at BIGINT NOT NULL, \
             result BLOB NULL, PRIMARY KEY (biz, idem_key)) ENGINE = InnoDB"
        )
    }

    async fn claim<'c>(&self, exec: impl sqlx::Executor<'c, Database = sqlx::MySql>, key: &str) {
        let now = now_ms();
        let mut query = sqlx::query(AssertSqlSafe(self.insert.as_str()))
            .bind(BIZ)
            .bind(key);
        query = if self.indexed {
            query
                .bind(now * 1000)
                .bind(now + LEASE_MS)
                .bind(now)
                .bind(now)
                .bind(now + TTL_MS)
        } else {
            query.bind(now + LEASE_MS).bind(now + TTL_MS)
        };
        let done = query.execute(exec).await.unwrap();
        assert_eq!(done.rows_affected(), 1);
    }

    async fn mark<'c>(
        &self,
        exec: impl sqlx::Executor<'c, Database = sqlx::MySql>,
        key: &str,
        k: u64,
    ) -> Receipt {
        let value = receipt(k);
        let snapshot = serde_json::to_vec(&value).unwrap();
        let done = sqlx::query(AssertSqlSafe(self.mark.as_str()))
            .bind(snapshot)
            .bind(now_ms() + TTL_MS)
            .bind(BIZ)
            .bind(key)
            .execute(exec)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1);
        value
    }

    async fn read<'c>(
        &self,
        exec: impl sqlx::Executor<'c, Database = sqlx::MySql>,
        key: &str,
    ) -> Receipt {
        let row = sqlx::query(AssertSqlSafe(self.read.as_str()))
            .bind(BIZ)
            .bind(key)
            .fetch_one(exec)
            .await
            .unwrap();
        assert_eq!(row.get::<String, _>("status"), self.done);
        serde_json::from_slice(&row.get::<Vec<u8>, _>("result")).unwrap()
    }
}

impl Contender for Design {
    async fn call(&self, key: String, k: u64, w: Workload) -> Receipt {
        match w {
            Workload::LeaseFirst => {
                self.claim(&self.pool, &key).await;
                self.mark(&self.pool, &key, k).await
            }
            Workload::LeaseReplay => self.read(&self.pool, &key).await,
            Workload::TxFirst => {
                let mut t = self.pool.begin().await.unwrap();
                self.claim(&mut *t, &key).await;
                let value = self.mark(&mut *t, &key, k).await;
                t.commit().await.unwrap();
                value
            }
            Workload::TxReplay => {
                let mut t = self.pool.begin().await.unwrap();
                let value = self.read(&mut *t, &key).await;
                t.commit().await.unwrap();
                value
            }
        }
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
                    black_box(c.call(format!("{prefix}-{k}"), k, workload).await);
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
/// `calls / SLICES` calls, the contenders' order rotating from slice to slice, and the times add
/// up.
const SLICES: u64 = 10;

/// (workload, callers) and the (idem, floor, design, indexed) calls/s of every round (NaN for a
/// floor not run).
type Measured = ((Workload, usize), Vec<[f64; 4]>);

fn main() {
    let url = std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let rounds = support::rounds(5);
    let scale = support::scale();
    // IDEM_BENCH_ONLY: modes (tx, lease) and floors (floor, design, indexed), comma-separated.
    let only = support::only();
    let has = |t: &str| only.iter().any(|o| o == t);
    let (tx_only, lease_only) = (has("tx"), has("lease"));
    let wanted = |w: Workload| {
        if tx_only == lease_only {
            true
        } else if tx_only {
            w.in_tx()
        } else {
            !w.in_tx()
        }
    };
    let picked = if has("floor") || has("design") || has("indexed") {
        [true, has("floor"), has("design"), has("indexed")]
    } else {
        [true; 4]
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
        let design_table = format!("{table}_design");
        sqlx::raw_sql(AssertSqlSafe(Design::create(&design_table)))
            .execute(store.pool())
            .await
            .unwrap();
        // The indexed floor's table: idem's own, made by its migrations.
        let indexed_table = format!("{table}_indexed");
        let indexed_store = store.clone().with_table(&indexed_table).unwrap();
        indexed_store.migrate().await.unwrap();
        let design = Design::new(store.pool().clone(), &design_table);
        let indexed = Design::indexed(store.pool().clone(), &indexed_table);
        let floor = Floor {
            pool: store.pool().clone(),
            sql: Sql::new(&table),
            savepoints: AtomicU64::new(0),
        };
        Some((
            Arc::new(Idem(store)),
            Arc::new(floor),
            Arc::new(design),
            Arc::new(indexed),
            [table, design_table, indexed_table],
        ))
    });
    let Some((idem, floor, design, indexed, tables)) = setup else {
        return;
    };
    println!(
        "MySqlStore against the same statements in plain sqlx (floor), the design floor (design) \
         and the design floor on idem's table (indexed); {rounds} rounds, median ratios"
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
                let prefix = |who: &str| format!("{who}{round}{key_round}{callers}");
                let (pi, pf, pd, px) = (prefix("i"), prefix("f"), prefix("d"), prefix("x"));
                let rates = rt.block_on(async {
                    let mut t = [Duration::ZERO; 4];
                    for slice in 0..SLICES {
                        let range = (calls * slice / SLICES, calls * (slice + 1) / SLICES);
                        for j in 0..4 {
                            let who = (round + slice as usize + j) % 4;
                            if !picked[who] {
                                continue;
                            }
                            t[who] += match who {
                                0 => measure(&idem, &pi, w, callers, range).await,
                                1 => measure(&floor, &pf, w, callers, range).await,
                                2 => measure(&design, &pd, w, callers, range).await,
                                _ => measure(&indexed, &px, w, callers, range).await,
                            };
                        }
                    }
                    t.map(|t| {
                        if t.is_zero() {
                            f64::NAN
                        } else {
                            calls as f64 / t.as_secs_f64()
                        }
                    })
                });
                let slot = results
                    .iter_mut()
                    .find(|(key, _)| *key == (w, callers))
                    .unwrap();
                slot.1.push(rates);
            }
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    let mut table = Table::new(
        "mysql",
        &[
            "workload",
            "callers",
            "idem calls/s",
            "idem / floor",
            "idem / design floor",
            "idem / indexed floor",
        ],
    );
    for ((w, callers), runs) in &results {
        let ratio = |j: usize| median(runs.iter().map(|r| r[0] / r[j]).collect());
        table.row([
            w.name().to_owned(),
            callers.to_string(),
            rate(median(runs.iter().map(|r| r[0]).collect())),
            r3(ratio(1)),
            r3(ratio(2)),
            r3(ratio(3)),
        ]);
    }
    table.emit();
    rt.block_on(async {
        for t in &tables {
            let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE `{t}`")))
                .execute(&floor.pool)
                .await;
        }
    });
}
