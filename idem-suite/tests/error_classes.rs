//! Each store error class of docs/RELIABILITY.md ("Error classes"), provoked on a real server
//! where the local services allow it: Postgres (`IDEM_PG_URL`), MariaDB (`IDEM_MYSQL_URL`) and
//! Redis servers this test starts itself from the installed `redis-server`. Each test asserts the
//! class of the error the store gives and, where a caller meets it, what the caller sees through
//! `Call` (the variant, `is_retryable()`, `http_status()`).
//!
//! What no local server can be made to answer (a Postgres 08xxx, MariaDB's 1040 without lowering
//! the shared server's `max_connections`, Redis's TRYAGAIN, CLUSTERDOWN and MISCONF) comes from a
//! scripted stand-in on a loopback port that answers with the server's exact bytes, so the real
//! driver parses it and the real store classifies it.
//!
//! Roles and users are named `idemr_<pid>_<n>` / `idemu_<pid>_<n>` and dropped at the end; those of
//! processes that no longer run are dropped first, so a test cut off half-way leaves nothing for
//! long. Every wait is bounded.

mod contract;
#[path = "support/postgres.rs"]
mod pg;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use contract::{biz, server};
use idem::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use idem::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use idem::sqlx::{self, AssertSqlSafe, Connection, Executor, MySqlPool, Row};
use idem::{
    Busy, Call, ClaimOutcome, ClaimRequest, IdemError, MySqlStore, MySqlTx, PgStore, PgTx,
    RedisStore, Store,
};
use redis_server::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The longest any single step of these tests may take.
const BOUND: Duration = Duration::from_secs(30);

async fn bounded<T>(what: &str, work: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, work).await {
        Ok(done) => done,
        Err(_) => panic!("{what}: not done within {BOUND:?}"),
    }
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

#[track_caller]
fn assert_unavailable(e: &IdemError) {
    assert!(matches!(e, IdemError::StoreUnavailable { .. }), "{e:?}");
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(e.http_status(), 503, "{e:?}");
}

/// A call on `store` for `(biz, key)` whose body counts its runs in `ran` and answers `value`,
/// bounded in time (`what` names it when it hangs).
async fn counted_call(
    what: &str,
    store: &dyn Store,
    biz: &str,
    key: &str,
    value: u32,
    ran: &AtomicU32,
) -> Result<u32, IdemError> {
    bounded(
        what,
        Call::new(biz.to_owned(), key).run(store, async {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok(value)
        }),
    )
    .await
}

/// A claim on `store` and a call through it are both `StoreUnavailable`, and the body never runs.
async fn unavailable_and_nothing_runs(store: &dyn Store) {
    let e = bounded("a claim", store.claim(&req("PAY", "k")))
        .await
        .unwrap_err();
    assert_unavailable(&e);
    let ran = AtomicU32::new(0);
    let res = counted_call("a call", store, "PAY", "k", 1, &ran).await;
    assert_unavailable(&res.unwrap_err());
    assert_eq!(ran.load(Ordering::Relaxed), 0);
}

#[track_caller]
fn assert_busy(e: &IdemError, reason: Busy, status: u16) {
    assert!(
        matches!(e, IdemError::StoreBusy { reason: r, .. } if *r == reason),
        "expected StoreBusy({reason:?}): {e:?}"
    );
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(e.http_status(), status, "{e:?}");
}

#[track_caller]
fn assert_in_progress<T: std::fmt::Debug>(res: &Result<T, IdemError>) {
    match res {
        Err(e @ IdemError::InProgress { .. }) => {
            assert!(e.is_retryable());
            assert_eq!(e.http_status(), 409);
        }
        other => panic!("expected InProgress: {other:?}"),
    }
}

/// Whether a process of this machine with this pid still runs (Linux; elsewhere: assume it does).
fn alive(pid: &str) -> bool {
    !std::path::Path::new("/proc/self").exists()
        || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

// ---------------------------------------------------------------------------------------------
// Postgres
// ---------------------------------------------------------------------------------------------

/// A superuser pool on the server, for what a test does behind the store's back.
async fn pg_admin() -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg::url())
        .await
        .unwrap()
}

/// A login role of this process (`idemr_<pid>_<n>`, password `idem`) with `attributes` (e.g.
/// `CONNECTION LIMIT 1`) and the session `settings` given by `ALTER ROLE … SET`, allowed to use the
/// tables of `store`; the roles earlier processes left behind are dropped first.
async fn pg_role(admin: &PgPool, store: &PgStore, attributes: &str, settings: &[&str]) -> String {
    let stale: Vec<String> =
        sqlx::query_scalar("SELECT rolname::TEXT FROM pg_roles WHERE rolname ~ '^idemr_[0-9]+_'")
            .fetch_all(admin)
            .await
            .unwrap();
    for role in stale {
        if !alive(role.split('_').nth(1).unwrap_or("")) {
            let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP OWNED BY {role}; DROP ROLE IF EXISTS {role}"
            )))
            .execute(admin)
            .await;
        }
    }
    let role = server::unique("idemr");
    let mut sql = format!("CREATE ROLE {role} LOGIN PASSWORD 'idem' {attributes};");
    for setting in settings {
        sql.push_str(&format!("ALTER ROLE {role} SET {setting};"));
    }
    sql.push_str(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON {}, {} TO {role};",
        store.table(),
        store.token_table()
    ));
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(admin)
        .await
        .unwrap();
    role
}

async fn pg_drop_role(admin: &PgPool, role: &str) {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(admin)
    .await
    .unwrap();
}

/// Connect options for `role` (or the URL's own user), with `options` as session settings.
fn pg_options(role: Option<&str>, options: &[(&str, &str)]) -> PgConnectOptions {
    let mut connect: PgConnectOptions = pg::url().parse().unwrap();
    if let Some(role) = role {
        connect = connect.username(role).password("idem");
    }
    connect.options(options.iter().copied())
}

/// A store on `tables`' tables over `pool` (its lock timeout, for transaction mode: `lock_timeout`).
fn pg_store_on(tables: &PgStore, pool: PgPool, lock_timeout: Duration) -> PgStore {
    PgStore::builder()
        .table(tables.table())
        .unwrap()
        .token_table(tables.token_table())
        .unwrap()
        .lock_timeout(lock_timeout)
        .build(pool)
        .unwrap()
}

/// `$name`: the scenario a lock wait that is cut off shows up in. `holder` (on the same tables) keeps a
/// transaction-mode call's record written but uncommitted, so its row is locked; `store` is the one
/// whose waits are cut off (by its lock timeout or by a statement timeout, `limit`). Then:
/// - a lease-mode duplicate (`Call::run` and `Store::claim`) answers `InProgress`, within about `limit`;
/// - a transaction-mode duplicate answers `InProgress` and its transaction is still usable;
/// - a mark that waits for a locked row is `StoreBusy(LockTimeout)`: retryable, 503;
/// - once the holder commits, the duplicate replays.
///
/// One body for both SQL servers (written as a macro since the stores and transactions are
/// different types): `$lock_row` is the dialect's `SELECT … FOR UPDATE` of row `m`.
macro_rules! cut_off_waits {
    ($name:ident, $store:ty, $tx:ty, $lock_row:literal) => {
        async fn $name(holder: &$store, store: &$store, limit: Duration, case: &str) {
            let biz = biz(case);
            let mut first = holder.begin().await.unwrap();
            let ran: Result<u32, IdemError> = Call::new(biz.clone(), "k")
                .run_in_tx(&mut first, async |_tx: &mut $tx| Ok(1))
                .await;
            assert_eq!(ran.unwrap(), 1);

            let started = Instant::now();
            let dup: Result<u32, IdemError> = bounded(
                "lease-mode duplicate",
                Call::new(biz.clone(), "k").run(store, async { Ok(2) }),
            )
            .await;
            assert_in_progress(&dup);
            assert!(
                started.elapsed() < limit + Duration::from_secs(3),
                "the wait was cut off after {limit:?}, not later: {:?}",
                started.elapsed()
            );
            let claimed = bounded("Store::claim", store.claim(&req(&biz, "k"))).await;
            assert!(
                matches!(claimed, Ok(ClaimOutcome::InProgress { .. })),
                "{claimed:?}"
            );

            let mut dup_tx = store.begin().await.unwrap();
            let dup: Result<u32, IdemError> = bounded(
                "transaction-mode duplicate",
                Call::new(biz.clone(), "k").run_in_tx(&mut dup_tx, async |_tx: &mut $tx| Ok(3)),
            )
            .await;
            assert_in_progress(&dup);
            sqlx::query("SELECT 1")
                .execute(&mut *dup_tx)
                .await
                .expect("the duplicate's transaction is still usable");
            dup_tx.rollback().await.unwrap();

            // A mark that waits for a row another transaction locked.
            let Ok(ClaimOutcome::Acquired { claim, .. }) = store.claim(&req(&biz, "m")).await
            else {
                panic!("a fresh key is acquired");
            };
            let mut locker = holder.begin().await.unwrap();
            sqlx::query(AssertSqlSafe(format!($lock_row, holder.table())))
                .bind(&biz)
                .execute(&mut *locker)
                .await
                .unwrap();
            let marked = bounded(
                "a mark on a locked row",
                store.complete(&biz, "m", &claim, b"1", req(&biz, "m").ttl),
            )
            .await;
            assert_busy(&marked.unwrap_err(), Busy::LockTimeout, 503);
            locker.rollback().await.unwrap();

            first.commit().await.unwrap();
            let replay: Result<u32, IdemError> = Call::new(biz.clone(), "k")
                .run(store, async { panic!("must replay") })
                .await;
            assert_eq!(replay.unwrap(), 1, "replayed after the holder committed");
        }
    };
}

cut_off_waits!(
    pg_cut_off_waits,
    PgStore,
    PgTx,
    "SELECT 1 FROM {} WHERE biz_type = $1 AND idem_key = 'm' FOR UPDATE"
);
cut_off_waits!(
    my_cut_off_waits,
    MySqlStore,
    MySqlTx,
    "SELECT 1 FROM `{}` WHERE biz_type = ? AND idem_key = 'm' FOR UPDATE"
);

/// 55P03: the store's own lock timeout cuts off a duplicate waiting on the claimant's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_55p03_lock_timeout_is_in_progress() {
    let limit = Duration::from_millis(300);
    let Some(store) = pg::store_with(PgStore::builder().lock_timeout(limit), 4).await else {
        return;
    };
    pg_cut_off_waits(&store, &store, limit, "pg_55p03").await;
    pg::drop_tables(&store).await;
}

/// 57014: a role whose `statement_timeout` (300 ms) is shorter than the store's lock timeout
/// (10 s): the duplicate's wait on the claimant's row is cancelled by the statement timeout, and
/// is the same lock wait as far as the caller is concerned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_57014_statement_timeout_on_a_lock_wait_is_in_progress() {
    let Some(tables) = pg::store(4).await else {
        return;
    };
    let admin = pg_admin().await;
    let role = pg_role(&admin, &tables, "", &["statement_timeout = '300ms'"]).await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(pg_options(Some(&role), &[("lock_timeout", "10s")]))
        .await
        .unwrap();
    let store = pg_store_on(&tables, pool.clone(), Duration::from_secs(10));
    pg_cut_off_waits(&tables, &store, Duration::from_millis(300), "pg_57014").await;
    pool.close().await;
    pg_drop_role(&admin, &role).await;
    pg::drop_tables(&tables).await;
}

// 40001 (a stale REPEATABLE READ snapshot): `a_stale_snapshot_restarts_the_transaction` in
// tests/postgres_store.rs asserts its class, status and the retry.

/// 40P01: transaction A holds a business row and claims a key transaction B holds; B then
/// updates A's row. A waits first with the shorter `deadlock_timeout`, so A's claim is the victim:
/// `StoreBusy(Deadlock)`, 409, run the transaction again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_40p01_deadlock_restarts_the_transaction() {
    let Some(store) = pg::store_with(PgStore::builder().lock_timeout(BOUND), 4).await else {
        return;
    };
    let admin = pg_admin().await;
    let app = format!("{}_app", store.table());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {app} (id INT PRIMARY KEY, n INT NOT NULL); INSERT INTO {app} VALUES (1, 0)"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let biz = biz("pg_40p01");

    let mut b = store.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL deadlock_timeout = '20s'")
        .execute(&mut *b)
        .await
        .unwrap();
    let held: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut b, async |_tx: &mut PgTx| Ok(1))
        .await;
    assert_eq!(held.unwrap(), 1);

    let mut a = store.begin().await.unwrap();
    let a_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *a)
        .await
        .unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SET LOCAL deadlock_timeout = '1s'; UPDATE {app} SET n = n + 1 WHERE id = 1"
    )))
    .execute(&mut *a)
    .await
    .unwrap();
    let biz_a = biz.clone();
    let a_claims = tokio::spawn(async move {
        let res: Result<u32, IdemError> = Call::new(biz_a, "k")
            .run_in_tx(&mut a, async |_tx: &mut PgTx| Ok(2))
            .await;
        (a, res)
    });
    // A waits on B's record; then B waits on A's row.
    bounded("A waits for B's record", async {
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            )
            .bind(a_pid)
            .fetch_one(&admin)
            .await
            .unwrap();
            if waiting == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let b_update = sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE {app} SET n = n + 10 WHERE id = 1"
    )));
    let (b_done, a_done) = bounded("the deadlock is resolved", async {
        let b_done = b_update.execute(&mut *b);
        // B blocks until A's transaction ends; A ends it once its claim failed.
        let a_done = async {
            let (a, res) = a_claims.await.unwrap();
            a.rollback().await.unwrap();
            res
        };
        tokio::join!(b_done, a_done)
    })
    .await;
    b_done.expect("B is not the victim");
    let e = a_done.unwrap_err();
    assert_busy(&e, Busy::Deadlock, 409);
    assert!(e.restarts_transaction());
    b.rollback().await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {app}")))
        .execute(&admin)
        .await
        .unwrap();
    pg::drop_tables(&store).await;
}

/// 53300: a role limited to one connection. The pool cannot open a second one; sqlx retries 53300
/// while connecting until the pool's acquire timeout, so a call that needs a second connection is
/// `StoreUnavailable` (503), retried inside idem, and the body does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_53300_too_many_connections_is_unavailable() {
    let Some(tables) = pg::store(2).await else {
        return;
    };
    let admin = pg_admin().await;
    let role = pg_role(&admin, &tables, "CONNECTION LIMIT 1", &[]).await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(500))
        .connect_with(pg_options(Some(&role), &[]))
        .await
        .unwrap();
    let store = pg_store_on(&tables, pool.clone(), Duration::from_secs(3));
    let hold = store.begin().await.unwrap(); // the role's one connection
    let biz = biz("pg_53300");
    let ran = AtomicU32::new(0);
    let res = counted_call("a call without a connection", &store, &biz, "k", 1, &ran).await;
    assert_unavailable(&res.unwrap_err());
    assert_eq!(ran.load(Ordering::Relaxed), 0);
    // Directly: the server's answer to the connection attempt.
    let direct = sqlx::PgConnection::connect_with(&pg_options(Some(&role), &[])).await;
    let code = match &direct {
        Err(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
        other => panic!("expected the server's refusal: {other:?}"),
    };
    assert_eq!(code.as_deref(), Some("53300"));
    hold.rollback().await.unwrap();
    let res: Result<u32, IdemError> = Call::new(biz, "k").run(&store, async { Ok(1) }).await;
    assert_eq!(res.unwrap(), 1, "with a connection free the call runs");
    pool.close().await;
    pg_drop_role(&admin, &role).await;
    pg::drop_tables(&tables).await;
}

/// 57P01: an administrator terminates a backend. A claim waiting on a lock gets
/// `StoreUnavailable` (503) from the store; a pooled idle connection terminated behind the store's
/// back costs a call nothing: idem tries again on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_57p01_terminated_backend_is_unavailable() {
    let Some(tables) = pg::store(2).await else {
        return;
    };
    let admin = pg_admin().await;
    let name = server::unique("idemec");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(pg_options(None, &[("lock_timeout", "20s")]).application_name(&name))
        .await
        .unwrap();
    let store = pg_store_on(&tables, pool.clone(), Duration::from_secs(20));
    let biz = biz("pg_57p01");

    let mut holder = tables.begin().await.unwrap();
    let held: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut holder, async |_tx: &mut PgTx| Ok(1))
        .await;
    assert_eq!(held.unwrap(), 1);
    let (waiter, biz_w) = (store.clone(), biz.clone());
    let waiting = tokio::spawn(async move { waiter.claim(&req(&biz_w, "k")).await });
    let pid: i32 = bounded("the claim waits for the holder", async {
        loop {
            let pid: Option<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
                 AND wait_event_type = 'Lock'",
            )
            .bind(&name)
            .fetch_optional(&admin)
            .await
            .unwrap();
            if let Some(pid) = pid {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&admin)
        .await
        .unwrap();
    let claimed = bounded("the terminated claim", waiting).await.unwrap();
    assert_unavailable(&claimed.unwrap_err());
    holder.commit().await.unwrap();

    // Idle connections terminated behind the pool's back.
    let res: Result<u32, IdemError> = Call::new(biz.clone(), "warm")
        .run(&store, async { Ok(1) })
        .await;
    assert_eq!(res.unwrap(), 1);
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&name)
    .execute(&admin)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ran = AtomicU32::new(0);
    let res = counted_call(
        "a call on terminated connections",
        &store,
        &biz,
        "after",
        2,
        &ran,
    )
    .await;
    assert_eq!(res.unwrap(), 2, "retried on a fresh connection");
    assert_eq!(ran.load(Ordering::Relaxed), 1);
    pool.close().await;
    pg::drop_tables(&tables).await;
}

/// 25P03: a transaction left idle longer than `idle_in_transaction_session_timeout` loses its
/// connection (and the transaction with it); the next claim in it is `StoreUnavailable` (503), not
/// a permanent store error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_25p03_idle_transaction_timeout_is_unavailable() {
    let Some(store) = pg::store(2).await else {
        return;
    };
    let biz = biz("pg_25p03");
    let mut tx = store.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL idle_in_transaction_session_timeout = '200ms'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let res: Result<u32, IdemError> = bounded(
        "a claim in a timed-out transaction",
        Call::new(biz.clone(), "k").run_in_tx(&mut tx, async |_tx: &mut PgTx| Ok(1)),
    )
    .await;
    assert_unavailable(&res.unwrap_err());
    drop(tx);
    let res: Result<u32, IdemError> = Call::new(biz, "k").run(&store, async { Ok(2) }).await;
    assert_eq!(res.unwrap(), 2, "nothing was claimed");
    pg::drop_tables(&store).await;
}

/// A stand-in Postgres on a loopback port that refuses every connection with `code` (a FATAL
/// ErrorResponse, as a server does for a connection it cannot serve).
async fn fake_pg(code: &'static str, message: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                loop {
                    let mut len = [0u8; 4];
                    if sock.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut body = vec![0u8; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
                    if sock.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    // SSLRequest / GSSENCRequest: "no", then the startup message follows.
                    if matches!(body.get(..4), Some([0x04, 0xd2, 0x16, 0x2f | 0x30])) {
                        let _ = sock.write_all(b"N").await;
                        continue;
                    }
                    let mut fields = Vec::new();
                    for (tag, value) in [
                        (b'S', "FATAL"),
                        (b'V', "FATAL"),
                        (b'C', code),
                        (b'M', message),
                    ] {
                        fields.push(tag);
                        fields.extend_from_slice(value.as_bytes());
                        fields.push(0);
                    }
                    fields.push(0);
                    let mut reply = vec![b'E'];
                    reply.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                    reply.extend_from_slice(&fields);
                    let _ = sock.write_all(&reply).await;
                    return;
                }
            });
        }
    });
    port
}

/// 08xxx (here 08006, connection_failure): the server refuses the connection the pool opens for a
/// call: `StoreUnavailable` (503), and the body does not run. No local server can be made to send
/// it, so a stand-in sends the server's bytes to the real driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_08xxx_connection_exception_is_unavailable() {
    let port = fake_pg("08006", "connection failure").await;
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("idem")
        .database("test")
        .ssl_mode(PgSslMode::Disable);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    let store = PgStore::from_pool(pool);
    unavailable_and_nothing_runs(&store).await;
}

// ---------------------------------------------------------------------------------------------
// MySQL / MariaDB
// ---------------------------------------------------------------------------------------------

fn my_url() -> String {
    server::url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// A store (pool of `connections`, lock wait `lock_wait`) on a table of its own, migrated.
async fn my_store(connections: u32, lock_wait: Duration) -> Option<MySqlStore> {
    let url = my_url();
    let store = server::reach(
        "MySQL",
        &url,
        MySqlStore::connect_with(&url, connections, lock_wait),
    )
    .await?;
    let store = store.with_table(&server::unique("idem_ec")).unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

async fn my_admin() -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(2)
        .connect(&my_url())
        .await
        .unwrap()
}

async fn my_drop_table(pool: &MySqlPool, table: &str) {
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{table}`")))
        .execute(pool)
        .await
        .unwrap();
}

/// Waits (bounded) until connection `id` runs a statement that begins with `start` (a name of
/// this test, no quotes). Only ever a connection of this test: other suites on the same server
/// wait for locks too. Asked in the text protocol: MariaDB may answer a prepared statement on an
/// `information_schema` table from an earlier execution.
async fn my_wait_for_statement(admin: &MySqlPool, id: u64, start: &str) {
    let probe = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id} AND INFO LIKE '{start}%'"
    );
    bounded("a statement", async {
        loop {
            let row = sqlx::raw_sql(AssertSqlSafe(probe.clone()))
                .fetch_one(admin)
                .await
                .unwrap();
            if row.get::<i64, _>(0) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

async fn my_connection_id(conn: impl sqlx::MySqlExecutor<'_>) -> u64 {
    sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// 1205: InnoDB's lock wait (the store's 1 s) cuts off a duplicate waiting on the claimant's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_1205_lock_wait_timeout_is_in_progress() {
    let Some(store) = my_store(4, Duration::from_secs(1)).await else {
        return;
    };
    my_cut_off_waits(&store, &store, Duration::from_secs(1), "my_1205").await;
    my_drop_table(store.pool(), store.table()).await;
}

/// 1969: MariaDB's `max_statement_time` (300 ms, on every session of the store's pool) is shorter
/// than its lock wait (10 s); the wait it cuts off is the same lock wait to the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_1969_statement_time_on_a_lock_wait_is_in_progress() {
    let Some(tables) = my_store(2, Duration::from_secs(1)).await else {
        return;
    };
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION max_statement_time = 0.3, innodb_lock_wait_timeout = 10")
                    .await?;
                Ok(())
            })
        })
        .connect(&my_url())
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool.clone())
        .with_lock_wait(Duration::from_secs(10))
        .with_table(tables.table())
        .unwrap();
    my_cut_off_waits(&tables, &store, Duration::from_millis(300), "my_1969").await;
    pool.close().await;
    my_drop_table(tables.pool(), tables.table()).await;
}

/// 1213: transaction A holds one business row and claims a key transaction B holds; B, which
/// wrote many more rows, then updates A's row. InnoDB rolls back the lighter transaction, A, whose
/// claim is `StoreBusy(Deadlock)`, 409: run the transaction again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_1213_deadlock_restarts_the_transaction() {
    let Some(store) = my_store(4, Duration::from_secs(20)).await else {
        return;
    };
    let admin = my_admin().await;
    let app = server::unique("idem_ec"); // the business table
    let mut rows = String::from("(1, 0)");
    for id in 2..=60 {
        rows.push_str(&format!(", ({id}, 0)"));
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE `{app}` (id INT PRIMARY KEY, n INT NOT NULL) ENGINE = InnoDB; \
         INSERT INTO `{app}` VALUES {rows}"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let biz = biz("my_1213");

    let mut a = store.begin().await.unwrap();
    let a_id = my_connection_id(&mut *a).await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE `{app}` SET n = n + 1 WHERE id = 1"
    )))
    .execute(&mut *a)
    .await
    .unwrap();
    let mut b = store.begin().await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE `{app}` SET n = n + 1 WHERE id > 1"
    )))
    .execute(&mut *b)
    .await
    .unwrap();
    let held: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut b, async |_tx: &mut MySqlTx| Ok(1))
        .await;
    assert_eq!(held.unwrap(), 1);

    let biz_a = biz.clone();
    let a_claims = tokio::spawn(async move {
        let res: Result<u32, IdemError> = Call::new(biz_a, "k")
            .run_in_tx(&mut a, async |_tx: &mut MySqlTx| Ok(2))
            .await;
        (a, res)
    });
    my_wait_for_statement(&admin, a_id, &format!("INSERT INTO `{}`", store.table())).await;
    let b_done = bounded(
        "B's update",
        sqlx::raw_sql(AssertSqlSafe(format!(
            "UPDATE `{app}` SET n = n + 10 WHERE id = 1"
        )))
        .execute(&mut *b),
    )
    .await;
    b_done.expect("B is not the victim");
    let (a, res) = bounded("A's claim", a_claims).await.unwrap();
    let e = res.unwrap_err();
    assert_busy(&e, Busy::Deadlock, 409);
    assert!(e.restarts_transaction());
    let _ = a.rollback().await;
    b.rollback().await.unwrap();
    my_drop_table(&admin, &app).await;
    my_drop_table(&admin, store.table()).await;
}

/// 1317: an administrator's `KILL QUERY` of a claim waiting on a lock is a cut-off lock wait
/// (`InProgress`). `KILL` of its connection: MariaDB closes it without a word, which the driver
/// reports as an I/O error (what the C client calls 2013, lost connection): `StoreUnavailable`
/// (503). An idle pooled connection killed behind the store's back costs a call nothing: idem
/// tries again on a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_1317_killed_query_and_lost_connection() {
    let Some(store) = my_store(1, Duration::from_secs(20)).await else {
        return;
    };
    let admin = my_admin().await;
    let holder = MySqlStore::connect_with(&my_url(), 1, Duration::from_secs(20))
        .await
        .unwrap()
        .with_table(store.table())
        .unwrap();
    let biz = biz("my_kill");
    let mut first = holder.begin().await.unwrap();
    let held: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut first, async |_tx: &mut MySqlTx| Ok(1))
        .await;
    assert_eq!(held.unwrap(), 1);

    for (kill, case) in [("KILL QUERY", "query"), ("KILL", "connection")] {
        // The pool's one connection: the one the claim will wait on.
        let id = my_connection_id(store.pool()).await;
        let (waiter, biz_w) = (store.clone(), biz.clone());
        let waiting = tokio::spawn(async move { waiter.claim(&req(&biz_w, "k")).await });
        my_wait_for_statement(&admin, id, &format!("INSERT INTO `{}`", store.table())).await;
        sqlx::raw_sql(AssertSqlSafe(format!("{kill} {id}")))
            .execute(&admin)
            .await
            .unwrap();
        let claimed = bounded("the killed claim", waiting).await.unwrap();
        match case {
            "query" => assert!(
                matches!(claimed, Ok(ClaimOutcome::InProgress { .. })),
                "{kill}: {claimed:?}"
            ),
            _ => assert_unavailable(&claimed.unwrap_err()),
        }
    }
    first.commit().await.unwrap();

    // The pool's one idle connection, killed behind its back.
    let res: Result<u32, IdemError> = Call::new(biz.clone(), "warm")
        .run(&store, async { Ok(1) })
        .await;
    assert_eq!(res.unwrap(), 1);
    let id = my_connection_id(store.pool()).await;
    sqlx::raw_sql(AssertSqlSafe(format!("KILL {id}")))
        .execute(&admin)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ran = AtomicU32::new(0);
    let res = counted_call(
        "a call on a killed connection",
        &store,
        &biz,
        "after",
        2,
        &ran,
    )
    .await;
    assert_eq!(res.unwrap(), 2, "retried on a fresh connection");
    assert_eq!(ran.load(Ordering::Relaxed), 1);
    my_drop_table(&admin, store.table()).await;
}

/// A MariaDB user of this process (`idemu_<pid>_<n>`, password `idem`) limited to one connection,
/// allowed to use `table`; the users earlier processes left behind are dropped first.
async fn my_limited_user(admin: &MySqlPool, table: &str) -> String {
    let stale: Vec<String> =
        sqlx::query_scalar("SELECT CAST(User AS CHAR) FROM mysql.user WHERE User LIKE 'idemu\\_%'")
            .fetch_all(admin)
            .await
            .unwrap();
    for user in stale {
        if !alive(user.split('_').nth(1).unwrap_or("")) {
            let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP USER IF EXISTS '{user}'@'%'")))
                .execute(admin)
                .await;
        }
    }
    let user = server::unique("idemu");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'idem' WITH MAX_USER_CONNECTIONS 1; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON `{table}` TO '{user}'@'%'"
    )))
    .execute(admin)
    .await
    .unwrap();
    user
}

/// 1226: a user limited to one connection (`MAX_USER_CONNECTIONS 1`: what a shared server's
/// `max_connections`, 1040, does to everyone). A call that needs a second connection is
/// `StoreUnavailable` (503), retried inside idem, and the body does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_1226_user_connection_limit_is_unavailable() {
    let Some(tables) = my_store(1, Duration::from_secs(2)).await else {
        return;
    };
    let admin = my_admin().await;
    let user = my_limited_user(&admin, tables.table()).await;
    let options = MySqlConnectOptions::from_str(&my_url())
        .unwrap()
        .username(&user)
        .password("idem");
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options.clone())
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool.clone())
        .with_table(tables.table())
        .unwrap();
    let hold = store.begin().await.unwrap(); // the user's one connection
    let biz = biz("my_1226");
    let ran = AtomicU32::new(0);
    let res = counted_call("a call without a connection", &store, &biz, "k", 1, &ran).await;
    assert_unavailable(&res.unwrap_err());
    assert_eq!(ran.load(Ordering::Relaxed), 0);
    let direct = sqlx::MySqlConnection::connect_with(&options).await;
    let number = match &direct {
        Err(sqlx::Error::Database(db)) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|e| e.number()),
        other => panic!("expected the server's refusal: {other:?}"),
    };
    assert_eq!(number, Some(1226));
    hold.rollback().await.unwrap();
    let res: Result<u32, IdemError> = Call::new(biz, "k").run(&store, async { Ok(1) }).await;
    assert_eq!(res.unwrap(), 1, "with a connection free the call runs");
    pool.close().await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP USER '{user}'@'%'")))
        .execute(&admin)
        .await
        .unwrap();
    my_drop_table(&admin, tables.table()).await;
}

/// A stand-in MariaDB on a loopback port that refuses every connection the way a full server does:
/// an ERR packet (`number`, `message`) instead of the handshake.
async fn fake_mysql(number: u16, message: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut payload = vec![0xff];
            payload.extend_from_slice(&number.to_le_bytes());
            payload.extend_from_slice(message.as_bytes());
            let mut packet = (payload.len() as u32).to_le_bytes()[..3].to_vec();
            packet.push(0); // sequence id
            packet.extend_from_slice(&payload);
            let _ = sock.write_all(&packet).await;
        }
    });
    port
}

/// 1040: the server has no connection left for anyone. The shared server's `max_connections`
/// cannot be lowered under the other suites, so a stand-in sends MariaDB's bytes to the real
/// driver: `StoreUnavailable` (503), and the body does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_1040_too_many_connections_is_unavailable() {
    let port = fake_mysql(1040, "Too many connections").await;
    let options = MySqlConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("idem");
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    let store = MySqlStore::from_pool(pool);
    unavailable_and_nothing_runs(&store).await;
}

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

/// Whether the server's reply `code` is named in `e` (the client spells the codes it knows its own
/// way: `BusyLoading`, `ReadOnly`, `MasterDown`).
fn says(e: &IdemError, code: &str) -> bool {
    e.to_string().to_lowercase().contains(&code.to_lowercase())
}

/// A call on `store` whose body counts its runs in `ran`.
async fn redis_call(store: &RedisStore, key: &str, ran: &AtomicU32) -> Result<u32, IdemError> {
    counted_call("a Redis call", store, "EC", key, 1, ran).await
}

async fn redis_connect(server: &RedisServer) -> RedisStore {
    bounded("connect", RedisStore::connect(&server.url()))
        .await
        .unwrap()
        .with_prefix("idemec:")
        .unwrap()
}

/// A scratch directory of this test, removed when dropped (after the servers in it: declare it
/// first).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(redis_server::scratch_dir(name))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `redis-cli` child of this test (a long-running command), reaped and, if still running,
/// killed when dropped.
struct Cli(std::process::Child);

impl Cli {
    fn spawn(server: &RedisServer, args: &[&str]) -> Cli {
        let child = std::process::Command::new("redis-cli")
            .args(["-p", &server.port.to_string()])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-cli runs");
        Cli(child)
    }

    /// Waits (bounded) for it to end.
    fn wait(mut self) {
        let start = Instant::now();
        while self.0.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < BOUND, "redis-cli did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Polls (bounded) until `PING` answers with `reply`.
/// A redis-server of this test's own in `dir`, on a free port from `base`, without persistence,
/// with `extra` options (declare `dir` first, so it is removed after the server stops).
fn own_server(dir: &Scratch, base: u16, extra: &[&str]) -> RedisServer {
    let port = redis_server::ports(base, 1).next().unwrap();
    let mut args = vec!["--save", "", "--appendonly", "no"];
    args.extend_from_slice(extra);
    RedisServer::start(port, &dir.0, &args)
}

/// A call on `store` refused with the server's `code`, of the class `check` asserts, before its
/// body ran.
async fn refused(store: &RedisStore, ran: &AtomicU32, code: &str, check: impl Fn(&IdemError)) {
    let before = ran.load(Ordering::Relaxed);
    let e = redis_call(store, "k", ran).await.unwrap_err();
    assert!(says(&e, code), "{e}");
    check(&e);
    assert_eq!(
        ran.load(Ordering::Relaxed),
        before,
        "the body ran on a refused claim"
    );
}

fn wait_for_ping(server: &RedisServer, reply: &str) {
    server.wait_for(|r| r.contains(reply), &["PING"]);
}

/// LOADING: the server is loading its dataset (`DEBUG RELOAD` with a delay per key, on a server
/// of this test): `StoreUnavailable` (503); once loaded, the call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_loading_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-loading");
    let server = own_server(&dir, 15_000, &["--enable-debug-command", "yes"]);
    let store = redis_connect(&server).await;
    server.cli(&["DEBUG", "POPULATE", "20000", "fill", "10"]);
    server.cli(&["CONFIG", "SET", "key-load-delay", "250"]);
    server.cli(&[
        "CONFIG",
        "SET",
        "loading-process-events-interval-bytes",
        "1024",
    ]);
    let reload = Cli::spawn(&server, &["DEBUG", "RELOAD"]);
    wait_for_ping(&server, "LOADING");
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "LOADING", assert_unavailable).await;
    reload.wait();
    server.cli(&["CONFIG", "SET", "key-load-delay", "0"]);
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// BUSY: a script runs past `busy-reply-threshold`: the server answers nothing but BUSY until it
/// ends: `StoreBusy(Locked)` (503); after `SCRIPT KILL` the call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_busy_script_is_busy() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-busy");
    let server = own_server(&dir, 16_000, &["--busy-reply-threshold", "50"]);
    let store = redis_connect(&server).await;
    // A read-only script that spins for up to 20 s (so SCRIPT KILL can end it).
    let spin = Cli::spawn(
        &server,
        &[
            "EVAL",
            "local s = tonumber(redis.call('TIME')[1]) \
             while tonumber(redis.call('TIME')[1]) < s + 20 do end return 1",
            "0",
        ],
    );
    wait_for_ping(&server, "BUSY");
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "BUSY", |e| assert_busy(e, Busy::Locked, 503)).await;
    server.cli(&["SCRIPT", "KILL"]);
    spin.wait();
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// A primary and its replica, both of this test; the replica with `replica_args` on top.
fn redis_pair(
    dir: &std::path::Path,
    base: u16,
    replica_args: &[&str],
) -> (RedisServer, RedisServer) {
    let mut ports = redis_server::ports(base, 2);
    let plain = ["--save", "", "--appendonly", "no"];
    let primary = RedisServer::start(ports.next().unwrap(), dir, &plain);
    let primary_port = primary.port.to_string();
    let mut args = plain.to_vec();
    args.extend(["--replicaof", "127.0.0.1", &primary_port]);
    args.extend(replica_args);
    let replica = RedisServer::start(ports.next().unwrap(), dir, &args);
    replica.wait_for(
        |info| info.contains("master_link_status:up"),
        &["INFO", "replication"],
    );
    (primary, replica)
}

/// READONLY: a store pointed at a replica (a failover demoted its server, or the URL names a
/// replica): `StoreUnavailable` (503), nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_readonly_replica_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-readonly");
    let (_primary, replica) = redis_pair(&dir.0, 18_000, &[]);
    let store = redis_connect(&replica).await;
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "READONLY", assert_unavailable).await;
    // Promoted, the same server takes the call.
    assert!(replica.cli(&["REPLICAOF", "NO", "ONE"]).contains("OK"));
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// MASTERDOWN: a replica with `replica-serve-stale-data no` whose primary is gone:
/// `StoreUnavailable` (503), and the body does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_masterdown_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-masterdown");
    let (primary, replica) = redis_pair(&dir.0, 20_000, &["--replica-serve-stale-data", "no"]);
    let store = redis_connect(&replica).await;
    primary.shutdown_nosave();
    replica.wait_for(
        |info| info.contains("master_link_status:down"),
        &["INFO", "replication"],
    );
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "MASTERDOWN", assert_unavailable).await;
}

/// NOREPLICAS: `min-replicas-to-write 1` and no replica: the server refuses writes:
/// `StoreUnavailable` (503), as when `with_replica_acks` finds too few replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_noreplicas_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-noreplicas");
    let server = own_server(&dir, 17_000, &["--min-replicas-to-write", "1"]);
    let store = redis_connect(&server).await;
    let ran = AtomicU32::new(0);
    refused(&store, &ran, "NOREPLICAS", assert_unavailable).await;
    server.cli(&["CONFIG", "SET", "min-replicas-to-write", "0"]);
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// OOM: `maxmemory` reached under `noeviction`: the server refuses writes: `StoreUnavailable`
/// (503); with memory again, the call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_oom_is_unavailable() {
    if !redis_server::installed() {
        return;
    }
    let dir = Scratch::new("ec-oom");
    let server = own_server(&dir, 30_000, &["--enable-debug-command", "yes"]);
    let store = redis_connect(&server).await;
    let ran = AtomicU32::new(0);
    assert_eq!(redis_call(&store, "warm", &ran).await.unwrap(), 1);
    server.cli(&["DEBUG", "POPULATE", "20000", "fill", "10"]);
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cli(&["CONFIG", "SET", "maxmemory", "1mb"]);
    refused(&store, &ran, "OOM", assert_unavailable).await;
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(redis_call(&store, "k", &ran).await.unwrap(), 1);
}

/// A stand-in Redis on a loopback port: answers `+OK` / `+PONG` to the connection's set-up and
/// `error` (a whole RESP error line, without CRLF) to every script.
async fn fake_redis(error: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = sock.into_split();
                let mut read = BufReader::new(read);
                loop {
                    // One command: *<n>, then n bulk strings ($<len>, the bytes).
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let n: usize = line.trim().trim_start_matches('*').parse().unwrap_or(0);
                    let mut parts = Vec::new();
                    for _ in 0..n {
                        line.clear();
                        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let len: usize = line.trim().trim_start_matches('$').parse().unwrap_or(0);
                        let mut bytes = vec![0u8; len + 2];
                        if read.read_exact(&mut bytes).await.is_err() {
                            return;
                        }
                        bytes.truncate(len);
                        parts.push(String::from_utf8_lossy(&bytes).to_uppercase());
                    }
                    let reply = match parts.first().map(String::as_str) {
                        Some("EVALSHA" | "EVAL" | "FCALL") => format!("{error}\r\n"),
                        Some("PING") => "+PONG\r\n".to_owned(),
                        _ => "+OK\r\n".to_owned(),
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("redis://127.0.0.1:{port}")
}

/// TRYAGAIN, CLUSTERDOWN, MISCONF: replies no server of this machine gives idem's one-key scripts
/// (TRYAGAIN answers a multi-key command during a resharding; CLUSTERDOWN a cluster with an
/// unserved slot, which the cluster client waits out itself; MISCONF a server that cannot write
/// its snapshot, which root on this machine cannot be kept from doing). A stand-in sends the
/// server's bytes to the real client and store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tryagain_clusterdown_misconf_from_a_stand_in() {
    let cases: [(&str, Option<Busy>); 3] = [
        (
            "-TRYAGAIN Multiple keys request during rehashing of slot",
            Some(Busy::Locked),
        ),
        ("-CLUSTERDOWN The cluster is down", None),
        (
            "-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to \
             persist to disk. Commands that may modify the data set are disabled",
            None,
        ),
    ];
    for (error, busy) in cases {
        let url = fake_redis(error).await;
        let store = bounded("connect", RedisStore::connect(&url)).await.unwrap();
        let ran = AtomicU32::new(0);
        let e = redis_call(&store, "k", &ran).await.unwrap_err();
        match busy {
            Some(reason) => assert_busy(&e, reason, 503),
            None => assert_unavailable(&e),
        }
        assert_eq!(ran.load(Ordering::Relaxed), 0, "{error}");
    }
}

/// A table never migrated, on each SQL store: the error names the server, its code and its
/// message, and says how to fix it; never the line of the server's C source that raised it
/// (Postgres's `… at line 1392`), nor its file; through a call, also the step of idem's protocol
/// ("during the claim").
#[tokio::test]
async fn a_server_error_reads_as_the_servers_message_with_its_code() {
    let mut stores: Vec<(&str, idem::AnyStore, &str)> = Vec::new();
    let dir = std::env::temp_dir().join(format!("idem-ec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = format!("sqlite:{}", dir.join("never.db").display());
    stores.push((
        "SQLite",
        idem::connect(&sqlite).await.unwrap(),
        "SQLite error 1: no such table",
    ));
    let pg_url = server::url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
    if let Some(store) = server::reach("Postgres", &pg_url, idem::connect(&pg_url)).await {
        stores.push(("Postgres", store, "Postgres error 42P01: relation"));
    }
    if let Some(store) = server::reach("MySQL", &my_url(), idem::connect(&my_url())).await {
        stores.push(("MySQL", store, "MySQL error 1146 (42S02): Table"));
    }
    for (service, store, says) in stores {
        let store = store.with_table(&server::unique("idem_never")).unwrap();
        let err = store.load("PAY", "k").await.unwrap_err();
        let shown = err.to_string();
        assert!(
            matches!(err, IdemError::StoreSchema { .. }) && shown.contains(says),
            "{service}: {shown}"
        );
        assert!(shown.contains("migrate()"), "{service}: {shown}");
        assert!(!shown.contains(" at line "), "{service}: {shown}");
        let debug = format!("{err:?}");
        assert!(
            !debug.contains(".c\"") && !debug.contains("idem-runtime/"),
            "{service}: {debug}"
        );
        // Through a call, the error also names the step of idem's it came from.
        let err = Call::new("PAY", "k")
            .run(&store, async { Ok::<_, IdemError>(1u8) })
            .await
            .unwrap_err();
        let shown = err.to_string();
        assert!(
            matches!(err, IdemError::StoreSchema { .. })
                && shown.contains(&format!("during the claim, {says}")),
            "{service}: {shown}"
        );
    }
}
