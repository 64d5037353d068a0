//! Every earlier schema layout, upgraded by `migrate()`, keeps its records' meaning, on each SQL
//! store: for each prefix of the shipped migrations (the table as a version of idem that had
//! shipped only those made it), a table is made with them alone, filled with one record in each
//! state the store can hold (a success, a live claim, a stuck claim, a failure, an expired
//! success), written with the columns that layout has; then `migrate()` runs twice, and the store
//! must read and decide every record as before: the success replays its result, the live claim is
//! in progress, the stuck one is listed for the reconciler and taken over, the failure is retried,
//! the expired one is swept and its key runs again, and a new key runs once.
//!
//! A new migration needs no new test here: the loop takes every prefix of `MIGRATIONS`. A
//! migration that changes what a column means must add the record states it changes.
//!
//! SQLite in a file per layout; Postgres (`IDEM_PG_URL`) in a schema per layout; MariaDB
//! (`IDEM_MYSQL_URL`) in a database per layout. A server that cannot be reached is skipped with
//! one line (a failure under `IDEM_REQUIRE_SERVICES=1`).

#[path = "contract/server.rs"]
mod server;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::sqlx::{self, AssertSqlSafe};
use idem::{
    Call, IdemError, Store,
    store::{Acquired, ClaimOutcome, ClaimRequest, Status},
};

const BIZ: &str = "UPG";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The stored form of `7` as a success's result, written by the store itself (so the test does
/// not restate the snapshot's encoding).
async fn snapshot_of_seven(store: &dyn Store) -> Vec<u8> {
    let key = format!("seed-{}", now_ms());
    let seven: Result<u32, IdemError> = Call::new(BIZ, &key).run(store, async { Ok(7) }).await;
    assert_eq!(seven.unwrap(), 7);
    store
        .load(BIZ, &key)
        .await
        .unwrap()
        .and_then(|r| r.snapshot)
        .expect("a success keeps its result")
}

/// The records every layout is filled with: `(key, status, lease_until, expire_at)`.
fn states(now: i64) -> [(&'static str, &'static str, i64, i64); 5] {
    let (past, future) = (now - 3_600_000, now + 3_600_000);
    [
        ("done", "SUCCEEDED", past, future),
        ("live", "PROCESSING", future, future),
        ("stuck", "PROCESSING", past, future),
        ("failed", "FAILED", past, future),
        ("expired", "SUCCEEDED", past, past),
    ]
}

/// The statements that fill a layout's `table` with [`states`], the success's result written as
/// `blob` (the backend's literal of the bytes), with a `fence` column or without.
fn fill(table: &str, fence: bool, blob: &str) -> Vec<String> {
    let (fence_column, fence_value) = if fence { (", fence", ", 1") } else { ("", "") };
    states(now_ms())
        .into_iter()
        .map(|(key, status, lease, expire)| {
            let result = if status == "SUCCEEDED" { blob } else { "NULL" };
            format!(
                "INSERT INTO {table} (biz_type, idem_key, status, attempt{fence_column}, \
                 fingerprint, result, lease_until, created_at, updated_at, expire_at) \
                 VALUES ('{BIZ}', '{key}', '{status}', 1{fence_value}, NULL, {result}, {lease}, \
                 0, 0, {expire})"
            )
        })
        .collect()
}

/// The bytes as hexadecimal digits, for a backend's literal.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn request(key: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        biz: BIZ,
        key,
        fingerprint: None,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
    }
}

/// What every upgraded layout must still answer. `layout` names it in the messages.
async fn keeps_its_meaning(store: &dyn Store, layout: &str) {
    let done: Result<u32, IdemError> = Call::new(BIZ, "done").run(store, async { Ok(0) }).await;
    assert_eq!(done.unwrap(), 7, "{layout}: the success replays its result");
    assert!(
        matches!(
            store.claim(&request("live")).await.unwrap(),
            ClaimOutcome::InProgress { .. }
        ),
        "{layout}: the live claim is in progress"
    );
    let stuck: Vec<String> = store
        .stuck(BIZ, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(stuck, ["stuck"], "{layout}: the stuck claim is listed");
    match store.claim(&request("stuck")).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => {
            assert_eq!(how, Acquired::TakeOver, "{layout}");
            assert_eq!(claim.attempt, 2, "{layout}: the takeover counts on from 1");
        }
        other => panic!("{layout}: the stuck claim is taken over, not {other:?}"),
    }
    match store.claim(&request("failed")).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => {
            assert_eq!(how, Acquired::RetryAfterFailure, "{layout}");
            assert_eq!(claim.attempt, 2, "{layout}");
        }
        other => panic!("{layout}: the failure is retried, not {other:?}"),
    }
    let swept = store.sweep_expired(100).await.unwrap();
    assert!(swept >= 1, "{layout}: the expired record is swept");
    assert_eq!(
        store.load(BIZ, "expired").await.unwrap(),
        None,
        "{layout}: the expired record is gone"
    );
    let again: Result<u32, IdemError> = Call::new(BIZ, "expired").run(store, async { Ok(8) }).await;
    assert_eq!(again.unwrap(), 8, "{layout}: an expired key runs again");
    let fresh: Result<u32, IdemError> = Call::new(BIZ, "new").run(store, async { Ok(9) }).await;
    assert_eq!(fresh.unwrap(), 9, "{layout}: a new key runs");
    let replay: Result<u32, IdemError> = Call::new(BIZ, "new").run(store, async { Ok(0) }).await;
    assert_eq!(replay.unwrap(), 9, "{layout}: and replays");
    let done = store.load(BIZ, "done").await.unwrap().unwrap();
    assert_eq!(done.status, Status::Succeeded, "{layout}");
    assert_eq!(
        done.result_until_ms, None,
        "{layout}: no result ttl was set"
    );
}

mod sqlite {
    use super::*;
    use idem::SqliteStore;

    #[tokio::test]
    async fn every_earlier_layout_keeps_its_records_meaning() {
        let seed = SqliteStore::open(path("seed")).await.unwrap();
        seed.migrate().await.unwrap();
        let snapshot = snapshot_of_seven(&seed).await;
        for k in 1..=SqliteStore::MIGRATIONS.len() {
            let layout = format!("SQLite after migration {k}");
            let store = SqliteStore::open(path(&format!("layout-{k}")))
                .await
                .unwrap();
            for ddl in &SqliteStore::MIGRATIONS[..k] {
                sqlx::raw_sql(AssertSqlSafe(*ddl))
                    .execute(store.pool())
                    .await
                    .unwrap();
            }
            // The fence column came with the second migration.
            for insert in fill("idem_record", k >= 2, &format!("X'{}'", hex(&snapshot))) {
                sqlx::query(AssertSqlSafe(insert))
                    .execute(store.pool())
                    .await
                    .unwrap();
            }
            store.migrate().await.unwrap();
            store.migrate().await.unwrap();
            keeps_its_meaning(&store, &layout).await;
        }
    }

    fn path(name: &str) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("idem-upgrades-{name}-{}.db", std::process::id()));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        path
    }
}

mod postgres {
    use super::*;
    use idem::PgStore;

    #[tokio::test]
    async fn every_earlier_layout_keeps_its_records_meaning() {
        let url = server::pg_url();
        let Some(seed) = server::reach("Postgres", &url, PgStore::connect(&url)).await else {
            return;
        };
        let pool = idem::sqlx::PgPool::connect(&url).await.unwrap();
        let base = server::unique("idemt_up");
        let seed = seed.with_table(&format!("{base}_seed")).unwrap();
        seed.migrate().await.unwrap();
        let snapshot = snapshot_of_seven(&seed).await;
        for k in 1..=PgStore::MIGRATIONS.len() {
            let layout = format!("Postgres after migration {k}");
            let schema = format!("{base}_{k}");
            let mut ddl = format!("CREATE SCHEMA {schema}; SET search_path TO {schema};");
            for step in &PgStore::MIGRATIONS[..k] {
                ddl.push_str(step);
                ddl.push('\n');
            }
            ddl.push_str("SET search_path TO DEFAULT;");
            let mut conn = pool.acquire().await.unwrap();
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&mut *conn)
                .await
                .unwrap();
            drop(conn);
            let table = format!("{schema}.idem_record");
            for insert in fill(&table, true, &format!("'\\x{}'::bytea", hex(&snapshot))) {
                sqlx::query(AssertSqlSafe(insert))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            let store = PgStore::connect(&url)
                .await
                .unwrap()
                .with_table(&format!("{schema}.idem_record"))
                .unwrap();
            store.migrate().await.unwrap();
            store.migrate().await.unwrap();
            keeps_its_meaning(&store, &layout).await;
            let indexes: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'idem_record'",
            )
            .bind(&schema)
            .fetch_one(&pool)
            .await
            .unwrap();
            let fresh: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = 'public' AND tablename = $1",
            )
            .bind(format!("{base}_seed"))
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(
                indexes, fresh,
                "{layout}: the indexes of a fresh table, no more"
            );
            sqlx::query(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
                .execute(&pool)
                .await
                .unwrap();
        }
        sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE {base}_seed, {base}_seed_tok"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
}

mod mariadb {
    use super::*;
    use idem::MySqlStore;

    #[tokio::test]
    async fn every_earlier_layout_keeps_its_records_meaning() {
        let url = server::mysql_url();
        let Some(seed) = server::reach("MariaDB", &url, MySqlStore::connect(&url)).await else {
            return;
        };
        let pool = idem::sqlx::MySqlPool::connect(&url).await.unwrap();
        let base = server::unique("idemt_up");
        let seed = seed.with_table(&format!("{base}_seed")).unwrap();
        seed.migrate().await.unwrap();
        let snapshot = snapshot_of_seven(&seed).await;
        for k in 1..=MySqlStore::MIGRATIONS.len() {
            let layout = format!("MariaDB after migration {k}");
            let db = format!("{base}_{k}");
            let mut conn = pool.acquire().await.unwrap();
            let mut ddl = format!("CREATE DATABASE {db}; USE {db};");
            for step in &MySqlStore::MIGRATIONS[..k] {
                ddl.push_str(step);
                ddl.push('\n');
            }
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&mut *conn)
                .await
                .unwrap();
            // Closed, not handed back: its default database is the layout's now.
            drop(conn.detach());
            let table = format!("{db}.idem_record");
            for insert in fill(&table, true, &format!("X'{}'", hex(&snapshot))) {
                sqlx::query(AssertSqlSafe(insert))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            let store = MySqlStore::connect(&url)
                .await
                .unwrap()
                .with_table(&format!("{db}.idem_record"))
                .unwrap();
            store.migrate().await.unwrap();
            store.migrate().await.unwrap();
            keeps_its_meaning(&store, &layout).await;
            let indexes: Vec<String> = sqlx::query_scalar(
                "SELECT DISTINCT index_name FROM information_schema.statistics \
                 WHERE table_schema = ? AND table_name = 'idem_record' ORDER BY index_name",
            )
            .bind(&db)
            .fetch_all(&pool)
            .await
            .unwrap();
            let fresh: Vec<String> = sqlx::query_scalar(
                "SELECT DISTINCT index_name FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = ? ORDER BY index_name",
            )
            .bind(format!("{base}_seed"))
            .fetch_all(&pool)
            .await
            .unwrap();
            assert_eq!(
                indexes.len(),
                fresh.len(),
                "{layout}: the indexes of a fresh table, no more: {indexes:?} / {fresh:?}"
            );
            sqlx::query(AssertSqlSafe(format!("DROP DATABASE {db}")))
                .execute(&pool)
                .await
                .unwrap();
        }
        sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE {base}_seed, {base}_seed_tok"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
}
