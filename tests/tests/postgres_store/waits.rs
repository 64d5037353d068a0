//! Duplicates of a transaction still open: a bounded wait, then a replay once it commits; the
//! key's lock per table; a stale snapshot that must restart its transaction.

use super::*;

/// A duplicate in transaction mode waits for the claimant's transaction at most the store's lock
/// timeout, then answers `InProgress` (so does a lease-mode duplicate); after the claimant commits,
/// both replay. The claimant's body runs with the caller's own lock timeout, not idem's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_a_bounded_time_then_replays() {
    let builder = PgStore::builder().lock_timeout(Duration::from_millis(200));
    let Some(store) = pg::store_with(builder, 4).await else {
        return;
    };
    let biz = biz("pg_wait");
    let mut holder = store.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *holder)
        .await
        .unwrap();
    let seen: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut holder, async |tx: &mut PgTx| {
            let row = sqlx::raw_sql("SHOW lock_timeout")
                .fetch_one(&mut **tx)
                .await
                .map_err(IdemError::store)?;
            Ok(row.get::<String, _>(0))
        })
        .await;
    assert_eq!(
        seen.unwrap(),
        "7s",
        "the body runs with the caller's lock timeout"
    );

    // The claimant's transaction is still open: its record is locked and uncommitted.
    let mut dup = store.begin().await.unwrap();
    let res: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut dup, async |_tx: &mut PgTx| Ok("second run".to_owned()))
        .await;
    assert!(
        matches!(res, Err(IdemError::InProgress { .. })),
        "tx-mode duplicate: {res:?}"
    );
    // The duplicate's transaction is still usable after the timed-out wait.
    sqlx::query("SELECT 1").execute(&mut *dup).await.unwrap();
    dup.rollback().await.unwrap();
    let res: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run(&store, async { Ok("second run".to_owned()) })
        .await;
    assert!(
        matches!(res, Err(IdemError::InProgress { .. })),
        "lease-mode duplicate: {res:?}"
    );

    holder.commit().await.unwrap();
    let mut dup = store.begin().await.unwrap();
    let res: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut dup, async |_tx: &mut PgTx| Ok("second run".to_owned()))
        .await;
    dup.commit().await.unwrap();
    assert_eq!(res.unwrap(), "7s", "replayed after the commit");
    pg::drop_tables(&store).await;
}

/// A transaction-mode duplicate that arrives while the claimant's transaction is open waits for
/// it (the key's advisory lock, within the store's lock timeout) and replays the claimant's
/// answer once it commits; its body never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_replays_when_the_claimant_commits() {
    let builder = PgStore::builder().lock_timeout(Duration::from_secs(10));
    let Some(store) = pg::store_with(builder, 4).await else {
        return;
    };
    let biz = biz("pg_wait_commit");
    let mut holder = store.begin().await.unwrap();
    let first: Result<String, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut holder, async |_tx: &mut PgTx| {
            Ok("first run".to_owned())
        })
        .await;
    assert_eq!(first.unwrap(), "first run");

    let ran_twice = Arc::new(AtomicU32::new(0));
    let dup = tokio::spawn({
        let (store, biz, ran_twice) = (store.clone(), biz.clone(), ran_twice.clone());
        async move {
            let mut dup = store.begin().await.unwrap();
            let res: Result<String, IdemError> = Call::new(biz, "k")
                .run_in_tx(&mut dup, async |_tx: &mut PgTx| {
                    ran_twice.fetch_add(1, Ordering::SeqCst);
                    Ok("second run".to_owned())
                })
                .await;
            dup.commit().await.unwrap();
            res
        }
    });
    // The duplicate is waiting on the open transaction's advisory lock for this key (its lock
    // timeout is 10 s), as the server's lock table shows: a bigint key is `classid` (high 32
    // bits) and `objid` (low 32 bits), `objsubid` 1.
    let mut waiting = 0i64;
    for _ in 0..400 {
        waiting = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_locks, \
             (SELECT hashtextextended($1 || chr(31) || 'k', hashtext($2)) AS h) AS k \
             WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid::bigint = (k.h >> 32) & 4294967295 AND objid::bigint = k.h & 4294967295",
        )
        .bind(&biz)
        .bind(store.table())
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting > 0 || dup.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiting, 1, "the duplicate waits for the claimant's lock");
    assert!(!dup.is_finished());
    holder.commit().await.unwrap();
    let res = dup.await.unwrap();
    assert_eq!(res.unwrap(), "first run", "replayed the claimant's answer");
    assert_eq!(ran_twice.load(Ordering::SeqCst), 0);
    pg::drop_tables(&store).await;
}

/// The key's lock is per table: a transaction-mode call of the same business type and key on
/// another table neither waits for an open claimant's transaction nor is told "in progress".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_on_another_table_does_not_wait() {
    let builder = || PgStore::builder().lock_timeout(Duration::from_secs(10));
    let (Some(one), Some(other)) = (
        pg::store_with(builder(), 2).await,
        pg::store_with(builder(), 2).await,
    ) else {
        return;
    };
    assert_ne!(one.table(), other.table());
    let biz = biz("pg_lock_table");
    let mut holder = one.begin().await.unwrap();
    let first: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut holder, async |_tx: &mut PgTx| Ok(1))
        .await;
    assert_eq!(first.unwrap(), 1);
    let mut elsewhere = other.begin().await.unwrap();
    let res: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut elsewhere, async |_tx: &mut PgTx| Ok(2))
        .await;
    elsewhere.commit().await.unwrap();
    holder.commit().await.unwrap();
    // A lock shared with the open transaction would have ended in `InProgress` after the 10 s
    // lock timeout (the holder commits only after this call).
    assert_eq!(res.unwrap(), 2, "its own table, its own record");
    pg::drop_tables(&one).await;
    pg::drop_tables(&other).await;
}

/// REPEATABLE READ: a transaction whose snapshot predates another's committed claim cannot replay
/// it (its snapshot would lie): the claim fails with a serialization failure that says to run the
/// transaction again, and the next transaction replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_snapshot_restarts_the_transaction() {
    let Some(store) = pg::store(4).await else {
        return;
    };
    let biz = biz("pg_rr");
    let mut stale = store.begin_with(PgIsolation::RepeatableRead).await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *stale).await.unwrap(); // takes the snapshot
    let first: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run(&store, async { Ok(1) })
        .await;
    assert_eq!(first.unwrap(), 1);
    let res: Result<u32, IdemError> = Call::new(biz.clone(), "k")
        .run_in_tx(&mut stale, async |_tx: &mut PgTx| Ok(2))
        .await;
    match res {
        Err(e) => {
            assert!(e.restarts_transaction(), "{e:?}");
            assert!(
                matches!(
                    e,
                    IdemError::StoreBusy {
                        reason: Busy::Serialization,
                        ..
                    }
                ),
                "{e:?}"
            );
            assert_eq!(e.http_status(), 409);
        }
        Ok(v) => panic!("a stale snapshot must not answer: {v}"),
    }
    stale.rollback().await.unwrap();
    let again = idem::retry_transaction(|| async {
        let mut tx = store.begin_with(PgIsolation::RepeatableRead).await?;
        let v: u32 = Call::new(biz.clone(), "k")
            .run_in_tx(&mut tx, async |_tx: &mut PgTx| Ok::<_, IdemError>(3))
            .await?;
        tx.commit().await?;
        Ok::<_, IdemError>(v)
    })
    .await;
    assert_eq!(again.unwrap(), 1, "the next transaction replays");
    pg::drop_tables(&store).await;
}
