//! Transaction mode bounds an idle transaction: a client that vanished mid-transaction (its
//! process paused, its network silent with the TCP connection still open) holds its claim's row
//! lock, and so the key, only until its session has been idle for the call's bound (by default its
//! lease); then the server ends the session, rolls the transaction back, and a repeat takes the
//! key. On the local Postgres (`IDEM_PG_URL`) and MariaDB (`IDEM_MYSQL_URL`).
//!
//! The holder here is a transaction of this process that claims, writes its effect, and then
//! sends nothing more, which is all the server sees of a paused or cut-off client. Its effects go
//! to a table of their own, written in the holder's transaction: a row there that the holder never
//! committed must never be seen.

#[path = "contract/server.rs"]
mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem::sqlx::{self, AssertSqlSafe};
use idem::{
    Call, IdemError, IdemTx, MAX_TX_IDLE_TIMEOUT, MySqlStore, MySqlTx, PgStore, PgTx, Store,
    TransactionalStore, TxIdleTimeout,
};

/// The bound the tests put in force: short, so the suite stays quick, and a whole second count for
/// MariaDB.
const BOUND: Duration = Duration::from_secs(2);

/// How long a repeat keeps trying before the test gives up on the key being freed.
const GIVE_UP: Duration = Duration::from_secs(15);

/// What a backend of these tests does beside idem: its stores and its effects table.
trait Backend: Send + Sync + 'static {
    type Store: TransactionalStore<Tx = Self::Tx> + Clone + Send + Sync + 'static;
    type Tx: IdemTx + Send + 'static;

    /// The store, with `idle` as its own bound when given.
    async fn store(&self, idle: Option<TxIdleTimeout>) -> Self::Store;

    /// Writes one effect of `who` for `key` in `tx`.
    async fn write_effect(tx: &mut Self::Tx, table: &str, key: &str, who: &str);

    /// Who wrote the committed effects of `key`.
    async fn effects(&self, key: &str) -> Vec<String>;

    /// The effects table.
    fn table(&self) -> &str;

    async fn commit(tx: Self::Tx) -> Result<(), IdemError>;
    async fn rollback(tx: Self::Tx) -> Result<(), IdemError>;
}

struct Pg {
    url: String,
    table: String,
    records: String,
    admin: PgStore,
}

impl Pg {
    async fn new() -> Option<Self> {
        let url = server::pg_url();
        let records = server::unique("idemt");
        let admin = server::reach(
            "Postgres",
            &url,
            PgStore::builder()
                .table(&records)
                .unwrap()
                .max_connections(2)
                .connect(&url),
        )
        .await?;
        admin.migrate().await.unwrap();
        let table = format!("{records}_fx");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, k TEXT NOT NULL, who TEXT NOT NULL)"
        )))
        .execute(admin.pool())
        .await
        .unwrap();
        Some(Pg {
            url,
            table,
            records,
            admin,
        })
    }
}

impl Backend for Pg {
    type Store = PgStore;
    type Tx = PgTx;

    async fn store(&self, idle: Option<TxIdleTimeout>) -> PgStore {
        // A small pool, so a connection the server closed would be met again if it were kept;
        // a short lock timeout, so a repeat that finds the key held answers soon.
        let builder = PgStore::builder()
            .table(&self.records)
            .unwrap()
            .max_connections(2)
            .lock_timeout(Duration::from_millis(300));
        let builder = match idle {
            None => builder,
            Some(TxIdleTimeout::After(d)) => builder.tx_idle_timeout(d),
            Some(_) => builder.no_tx_idle_timeout(),
        };
        builder.connect(&self.url).await.unwrap()
    }

    async fn write_effect(tx: &mut PgTx, table: &str, key: &str, who: &str) {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (k, who) VALUES ($1, $2)"
        )))
        .bind(key)
        .bind(who)
        .execute(&mut **tx)
        .await
        .unwrap();
    }

    async fn effects(&self, key: &str) -> Vec<String> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT who FROM {} WHERE k = $1 ORDER BY id",
            self.table
        )))
        .bind(key)
        .fetch_all(self.admin.pool())
        .await
        .unwrap()
    }

    fn table(&self) -> &str {
        &self.table
    }

    async fn commit(tx: PgTx) -> Result<(), IdemError> {
        tx.commit().await
    }

    async fn rollback(tx: PgTx) -> Result<(), IdemError> {
        tx.rollback().await
    }
}

struct Maria {
    url: String,
    table: String,
    records: String,
    admin: MySqlStore,
}

impl Maria {
    async fn new() -> Option<Self> {
        let url = server::mysql_url();
        let records = server::unique("idem_idle");
        let admin = server::reach(
            "MariaDB",
            &url,
            MySqlStore::builder().max_connections(2).connect(&url),
        )
        .await?
        .with_table(&records)
        .unwrap();
        admin.migrate().await.unwrap();
        let table = format!("{records}_fx");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             k VARCHAR(255) NOT NULL, who VARCHAR(32) NOT NULL) ENGINE = InnoDB"
        )))
        .execute(admin.pool())
        .await
        .unwrap();
        Some(Maria {
            url,
            table,
            records,
            admin,
        })
    }
}

impl Backend for Maria {
    type Store = MySqlStore;
    type Tx = MySqlTx;

    async fn store(&self, idle: Option<TxIdleTimeout>) -> MySqlStore {
        let builder = MySqlStore::builder()
            .max_connections(2)
            .lock_wait(Duration::from_secs(1));
        let builder = match idle {
            None => builder,
            Some(TxIdleTimeout::After(d)) => builder.tx_idle_timeout(d),
            Some(_) => builder.no_tx_idle_timeout(),
        };
        builder
            .connect(&self.url)
            .await
            .unwrap()
            .with_table(&self.records)
            .unwrap()
    }

    async fn write_effect(tx: &mut MySqlTx, table: &str, key: &str, who: &str) {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (k, who) VALUES (?, ?)"
        )))
        .bind(key)
        .bind(who)
        .execute(&mut **tx)
        .await
        .unwrap();
    }

    async fn effects(&self, key: &str) -> Vec<String> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT who FROM {} WHERE k = ? ORDER BY id",
            self.table
        )))
        .bind(key)
        .fetch_all(self.admin.pool())
        .await
        .unwrap()
    }

    fn table(&self) -> &str {
        &self.table
    }

    async fn commit(tx: MySqlTx) -> Result<(), IdemError> {
        tx.commit().await
    }

    async fn rollback(tx: MySqlTx) -> Result<(), IdemError> {
        tx.rollback().await
    }
}

/// How the test sets the bound the holder's call runs under.
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// The call's own: `tx_idle_timeout(BOUND)`.
    Call,
    /// The default: the call's lease, `BOUND`.
    Lease,
    /// The store's: `tx_idle_timeout(BOUND)` on its builder, the call's lease the default 30 s.
    Store,
    /// Off: `no_tx_idle_timeout()`, the call's lease `BOUND`.
    Off,
}

impl Bound {
    fn store_setting(self) -> Option<TxIdleTimeout> {
        match self {
            Bound::Store => Some(TxIdleTimeout::After(BOUND)),
            _ => None,
        }
    }

    fn call(self, key: &str) -> Call {
        let call = Call::new("IDLE", key);
        match self {
            Bound::Call => call.tx_idle_timeout(BOUND),
            Bound::Lease => call.lease(BOUND),
            Bound::Store => call,
            Bound::Off => call.lease(BOUND).no_tx_idle_timeout(),
        }
    }
}

/// Holds a claim of `key` in a transaction that then sends nothing: the vanished client. Its body
/// ran and wrote its effect; nothing is committed.
async fn vanished_holder<B: Backend>(
    backend: &B,
    store: &B::Store,
    bound: Bound,
    key: &str,
    runs: &Arc<AtomicU32>,
) -> B::Tx {
    let mut tx = store.begin_tx().await.unwrap();
    let table = backend.table().to_owned();
    let runs = runs.clone();
    let out: Result<u32, IdemError> = bound
        .call(key)
        .run_in_tx(&mut tx, async |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            B::write_effect(tx, &table, key, "holder").await;
            Ok(1)
        })
        .await;
    assert_eq!(out.unwrap(), 1, "the holder's body ran");
    tx
}

/// One repeat of `key` from a live client: `Ok(Some(value))` when it ran (or replayed) and
/// committed, `Ok(None)` when the key is still held (`InProgress`).
async fn repeat<B: Backend>(
    backend: &B,
    store: &B::Store,
    bound: Bound,
    key: &str,
    runs: &Arc<AtomicU32>,
) -> Option<u32> {
    let mut tx = store.begin_tx().await.unwrap();
    let table = backend.table().to_owned();
    let runs = runs.clone();
    let out: Result<u32, IdemError> = bound
        .call(key)
        .run_in_tx(&mut tx, async |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            B::write_effect(tx, &table, key, "repeat").await;
            Ok(2)
        })
        .await;
    match out {
        Ok(value) => {
            B::commit(tx).await.unwrap();
            Some(value)
        }
        Err(IdemError::InProgress { .. }) => {
            B::rollback(tx).await.unwrap();
            None
        }
        Err(e) => panic!("a repeat failed: {e}"),
    }
}

/// A holder vanishes with a bound of `BOUND` in force: a repeat takes the key after the bound
/// (not before), runs the body and commits; the holder's write never lands, its late commit fails,
/// and the stores' pools serve fresh calls afterwards.
async fn freed_after_the_bound<B: Backend>(backend: B, bound: Bound) {
    let holder_store = backend.store(bound.store_setting()).await;
    let store = backend.store(bound.store_setting()).await;
    let key = server::unique("k");
    let runs = Arc::new(AtomicU32::new(0));
    let mut holder = Some(vanished_holder(&backend, &holder_store, bound, &key, &runs).await);
    let held_since = Instant::now();
    let taken = loop {
        if let Some(value) = repeat(&backend, &store, bound, &key, &runs).await {
            break (value, held_since.elapsed());
        }
        assert!(
            held_since.elapsed() < GIVE_UP,
            "{bound:?}: the key stayed held {GIVE_UP:?} after its holder went silent, with a \
             bound of {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (value, after) = taken;
    eprintln!("{bound:?}: the key was taken {after:?} after its holder went silent");
    assert_eq!(value, 2, "{bound:?}: the repeat ran the body");
    assert!(
        after >= BOUND - Duration::from_millis(250),
        "{bound:?}: the key was taken after {after:?}, before the bound of {BOUND:?}"
    );
    // The holder's transaction is gone: its write never landed, and its late commit says so.
    assert_eq!(backend.effects(&key).await, ["repeat"], "{bound:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "{bound:?}: the holder's run and the repeat's"
    );
    let late = B::commit(holder.take().unwrap()).await;
    let err = late.expect_err("the vanished holder's transaction was ended by the server");
    assert!(err.is_retryable(), "{bound:?}: {err}");
    assert_eq!(backend.effects(&key).await, ["repeat"], "{bound:?}");
    // The closed connection is not handed to anyone: fresh calls on the holder's pool (two
    // connections) and the repeat's all succeed, and a repeat of the key replays.
    for i in 0..6 {
        let fresh = format!("{key}-after-{i}");
        let value = repeat(&backend, &holder_store, bound, &fresh, &runs).await;
        assert_eq!(value, Some(2), "{bound:?}: fresh call {i} after the kill");
        let lease_mode: Result<u32, IdemError> = Call::new("IDLE-LEASE", &fresh)
            .run(&holder_store, async { Ok(3) })
            .await;
        assert_eq!(lease_mode.unwrap(), 3);
    }
    assert_eq!(repeat(&backend, &store, bound, &key, &runs).await, Some(2));
    assert_eq!(
        backend.effects(&key).await,
        ["repeat"],
        "{bound:?}: one effect in all"
    );
}

/// With the bound off, the silent holder keeps the key well past the lease: every repeat in that
/// time answers in progress; once the holder speaks again it commits, and the repeat replays.
async fn held_while_off<B: Backend>(backend: B) {
    let bound = Bound::Off;
    let holder_store = backend.store(None).await;
    let store = backend.store(None).await;
    let key = server::unique("k");
    let runs = Arc::new(AtomicU32::new(0));
    let holder = vanished_holder(&backend, &holder_store, bound, &key, &runs).await;
    let held_since = Instant::now();
    while held_since.elapsed() < BOUND * 2 + Duration::from_secs(1) {
        assert_eq!(
            repeat(&backend, &store, bound, &key, &runs).await,
            None,
            "the key was taken after {:?} with the bound off",
            held_since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    B::commit(holder)
        .await
        .expect("the holder's session lived on");
    assert_eq!(repeat(&backend, &store, bound, &key, &runs).await, Some(1));
    assert_eq!(backend.effects(&key).await, ["holder"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Durations out of range are refused where they are given, and a refused call writes nothing.
async fn bad_values_refused<B: Backend>(backend: B) {
    let store = backend.store(None).await;
    for bad in [
        Duration::ZERO,
        Duration::from_micros(999),
        MAX_TX_IDLE_TIMEOUT + Duration::from_millis(1),
    ] {
        let key = server::unique("k");
        let mut tx = store.begin_tx().await.unwrap();
        let out: Result<u32, IdemError> = Call::new("IDLE", &key)
            .tx_idle_timeout(bad)
            .run_in_tx(&mut tx, async |_| Ok(1))
            .await;
        B::commit(tx).await.unwrap();
        match out {
            Err(IdemError::InvalidOptions { reason }) => {
                assert!(
                    reason.contains("transaction idle timeout"),
                    "{bad:?}: {reason}"
                )
            }
            other => panic!("{bad:?} was not refused: {other:?}"),
        }
        assert!(
            store.load("IDLE", &key).await.unwrap().is_none(),
            "{bad:?}: nothing written"
        );
    }
    // The longest is taken.
    let key = server::unique("k");
    let mut tx = store.begin_tx().await.unwrap();
    let out: Result<u32, IdemError> = Call::new("IDLE", &key)
        .tx_idle_timeout(MAX_TX_IDLE_TIMEOUT)
        .run_in_tx(&mut tx, async |_| Ok(1))
        .await;
    B::commit(tx).await.unwrap();
    assert_eq!(out.unwrap(), 1);
}

#[tokio::test]
async fn pg_call_bound_frees_a_vanished_holders_key() {
    let Some(pg) = Pg::new().await else { return };
    freed_after_the_bound(pg, Bound::Call).await;
}

#[tokio::test]
async fn pg_lease_is_the_default_bound() {
    let Some(pg) = Pg::new().await else { return };
    freed_after_the_bound(pg, Bound::Lease).await;
}

#[tokio::test]
async fn pg_store_bound_frees_a_vanished_holders_key() {
    let Some(pg) = Pg::new().await else { return };
    freed_after_the_bound(pg, Bound::Store).await;
}

#[tokio::test]
async fn pg_bound_off_keeps_the_key_held() {
    let Some(pg) = Pg::new().await else { return };
    held_while_off(pg).await;
}

#[tokio::test]
async fn pg_bad_bounds_are_refused() {
    let Some(pg) = Pg::new().await else { return };
    bad_values_refused(pg).await;
}

#[tokio::test]
async fn mariadb_call_bound_frees_a_vanished_holders_key() {
    let Some(db) = Maria::new().await else { return };
    freed_after_the_bound(db, Bound::Call).await;
}

#[tokio::test]
async fn mariadb_lease_is_the_default_bound() {
    let Some(db) = Maria::new().await else { return };
    freed_after_the_bound(db, Bound::Lease).await;
}

#[tokio::test]
async fn mariadb_store_bound_frees_a_vanished_holders_key() {
    let Some(db) = Maria::new().await else { return };
    freed_after_the_bound(db, Bound::Store).await;
}

#[tokio::test]
async fn mariadb_bound_off_keeps_the_key_held() {
    let Some(db) = Maria::new().await else { return };
    held_while_off(db).await;
}

#[tokio::test]
async fn mariadb_bad_bounds_are_refused() {
    let Some(db) = Maria::new().await else { return };
    bad_values_refused(db).await;
}

/// A store's own bound is checked when it is built or set.
#[tokio::test]
async fn store_bounds_are_checked_when_built() {
    let too_long = MAX_TX_IDLE_TIMEOUT + Duration::from_secs(1);
    let lazy = idem::sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://postgres@127.0.0.1:1/none")
        .unwrap();
    for bad in [Duration::ZERO, too_long] {
        let built = PgStore::builder().tx_idle_timeout(bad).build(lazy.clone());
        assert!(
            matches!(built, Err(IdemError::InvalidOptions { .. })),
            "{bad:?}"
        );
        let set = PgStore::builder()
            .build(lazy.clone())
            .unwrap()
            .with_tx_idle_timeout(TxIdleTimeout::After(bad));
        assert!(
            matches!(set, Err(IdemError::InvalidOptions { .. })),
            "{bad:?}"
        );
        let connected = MySqlStore::builder()
            .tx_idle_timeout(bad)
            .connect("mysql://root@127.0.0.1:1/none")
            .await;
        assert!(
            matches!(connected, Err(IdemError::InvalidOptions { .. })),
            "{bad:?}"
        );
        let mysql_lazy = idem::sqlx::mysql::MySqlPoolOptions::new()
            .connect_lazy("mysql://root@127.0.0.1:1/none")
            .unwrap();
        let set = MySqlStore::from_pool(mysql_lazy).with_tx_idle_timeout(TxIdleTimeout::After(bad));
        assert!(
            matches!(set, Err(IdemError::InvalidOptions { .. })),
            "{bad:?}"
        );
    }
    let fine = PgStore::builder()
        .tx_idle_timeout(Duration::from_millis(1))
        .build(lazy)
        .unwrap();
    assert_eq!(
        fine.tx_idle_timeout(),
        TxIdleTimeout::After(Duration::from_millis(1))
    );
    assert_eq!(
        fine.with_tx_idle_timeout(TxIdleTimeout::Off)
            .unwrap()
            .tx_idle_timeout(),
        TxIdleTimeout::Off
    );
}

/// The attribute's `tx_idle` puts the bound in force (the call's lease is the default 30 s here).
#[idem::idempotent(biz = "IDLE", key = "key", tx = "tx", tx_idle = "2s")]
async fn pg_holder(tx: &mut PgTx, table: &str, key: &str) -> Result<u32, IdemError> {
    Pg::write_effect(tx, table, key, "holder").await;
    Ok(1)
}

#[idem::idempotent(biz = "IDLE", key = "key", tx = "tx", tx_idle = "2s")]
async fn maria_holder(tx: &mut MySqlTx, table: &str, key: &str) -> Result<u32, IdemError> {
    Maria::write_effect(tx, table, key, "holder").await;
    Ok(1)
}

/// A repeat keeps trying until it runs; how long the key stayed held.
async fn taken_after<B: Backend>(backend: &B, key: &str) -> Duration {
    let store = backend.store(None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let held_since = Instant::now();
    loop {
        if let Some(value) = repeat(backend, &store, Bound::Call, key, &runs).await {
            assert_eq!(value, 2, "the repeat ran the body");
            return held_since.elapsed();
        }
        assert!(
            held_since.elapsed() < GIVE_UP,
            "the key stayed held {GIVE_UP:?} after its holder went silent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn pg_attribute_bound_frees_a_vanished_holders_key() {
    let Some(pg) = Pg::new().await else { return };
    let store = pg.store(None).await;
    let key = server::unique("k");
    let mut holder = store.begin().await.unwrap();
    assert_eq!(pg_holder(&mut holder, pg.table(), &key).await.unwrap(), 1);
    let after = taken_after(&pg, &key).await;
    assert!(
        after >= BOUND - Duration::from_millis(250),
        "taken after {after:?}"
    );
    assert!(
        holder.commit().await.is_err(),
        "the server ended the holder's transaction"
    );
    assert_eq!(pg.effects(&key).await, ["repeat"]);
}

#[tokio::test]
async fn mariadb_attribute_bound_frees_a_vanished_holders_key() {
    let Some(db) = Maria::new().await else { return };
    let store = db.store(None).await;
    let key = server::unique("k");
    let mut holder = store.begin().await.unwrap();
    assert_eq!(
        maria_holder(&mut holder, db.table(), &key).await.unwrap(),
        1
    );
    let after = taken_after(&db, &key).await;
    assert!(
        after >= BOUND - Duration::from_millis(250),
        "taken after {after:?}"
    );
    assert!(
        holder.commit().await.is_err(),
        "the server ended the holder's transaction"
    );
    assert_eq!(db.effects(&key).await, ["repeat"]);
}
