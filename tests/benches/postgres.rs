//! The Postgres store against the floor, side by side in one process.
//!
//! ```text
//! cargo bench -p idem-suite --bench postgres --features postgres,sqlite        # on postgres://postgres@127.0.0.1:5432/test
//! IDEM_PG_URL=postgres://user@host/db cargo bench -p idem-suite --bench postgres --features postgres,sqlite
//! IDEM_BENCH_ROUNDS=3 IDEM_BENCH_SCALE=0.2 cargo bench -p idem-suite --bench postgres --features postgres,sqlite
//! IDEM_BENCH_ONLY=c1 cargo bench -p idem-suite --bench postgres --features postgres,sqlite     # one mode (c1 or c32)
//! IDEM_BENCH_ONLY=design cargo bench -p idem-suite --bench postgres --features postgres,sqlite # idem and the design floor only
//! ```
//!
//! `IDEM_BENCH_ONLY` is a comma-separated choice of modes (`c1`, `c32`) and floors (`floor`,
//! `design`, `indexed`); what names neither of a kind runs all of that kind. idem always runs.
//!
//! Workloads (a small serde result: a string and two integers):
//! - `lease`: a new key per call in lease mode: the claim (a plain `INSERT … ON CONFLICT DO
//!   NOTHING` while new keys prevail), the body, the mark: 2 round trips;
//! - `replay`: the same keys again, already SUCCEEDED: while repeats prevail (idem's claim order),
//!   one read of the stored result by primary key, then decoding: 1 round trip;
//! - `tx`: a new key per call in transaction mode, in a transaction of its own: `BEGIN; SAVEPOINT`
//!   (one round trip while new keys prevail), the claim (an insert under the key's advisory lock), the
//!   mark, `COMMIT` (which releases the savepoint): 5 statements in 4 round trips;
//! - `tx-replay`: the same keys again in transaction mode: `BEGIN`, one read, `COMMIT` (3 round
//!   trips). (`statement_counts.rs` holds these counts.)
//!
//! Contenders, each on a pool of its own of the same size and settings (`PgStore::connect`'s):
//! - `idem`: `Call::new(..).run(&PgStore, ..)` / `.run_in_tx(&mut PgTx, ..)`;
//! - `floor`: plain sqlx sending the same statements (their texts are the store's own, from
//!   `PgStore::__statement`) with no framework around them;
//! - `design`: the design floor, what a careful team would hand-write for a dedup
//!   table of its own (`biz, idem_key, status, lease_until, expire_at, result`, primary key
//!   `(biz, idem_key)`, made and dropped by the bench) with the fewest statements: a first
//!   execution = the claim `INSERT … ON CONFLICT DO NOTHING` + the `UPDATE` to done with the
//!   result; a replay = one `SELECT` by primary key (the floor knows which workload it runs); tx =
//!   BEGIN, claim, the body's writes (none: idem's tx body writes nothing either), mark, COMMIT;
//!   tx-replay = BEGIN, the `SELECT`, COMMIT. Times are the client's clock, bound as values.
//! - `indexed`, the contract floor: the design floor's statements on idem's own table with its
//!   migrations' indexes (made by `PgStore::migrate`); the claim also writes the attempt, a fence
//!   and the times, and the statuses are idem's.
//!
//! Besides calls/s it prints the client's CPU time per call (user + system of this process, from
//! `/proc/self/stat`), which a loaded machine disturbs far less than wall-clock throughput.
//!
//! Two modes: `c1` (one task on a current-thread runtime) and `c32` (32 tasks on a multi-thread
//! runtime with 2 workers). Each round runs both contenders, the order alternating from round to
//! round; a ratio is taken within a round, then the median over rounds is reported.

use std::future::Future;
use std::hint::black_box;
use std::time::{Duration, Instant};

use idem::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use idem::sqlx::{self, AssertSqlSafe, Row};
use idem::{Call, IdemError, PgStore, PgTx};

mod support;
use support::{BIZ, Receipt, Table, cpu_seconds, median, now_ms, r3, rate, receipt};

const TTL: Duration = Duration::from_secs(3600);

/// One way of making call `k` in workload `w` (0 lease, 1 replay, 2 tx, 3 tx-replay).
trait Contender: Clone + Send + Sync + 'static {
    fn call(&self, w: usize, k: u64) -> impl Future<Output = Receipt> + Send;
}

#[derive(Clone)]
struct Idem(PgStore);

impl Contender for Idem {
    async fn call(&self, w: usize, k: u64) -> Receipt {
        let call = Call::new(BIZ, &k).ttl(TTL);
        let r: Result<Receipt, IdemError> = if w < 2 {
            call.run(&self.0, async move { Ok(receipt(k)) }).await
        } else {
            let mut tx = self.0.begin().await.unwrap();
            let r = call
                .run_in_tx(&mut tx, async move |_tx: &mut PgTx| Ok(receipt(k)))
                .await;
            tx.commit().await.unwrap();
            r
        };
        r.unwrap()
    }
}

/// Plain sqlx: the store's statements, sent by hand.
#[derive(Clone)]
struct Floor {
    pool: PgPool,
    claim: &'static str,
    insert_locking: &'static str,
    complete: &'static str,
    read: &'static str,
    lease_ms: i64,
    ttl_ms: i64,
}

impl Floor {
    /// The claim statement on `conn`: `Some(fence)` for a new record, `None` with the stored
    /// result for a replay.
    async fn claim(
        &self,
        conn: &mut sqlx::PgConnection,
        sql: &'static str,
        k: u64,
    ) -> (Option<i64>, Option<Vec<u8>>) {
        let mut query = sqlx::query(sql)
            .bind(BIZ)
            .bind(k.to_string())
            .bind(None::<&str>)
            .bind(self.lease_ms)
            .bind(self.ttl_ms)
            .bind(0i64);
        if sql == self.insert_locking {
            // Transaction mode's claim also sets the transaction's idle bound: the lease, in ms.
            query = query.bind(Some(self.lease_ms.to_string()));
        }
        let row = query.fetch_one(&mut *conn).await.unwrap();
        if row.try_get::<bool, _>("inserted").unwrap_or(true) {
            (Some(row.get("fence")), None)
        } else {
            assert_eq!(row.get::<&str, _>("status"), "SUCCEEDED");
            (None, row.get("result"))
        }
    }

    async fn complete(&self, conn: &mut sqlx::PgConnection, k: u64, fence: i64, r: &Receipt) {
        let done = sqlx::query(self.complete)
            .bind(BIZ)
            .bind(k.to_string())
            .bind(fence)
            .bind(serde_json::to_vec(r).unwrap())
            .bind(self.ttl_ms)
            .bind(0i64)
            .bind(None::<i64>)
            .execute(&mut *conn)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1, "complete lost its fence");
    }
}

impl Contender for Floor {
    async fn call(&self, w: usize, k: u64) -> Receipt {
        if w < 2 {
            let (fence, stored) = {
                let mut conn = self.pool.acquire().await.unwrap();
                self.claim(&mut conn, self.claim, k).await
            };
            return match fence {
                Some(fence) => {
                    let r = receipt(k);
                    let mut conn = self.pool.acquire().await.unwrap();
                    self.complete(&mut conn, k, fence, &r).await;
                    r
                }
                None => serde_json::from_slice(&stored.unwrap()).unwrap(),
            };
        }
        if w == 3 {
            // Repeats prevail: a plain read before any savepoint, as the store's claim does.
            let mut tx = self.pool.begin().await.unwrap();
            let row = sqlx::query(self.read)
                .bind(BIZ)
                .bind(k.to_string())
                .bind(0i64)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            assert_eq!(row.get::<&str, _>("status"), "SUCCEEDED");
            let stored: Vec<u8> = row.get("result");
            tx.commit().await.unwrap();
            return serde_json::from_slice(&stored).unwrap();
        }
        // New keys prevail: the savepoint opened in BEGIN's round trip, the insert under the
        // key's advisory lock, taken at once, the mark, COMMIT.
        let mut tx = self
            .pool
            .begin_with("BEGIN; SAVEPOINT bench")
            .await
            .unwrap();
        let (fence, _) = self.claim(&mut tx, self.insert_locking, k).await;
        let r = receipt(k);
        self.complete(&mut tx, k, fence.expect("a new key"), &r)
            .await;
        tx.commit().await.unwrap();
        r
    }
}

/// The design floor: the fewest statements per call, on a dedup table of its own (`design`) or
/// on idem's own table with its migrations' indexes (`indexed`, the contract floor: the same
/// statements, plus the columns and index entries the contract keeps).
#[derive(Clone)]
struct Design {
    pool: PgPool,
    insert: &'static str,
    mark: &'static str,
    read: &'static str,
    /// The status a mark writes.
    done: &'static str,
    lease_ms: i64,
    ttl_ms: i64,
}

impl Design {
    fn new(pool: PgPool, t: &str, lease_ms: i64, ttl_ms: i64) -> Self {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        Design {
            pool,
            insert: leak(format!(
                "INSERT INTO {t} (biz, idem_key, status, lease_until, expire_at) \
                 VALUES ($1, $2, 'P', $3, $4) ON CONFLICT DO NOTHING"
            )),
            mark: leak(format!(
                "UPDATE {t} SET status = 'D', result = $3, expire_at = $4 \
                 WHERE biz = $1 AND idem_key = $2"
            )),
            read: leak(format!(
                "SELECT status, result FROM {t} WHERE biz = $1 AND idem_key = $2"
            )),
            done: "D",
            lease_ms,
            ttl_ms,
        }
    }

    /// The same statements on idem's table `t` (made by `PgStore::migrate`): the claim also
    /// writes the attempt, a fence (the lease end in µs) and the times.
    fn indexed(pool: PgPool, t: &str, lease_ms: i64, ttl_ms: i64) -> Self {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        Design {
            pool,
            insert: leak(format!(
                "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, lease_until, \
                 created_at, updated_at, expire_at) \
                 VALUES ($1, $2, 'PROCESSING', 1, $3 * 1000, $3, $3 - {lease_ms}, $3 - {lease_ms}, $4) \
                 ON CONFLICT DO NOTHING"
            )),
            mark: leak(format!(
                "UPDATE {t} SET status = 'SUCCEEDED', result = $3, expire_at = $4 \
                 WHERE biz_type = $1 AND idem_key = $2"
            )),
            read: leak(format!(
                "SELECT status, result FROM {t} WHERE biz_type = $1 AND idem_key = $2"
            )),
            done: "SUCCEEDED",
            lease_ms,
            ttl_ms,
        }
    }

    fn create(t: &str) -> String {
        format!(
            "CREATE TABLE {t} (biz text NOT NULL, idem_key text NOT NULL, status char(1) NOT NULL, \
             lease_until bigint NOT NULL, expire_at bigint NOT NULL, result bytea, \
             PRIMARY KEY (biz, idem_key))"
        )
    }

    async fn claim(&self, conn: &mut sqlx::PgConnection, k: u64) {
        let now = now_ms();
        let done = sqlx::query(self.insert)
            .bind(BIZ)
            .bind(k.to_string())
            .bind(now + self.lease_ms)
            .bind(now + self.ttl_ms)
            .execute(&mut *conn)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1, "the design floor's key was taken");
    }

    async fn mark(&self, conn: &mut sqlx::PgConnection, k: u64) -> Receipt {
        let r = receipt(k);
        let done = sqlx::query(self.mark)
            .bind(BIZ)
            .bind(k.to_string())
            .bind(serde_json::to_vec(&r).unwrap())
            .bind(now_ms() + self.ttl_ms)
            .execute(&mut *conn)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1);
        r
    }

    async fn read(&self, conn: &mut sqlx::PgConnection, k: u64) -> Receipt {
        let row = sqlx::query(self.read)
            .bind(BIZ)
            .bind(k.to_string())
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(row.get::<&str, _>("status"), self.done);
        serde_json::from_slice(row.get::<&[u8], _>("result")).unwrap()
    }
}

impl Contender for Design {
    async fn call(&self, w: usize, k: u64) -> Receipt {
        match w {
            0 => {
                let mut conn = self.pool.acquire().await.unwrap();
                self.claim(&mut conn, k).await;
                drop(conn);
                let mut conn = self.pool.acquire().await.unwrap();
                self.mark(&mut conn, k).await
            }
            1 => {
                let mut conn = self.pool.acquire().await.unwrap();
                self.read(&mut conn, k).await
            }
            2 => {
                let mut tx = self.pool.begin().await.unwrap();
                self.claim(&mut tx, k).await;
                let r = self.mark(&mut tx, k).await;
                tx.commit().await.unwrap();
                r
            }
            _ => {
                let mut tx = self.pool.begin().await.unwrap();
                let r = self.read(&mut tx, k).await;
                tx.commit().await.unwrap();
                r
            }
        }
    }
}

/// Runs calls `keys` of workload `w` split over `tasks` tasks, all at once; returns calls/s and
/// the client's CPU microseconds per call.
async fn timed<C: Contender>(
    c: &C,
    w: usize,
    keys: std::ops::Range<u64>,
    tasks: u64,
) -> (f64, f64) {
    let per = (keys.end - keys.start) / tasks;
    let cpu = cpu_seconds();
    let t = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let c = c.clone();
            let start = keys.start + i * per;
            tokio::spawn(async move {
                for k in start..start + per {
                    let r = c.call(w, k).await;
                    assert_eq!(black_box(r).seq, k);
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let calls = (per * tasks) as f64;
    (
        calls / t.elapsed().as_secs_f64(),
        (cpu_seconds() - cpu) * 1e6 / calls,
    )
}

/// The contenders, in the order of [`Figures`]' rows.
const NAMES: [&str; 4] = ["idem", "floor", "design", "indexed"];

/// Calls/s and client CPU µs per call, per contender (0 idem, 1 floor, 2 design, 3 indexed) and
/// workload, one per round.
#[derive(Default)]
struct Figures {
    ops: [[Vec<f64>; 4]; 4],
    cpu: [[Vec<f64>; 4]; 4],
}

impl Figures {
    /// The median of the per-round ratios idem / contender `of`.
    fn ratio(&self, of: usize, workload: usize) -> f64 {
        support::ratio(&self.ops[0][workload], &self.ops[of][workload])
    }
}

/// A pool as `PgStore::connect` makes it.
async fn pool(url: &str, max: u32) -> PgPool {
    let options: PgConnectOptions = url.parse().unwrap();
    PgPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .connect_with(options.options([("lock_timeout", "3000ms")]))
        .await
        .unwrap()
}

async fn measure(
    url: &str,
    mode: &str,
    tasks: u64,
    calls: u64,
    rounds: usize,
    picked: [bool; 4],
) -> Figures {
    let tag = format!("bench_{}_{mode}", std::process::id());
    let conns = u32::try_from(tasks).unwrap().max(2);
    let store = PgStore::builder()
        .table(&format!("{tag}_idem"))
        .unwrap()
        .token_table(&format!("{tag}_idem_tok"))
        .unwrap()
        .max_connections(conns)
        .connect(url)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let floor_store = PgStore::builder()
        .table(&format!("{tag}_floor"))
        .unwrap()
        .token_table(&format!("{tag}_floor_tok"))
        .unwrap()
        .build(pool(url, conns).await)
        .unwrap();
    floor_store.migrate().await.unwrap();
    let text = |name: &str| -> &'static str {
        Box::leak(
            floor_store
                .__statement(name)
                .unwrap()
                .to_owned()
                .into_boxed_str(),
        )
    };
    let floor = Floor {
        pool: floor_store.pool().clone(),
        claim: text("claim"),
        insert_locking: text("insert_locking"),
        complete: text("complete"),
        read: text("read"),
        lease_ms: idem::DEFAULT_LEASE.as_millis() as i64,
        ttl_ms: TTL.as_millis() as i64,
    };
    let idem = Idem(store.clone());
    let design_table = format!("{tag}_design");
    let design_pool = pool(url, conns).await;
    sqlx::raw_sql(AssertSqlSafe(Design::create(&design_table)))
        .execute(&design_pool)
        .await
        .unwrap();
    let design = Design::new(
        design_pool,
        &design_table,
        idem::DEFAULT_LEASE.as_millis() as i64,
        TTL.as_millis() as i64,
    );
    // The indexed floor's table: idem's own, made by its migrations. It shares the design floor's
    // pool (the two never run at once), so four contenders of 32 stay within Postgres's default
    // 100 connections.
    let indexed_store = PgStore::builder()
        .table(&format!("{tag}_indexed"))
        .unwrap()
        .token_table(&format!("{tag}_indexed_tok"))
        .unwrap()
        .build(design.pool.clone())
        .unwrap();
    indexed_store.migrate().await.unwrap();
    let indexed = Design::indexed(
        indexed_store.pool().clone(),
        indexed_store.table(),
        idem::DEFAULT_LEASE.as_millis() as i64,
        TTL.as_millis() as i64,
    );

    // A warm-up, not counted: connections up, statements prepared, caches warm.
    let warm = (calls / 5).max(tasks);
    let base = 1_000_000_000u64;
    for (w, offset) in [(0, 0), (1, 0), (2, warm), (3, warm)] {
        let keys = base + offset..base + offset + warm;
        timed(&idem, w, keys.clone(), tasks).await;
        if picked[1] {
            timed(&floor, w, keys.clone(), tasks).await;
        }
        if picked[2] {
            timed(&design, w, keys.clone(), tasks).await;
        }
        if picked[3] {
            timed(&indexed, w, keys, tasks).await;
        }
    }

    let mut figures = Figures::default();
    for round in 0..rounds {
        let lease_keys = (2 * round as u64 * calls)..(2 * round as u64 + 1) * calls;
        let tx_keys = lease_keys.end..lease_keys.end + calls;
        for i in 0..4 {
            let who = (round + i) % 4;
            if !picked[who] {
                continue;
            }
            for (w, keys) in [
                (0, &lease_keys),
                (1, &lease_keys),
                (2, &tx_keys),
                (3, &tx_keys),
            ] {
                let (ops, cpu) = match who {
                    0 => timed(&idem, w, keys.clone(), tasks).await,
                    1 => timed(&floor, w, keys.clone(), tasks).await,
                    2 => timed(&design, w, keys.clone(), tasks).await,
                    _ => timed(&indexed, w, keys.clone(), tasks).await,
                };
                figures.ops[who][w].push(ops);
                figures.cpu[who][w].push(cpu);
            }
        }
        let at = |who: usize, w: usize| figures.ops[who][w].last().copied().unwrap_or(f64::NAN);
        let line: Vec<String> = (0..4)
            .map(|w| {
                let r: Vec<String> = (0..4).map(|who| format!("{:.0}", at(who, w))).collect();
                r.join("/")
            })
            .collect();
        eprintln!(
            "  {mode} round {round}: lease {}, replay {}, tx {}, tx-replay {} ({})",
            line[0],
            line[1],
            line[2],
            line[3],
            NAMES.join("/")
        );
    }
    for s in [&store, &floor_store, &indexed_store] {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE {}, {}",
            s.table(),
            s.token_table()
        )))
        .execute(s.pool())
        .await
        .unwrap();
    }
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {design_table}")))
        .execute(&design.pool)
        .await
        .unwrap();
    figures
}

fn main() {
    let url = std::env::var("IDEM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let scale = support::scale();
    let rounds = support::rounds(5);
    let calls = |base: u64| ((base as f64 * scale) as u64).max(32) / 32 * 32;

    let seq_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reachable = seq_rt.block_on(async {
        let probe = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(3))
            .connect(&url)
            .await;
        match probe {
            Ok(pool) => {
                pool.close().await;
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    });
    if let Err(e) = reachable {
        println!("skipped: Postgres at {url} is unreachable ({e})");
        return;
    }
    println!(
        "idem on Postgres ({url}), {rounds} rounds, median of per-round ratios; scale {scale}\n"
    );
    // IDEM_BENCH_ONLY: modes (c1, c32) and floors (floor, design, indexed), comma-separated.
    let only = support::only();
    let has = |t: &str| only.iter().any(|o| o == t);
    let (c1, c32) = if has("c1") || has("c32") {
        (has("c1"), has("c32"))
    } else {
        (true, true)
    };
    let picked = if has("floor") || has("design") || has("indexed") {
        [true, has("floor"), has("design"), has("indexed")]
    } else {
        [true; 4]
    };
    let mut results = Vec::new();
    if c1 {
        let n = calls(2_000);
        let f = seq_rt.block_on(measure(&url, "c1", 1, n, rounds, picked));
        results.push(("1", n, f));
    }
    drop(seq_rt);
    if c32 {
        let multi_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let n = calls(8_000);
        let f = multi_rt.block_on(measure(&url, "c32", 32, n, rounds, picked));
        results.push(("32", n, f));
    }

    let mut table = Table::new(
        "postgres",
        &[
            "workload",
            "callers",
            "idem calls/s",
            "idem / floor",
            "idem / design floor",
            "idem / indexed floor",
            "idem CPU µs/call",
            "design CPU µs/call",
        ],
    );
    for (label, _, f) in &results {
        for (w, name) in ["lease first", "lease replay", "tx first", "tx replay"]
            .iter()
            .enumerate()
        {
            let cpu = |who: usize| format!("{:.0}", median(f.cpu[who][w].clone()));
            table.row([
                name.to_string(),
                label.to_string(),
                rate(median(f.ops[0][w].clone())),
                r3(f.ratio(1, w)),
                r3(f.ratio(2, w)),
                r3(f.ratio(3, w)),
                cpu(0),
                cpu(2),
            ]);
        }
    }
    table.emit();
}
