//! What is particular to MySQL / MariaDB (`IDEM_MYSQL_URL`, default the local server): keys that
//! differ only in case or accents are two records, a snapshot at the limit fits, limits and table
//! names the table cannot hold are refused, a missing table says "run migrate()", InnoDB's
//! deadlocks among same-key claimants in transactions restart the transaction and never run the
//! business twice, the sweeper clears 100k expired rows in batches while sparing live leases, and
//! a mark or a claim cut off by the store timeout, which the server then drops or commits, keeps
//! its key in progress until the claim's lease ends.

mod contract;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use contract::server;
use idem::sqlx::{self, AssertSqlSafe};
use idem::{
    Call, IdemError, MySqlStore, Store,
    store::{ClaimOutcome, ClaimRequest, Limits, Status},
};
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;

fn url() -> String {
    server::mysql_url()
}

/// A store on a table of its own, migrated.
async fn store_with(max_connections: u32) -> Option<MySqlStore> {
    let url = url();
    let store = server::reach(
        "MySQL",
        &url,
        MySqlStore::connect_with(&url, max_connections, Duration::from_secs(2)),
    )
    .await?;
    let store = store.with_table(&server::unique("idem_my")).unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

fn req<'a>(biz: &'a str, key: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        biz,
        key,
        fingerprint: None,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
    }
}

#[tokio::test]
async fn keys_differing_in_case_or_accents_are_two_records() {
    let Some(store) = store_with(4).await else {
        return;
    };
    let runs = AtomicU32::new(0);
    let mut answers = Vec::new();
    for key in ["ORD-1", "ord-1", "Ord-1", "café", "cafe", "CAFÉ", "ORD-1 "] {
        let answer: Result<String, IdemError> = Call::new("PAY", key)
            .run(&store, async {
                runs.fetch_add(1, Ordering::Relaxed);
                Ok(format!("receipt for {key}"))
            })
            .await;
        answers.push(answer.unwrap());
    }
    assert_eq!(
        runs.load(Ordering::Relaxed),
        7,
        "each spelling is its own record"
    );
    // And each replays its own answer, not a neighbour's.
    for key in ["ord-1", "cafe", "ORD-1 "] {
        let again: Result<String, IdemError> = Call::new("PAY", key)
            .run(&store, async { panic!("must replay") })
            .await;
        assert_eq!(again.unwrap(), format!("receipt for {key}"));
    }
    let rec = store.load("PAY", "ord-1").await.unwrap().unwrap();
    assert_eq!(rec.key, "ord-1");
}

#[tokio::test]
async fn a_snapshot_at_the_limit_fits() {
    let Some(store) = store_with(4).await else {
        return;
    };
    for limit in [64 * 1024, 1024 * 1024] {
        let store = store
            .clone()
            .with_limits(Limits {
                max_snapshot_len: limit,
                ..Limits::default()
            })
            .unwrap();
        let key = format!("big-{limit}");
        let ClaimOutcome::Acquired { claim, .. } = store.claim(&req("SNAP", &key)).await.unwrap()
        else {
            panic!("a fresh key is acquired");
        };
        let snapshot: Vec<u8> = (0..limit).map(|i| (i % 251) as u8).collect();
        store
            .complete("SNAP", &key, &claim, &snapshot, req("SNAP", &key).ttl)
            .await
            .unwrap();
        let rec = store.load("SNAP", &key).await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Succeeded);
        assert_eq!(
            rec.snapshot.as_deref(),
            Some(&snapshot[..]),
            "{limit} bytes stored whole"
        );
    }
    // Through a call: a result whose stored form is just under the default limit replays whole.
    let text = "y".repeat(64 * 1024 - 64);
    let first: Result<String, IdemError> = Call::new("SNAP", "call")
        .run(&store, async { Ok(text.clone()) })
        .await;
    let again: Result<String, IdemError> = Call::new("SNAP", "call")
        .run(&store, async { panic!("must replay") })
        .await;
    assert_eq!(first.unwrap(), again.unwrap());
}

#[tokio::test]
async fn limits_and_names_the_table_cannot_hold_are_refused() {
    let Some(store) = store_with(2).await else {
        return;
    };
    for limits in [
        Limits {
            max_key_len: 256,
            ..Limits::default()
        },
        Limits {
            max_biz_len: 65,
            ..Limits::default()
        },
        Limits {
            max_snapshot_len: 1 << 24,
            ..Limits::default()
        },
    ] {
        assert!(matches!(
            store.clone().with_limits(limits),
            Err(IdemError::InvalidOptions { .. })
        ));
    }
    for bad in ["", "idem record", "x`; DROP TABLE y", "a.b.c"] {
        assert!(matches!(
            store.clone().with_table(bad),
            Err(IdemError::InvalidOptions { .. })
        ));
    }
    // A key at the 128-byte default limit is stored; one byte more is refused before any write.
    let at_limit = "k".repeat(128);
    let ok: Result<u8, IdemError> = Call::new("LIM", &at_limit)
        .run(&store, async { Ok(1) })
        .await;
    assert_eq!(ok.unwrap(), 1);
    let over: Result<u8, IdemError> = Call::new("LIM", &"k".repeat(129))
        .run(&store, async { Ok(1) })
        .await;
    assert!(
        matches!(over, Err(IdemError::InvalidKey { .. })),
        "{over:?}"
    );
}

#[tokio::test]
async fn a_missing_table_says_to_run_migrate() {
    let url = url();
    let Some(store) = server::reach("MySQL", &url, MySqlStore::connect(&url)).await else {
        return;
    };
    let store = store.with_table(&server::unique("idem_absent")).unwrap();
    let err = store.claim(&req("PAY", "k")).await.unwrap_err();
    match &err {
        IdemError::StoreSchema { hint, .. } => assert!(hint.contains("migrate()"), "{hint}"),
        other => panic!("expected StoreSchema, got {other:?}"),
    }
    assert!(!err.is_retryable());
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    claimant: u32,
    effect: u64,
}

#[derive(Debug, thiserror::Error)]
enum StormError {
    #[error("declined")]
    Declined,
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// 64 claimants of one key in transaction mode, released together by a barrier, round after round.
/// Some claim and then roll their whole transaction back, some have a body that fails (back to the
/// savepoint) while the others wait on the row lock: the situations in which InnoDB deadlocks
/// same-key inserts. Every deadlock victim is told to restart its transaction (and does); the
/// business writes its effect in an independent table inside the transaction, and exactly one
/// effect per round is committed, whose receipt every committing claimant gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deadlock_storm_of_same_key_claimants_commits_one_effect_per_round() {
    const CLAIMANTS: u32 = 64;
    const ROUNDS: u32 = 12;
    let Some(store) = store_with(CLAIMANTS + 4).await else {
        return;
    };
    let store = Arc::new(store);
    let effects = format!("{}_fx", store.table());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {effects} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         k VARCHAR(64) NOT NULL, claimant INT NOT NULL) ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let restarts = Arc::new(AtomicU32::new(0));
    let in_progress = Arc::new(AtomicU32::new(0));
    for round in 0..ROUNDS {
        let key = format!("storm-{round}");
        let barrier = Arc::new(Barrier::new(CLAIMANTS as usize));
        let tasks: Vec<_> = (0..CLAIMANTS)
            .map(|i| {
                let (store, barrier, key, effects) =
                    (store.clone(), barrier.clone(), key.clone(), effects.clone());
                let (restarts, in_progress) = (restarts.clone(), in_progress.clone());
                tokio::spawn(async move {
                    // 1 in 8 rolls the whole transaction back after its call, 1 in 8 has a
                    // failing body; they take part once. The rest commit, trying again until
                    // they get an answer.
                    let role = i % 8;
                    barrier.wait().await;
                    for attempt in 0..400u32 {
                        let mut tx = store.begin().await?;
                        let out: Result<Receipt, StormError> = Call::new("STORM", &key)
                            .run_in_tx(&mut tx, async |tx: &mut idem::MySqlTx| {
                                let id = sqlx::query(AssertSqlSafe(format!(
                                    "INSERT INTO {effects} (k, claimant) VALUES (?, ?)"
                                )))
                                .bind(&key)
                                .bind(i)
                                .execute(&mut **tx)
                                .await?
                                .last_insert_id();
                                if role == 1 {
                                    return Err(StormError::Declined);
                                }
                                Ok(Receipt {
                                    claimant: i,
                                    effect: id,
                                })
                            })
                            .await;
                        match out {
                            Ok(receipt) if role == 0 => {
                                tx.rollback().await?;
                                return Ok::<_, StormError>(Some((attempt, receipt, false)));
                            }
                            Ok(receipt) => match tx.commit().await {
                                Ok(()) => return Ok(Some((attempt, receipt, true))),
                                Err(e) if e.restarts_transaction() => {
                                    restarts.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => return Err(e.into()),
                            },
                            Err(StormError::Declined) => {
                                tx.commit().await?;
                                return Ok(None);
                            }
                            Err(StormError::Idem(e)) if e.restarts_transaction() => {
                                // The deadlock victim: InnoDB rolled the transaction back.
                                restarts.fetch_add(1, Ordering::Relaxed);
                                drop(tx);
                            }
                            Err(StormError::Idem(IdemError::InProgress { .. })) => {
                                in_progress.fetch_add(1, Ordering::Relaxed);
                                tx.rollback().await?;
                                if role <= 1 {
                                    return Ok(None);
                                }
                            }
                            Err(e) => return Err(e),
                        }
                        tokio::time::sleep(Duration::from_millis(u64::from(attempt % 7) + 1)).await;
                    }
                    panic!("claimant {i} got no answer in 400 transactions");
                })
            })
            .collect();
        let mut committed = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            match task.await.unwrap().unwrap() {
                Some((_, receipt, true)) => committed.push(receipt),
                _ if i % 8 >= 2 => panic!("round {round}: claimant {i} committed no answer"),
                _ => {}
            }
        }
        let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {effects} WHERE k = ?"
        )))
        .bind(&key)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(rows, 1, "round {round}: exactly one committed effect");
        let effect_id: u64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT CAST(id AS UNSIGNED) FROM {effects} WHERE k = ?"
        )))
        .bind(&key)
        .fetch_one(store.pool())
        .await
        .unwrap();
        // Every claimant that always commits did; a failing body that replayed commits too.
        assert!(committed.len() >= (CLAIMANTS - 2 * CLAIMANTS / 8) as usize);
        assert!(
            committed.iter().all(|r| r.effect == effect_id),
            "round {round}: every committer got the receipt of the committed effect"
        );
        let rec = store.load("STORM", &key).await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Succeeded);
    }
    eprintln!(
        "deadlock storm: {ROUNDS} rounds of {CLAIMANTS}: {} transactions restarted, {} lock waits ran out",
        restarts.load(Ordering::Relaxed),
        in_progress.load(Ordering::Relaxed)
    );
}

/// 100,000 expired records among live ones: the sweeper deletes them in batches of 1,000 (each a
/// short statement), and spares records whose TTL passed but whose lease is live, and records not
/// yet expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_clears_100k_expired_rows_in_batches_and_spares_live_ones() {
    let Some(store) = store_with(4).await else {
        return;
    };
    let t = store.table().to_owned();
    let now = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)";
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
                  SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL \
                  SELECT 8 UNION ALL SELECT 9)";
    // (biz, how many, status, lease_until offset ms, expire_at offset ms)
    let kinds = [
        ("EXPIRED", 100_000, "SUCCEEDED", -60_000, -1_000),
        ("EXP_FAIL", 0, "FAILED", -60_000, -1_000),
        ("LEASED", 1_000, "PROCESSING", 3_600_000, -1_000),
        ("LIVE", 1_000, "SUCCEEDED", -60_000, 3_600_000),
    ];
    for (biz, n, status, lease, expire) in kinds {
        if n == 0 {
            continue;
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (biz_type, idem_key, status, attempt, fence, fingerprint, result, \
             lease_until, created_at, updated_at, expire_at) \
             SELECT ?, CONCAT('k-', n), ?, 1, n + 1, NULL, NULL, {now} + ?, {now}, {now}, {now} + ? \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n \
                   FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) AS s \
             WHERE n < ?"
        )))
        .bind(biz)
        .bind(status)
        .bind(lease)
        .bind(expire)
        .bind(n)
        .execute(store.pool())
        .await
        .unwrap();
    }
    let count = |biz: &'static str| {
        let (store, t) = (store.clone(), t.clone());
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM {t} WHERE biz_type = ?"
            )))
            .bind(biz)
            .fetch_one(store.pool())
            .await
            .unwrap()
        }
    };
    assert_eq!(count("EXPIRED").await, 100_000);

    let mut batches = 0;
    let mut deleted = 0;
    loop {
        let n = store.sweep_expired(1_000).await.unwrap();
        assert!(
            n <= 1_000,
            "a batch deletes at most 1,000 rows, deleted {n}"
        );
        deleted += n;
        if n == 0 {
            break;
        }
        batches += 1;
    }
    assert_eq!(deleted, 100_000);
    assert!(batches >= 100, "{batches} batches");
    assert_eq!(count("EXPIRED").await, 0);
    assert_eq!(count("LEASED").await, 1_000, "live leases are spared");
    assert_eq!(count("LIVE").await, 1_000, "unexpired records are spared");
    // The Sweeper drives the same statement.
    assert_eq!(
        idem::Sweeper::new(store.clone(), 1_000)
            .sweep_once()
            .await
            .unwrap(),
        0
    );
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

static PAID: AtomicU32 = AtomicU32::new(0);

// `store = "mysql"`: the store registered under that name at start-up.
#[idem::idempotent(biz = "PAY_ATTR", key = "order_no", store = "mysql")]
async fn pay_by_name(order_no: &str, amount: u32) -> Result<u32, PayError> {
    PAID.fetch_add(1, Ordering::Relaxed);
    Ok(amount)
}

// `tx = "tx"`: the claim, the business write and the mark in the caller's MySqlTx.
#[idem::idempotent(biz = "PAY_TX", key = "order_no", tx = "tx")]
async fn pay_in_tx(tx: &mut idem::MySqlTx, order_no: &str) -> Result<u64, PayError> {
    let table = format!("{}_pay", tx.store().table());
    let id = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (order_no) VALUES (?)"
    )))
    .bind(order_no)
    .execute(&mut **tx)
    .await?
    .last_insert_id();
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_runs_on_mysql_by_name_and_in_a_transaction() {
    let Some(store) = store_with(8).await else {
        return;
    };
    idem::register_store("mysql", store.clone());
    let before = PAID.load(Ordering::Relaxed);
    assert_eq!(pay_by_name("A-1", 990).await.unwrap(), 990);
    let (again, report) = idem::metrics::observe(pay_by_name("A-1", 990)).await;
    assert_eq!(again.unwrap(), 990);
    assert!(report.unwrap().replayed());
    assert_eq!(PAID.load(Ordering::Relaxed) - before, 1);

    let table = format!("{}_pay", store.table());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(32) NOT NULL) \
         ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let mut tx = store.begin().await.unwrap();
    let row = pay_in_tx(&mut tx, "T-1").await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(pay_in_tx(&mut tx, "T-1").await.unwrap(), row, "replayed");
    tx.commit().await.unwrap();
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// Statements the server saw on the store's one connection (`Questions`, less the `SHOW` itself).
async fn statements(store: &MySqlStore) -> i64 {
    let row: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Questions'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    row.1.parse().unwrap()
}

/// The round trips BENCHMARKS.md states, counted by the server: a new key is the claim `INSERT`
/// and the mark; a repeat is the refused `INSERT` and one read (while the store's claims write
/// first); in a transaction the savepoint comes on top, in the insert's round trip.
#[tokio::test]
async fn round_trips_per_call_are_what_the_docs_say() {
    let Some(store) = store_with(1).await else {
        return;
    };
    let lease = |key: &'static str| {
        let store = store.clone();
        async move {
            let r: Result<u8, IdemError> = Call::new("RT", key).run(&store, async { Ok(1) }).await;
            r.unwrap();
        }
    };
    // Warm up: prepare every statement once on the connection.
    lease("warm").await;
    lease("warm").await;
    let before = statements(&store).await;
    lease("a").await;
    let first = statements(&store).await - before - 1;
    let before = statements(&store).await;
    lease("a").await;
    let replay = statements(&store).await - before - 1;
    assert_eq!((first, replay), (2, 2), "lease mode: new key, repeat");
    let in_tx = |key: &'static str| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            let r: Result<u8, IdemError> = Call::new("RT", key)
                .run_in_tx(&mut tx, async |_tx: &mut idem::MySqlTx| Ok(1))
                .await;
            r.unwrap();
            tx.commit().await.unwrap();
        }
    };
    in_tx("warm-tx").await;
    in_tx("warm-tx").await;
    let before = statements(&store).await;
    in_tx("b").await;
    let first = statements(&store).await - before - 1;
    let before = statements(&store).await;
    in_tx("b").await;
    let replay = statements(&store).await - before - 1;
    // `SET SESSION` (the lock wait and the idle bound: MariaDB has no transaction-local SET, so
    // every transaction the store begins sets them) and `BEGIN` in one round trip,
    // `SAVEPOINT …; INSERT …` (one round trip), mark or read, COMMIT: 6 statements in 4 round
    // trips (the savepoint is released by the commit). Here the store's claims write first: a
    // repeat is the refused insert and a read; once repeats prevail it is one read
    // (`statement_counts.rs`).
    assert_eq!((first, replay), (6, 6), "tx mode: new key, repeat");
}

/// The lock wait in force inside a transaction `begin` opened.
async fn lock_wait_in_tx(store: &MySqlStore) -> u64 {
    let mut tx = store.begin().await.unwrap();
    let (secs,): (u64,) = sqlx::query_as("SELECT @@SESSION.innodb_lock_wait_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    secs
}

/// A transaction waits the store's lock wait, however the store was made: `connect_with` sets it
/// on each session as it connects (and `begin` sets it again with the idle bound), `with_lock_wait`
/// after it and a pool given to `from_pool` get it from `begin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_waits_the_stores_lock_wait_however_it_was_made() {
    let url = url();
    let Some(made) = server::reach(
        "MySQL",
        &url,
        MySqlStore::connect_with(&url, 2, Duration::from_secs(3)),
    )
    .await
    else {
        return;
    };
    assert_eq!(
        lock_wait_in_tx(&made).await,
        3,
        "set when each session connected"
    );
    let changed = made.clone().with_lock_wait(Duration::from_secs(7));
    assert_eq!(
        lock_wait_in_tx(&changed).await,
        7,
        "with_lock_wait after connecting"
    );
    assert_eq!(lock_wait_in_tx(&made).await, 3, "the first store's again");
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let given = MySqlStore::from_pool(pool.clone());
    assert_eq!(
        lock_wait_in_tx(&given).await,
        2,
        "the default, on a pool of the caller's"
    );
    pool.close().await;
}

/// A duplicate behind a transaction that holds the key and has not committed: the wait is bounded
/// by the store's lock wait (1 s here, not InnoDB's 50 s), then the call answers `InProgress`, in
/// lease mode and in tx mode; the waiting transaction stays usable (only the statement was undone),
/// and once the holder commits, a repeat replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_behind_an_open_transaction_is_told_in_progress() {
    let url = url();
    let Some(store) = server::reach(
        "MySQL",
        &url,
        MySqlStore::connect_with(&url, 4, Duration::from_secs(1)),
    )
    .await
    else {
        return;
    };
    let store = store.with_table(&server::unique("idem_wait")).unwrap();
    store.migrate().await.unwrap();

    let mut holder = store.begin().await.unwrap();
    let first: Result<u32, IdemError> = Call::new("WAIT", "k")
        .run_in_tx(&mut holder, async |_tx: &mut idem::MySqlTx| Ok(1))
        .await;
    assert_eq!(first.unwrap(), 1);

    let leased: Result<u32, IdemError> = Call::new("WAIT", "k")
        .run(&store, async {
            panic!("must not run while the holder is open")
        })
        .await;
    assert!(
        matches!(leased, Err(IdemError::InProgress { .. })),
        "{leased:?}"
    );

    let mut waiter = store.begin().await.unwrap();
    let dup: Result<u32, IdemError> = Call::new("WAIT", "k")
        .run_in_tx(&mut waiter, async |_tx: &mut idem::MySqlTx| {
            panic!("must not run while the holder is open")
        })
        .await;
    assert!(matches!(dup, Err(IdemError::InProgress { .. })), "{dup:?}");
    let other: Result<u32, IdemError> = Call::new("WAIT", "other")
        .run_in_tx(&mut waiter, async |_tx: &mut idem::MySqlTx| Ok(2))
        .await;
    assert_eq!(other.unwrap(), 2, "the waiting transaction goes on");
    waiter.commit().await.unwrap();

    holder.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let again: Result<u32, IdemError> = Call::new("WAIT", "k")
        .run_in_tx(&mut tx, async |_tx: &mut idem::MySqlTx| {
            panic!("must replay")
        })
        .await;
    tx.commit().await.unwrap();
    assert_eq!(again.unwrap(), 1);
    assert_eq!(
        store.load("WAIT", "other").await.unwrap().unwrap().status,
        Status::Succeeded
    );
}

/// The columns of `index` on `table` (of the store's database), in order; empty when it is absent.
async fn index_columns(store: &MySqlStore, table: &str, index: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT CAST(column_name AS CHAR) FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ? ORDER BY seq_in_index",
    )
    .bind(table)
    .bind(index)
    .fetch_all(store.pool())
    .await
    .unwrap()
}

/// A table made by the previous version's DDL gets the index `stuck` reads,
/// `(biz_type, status, lease_until)`, from `migrate()` (MySQL has no `CREATE INDEX IF NOT EXISTS`:
/// migrating again finds it there); and a table whose name is as long as idem allows gets it
/// beside its expiry index, under a name of its own.
#[tokio::test]
async fn migrate_adds_the_stuck_index_to_a_table_of_the_previous_version() {
    let url = url();
    let Some(store) = server::reach("MySQL", &url, MySqlStore::connect(&url)).await else {
        return;
    };
    let t = server::unique("idem_old");
    sqlx::raw_sql(AssertSqlSafe(
        MySqlStore::MIGRATIONS[0].replace("idem_record", &t),
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let store = store.with_table(&t).unwrap();
    let stuck = format!("{t}_stuck");
    assert_eq!(index_columns(&store, &t, &stuck).await, [] as [String; 0]);
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // idempotent
    assert_eq!(
        index_columns(&store, &t, &stuck).await,
        ["biz_type", "status", "lease_until"]
    );
    assert_eq!(
        index_columns(&store, &t, &format!("{t}_expire_at")).await,
        ["expire_at"]
    );

    // 63 bytes: `<table>_expire_at` and `<table>_stuck` cut at 63 would both be the table's name.
    let long = format!("{t}_{}", "x".repeat(62 - t.len()));
    assert_eq!(long.len(), 63);
    let store = store.with_table(&long).unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(index_name AS CHAR), CAST(GROUP_CONCAT(column_name ORDER BY seq_in_index) AS CHAR) \
         FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ? \
         GROUP BY index_name ORDER BY 2",
    )
    .bind(&long)
    .fetch_all(store.pool())
    .await
    .unwrap();
    let columns: Vec<&str> = indexes.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(
        columns,
        [
            "biz_type,idem_key",
            "biz_type,status,lease_until",
            "expire_at",
            "result_until"
        ],
        "{indexes:?}"
    );
    // With the token tables `with_table` moved the tokens to.
    let tokens = [
        store
            .clone()
            .with_table(&t)
            .unwrap()
            .token_table()
            .to_owned(),
        store.token_table().to_owned(),
    ];
    for table in [&t, &long].into_iter().chain(&tokens) {
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{table}`")))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// The connections the store keeps warm between its statements go back to the pool the
/// application shares with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_connections_go_back_to_the_pool() {
    let url = url();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&url);
    let Some(pool) = server::reach("MySQL", &url, pool).await else {
        return;
    };
    let store = MySqlStore::from_pool(pool.clone())
        .with_table(&server::unique("idem_my"))
        .unwrap();
    store.migrate().await.unwrap();
    contract::pool::warm_connections_go_back_to_the_pool(&pool, &store).await;
}

/// Concurrent batch claims over overlapping new keys, each batch with a key that exists: InnoDB
/// picks deadlock victims among them (a batch's insert meets the existing key and rolls back
/// while others wait on its new keys), and the store runs the victim's batch again, so no
/// caller sees the deadlock and every key is acquired by exactly one batch. The server's own
/// deadlock counter says how often it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_batch_claims_are_answered_through_deadlocks() {
    use idem::store::{BatchClaim, BatchItem};
    const TASKS: usize = 16;
    const ROUNDS: usize = 20;
    const KEYS: usize = 30;
    let Some(store) = store_with(TASKS as u32 + 4).await else {
        return;
    };
    let store = Arc::new(store);
    let deadlocks = async || -> i64 {
        let (_, n): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
            .fetch_one(store.pool())
            .await
            .unwrap();
        n.parse().unwrap()
    };
    let before = deadlocks().await;
    let mut acquired_total = 0;
    for round in 0..ROUNDS {
        // A key that exists before the batches arrive.
        let existing = format!("b{round}-old");
        assert!(matches!(
            store.claim(&req("BATCH", &existing)).await.unwrap(),
            ClaimOutcome::Acquired { .. }
        ));
        let barrier = Arc::new(Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (store, barrier, existing) = (store.clone(), barrier.clone(), existing.clone());
                tokio::spawn(async move {
                    // 10 of the round's 30 new keys, overlapping the neighbours' (and the
                    // existing key last or first, by task).
                    let mut keys: Vec<String> = (0..10)
                        .map(|i| format!("b{round}-{}", (t * 3 + i * 7) % KEYS))
                        .collect();
                    keys.sort();
                    keys.dedup();
                    if t % 2 == 0 {
                        keys.push(existing);
                    } else {
                        keys.insert(0, existing);
                    }
                    let items: Vec<BatchItem<'_>> = keys
                        .iter()
                        .map(|key| BatchItem {
                            key,
                            fingerprint: None,
                        })
                        .collect();
                    barrier.wait().await;
                    let got = store
                        .claim_batch(&BatchClaim {
                            biz: "BATCH",
                            items: &items,
                            lease: Duration::from_secs(30),
                            ttl: Duration::from_secs(3600),
                        })
                        .await
                        .unwrap_or_else(|e| panic!("a batch claim failed: {e:?}"));
                    keys.into_iter()
                        .zip(got)
                        .filter(|(_, o)| matches!(o, ClaimOutcome::Acquired { .. }))
                        .map(|(k, _)| k)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut won: Vec<String> = Vec::new();
        for t in tasks {
            won.extend(t.await.unwrap());
        }
        let n = won.len();
        won.sort();
        won.dedup();
        assert_eq!(won.len(), n, "round {round}: a key acquired by two batches");
        assert!(
            !won.contains(&format!("b{round}-old")),
            "the existing key is held"
        );
        acquired_total += n;
    }
    let happened = deadlocks().await - before;
    eprintln!(
        "{ROUNDS} rounds of {TASKS} overlapping batches: {acquired_total} keys acquired once each; \
         InnoDB counted {happened} deadlocks, each batch run again by the store"
    );
}

/// Waits (bounded) until no statement of another session mentions `table` any more (the server
/// finished or dropped it).
async fn settled(store: &MySqlStore, table: &str) {
    for _ in 0..200 {
        let busy: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%', ?, '%') \
             AND INFO NOT LIKE '%PROCESSLIST%'",
        )
        .bind(table)
        .fetch_one(store.pool())
        .await
        .unwrap();
        if busy == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a statement on {table} is still running");
}

/// A mark whose outcome the caller cannot know, and which the server then discards: cut off by
/// the store timeout while it waited for a lock, its connection closed, and MariaDB ending a
/// metadata-lock wait whose client is gone (as it ends a write waiting for a Galera donor's
/// backup lock; a node that loses the primary component drops its write sets likewise). The
/// caller is told to try again; the record stays PROCESSING under the first claim, so while its
/// lease lives a repeat is told "in progress" and runs nothing (the store neither frees nor fails
/// the key); once the lease ends, the takeover asks `recover`, which finds the effect
/// (docs/DESIGN.md, *The store timeout*).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_the_server_discards_keeps_the_key_in_progress_until_the_lease_ends() {
    use idem::sqlx::Connection;
    let Some(store) = store_with(4).await else {
        return;
    };
    let table = store.table().to_owned();
    let mut locker = sqlx::MySqlConnection::connect(&url()).await.unwrap();
    let runs = AtomicU32::new(0);
    let lease = Duration::from_secs(3);
    let first: Result<u32, IdemError> = Call::new("CUT", "mark")
        .lease(lease)
        .store_timeout(Duration::from_millis(500))
        .run(&store, async {
            runs.fetch_add(1, Ordering::Relaxed);
            // The mark's UPDATE now waits for this table lock.
            sqlx::query(AssertSqlSafe(format!("LOCK TABLES {table} READ")))
                .execute(&mut locker)
                .await
                .unwrap();
            Ok(1)
        })
        .await;
    let ran_at = std::time::Instant::now();
    assert!(
        matches!(&first, Err(e @ IdemError::StoreUnavailable { .. }) if e.is_retryable()),
        "{first:?}"
    );
    settled(&store, &table).await;
    sqlx::query("UNLOCK TABLES")
        .execute(&mut locker)
        .await
        .unwrap();
    let record = store.load("CUT", "mark").await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.attempt),
        (Status::Processing, 1),
        "the server discarded the mark"
    );

    let again: Result<u32, IdemError> = Call::new("CUT", "mark")
        .lease(lease)
        .run(&store, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok(2)
        })
        .await;
    assert!(
        matches!(again, Err(IdemError::InProgress { .. })),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::Relaxed), 1);

    tokio::time::sleep((lease + Duration::from_millis(300)).saturating_sub(ran_at.elapsed())).await;
    let recovered: Result<u32, IdemError> = Call::new("CUT", "mark")
        .lease(lease)
        .recover(|| async { Ok(Some(1)) })
        .run(&store, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok(3)
        })
        .await;
    assert_eq!(recovered.unwrap(), 1);
    assert_eq!(runs.load(Ordering::Relaxed), 1, "the body ran once");
    let record = store.load("CUT", "mark").await.unwrap().unwrap();
    assert_eq!((record.status, record.attempt), (Status::Succeeded, 2));
}

/// A claim whose outcome the caller cannot know, and which the server then commits: its INSERT
/// cut off by the store timeout while it waited for a row lock, which MariaDB does not end when
/// the client leaves (as a Galera node commits a write set its client stopped waiting for). The
/// caller is told to try again and ran nothing. Its retry meets the record it wrote itself and,
/// unable to tell it from another holder's, is told "in progress": it neither takes the record
/// as its own nor as free, so the body runs once, after the orphaned claim's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_after_its_caller_gave_up_is_in_progress_until_its_lease_ends() {
    use idem::sqlx::Connection;
    let Some(store) = store_with(4).await else {
        return;
    };
    let table = store.table().to_owned();
    let mut locker = sqlx::MySqlConnection::connect(&url()).await.unwrap();
    // A gap lock where the key's row goes: the claim's INSERT waits for it.
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM {table} WHERE biz_type = 'LATE' AND idem_key = 'claim' FOR UPDATE"
    )))
    .fetch_all(&mut locker)
    .await
    .unwrap();
    let runs = AtomicU32::new(0);
    let lease = Duration::from_secs(3);
    let first: Result<u32, IdemError> = Call::new("LATE", "claim")
        .lease(lease)
        .store_timeout(Duration::from_millis(500))
        .run(&store, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok(1)
        })
        .await;
    assert!(
        matches!(&first, Err(e @ IdemError::StoreUnavailable { .. }) if e.is_retryable()),
        "{first:?}"
    );
    // Within the store's lock wait (2 s): the INSERT gets its lock and commits, its client gone.
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    settled(&store, &table).await;
    let record = store.load("LATE", "claim").await.unwrap();
    assert!(
        matches!(&record, Some(r) if r.status == Status::Processing && r.attempt == 1),
        "the server committed the claim: {record:?}"
    );
    let committed_at = std::time::Instant::now();

    let again: Result<u32, IdemError> = Call::new("LATE", "claim")
        .lease(lease)
        .run(&store, async {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok(2)
        })
        .await;
    assert!(
        matches!(again, Err(IdemError::InProgress { .. })),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::Relaxed), 0);

    tokio::time::sleep((lease + Duration::from_millis(300)).saturating_sub(committed_at.elapsed()))
        .await;
    for expected in [3, 3] {
        let after: Result<u32, IdemError> = Call::new("LATE", "claim")
            .lease(lease)
            .run(&store, async {
                runs.fetch_add(1, Ordering::Relaxed);
                Ok(3)
            })
            .await;
        assert_eq!(after.unwrap(), expected);
    }
    assert_eq!(runs.load(Ordering::Relaxed), 1, "the body ran once");
}
