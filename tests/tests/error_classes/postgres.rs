//! Postgres: lock waits cut off, deadlocks, connection limits, terminated backends, idle
//! transactions, and a refused connection from a stand-in.

use super::*;

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

cut_off_waits!(
    pg_cut_off_waits,
    PgStore,
    PgTx,
    "SELECT 1 FROM {} WHERE biz_type = $1 AND idem_key = 'm' FOR UPDATE"
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
// tests/postgres_store/ asserts its class, status and the retry.

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
