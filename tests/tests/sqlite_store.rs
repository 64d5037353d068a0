//! SQLite-specific behaviour: error classes (a missing table, a locked database), the schema
//! upgrade, and transactions that carry their store.

use std::time::Duration;

use idem::sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use idem::sqlx::{self, Row};
use idem::{Call, IdemError, SqliteStore, Store, TokenStore, error::Busy, store::Status};

fn temp_db(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("idem-sqlite-{name}-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

/// The first column of every row `sql` returns on `store`'s pool.
async fn first_column(store: &SqliteStore, sql: &'static str) -> Vec<String> {
    sqlx::query(sql)
        .fetch_all(store.pool())
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test]
async fn a_missing_table_says_to_run_migrate() {
    let store = SqliteStore::in_memory().await.unwrap();
    let res: Result<u8, IdemError> = Call::new("PAY", "k").run(&store, async { Ok(1) }).await;
    match res {
        Err(e @ IdemError::StoreSchema { .. }) => {
            assert!(e.to_string().contains("migrate()"), "{e}");
            assert!(!e.is_retryable());
            assert_eq!(e.http_status(), 500);
        }
        other => panic!("expected StoreSchema, got {other:?}"),
    }
}

/// Another connection holds the write lock past the busy timeout: the claim is refused as busy
/// (retryable, 503) after idem's own retries, and nothing ran.
#[tokio::test]
async fn a_locked_database_is_busy_and_retryable() {
    let path = temp_db("locked");
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .busy_timeout(Duration::from_millis(20));
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let store = SqliteStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let mut holder = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let res: Result<u8, IdemError> = Call::new("PAY", "k").run(&store, async { Ok(1) }).await;
    match &res {
        Err(
            e @ IdemError::StoreBusy {
                reason: Busy::Locked,
                ..
            },
        ) => {
            assert!(e.is_retryable());
            assert_eq!(e.http_status(), 503);
        }
        other => panic!("expected StoreBusy, got {other:?}"),
    }
    sqlx::query("SELECT 1").execute(&mut *holder).await.unwrap();
    holder.rollback().await.unwrap();
    assert!(store.load("PAY", "k").await.unwrap().is_none());
    let again: Result<u8, IdemError> = Call::new("PAY", "k").run(&store, async { Ok(1) }).await;
    assert_eq!(
        again.unwrap(),
        1,
        "once the lock is gone the call goes through"
    );
}

/// A database made by the first schema version (no fence column) is upgraded by `migrate()`, and
/// its records keep working.
#[tokio::test]
async fn migrate_upgrades_a_version_1_table() {
    let path = temp_db("v1");
    let store = SqliteStore::open(&path).await.unwrap();
    sqlx::raw_sql(SqliteStore::MIGRATIONS[0])
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idem_record (biz_type, idem_key, status, attempt, fingerprint, result, \
         lease_until, created_at, updated_at, expire_at) VALUES ('PAY', 'old', 'SUCCEEDED', 1, NULL, \
         CAST('{\"Ok\":7}' AS BLOB), 0, 0, 0, 9999999999999)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // idempotent
    let columns = first_column(&store, "SELECT name FROM pragma_table_info('idem_record')").await;
    assert!(columns.contains(&"fence".to_owned()), "{columns:?}");
    let old: Result<u8, IdemError> = Call::new("PAY", "old").run(&store, async { Ok(0) }).await;
    assert_eq!(old.unwrap(), 7, "an old record replays");
    let new: Result<u8, IdemError> = Call::new("PAY", "new").run(&store, async { Ok(1) }).await;
    assert_eq!(new.unwrap(), 1);
}

/// Probe 6: a transaction begun on store B claims in B's table. (Before, `tx = "tx"` with
/// `store = "a"` on a transaction of another database wrote the claim there, where A's lease-mode
/// calls and sweeper never look.) The transaction now carries its store, so this is the only
/// place a claim can go.
#[tokio::test]
async fn a_transaction_claims_in_the_store_it_was_begun_on() {
    let a = SqliteStore::open(temp_db("tx_a")).await.unwrap();
    let b = SqliteStore::open(temp_db("tx_b")).await.unwrap();
    a.migrate().await.unwrap();
    b.migrate().await.unwrap();
    let mut tx = b.begin().await.unwrap();
    let res: Result<u8, IdemError> = Call::new("PAY", "k")
        .run_in_tx(&mut tx, async |_tx| Ok(1))
        .await;
    tx.commit().await.unwrap();
    assert_eq!(res.unwrap(), 1);
    assert_eq!(
        b.load("PAY", "k").await.unwrap().unwrap().status,
        Status::Succeeded
    );
    assert!(a.load("PAY", "k").await.unwrap().is_none());
    // And store B's lease-mode calls see it.
    let replay: Result<u8, IdemError> = Call::new("PAY", "k").run(&b, async { Ok(2) }).await;
    assert_eq!(replay.unwrap(), 1);
}

/// Transaction mode hands the call's ttl to the mark too: a body slower than its ttl (ttl 2 s,
/// lease 1 s, 3 s on the test clock) commits a success that lives a ttl from its mark, so a
/// repeat replays; once that ttl has passed, the next call runs again.
#[tokio::test]
async fn a_success_in_a_transaction_outlives_a_body_slower_than_its_ttl() {
    use std::sync::atomic::{AtomicU32, Ordering};

    let clock = idem::TestClock::new();
    let store = SqliteStore::open(temp_db("slow_tx"))
        .await
        .unwrap()
        .with_test_clock(clock.clone());
    store.migrate().await.unwrap();
    let slow = || {
        Call::new("PAY", "slow")
            .ttl(Duration::from_secs(2))
            .lease(Duration::from_secs(1))
    };
    let runs = AtomicU32::new(0);
    let run = || runs.fetch_add(1, Ordering::SeqCst) + 1;
    let mut tx = store.begin().await.unwrap();
    let first: Result<u32, IdemError> = slow()
        .run_in_tx(&mut tx, async |_tx| {
            clock.advance(Duration::from_secs(3));
            Ok(run())
        })
        .await;
    tx.commit().await.unwrap();
    assert_eq!(first.unwrap(), 1);
    let rec = store.load("PAY", "slow").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Succeeded);
    assert!(
        rec.expire_at_ms >= rec.lease_until_ms + 4_000,
        "the success must live a ttl from its mark: {rec:?}"
    );
    let again: Result<u32, IdemError> = slow().run(&store, async { Ok(run()) }).await;
    assert_eq!(again.unwrap(), 1, "a repeat replays");
    clock.advance(Duration::from_secs(3));
    let later: Result<u32, IdemError> = slow().run(&store, async { Ok(run()) }).await;
    assert_eq!(later.unwrap(), 2, "past its ttl the record has expired");
}

/// A store that wraps another (here: one that counts claims) can hand out transactions that wrap
/// the inner store's, and a `tx = "…"` call joins them through the wrapper: the transaction type
/// carries the store, whatever is layered on it.
#[tokio::test]
async fn a_wrapping_store_hands_out_its_own_transactions() {
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use idem::{
        IdemTx, SqliteTx,
        store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record},
    };

    struct Counting {
        inner: SqliteStore,
        claims: AtomicU32,
    }
    struct CountingTx<'s> {
        tx: SqliteTx,
        store: &'s Counting,
    }

    #[async_trait]
    impl Store for Counting {
        fn backend(&self) -> &'static str {
            "counting"
        }
        fn limits(&self) -> &Limits {
            self.inner.limits()
        }
        async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
            self.claims.fetch_add(1, Ordering::SeqCst);
            self.inner.claim(req).await
        }
        async fn complete(
            &self,
            b: &str,
            k: &str,
            c: &Claim,
            s: &[u8],
            ttl: Duration,
        ) -> Result<(), IdemError> {
            self.inner.complete(b, k, c, s, ttl).await
        }
        async fn fail(&self, b: &str, k: &str, c: &Claim) -> Result<(), IdemError> {
            self.inner.fail(b, k, c).await
        }
        async fn renew(&self, b: &str, k: &str, c: &Claim, l: Duration) -> Result<(), IdemError> {
            self.inner.renew(b, k, c, l).await
        }
        async fn load(&self, b: &str, k: &str) -> Result<Option<Record>, IdemError> {
            self.inner.load(b, k).await
        }
        async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
            self.inner.sweep_expired(batch).await
        }
    }

    #[async_trait]
    impl IdemTx for CountingTx<'_> {
        fn store(&self) -> &dyn Store {
            self.store
        }
        async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
            self.store.claims.fetch_add(1, Ordering::SeqCst);
            self.tx.claim(req).await
        }
        async fn complete(
            &mut self,
            b: &str,
            k: &str,
            c: &Claim,
            s: &[u8],
            ttl: Duration,
        ) -> Result<(), IdemError> {
            self.tx.complete(b, k, c, s, ttl).await
        }
        async fn abort(&mut self) -> Result<(), IdemError> {
            self.tx.abort().await
        }
    }

    let inner = SqliteStore::open(temp_db("wrapped")).await.unwrap();
    inner.migrate().await.unwrap();
    let store = Counting {
        inner,
        claims: AtomicU32::new(0),
    };
    let mut tx = CountingTx {
        tx: store.inner.begin().await.unwrap(),
        store: &store,
    };
    let res: Result<u8, IdemError> = Call::new("PAY", "w")
        .run_in_tx(&mut tx, async |_tx| Ok(1))
        .await;
    tx.tx.commit().await.unwrap();
    assert_eq!(res.unwrap(), 1);
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        1,
        "the claim went through the wrapper"
    );
    let replay: Result<u8, IdemError> = Call::new("PAY", "w").run(&store, async { Ok(2) }).await;
    assert_eq!(
        replay.unwrap(),
        1,
        "and landed in the wrapped store's table"
    );
}

/// A database made by an earlier version (its DDL: the table, the fence, the tokens; and the index
/// over every record that `stuck` read until version 5) gets from `migrate()` the index `stuck`
/// reads now, over the PROCESSING records only, and loses the one it replaces; again is a no-op.
/// The reconciler's query reads that index, in its order.
#[tokio::test]
async fn migrate_brings_an_earlier_database_to_the_index_of_processing_records() {
    for version in [3, 4] {
        let path = temp_db(&format!("v{version}"));
        let store = SqliteStore::open(&path).await.unwrap();
        for ddl in &SqliteStore::MIGRATIONS[..version] {
            sqlx::raw_sql(*ddl).execute(store.pool()).await.unwrap();
        }
        let indexes = async || -> Vec<(String, i64)> {
            sqlx::query(
                "SELECT name, partial FROM pragma_index_list('idem_record') \
                 WHERE origin = 'c' ORDER BY name",
            )
            .fetch_all(store.pool())
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
        };
        let before: Vec<String> = indexes().await.into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            before.contains(&"idem_record_stuck".to_owned()),
            version == 4,
            "{before:?}"
        );
        store.migrate().await.unwrap();
        store.migrate().await.unwrap(); // idempotent
        assert_eq!(
            indexes().await,
            [
                ("idem_record_expire_at".to_owned(), 0),
                ("idem_record_processing".to_owned(), 1),
                ("idem_record_result_until".to_owned(), 1)
            ],
            "version {version}"
        );
        let columns = first_column(
            &store,
            "SELECT name FROM pragma_index_info('idem_record_processing') ORDER BY seqno",
        )
        .await;
        assert_eq!(columns, ["biz_type", "lease_until"]);
        // The reconciler's query (`records.rs`, STUCK): a range of the partial index, no sort.
        let plan: Vec<String> = sqlx::query(
            "EXPLAIN QUERY PLAN SELECT idem_key, status, attempt, fence, fingerprint, result, \
             lease_until, expire_at FROM idem_record WHERE biz_type = ?1 AND status = 'PROCESSING' \
             AND lease_until <= ?2 ORDER BY lease_until LIMIT ?3",
        )
        .bind("PAY")
        .bind(0_i64)
        .bind(10_i64)
        .fetch_all(store.pool())
        .await
        .unwrap()
        .iter()
        .map(|row| row.get("detail"))
        .collect();
        assert_eq!(
            plan,
            [
                "SEARCH idem_record USING INDEX idem_record_processing (biz_type=? AND lease_until<?)"
            ],
            "{plan:?}"
        );
    }
}

/// Two stores on one database file, each on tables of its own (`with_table`,
/// `with_token_table`): each migrates its tables and its indexes under names of its own, runs
/// calls, transactions, tokens and sweeps, and neither sees the other's records.
#[tokio::test]
async fn two_tables_in_one_file_keep_their_records_apart() {
    let path = temp_db("two_tables");
    let clock = idem::TestClock::new();
    let base = SqliteStore::open(&path)
        .await
        .unwrap()
        .with_test_clock(clock.clone());
    let orders = base
        .clone()
        .with_table("orders_idem")
        .unwrap()
        .with_token_table("orders_tok")
        .unwrap();
    let refunds = base
        .clone()
        .with_table("refunds_idem")
        .unwrap()
        .with_token_table("refunds_tok")
        .unwrap();
    for store in [&orders, &refunds] {
        store.migrate().await.unwrap();
        store.migrate().await.unwrap(); // idempotent
    }
    let tables: Vec<String> = sqlx::query(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'index') \
         AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .fetch_all(base.pool())
    .await
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect();
    assert_eq!(
        tables,
        [
            "orders_idem",
            "orders_idem_expire_at",
            "orders_idem_processing",
            "orders_idem_result_until",
            "orders_tok",
            "orders_tok_expire_at",
            "refunds_idem",
            "refunds_idem_expire_at",
            "refunds_idem_processing",
            "refunds_idem_result_until",
            "refunds_tok",
            "refunds_tok_expire_at",
        ],
        "no default table is made, and each index is named after its table"
    );

    // The same key in both: two records, each run once and replayed by its own store only.
    let first: Result<u8, IdemError> = Call::new("PAY", "k1").run(&orders, async { Ok(1) }).await;
    assert_eq!(first.unwrap(), 1);
    assert!(refunds.load("PAY", "k1").await.unwrap().is_none());
    let other: Result<u8, IdemError> = Call::new("PAY", "k1").run(&refunds, async { Ok(2) }).await;
    assert_eq!(other.unwrap(), 2, "the other table has no record of k1");
    let again: Result<u8, IdemError> = Call::new("PAY", "k1").run(&orders, async { Ok(9) }).await;
    assert_eq!(again.unwrap(), 1, "replayed from its own table");
    let again: Result<u8, IdemError> = Call::new("PAY", "k1").run(&refunds, async { Ok(9) }).await;
    assert_eq!(again.unwrap(), 2);

    // A transaction claims in its store's table.
    let mut tx = refunds.begin().await.unwrap();
    let in_tx: Result<u8, IdemError> = Call::new("PAY", "k2")
        .run_in_tx(&mut tx, async |_tx| Ok(3))
        .await;
    tx.commit().await.unwrap();
    assert_eq!(in_tx.unwrap(), 3);
    assert_eq!(
        refunds.load("PAY", "k2").await.unwrap().unwrap().status,
        Status::Succeeded
    );
    assert!(orders.load("PAY", "k2").await.unwrap().is_none());

    // Counts and stuck lists read one table each.
    let counts =
        |stats: Vec<idem::store::StatusCount>| stats.iter().map(|c| c.records).sum::<u64>();
    assert_eq!(counts(orders.stats().await.unwrap()), 1);
    assert_eq!(counts(refunds.stats().await.unwrap()), 2);

    // Tokens live in each store's token table.
    let tokens = orders.tokens();
    let token = tokens
        .issue(Duration::from_secs(60), Some("alice"))
        .await
        .unwrap();
    assert!(matches!(
        refunds.tokens().consume(&token, Some("alice")).await,
        Err(IdemError::TokenInvalid { .. })
    ));
    tokens.consume(&token, Some("alice")).await.unwrap();

    // Sweeping one table leaves the other's expired records alone.
    clock.advance(Duration::from_secs(8 * 24 * 3600)); // past the default ttl (7 days)
    assert_eq!(orders.sweep_expired(100).await.unwrap(), 1);
    assert!(orders.load("PAY", "k1").await.unwrap().is_none());
    assert!(refunds.load("PAY", "k1").await.unwrap().is_some());
    assert_eq!(refunds.sweep_expired(100).await.unwrap(), 2);
}

/// A store on a table that was never migrated says to run `migrate()`, like the default table.
#[tokio::test]
async fn a_named_table_not_migrated_says_to_run_migrate() {
    let store = SqliteStore::in_memory()
        .await
        .unwrap()
        .with_table("never_made")
        .unwrap();
    let res: Result<u8, IdemError> = Call::new("PAY", "k").run(&store, async { Ok(1) }).await;
    assert!(
        matches!(&res, Err(IdemError::StoreSchema { .. })),
        "{res:?}"
    );
}
