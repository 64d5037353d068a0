//! Many callers and many rows: the same-key storm in lease mode and in transactions at every
//! isolation level, and the sweeper over 100k expired rows.

use super::*;

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
        assert_eq!(rec.status, idem::store::Status::Succeeded);
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
