//! What the Postgres suites share: the server's URL (`IDEM_PG_URL`), stores on tables of their own,
//! and schemas of their own for scenarios with fixed table names. Include it after `mod contract;`.

#![allow(dead_code)]

use idem::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use idem::{PgStore, postgres::PgStoreBuilder};

use crate::contract::server;

/// The local Postgres (trust auth, database `test`) unless `IDEM_PG_URL` says otherwise.
pub fn url() -> String {
    server::pg_url()
}

/// Whether the server answers: asked once per test binary with a short timeout (a refused
/// connection would otherwise be retried by the pool for its whole acquire timeout, in every test).
async fn answers(url: &str) -> Result<(), String> {
    static SEEN: std::sync::Mutex<Option<Result<(), String>>> = std::sync::Mutex::new(None);
    if let Some(seen) = SEEN.lock().unwrap().clone() {
        return seen;
    }
    let probe = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(3))
        .connect(url)
        .await;
    let seen = match probe {
        Ok(pool) => {
            drop_stale(&pool).await;
            pool.close().await;
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    };
    *SEEN.lock().unwrap() = Some(seen.clone());
    seen
}

/// Drops the tables and schemas earlier test runs on this machine left behind (`idemt_<pid>_…`,
/// `idemp_<pid>_…`, `idems_<pid>_…`): those of processes that no longer run (`/proc/<pid>` is gone).
/// Only on Linux; elsewhere nothing is dropped.
async fn drop_stale(pool: &PgPool) {
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let names: Vec<(String, bool)> = idem::sqlx::query_as(
        "SELECT schemaname || '.' || tablename, TRUE FROM pg_tables \
         WHERE tablename ~ '^(idemt|idemp)_[0-9]+_' \
         UNION ALL SELECT nspname::TEXT, FALSE FROM pg_namespace WHERE nspname ~ '^idems_[0-9]+_'",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    let stale: Vec<String> = names
        .into_iter()
        .filter(|(name, _)| {
            let pid = name.rsplit('.').next().unwrap_or("").split('_').nth(1);
            pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        })
        .map(|(name, table)| {
            let kind = if table { "TABLE" } else { "SCHEMA" };
            format!("DROP {kind} IF EXISTS {name} CASCADE;")
        })
        .collect();
    for batch in stale.chunks(100) {
        // Best effort: another run may be dropping the same names.
        let _ = idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(batch.concat()))
            .execute(pool)
            .await;
    }
}

/// A store on tables no other test uses (`idemt_<pid>_<n>` and its `_tok`), migrated; `None`
/// (with one skip line) when the server is unreachable, unless `IDEM_REQUIRE_SERVICES=1`.
pub async fn store(max_connections: u32) -> Option<PgStore> {
    store_with(PgStore::builder(), max_connections).await
}

/// As [`store`], from `builder`'s other options.
pub async fn store_with(builder: PgStoreBuilder, max_connections: u32) -> Option<PgStore> {
    let url = url();
    let table = server::unique("idemt");
    let builder = builder
        .table(&table)
        .unwrap()
        .token_table(&format!("{table}_tok"))
        .unwrap()
        .max_connections(max_connections);
    server::reach("Postgres", &url, answers(&url)).await?;
    let store = builder.connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

/// A pool whose connections work in a fresh schema (`search_path`), for scenarios whose tables
/// have fixed names; the schema's name is returned too.
pub async fn schema_pool(max_connections: u32) -> Option<(PgPool, String)> {
    let url = url();
    let schema = server::unique("idems");
    server::reach("Postgres", &url, answers(&url)).await?;
    let admin = PgPool::connect(&url).await.unwrap();
    idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let options: PgConnectOptions = url.parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options.options([("search_path", schema.as_str())]))
        .await
        .unwrap();
    Some((pool, schema))
}

/// Drops a schema made by [`schema_pool`] and everything in it.
pub async fn drop_schema(pool: &PgPool, schema: &str) {
    idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {schema} CASCADE"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// Drops a store's tables (its records and tokens).
pub async fn drop_tables(store: &PgStore) {
    idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {}, {}",
        store.table(),
        store.token_table()
    )))
    .execute(store.pool())
    .await
    .unwrap();
}
