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
//!
//! One module per server (`postgres`, `mysql`, `redis`), and `messages` for what a server error
//! reads as, over the helpers and assertions here.

#[path = "../contract/mod.rs"]
mod contract;
#[path = "../support/postgres.rs"]
mod pg;
#[path = "../support/redis_server.rs"]
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
    Call, IdemError, MySqlStore, MySqlTx, PgStore, PgTx, RedisStore, Store,
    error::Busy,
    store::{ClaimOutcome, ClaimRequest},
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

mod messages;
mod mysql;
mod postgres;
mod redis;
