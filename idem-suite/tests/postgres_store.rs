//! What only Postgres has: the same-key storm in lease mode and in transactions at every isolation
//! level (claimants rolling back, deadlock and serialization victims running again), the sweeper
//! over 100k expired rows, schema-qualified tables, the bounded wait of a duplicate, the errors that
//! say "run migrate()" or "restart the transaction". Against the local Postgres (`IDEM_PG_URL`);
//! every test on tables of its own.

mod contract;
#[path = "support/postgres.rs"]
mod pg;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use contract::{Effects, PayError, Receipt, biz, server};
use idem::sqlx::{self, AssertSqlSafe, Row};
use idem::{Busy, Call, IdemError, PgIsolation, PgStore, PgTx, Store, Sweeper};
use tokio::sync::Barrier;

/// Claimants per round of a storm.
const CLAIMANTS: usize = 64;
/// Rounds (one fresh key each).
const ROUNDS: usize = 12;

fn receipt(key: &str, serial: u32) -> Receipt {
    Receipt {
        order: key.to_owned(),
        amount: 100,
        serial,
    }
}

/// Lease mode: 64 callers of one key per round, released together; every eighth caller's body
/// fails the first time (its claim goes FAILED and another caller retries). The business ran
/// exactly once per key, by the independent effects table, and every caller got its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_mode_storm_runs_each_key_once() {
    let Some(store) = pg::store(32).await else {
        return;
    };
    let store = Arc::new(store);
    let (fx, biz) = (Effects::new().await, biz("pg_storm"));
    let serial = Arc::new(AtomicU32::new(0));
    for round in 0..ROUNDS {
        let key = format!("k{round}");
        let barrier = Arc::new(Barrier::new(CLAIMANTS));
        let tasks: Vec<_> = (0..CLAIMANTS)
            .map(|i| {
                let (store, fx, biz, key, barrier, serial) = (
                    store.clone(),
                    fx.clone(),
                    biz.clone(),
                    key.clone(),
                    barrier.clone(),
                    serial.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut declined = false;
                    loop {
                        let res: Result<Receipt, PayError> = Call::new(biz.clone(), &key)
                            .wait(Duration::from_secs(30))
                            .run(&*store, async {
                                if i % 8 == 0 && !declined {
                                    declined = true;
                                    return Err(PayError::Declined);
                                }
                                fx.record(&biz, &key).await;
                                Ok(receipt(&key, serial.fetch_add(1, Ordering::Relaxed)))
                            })
                            .await;
                        match res {
                            Ok(r) => return r,
                            Err(PayError::Declined) => continue,
                            Err(PayError::Idem(e)) if e.is_retryable() => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Err(e) => panic!("round {round}, caller {i}: {e:?}"),
                        }
                    }
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        assert!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "round {round}: one answer for all"
        );
        assert_eq!(
            fx.count(&biz, &key).await,
            1,
            "round {round}: executed once"
        );
    }
    pg::drop_tables(&store).await;
}

/// A transaction-mode storm at `isolation`: 64 transactions carrying one key per round, released
/// together. Every eighth rolls its transaction back after its call succeeded (as if a later write
/// of the caller failed), then runs again; deadlock and serialization victims, lock-wait timeouts
/// (`InProgress`) and commits that fail run again too. Committed business rows: exactly one per key.
async fn tx_storm(isolation: PgIsolation) {
    let Some(store) = pg::store(40).await else {
        return;
    };
    let effects = format!("{}_fx", store.table());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {effects} (id BIGSERIAL PRIMARY KEY, biz TEXT NOT NULL, k TEXT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let insert: &'static str = Box::leak(
        format!("INSERT INTO {effects} (biz, k) VALUES ($1, $2) RETURNING id").into_boxed_str(),
    );
    let store = Arc::new(store);
    let biz = biz("pg_tx_storm");
    let (restarts, timeouts) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    for round in 0..ROUNDS {
        let key = format!("k{round}");
        let barrier = Arc::new(Barrier::new(CLAIMANTS));
        let tasks: Vec<_> = (0..CLAIMANTS)
            .map(|i| {
                let (store, biz, key, barrier) =
                    (store.clone(), biz.clone(), key.clone(), barrier.clone());
                let (restarts, timeouts) = (restarts.clone(), timeouts.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut rolled_back = false;
                    for attempt in 0..500 {
                        let mut tx = store.begin_with(isolation).await.unwrap();
                        let res: Result<Receipt, PayError> = Call::new(biz.clone(), &key)
                            .run_in_tx(&mut tx, async |tx: &mut PgTx| {
                                let id: i64 = sqlx::query_scalar(insert)
                                    .bind(&biz)
                                    .bind(&key)
                                    .fetch_one(&mut **tx)
                                    .await
                                    .map_err(IdemError::store)?;
                                Ok(receipt(&key, u32::try_from(id).unwrap()))
                            })
                            .await;
                        match res {
                            Ok(r) if i % 8 == 0 && !rolled_back => {
                                rolled_back = true;
                                tx.rollback().await.unwrap();
                                let _ = r;
                            }
                            Ok(r) => match tx.commit().await {
                                Ok(()) => return r,
                                Err(e) if e.restarts_transaction() => {
                                    restarts.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => panic!("round {round}, caller {i}: commit: {e:?}"),
                            },
                            Err(PayError::Idem(e)) if e.restarts_transaction() => {
                                restarts.fetch_add(1, Ordering::Relaxed);
                                tx.rollback().await.unwrap();
                            }
                            Err(PayError::Idem(IdemError::InProgress { .. })) => {
                                timeouts.fetch_add(1, Ordering::Relaxed);
                                tx.rollback().await.unwrap();
                            }
                            Err(e) => panic!("round {round}, caller {i}: {e:?}"),
                        }
                        let pause = 1 + (attempt as u64 % 8) + fastrand_u64(8);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    panic!("round {round}, caller {i}: no answer after 500 transactions");
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        assert!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "round {round} ({isolation:?}): one answer for all"
        );
        let committed: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {effects} WHERE biz = $1 AND k = $2"
        )))
        .bind(&biz)
        .bind(&key)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(
            committed, 1,
            "round {round} ({isolation:?}): one business row"
        );
        let rec = store.load(&biz, &key).await.unwrap().unwrap();
        assert_eq!(rec.status, idem::Status::Succeeded);
    }
    eprintln!(
        "{isolation:?}: {} transactions restarted, {} duplicates timed out waiting",
        restarts.load(Ordering::Relaxed),
        timeouts.load(Ordering::Relaxed)
    );
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {effects}")))
        .execute(store.pool())
        .await
        .unwrap();
    pg::drop_tables(&store).await;
}

/// A little jitter without another dependency.
fn fastrand_u64(below: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    u64::from(nanos) % below
}

/// The three isolation levels one after the other: each storm holds up to 40 connections, and
/// the server allows 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_storm_runs_each_key_once_at_every_isolation_level() {
    for isolation in [
        PgIsolation::ReadCommitted,
        PgIsolation::RepeatableRead,
        PgIsolation::Serializable,
    ] {
        tx_storm(isolation).await;
    }
}

/// 100,000 expired records among live ones and expired-TTL records under a live lease: the sweeper
/// deletes exactly the expired ones, at most 1,000 per statement, and keeps every leased one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_clears_100k_expired_rows_in_batches_and_spares_live_leases() {
    let Some(store) = pg::store(4).await else {
        return;
    };
    let t = store.table().to_owned();
    // Times relative to the database clock, as idem writes them (ms since the epoch).
    let now = "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";
    for (n, status, lease, expire, prefix) in [
        // expired, done
        (100_000, "SUCCEEDED", "-7200000", "-3600000", "old"),
        // alive, done
        (3_000, "SUCCEEDED", "-7200000", "3600000", "live"),
        // TTL passed, but a lease still running: never swept
        (700, "PROCESSING", "3600000", "-3600000", "leased"),
        // TTL passed, lease over: a dead claim, swept
        (300, "PROCESSING", "-1000", "-3600000", "dead"),
    ] {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
             lease_until, created_at, updated_at, expire_at) \
             SELECT 'SWEEP', '{prefix}-' || g, '{status}', 1, g, NULL, NULL, \
             {now} + {lease}, {now} - 7200000, {now} - 7200000, {now} + {expire} \
             FROM generate_series(1, {n}) AS g"
        )))
        .execute(store.pool())
        .await
        .unwrap();
    }
    let mut statements = 0;
    let mut deleted = 0;
    loop {
        let n = store.sweep_expired(PgStore::SWEEP_BATCH).await.unwrap();
        assert!(n <= 1_000, "one statement deleted {n} rows");
        statements += 1;
        deleted += n;
        if n < 1_000 {
            break;
        }
    }
    assert_eq!(deleted, 100_300);
    assert_eq!(statements, 101, "batches of 1,000 and a short last one");
    let left: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT split_part(idem_key, '-', 1), COUNT(*) FROM {t} GROUP BY 1 ORDER BY 1"
    )))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        left,
        vec![("leased".to_owned(), 700), ("live".to_owned(), 3_000)]
    );
    // The Sweeper's own pass finds nothing more.
    assert_eq!(
        Sweeper::new(store.clone(), PgStore::SWEEP_BATCH)
            .sweep_once()
            .await
            .unwrap(),
        0
    );
    pg::drop_tables(&store).await;
}

/// A table in a schema of its own (`schema.table`), quoted in every statement: the whole cycle
/// works there, and the records are in that schema. Bad names are refused before any SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_qualified_tables_work_and_bad_names_are_refused() {
    let Some((pool, schema)) = pg::schema_pool(4).await else {
        return;
    };
    let store = PgStore::builder()
        .table(&format!("{schema}.records"))
        .unwrap()
        .build(pool.clone())
        .unwrap();
    assert_eq!(store.token_table(), format!("{schema}.records_tok"));
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // idempotent
    let biz = biz("pg_schema");
    let first: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run(&store, async { Ok(7) })
        .await;
    let again: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run(&store, async { panic!("must replay") })
        .await;
    assert_eq!((first.unwrap(), again.unwrap()), (7, 7));
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::TEXT FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(tables, ["records", "records_tok"]);
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {schema}.records"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rows, 1);
    // A token in the same schema.
    let tokens = store.tokens();
    let token = idem::TokenStore::issue(&tokens, Duration::from_secs(60), None)
        .await
        .unwrap();
    idem::TokenStore::consume(&tokens, &token, None)
        .await
        .unwrap();
    for bad in ["", "a-b", "x; DROP TABLE y", "a.b.c", "1x"] {
        assert!(
            matches!(
                PgStore::builder().table(bad),
                Err(IdemError::InvalidOptions { .. })
            ),
            "{bad:?}"
        );
    }
    pg::drop_schema(&pool, &schema).await;
}

/// A store whose table was never made says so, and how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_says_run_migrate() {
    let Some(store) = pg::store(2).await else {
        return;
    };
    let missing = PgStore::builder()
        .table(&format!("{}_never_made", store.table()))
        .unwrap()
        .build(store.pool().clone())
        .unwrap();
    let res: Result<(), IdemError> = Call::new("PG_SCHEMA", "k")
        .run(&missing, async { Ok(()) })
        .await;
    match res {
        Err(e @ IdemError::StoreSchema { .. }) => {
            assert!(e.to_string().contains("migrate()"), "{e}");
            assert!(!e.is_retryable());
        }
        other => panic!("expected StoreSchema, got {other:?}"),
    }
    pg::drop_tables(&store).await;
}

/// A duplicate in transaction mode waits for the claimant's transaction at most the store's lock
/// timeout, then answers `InProgress` (so does a lease-mode duplicate); after the claimant commits,
/// both replay. The claimant's body runs with the caller's own lock timeout, not idem's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_a_bounded_time_then_replays() {
    let builder = PgStore::builder().lock_timeout(Duration::from_millis(200));
    let Some(store) = pg::store_with(builder, 4).await else {
        return;
    };
    let biz = biz("pg_wait");
    let mut holder = store.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *holder)
        .await
        .unwrap();
    let seen: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut holder, async |tx: &mut PgTx| {
            let row = sqlx::raw_sql("SHOW lock_timeout")
                .fetch_one(&mut **tx)
                .await
                .map_err(IdemError::store)?;
            Ok(row.get::<String, _>(0))
        })
        .await;
    assert_eq!(
        seen.unwrap(),
        "7s",
        "the body runs with the caller's lock timeout"
    );

    // The claimant's transaction is still open: its record is locked and uncommitted.
    let mut dup = store.begin().await.unwrap();
    let res: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut dup, async |_tx: &mut PgTx| Ok("second run".to_owned()))
        .await;
    assert!(
        matches!(res, Err(IdemError::InProgress { .. })),
        "tx-mode duplicate: {res:?}"
    );
    // The duplicate's transaction is still usable after the timed-out wait.
    sqlx::query("SELECT 1").execute(&mut *dup).await.unwrap();
    dup.rollback().await.unwrap();
    let res: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run(&store, async { Ok("second run".to_owned()) })
        .await;
    assert!(
        matches!(res, Err(IdemError::InProgress { .. })),
        "lease-mode duplicate: {res:?}"
    );

    holder.commit().await.unwrap();
    let mut dup = store.begin().await.unwrap();
    let res: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut dup, async |_tx: &mut PgTx| Ok("second run".to_owned()))
        .await;
    dup.commit().await.unwrap();
    assert_eq!(res.unwrap(), "7s", "replayed after the commit");
    pg::drop_tables(&store).await;
}

/// A transaction-mode duplicate that arrives while the claimant's transaction is open waits for
/// it (the key's advisory lock, within the store's lock timeout) and replays the claimant's
/// answer once it commits; its body never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_replays_when_the_claimant_commits() {
    let builder = PgStore::builder().lock_timeout(Duration::from_secs(10));
    let Some(store) = pg::store_with(builder, 4).await else {
        return;
    };
    let biz = biz("pg_wait_commit");
    let mut holder = store.begin().await.unwrap();
    let first: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut holder, async |_tx: &mut PgTx| {
            Ok("first run".to_owned())
        })
        .await;
    assert_eq!(first.unwrap(), "first run");

    let ran_twice = Arc::new(AtomicU32::new(0));
    let dup = tokio::spawn({
        let (store, biz, ran_twice) = (store.clone(), biz.clone(), ran_twice.clone());
        async move {
            let mut dup = store.begin().await.unwrap();
            let res: Result<String, IdemError> = Call::new(biz, "k")
                .run_in_tx(&mut dup, async |_tx: &mut PgTx| {
                    ran_twice.fetch_add(1, Ordering::SeqCst);
                    Ok("second run".to_owned())
                })
                .await;
            dup.commit().await.unwrap();
            res
        }
    });
    // The duplicate is waiting on the open transaction's advisory lock for this key (its lock
    // timeout is 10 s), as the server's lock table shows: a bigint key is `classid` (high 32
    // bits) and `objid` (low 32 bits), `objsubid` 1.
    let mut waiting = 0i64;
    for _ in 0..400 {
        waiting = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_locks, \
             (SELECT hashtextextended($1 || chr(31) || 'k', hashtext($2)) AS h) AS k \
             WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid::bigint = (k.h >> 32) & 4294967295 AND objid::bigint = k.h & 4294967295",
        )
        .bind(&biz)
        .bind(store.table())
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting > 0 || dup.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiting, 1, "the duplicate waits for the claimant's lock");
    assert!(!dup.is_finished());
    holder.commit().await.unwrap();
    let res = dup.await.unwrap();
    assert_eq!(res.unwrap(), "first run", "replayed the claimant's answer");
    assert_eq!(ran_twice.load(Ordering::SeqCst), 0);
    pg::drop_tables(&store).await;
}

/// The key's lock is per table: a transaction-mode call of the same business type and key on
/// another table neither waits for an open claimant's transaction nor is told "in progress".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_on_another_table_does_not_wait() {
    let builder = || PgStore::builder().lock_timeout(Duration::from_secs(10));
    let (Some(one), Some(other)) = (
        pg::store_with(builder(), 2).await,
        pg::store_with(builder(), 2).await,
    ) else {
        return;
    };
    assert_ne!(one.table(), other.table());
    let biz = biz("pg_lock_table");
    let mut holder = one.begin().await.unwrap();
    let first: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut holder, async |_tx: &mut PgTx| Ok(1))
        .await;
    assert_eq!(first.unwrap(), 1);
    let mut elsewhere = other.begin().await.unwrap();
    let res: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut elsewhere, async |_tx: &mut PgTx| Ok(2))
        .await;
    elsewhere.commit().await.unwrap();
    holder.commit().await.unwrap();
    // A lock shared with the open transaction would have ended in `InProgress` after the 10 s
    // lock timeout (the holder commits only after this call).
    assert_eq!(res.unwrap(), 2, "its own table, its own record");
    pg::drop_tables(&one).await;
    pg::drop_tables(&other).await;
}

/// REPEATABLE READ: a transaction whose snapshot predates another's committed claim cannot replay
/// it (its snapshot would lie): the claim fails with a serialization failure that says to run the
/// transaction again, and the next transaction replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_snapshot_restarts_the_transaction() {
    let Some(store) = pg::store(4).await else {
        return;
    };
    let biz = biz("pg_rr");
    let mut stale = store.begin_with(PgIsolation::RepeatableRead).await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *stale).await.unwrap(); // takes the snapshot
    let first: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run(&store, async { Ok(1) })
        .await;
    assert_eq!(first.unwrap(), 1);
    let res: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut stale, async |_tx: &mut PgTx| Ok(2))
        .await;
    match res {
        Err(e) => {
            assert!(e.restarts_transaction(), "{e:?}");
            assert!(
                matches!(
                    e,
                    IdemError::StoreBusy {
                        reason: Busy::Serialization,
                        ..
                    }
                ),
                "{e:?}"
            );
            assert_eq!(e.http_status(), 409);
        }
        Ok(v) => panic!("a stale snapshot must not answer: {v}"),
    }
    stale.rollback().await.unwrap();
    let again = idem::retry_transaction(|| async {
        let mut tx = store.begin_with(PgIsolation::RepeatableRead).await?;
        let v: u32 = Call::new(biz.clone(), "k")
            .run_in_tx(&mut tx, async |_tx: &mut PgTx| Ok::<_, IdemError>(3))
            .await?;
        tx.commit().await?;
        Ok::<_, IdemError>(v)
    })
    .await;
    assert_eq!(again.unwrap(), 1, "the next transaction replays");
    pg::drop_tables(&store).await;
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Paid {
    order_no: String,
    row: i64,
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

static RUNS: AtomicU32 = AtomicU32::new(0);

// By name: the store registered as "postgres" at start-up.
#[idem::idempotent(
    biz = "PG_MACRO",
    key = "order_no",
    store = "postgres",
    fingerprint = "amount"
)]
async fn pay_by_name(order_no: &str, amount: u64) -> Result<Paid, ShopError> {
    let row = i64::from(RUNS.fetch_add(1, Ordering::Relaxed));
    let _ = amount;
    Ok(Paid {
        order_no: order_no.to_owned(),
        row,
    })
}

// In the caller's transaction: the claim, the business row and the mark commit together.
#[idem::idempotent(biz = "PG_MACRO_TX", key = "order_no", tx = "tx")]
async fn pay_in_tx(tx: &mut PgTx, order_no: &str, table: &str) -> Result<Paid, ShopError> {
    let row: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO {table} (order_no) VALUES ($1) RETURNING id"
    )))
    .bind(order_no)
    .fetch_one(&mut **tx)
    .await?;
    Ok(Paid {
        order_no: order_no.to_owned(),
        row,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_works_by_name_and_in_transactions() {
    let Some(store) = pg::store(4).await else {
        return;
    };
    idem::register_store("postgres", store.clone());
    let order = contract::biz("ORD");
    let first = pay_by_name(&order, 990).await.unwrap();
    let (again, report) = idem::metrics::observe(pay_by_name(&order, 990)).await;
    assert_eq!(again.unwrap(), first);
    assert!(report.unwrap().replayed());
    assert!(matches!(
        pay_by_name(&order, 991).await,
        Err(ShopError::Idem(IdemError::PayloadMismatch))
    ));

    let payments = format!("{}_pay", store.table());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {payments} (id BIGSERIAL PRIMARY KEY, order_no TEXT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let mut tx = store.begin().await.unwrap();
    let first = pay_in_tx(&mut tx, &order, &payments).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(pay_in_tx(&mut tx, &order, &payments).await.unwrap(), first);
    tx.commit().await.unwrap();
    // A rolled-back transaction leaves neither the claim nor the payment.
    let other = contract::biz("ORD");
    let mut tx = store.begin().await.unwrap();
    pay_in_tx(&mut tx, &other, &payments).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store.load("PG_MACRO_TX", &other).await.unwrap().is_none());
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {payments}")))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1, "one payment row in all");
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {payments}")))
        .execute(store.pool())
        .await
        .unwrap();
    pg::drop_tables(&store).await;
}

/// The definitions of `table`'s indexes (in the current schema), by name.
async fn index_defs(store: &PgStore, table: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT indexname::TEXT, indexdef FROM pg_indexes \
         WHERE schemaname = current_schema() AND tablename = $1 ORDER BY indexdef",
    )
    .bind(table)
    .fetch_all(store.pool())
    .await
    .unwrap()
}

/// The reconciler's query (`stuck`) as Postgres plans it on `store`'s table (sequential scans
/// off: a test table is small enough that a scan would win).
async fn stuck_plan(store: &PgStore) -> String {
    let mut conn = store.pool().acquire().await.unwrap();
    sqlx::raw_sql("SET enable_seqscan = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    let sql = format!("EXPLAIN {}", store.__statement("stuck").unwrap());
    let lines: Vec<String> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind("PAY")
        .bind(0_i64)
        .bind(10_i64)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql("RESET enable_seqscan")
        .execute(&mut *conn)
        .await
        .unwrap();
    lines.join("\n")
}

/// Tables made by earlier versions' DDL (the table alone; the table and the index over every
/// record that `stuck` read before) get from `migrate()` the index `stuck` reads now, over the
/// PROCESSING records only, and lose the one it replaces; again is a no-op. The reconciler's
/// query reads the new index in its order (no sort). In a schema of its own, the index dropped
/// is the table's, named with its schema. And a table whose name is as long as idem allows gets
/// it beside its expiry index (at 62 bytes `<table>_expire_at` and `<table>_processing` cut at
/// 63 would be one name, and `CREATE INDEX IF NOT EXISTS` would skip the second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_brings_a_table_of_an_earlier_version_to_the_index_of_processing_records() {
    let Some(base) = pg::store(2).await else {
        return;
    };
    let store_on = |t: &str| {
        PgStore::builder()
            .table(t)
            .unwrap()
            .token_table(base.token_table())
            .unwrap()
            .build(base.pool().clone())
            .unwrap()
    };
    let names = |defs: Vec<(String, String)>| defs.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    for (version, old) in [(1, "_v1"), (3, "_v3")] {
        let t = format!("{}{old}", base.table());
        // The records' DDL of those versions (the second is the tokens').
        for (i, ddl) in PgStore::MIGRATIONS[..version].iter().enumerate() {
            if i == 1 {
                continue;
            }
            sqlx::raw_sql(AssertSqlSafe(ddl.replace("idem_record", &t)))
                .execute(base.pool())
                .await
                .unwrap();
        }
        let store = store_on(&t);
        let before = names(index_defs(&store, &t).await);
        assert_eq!(
            before.contains(&format!("{t}_stuck")),
            version == 3,
            "{before:?}"
        );
        store.migrate().await.unwrap();
        store.migrate().await.unwrap(); // idempotent
        let defs = index_defs(&store, &t).await;
        assert_eq!(
            names(defs.clone()),
            [
                format!("{t}_expire_at"),
                format!("{t}_processing"),
                format!("{t}_result_until"),
                format!("{t}_pkey")
            ],
            "{defs:?}"
        );
        assert!(
            defs[1].1.ends_with(
                "USING btree (biz_type, lease_until) WHERE (status = 'PROCESSING'::text)"
            ),
            "{defs:?}"
        );
        let plan = stuck_plan(&store).await;
        assert!(
            plan.contains(&format!("Index Scan using {t}_processing")) && !plan.contains("Sort"),
            "{plan}"
        );
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {t}")))
            .execute(base.pool())
            .await
            .unwrap();
    }

    // In a schema of its own, beside a table of the same name on the search path (the pool's
    // connections work in the default schema) whose index of the same name must stay.
    let Some((schema_pool, schema)) = pg::schema_pool(1).await else {
        return;
    };
    let pool = base.pool().clone();
    let t = format!("{}_twin", base.table());
    for qualified in [format!("{schema}.{t}"), t.clone()] {
        for ddl in [PgStore::MIGRATIONS[0], PgStore::MIGRATIONS[2]] {
            let ddl = ddl
                .replace("ON idem_record ", &format!("ON {qualified} "))
                .replace("EXISTS idem_record ", &format!("EXISTS {qualified} "))
                .replace("idem_record_", &format!("{t}_"));
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .unwrap();
        }
    }
    let store = PgStore::builder()
        .table(&format!("{schema}.{t}"))
        .unwrap()
        .build(pool.clone())
        .unwrap();
    store.migrate().await.unwrap();
    let in_schema = |schema: String| {
        let pool = pool.clone();
        let t = t.clone();
        async move {
            let names: Vec<String> = sqlx::query_scalar(
                "SELECT indexname::TEXT FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 \
                 ORDER BY 1",
            )
            .bind(schema)
            .bind(t)
            .fetch_all(&pool)
            .await
            .unwrap();
            names
        }
    };
    assert_eq!(
        in_schema(schema.clone()).await,
        [
            format!("{t}_expire_at"),
            format!("{t}_pkey"),
            format!("{t}_processing"),
            format!("{t}_result_until")
        ]
    );
    let public: String = sqlx::query_scalar("SELECT current_schema()::TEXT")
        .fetch_one(base.pool())
        .await
        .unwrap();
    assert_eq!(
        in_schema(public).await,
        [
            format!("{t}_expire_at"),
            format!("{t}_pkey"),
            format!("{t}_stuck")
        ],
        "the twin on the search path keeps its index"
    );
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {t}")))
        .execute(base.pool())
        .await
        .unwrap();
    pg::drop_schema(&schema_pool, &schema).await;

    let t = base.table().to_owned();
    let long = format!("{t}_{}", "x".repeat(61 - t.len()));
    assert_eq!(long.len(), 62);
    let store = store_on(&long);
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let mut columns: Vec<String> = index_defs(&store, &long)
        .await
        .into_iter()
        .map(|(_, def)| def.rsplit_once(" USING btree ").unwrap().1.to_owned())
        .collect();
    columns.sort();
    assert_eq!(
        columns,
        [
            "(biz_type, idem_key)",
            "(biz_type, lease_until) WHERE (status = 'PROCESSING'::text)",
            "(expire_at)",
            "(result_until) WHERE (result_until > 0)"
        ]
    );
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {long}")))
        .execute(base.pool())
        .await
        .unwrap();
    pg::drop_tables(&base).await;
}

/// The store's own `with_table` / `with_token_table` (not only the builder's): the statements and
/// `migrate()` use the new names; `with_limits` on the store and the builder's `limits` at `build`
/// refuse what a `bytea` / `text` column cannot hold.
#[tokio::test]
async fn the_store_takes_table_names_and_checks_limits() {
    let Some(base) = pg::store(2).await else {
        return;
    };
    let t = format!("{}_own", base.table());
    let store = base
        .clone()
        .with_table(&t)
        .unwrap()
        .with_token_table(&format!("{t}_tok"))
        .unwrap();
    assert_eq!(
        (store.table(), store.token_table()),
        (t.as_str(), &*format!("{t}_tok"))
    );
    store.migrate().await.unwrap();
    let ran: Result<u8, IdemError> = Call::new("PG_OWN", "k").run(&store, async { Ok(1) }).await;
    assert_eq!(ran.unwrap(), 1);
    assert!(base.load("PG_OWN", "k").await.unwrap().is_none());
    assert!(store.load("PG_OWN", "k").await.unwrap().is_some());
    for bad in ["", "a-b", "a.b.c"] {
        assert!(matches!(
            base.clone().with_table(bad),
            Err(IdemError::InvalidOptions { .. })
        ));
    }
    let too_big = idem::Limits {
        max_snapshot_len: (1 << 30) + 1,
        ..idem::Limits::default()
    };
    let err = store.clone().with_limits(too_big.clone()).err().unwrap();
    assert!(
        matches!(err, IdemError::InvalidOptions { .. })
            && err.to_string().contains("max_snapshot_len = 1073741825")
            && err.to_string().contains("at most 1073741824"),
        "{err}"
    );
    assert!(matches!(
        PgStore::builder()
            .limits(too_big)
            .build(base.pool().clone()),
        Err(IdemError::InvalidOptions { .. })
    ));
    let wide = store
        .with_limits(idem::Limits {
            max_snapshot_len: 1 << 30,
            ..idem::Limits::default()
        })
        .unwrap();
    assert_eq!(wide.limits().max_snapshot_len, 1 << 30);
    pg::drop_tables(&wide).await;
}

/// The connections the store keeps warm between its statements go back to the pool the
/// application shares with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_connections_go_back_to_the_pool() {
    let url = server::url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&url);
    let Some(pool) = server::reach("Postgres", &url, pool).await else {
        return;
    };
    let store = PgStore::from_pool(pool.clone())
        .with_table(&server::unique("idem_pg"))
        .unwrap();
    store.migrate().await.unwrap();
    contract::pool::warm_connections_go_back_to_the_pool(&pool, &store).await;
}

/// A `migrate()` that changes nothing says nothing: Postgres's "already exists, skipping"
/// notices, which sqlx logs at INFO, are not sent.
#[tokio::test]
async fn a_migrate_that_changes_nothing_logs_nothing() {
    use std::sync::Mutex;
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);
    struct Text<'a>(&'a mut String);
    impl tracing::field::Visit for Text<'_> {
        fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{value:?} "));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut text = String::new();
            event.record(&mut Text(&mut text));
            self.0.lock().unwrap().push(text);
        }
    }
    let Some(store) = pg::store(2).await else {
        return;
    };
    let seen = Seen::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));
    store.migrate().await.unwrap();
    let events = seen.0.lock().unwrap().clone();
    assert!(
        !events.iter().any(|e| e.contains("already exists")),
        "{events:#?}"
    );
    drop(_guard);
    pg::drop_tables(&store).await;
}
