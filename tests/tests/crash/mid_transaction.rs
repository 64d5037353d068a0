//! Holders killed inside their transaction (tx mode): the claim and the business write die with
//! it.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_mid_transaction() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    store.migrate().await.unwrap();
    // Effects live in the records' database, written inside the call's transaction.
    let effects = effects_pool(&path).await;
    let site = Site {
        backend: Backend::Sqlite { path: path.clone() },
        store: store.clone(),
        effects_path: path,
        effects: effects.clone(),
        _dir: dir,
    };
    let (biz, lease) = ("CRASHTX", Duration::from_secs(60));
    // One child at a time: an SQLite write transaction holds the database's write lock.
    site.kill_trials(biz, lease, Act::HoldTx, 1, async |key| {
        // The transaction died with its process: no record, no effect...
        assert!(store.load(biz, key).await.unwrap().is_none(), "{key}");
        assert!(effects_of(&effects, biz, key).await.is_empty(), "{key}");
        // ...and the next caller runs at once, without waiting for any lease.
        let mut tx = store.begin().await.unwrap();
        let (ran, report) = idem::metrics::observe(Call::new(biz, key).lease(lease).run_in_tx(
            &mut tx,
            async |tx| {
                sqlx::query("INSERT INTO effects (biz, k, who) VALUES (?, ?, 'next')")
                    .bind(biz)
                    .bind(key)
                    .execute(&mut **tx)
                    .await
                    .map_err(IdemError::store)?;
                Ok::<_, IdemError>(1)
            },
        ))
        .await;
        tx.commit().await.unwrap();
        assert_eq!(ran.unwrap(), 1);
        assert_eq!(report.unwrap().outcome, Outcome::Executed, "{key}");
        assert_eq!(effects_of(&effects, biz, key).await, ["next"], "{key}");
    })
    .await;
}

/// Server-store children killed inside their transaction (claim and effect written, not
/// committed), 10 at a time: the server rolls each back when its connection dies, and the next
/// caller runs at once.
macro_rules! server_killed_mid_transaction {
    ($name:ident, $feature:literal, $site:ident, $Backend:ident, $open:ident, $insert:literal, $count:literal) => {
        #[cfg(feature = $feature)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            if std::env::var("IDEM_CRASH_CHILD").is_ok() {
                return;
            }
            let Some(site) = $site().await else {
                return;
            };
            let Backend::$Backend { url, table } = site.backend.clone() else {
                unreachable!()
            };
            let store = $open(&url, &table).await;
            let (biz, lease) = ("CRASHTX", Duration::from_secs(60));
            let insert = format!($insert, table = table);
            let count = format!($count, table = table);
            site.kill_trials(biz, lease, Act::HoldTx, 10, async |key| {
                let mut tx = store.begin().await.unwrap();
                let (ran, report) = idem::metrics::observe(
                    Call::new(biz, key)
                        .lease(lease)
                        .run_in_tx(&mut tx, async |tx| {
                            sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
                                .bind(biz)
                                .bind(key)
                                .execute(&mut **tx)
                                .await
                                .map_err(IdemError::store)?;
                            Ok::<_, IdemError>(1)
                        }),
                )
                .await;
                tx.commit().await.unwrap();
                // No record and no effect survived the child: this caller ran at once, first.
                assert_eq!(ran.unwrap(), 1, "{key}");
                assert_eq!(report.unwrap().outcome, Outcome::Executed, "{key}");
                let effects: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.clone()))
                    .bind(biz)
                    .bind(key)
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                assert_eq!(effects, 1, "{key}");
            })
            .await;
        }
    };
}

server_killed_mid_transaction!(
    postgres_killed_mid_transaction,
    "postgres",
    pg_site,
    Postgres,
    pg_store,
    "INSERT INTO {table}_fx (biz, k, who) VALUES ($1, $2, 'next')",
    "SELECT COUNT(*) FROM {table}_fx WHERE biz = $1 AND k = $2"
);

server_killed_mid_transaction!(
    mysql_killed_mid_transaction,
    "mysql",
    my_site,
    MySql,
    my_store,
    "INSERT INTO {table}_fx (biz, k, who) VALUES (?, ?, 'next')",
    "SELECT COUNT(*) FROM {table}_fx WHERE biz = ? AND k = ?"
);
