//! MySQL / MariaDB: lock waits cut off, deadlocks, killed queries and connections, user
//! connection limits, and a full server from a stand-in.

use super::*;

pub(super) fn my_url() -> String {
    server::mysql_url()
}

cut_off_waits!(
    my_cut_off_waits,
    MySqlStore,
    MySqlTx,
    "SELECT 1 FROM `{}` WHERE biz_type = ? AND idem_key = 'm' FOR UPDATE"
);

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
