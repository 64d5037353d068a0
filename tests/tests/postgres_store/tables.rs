//! The store's tables and connections: schema-qualified names, a missing table, migrations from
//! earlier versions, table names and limits, the pool it shares with the application.

use super::*;

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
    let too_big = idem::store::Limits {
        max_snapshot_len: (1 << 30) + 1,
        ..idem::store::Limits::default()
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
        .with_limits(idem::store::Limits {
            max_snapshot_len: 1 << 30,
            ..idem::store::Limits::default()
        })
        .unwrap();
    assert_eq!(wide.limits().max_snapshot_len, 1 << 30);
    pg::drop_tables(&wide).await;
}

/// The connections the store keeps warm between its statements go back to the pool the
/// application shares with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_connections_go_back_to_the_pool() {
    let url = server::pg_url();
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
