//! `idem::outbox` on SQLite, the local MariaDB (`IDEM_MYSQL_URL`) and Postgres (`IDEM_PG_URL`):
//! enqueue commits and rolls back with the business transaction; the relay publishes in id order
//! per key, retries a failing key without holding back the others, and two relays racing over one
//! table publish every row exactly once (counted by a tap publisher: a publisher that records what
//! it is handed, in place of a broker; `outbox_brokers.rs` does the same on real brokers).

#[path = "contract/server.rs"]
mod server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem::outbox::{Outbox, OutboxMessage, OutboxPool, Publisher, Relay};
use idem::{IdemError, SqliteStore, error::BoxError};

/// One publish as the tap saw it: `(message id, destination, key, payload)`.
type Published = (String, String, String, Vec<u8>);

/// Records every publish: `(message id, destination, key, payload)` in publish order; fails a
/// key's next publishes when told to.
#[derive(Default)]
struct Tap {
    log: Mutex<Vec<Published>>,
    fail: Mutex<HashMap<String, u32>>,
}

impl Tap {
    fn fail(&self, key: &str, times: u32) {
        self.fail.lock().unwrap().insert(key.to_owned(), times);
    }

    fn log(&self) -> Vec<Published> {
        self.log.lock().unwrap().clone()
    }
}

#[async_trait]
impl Publisher for Tap {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        // Yield, so racing relays interleave.
        tokio::task::yield_now().await;
        if let Some(left) = self.fail.lock().unwrap().get_mut(&message.key)
            && *left > 0
        {
            *left -= 1;
            return Err(format!("broker down for {}", message.key).into());
        }
        self.log.lock().unwrap().push((
            message.message_id().to_owned(),
            message.destination.clone(),
            message.key.clone(),
            message.payload.clone(),
        ));
        Ok(())
    }
}

/// A database with idem's transactions: SQLite (a temp file), MariaDB or Postgres.
#[allow(clippy::large_enum_variant)]
enum Db {
    Sqlite(SqliteStore, #[allow(dead_code)] tempfile::TempDir),
    #[cfg(feature = "mysql")]
    MySql(idem::MySqlStore),
    #[cfg(feature = "postgres")]
    Pg(idem::PgStore),
}

impl Db {
    async fn sqlite() -> Option<Db> {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("outbox.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        Some(Db::Sqlite(store, dir))
    }

    #[cfg(feature = "mysql")]
    async fn mysql() -> Option<Db> {
        let url = server::mysql_url();
        let store = server::reach("MariaDB", &url, idem::MySqlStore::connect(&url)).await?;
        Some(Db::MySql(store))
    }

    #[cfg(feature = "postgres")]
    async fn postgres() -> Option<Db> {
        let url = server::pg_url();
        let store = server::reach("Postgres", &url, idem::PgStore::connect(&url)).await?;
        Some(Db::Pg(store))
    }

    fn pool(&self) -> OutboxPool {
        match self {
            Db::Sqlite(store, _) => store.pool().into(),
            #[cfg(feature = "mysql")]
            Db::MySql(store) => store.pool().into(),
            #[cfg(feature = "postgres")]
            Db::Pg(store) => store.pool().into(),
        }
    }

    /// Enqueues `rows` in one transaction of idem's, then commits it or rolls it back.
    async fn enqueue(&self, outbox: &Outbox, rows: &[(String, String, Vec<u8>)], commit: bool) {
        macro_rules! run {
            ($store:expr) => {{
                let mut tx = $store.begin().await.unwrap();
                for (destination, key, payload) in rows {
                    outbox
                        .enqueue(&mut tx, destination, key, payload)
                        .await
                        .unwrap();
                }
                if commit {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
            }};
        }
        match self {
            Db::Sqlite(store, _) => run!(store),
            #[cfg(feature = "mysql")]
            Db::MySql(store) => run!(store),
            #[cfg(feature = "postgres")]
            Db::Pg(store) => run!(store),
        }
    }

    async fn drop_table(&self, outbox: &Outbox) {
        let sql = format!("DROP TABLE IF EXISTS {}", outbox.table());
        let sql = idem::sqlx::AssertSqlSafe(sql);
        match self {
            Db::Sqlite(store, _) => {
                idem::sqlx::query(sql).execute(store.pool()).await.unwrap();
            }
            #[cfg(feature = "mysql")]
            Db::MySql(store) => {
                idem::sqlx::query(sql).execute(store.pool()).await.unwrap();
            }
            #[cfg(feature = "postgres")]
            Db::Pg(store) => {
                idem::sqlx::query(sql).execute(store.pool()).await.unwrap();
            }
        }
    }
}

/// Runs `scenario` on a fresh outbox table of every database this build and machine have.
async fn on_every_db<F, Fut>(scenario: F)
where
    F: Fn(Arc<Db>, Outbox) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut dbs = vec![Db::sqlite().await];
    #[cfg(feature = "mysql")]
    dbs.push(Db::mysql().await);
    #[cfg(feature = "postgres")]
    dbs.push(Db::postgres().await);
    for db in dbs.into_iter().flatten() {
        let db = Arc::new(db);
        let outbox = Outbox::with_table(&server::unique("idemt_outbox")).unwrap();
        outbox.migrate(db.pool()).await.unwrap();
        scenario(db.clone(), outbox.clone()).await;
        db.drop_table(&outbox).await;
    }
}

fn relay(db: &Db, outbox: &Outbox, tap: Arc<Tap>) -> Relay {
    Relay::builder(db.pool(), tap)
        .outbox(outbox)
        .batch(50)
        .retry_delay(Duration::from_millis(20))
        .max_retry_delay(Duration::from_millis(40))
        .build()
        .unwrap()
}

fn row(destination: &str, key: &str, n: u32) -> (String, String, Vec<u8>) {
    (
        destination.to_owned(),
        key.to_owned(),
        format!("{key}#{n}").into_bytes(),
    )
}

/// Runs passes until nothing is pending (bounded: 200 passes).
async fn drain(relay: &Relay) {
    for _ in 0..200 {
        if relay.pending().await.unwrap() == 0 {
            return;
        }
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "{} rows still pending after 200 passes",
        relay.pending().await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_published_only_if_its_transaction_commits() {
    on_every_db(|db, outbox| async move {
        let tap = Arc::new(Tap::default());
        let relay = relay(&db, &outbox, tap.clone());
        db.enqueue(&outbox, &[row("orders", "ORD-1", 1)], false)
            .await;
        assert_eq!(
            relay.pending().await.unwrap(),
            0,
            "a rollback enqueues nothing"
        );
        db.enqueue(&outbox, &[row("orders", "ORD-2", 1)], true)
            .await;
        assert_eq!(relay.pending().await.unwrap(), 1);
        let pass = relay.run_once().await.unwrap();
        assert_eq!((pass.sent, pass.failed), (1, 0));
        let log = tap.log();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].1, "orders");
        assert_eq!(log[0].2, "ORD-2");
        assert_eq!(log[0].3, b"ORD-2#1");
        assert!(
            log[0].0.starts_with(&format!("{}:", outbox.table())),
            "{}",
            log[0].0
        );
        assert_eq!(relay.pending().await.unwrap(), 0);
        // Nothing is published twice by later passes.
        relay.run_once().await.unwrap();
        assert_eq!(tap.log().len(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_key_is_retried_in_order_and_holds_back_only_its_own_messages() {
    on_every_db(|db, outbox| async move {
        let tap = Arc::new(Tap::default());
        let relay = relay(&db, &outbox, tap.clone());
        let rows: Vec<_> = (1..=3)
            .flat_map(|n| [row("orders", "A", n), row("orders", "B", n)])
            .collect();
        db.enqueue(&outbox, &rows, true).await;
        tap.fail("A", 2);
        let first = relay.run_once().await.unwrap();
        assert_eq!((first.sent, first.failed), (1, 1), "B#1 sent, A#1 failed");
        drain(&relay).await;
        let order = |key: &str| -> Vec<Vec<u8>> {
            tap.log()
                .into_iter()
                .filter(|(_, _, k, _)| k == key)
                .map(|(_, _, _, payload)| payload)
                .collect()
        };
        assert_eq!(
            order("A"),
            [b"A#1".to_vec(), b"A#2".to_vec(), b"A#3".to_vec()]
        );
        assert_eq!(
            order("B"),
            [b"B#1".to_vec(), b"B#2".to_vec(), b"B#3".to_vec()]
        );
        let log = tap.log();
        let b_done = log.iter().position(|(_, _, _, p)| p == b"B#3").unwrap();
        let a_first = log.iter().position(|(_, _, _, p)| p == b"A#1").unwrap();
        assert!(b_done < a_first, "B drained while A backed off: {log:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_racing_over_one_table_publish_every_row_once_in_order_per_key() {
    on_every_db(|db, outbox| async move {
        let rows: Vec<_> = (1..=12)
            .flat_map(|n| (0..25).map(move |k| row("orders", &format!("K{k}"), n)))
            .collect();
        db.enqueue(&outbox, &rows, true).await;
        let tap = Arc::new(Tap::default());
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let relays: Vec<_> = (0..2)
            .map(|_| {
                let relay = relay(&db, &outbox, tap.clone());
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut skipped = 0;
                    for _ in 0..400 {
                        if relay.pending().await.unwrap() == 0 {
                            break;
                        }
                        skipped += relay.run_once().await.unwrap().skipped;
                    }
                    skipped
                })
            })
            .collect();
        for relay in relays {
            relay.await.unwrap();
        }
        let log = tap.log();
        let mut ids: Vec<_> = log.iter().map(|(id, ..)| id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), rows.len(), "every row published");
        assert_eq!(log.len(), rows.len(), "no row published twice");
        for k in 0..25 {
            let key = format!("K{k}");
            let seen: Vec<_> = log
                .iter()
                .filter(|(_, _, k, _)| *k == key)
                .map(|(_, _, _, p)| String::from_utf8(p.clone()).unwrap())
                .collect();
            let expected: Vec<_> = (1..=12).map(|n| format!("{key}#{n}")).collect();
            assert_eq!(seen, expected, "{key} in enqueue order");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_rows_are_swept_after_their_retention_and_pending_ones_never() {
    on_every_db(|db, outbox| async move {
        let tap = Arc::new(Tap::default());
        let relay = Relay::builder(db.pool(), tap.clone())
            .outbox(&outbox)
            .retention(Duration::ZERO)
            .retry_delay(Duration::from_secs(60))
            .build()
            .unwrap();
        db.enqueue(
            &outbox,
            &[row("orders", "S", 1), row("orders", "F", 1)],
            true,
        )
        .await;
        tap.fail("F", 1);
        // The pass sweeps at its end (the first pass of a relay always does): the sent row, not
        // the failed one.
        let pass = relay.run_once().await.unwrap();
        assert_eq!((pass.sent, pass.failed, pass.swept), (1, 1, 1));
        assert_eq!(relay.pending().await.unwrap(), 1);
        assert_eq!(
            relay.sweep_once().await.unwrap(),
            0,
            "a pending row is never swept"
        );
        // A relay with a retention keeps what it sent.
        db.enqueue(&outbox, &[row("orders", "T", 1)], true).await;
        let keeping = Relay::builder(db.pool(), tap.clone())
            .outbox(&outbox)
            .retention(Duration::from_secs(3_600))
            .build()
            .unwrap();
        let pass = keeping.run_once().await.unwrap();
        assert_eq!((pass.sent, pass.swept), (1, 0));
    })
    .await;
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_written() {
    let db = Db::sqlite().await.unwrap();
    let outbox = Outbox::new();
    outbox.migrate(db.pool()).await.unwrap();
    let Db::Sqlite(store, _) = &db else {
        unreachable!()
    };
    let mut tx = store.begin().await.unwrap();
    let long = "x".repeat(idem::outbox::MAX_NAME_LEN + 1);
    for (destination, key) in [
        ("", "K"),
        ("orders", ""),
        (long.as_str(), "K"),
        ("orders", long.as_str()),
    ] {
        let refused = outbox.enqueue(&mut tx, destination, key, b"{}").await;
        assert!(
            matches!(refused, Err(IdemError::InvalidOptions { .. })),
            "{refused:?}"
        );
    }
    let big = vec![0u8; idem::outbox::MAX_PAYLOAD_LEN + 1];
    assert!(matches!(
        outbox.enqueue(&mut tx, "orders", "K", &big).await,
        Err(IdemError::InvalidOptions { .. })
    ));
    tx.commit().await.unwrap();
    let tap = Arc::new(Tap::default());
    let relay = Relay::builder(db.pool(), tap.clone()).build().unwrap();
    assert_eq!(relay.pending().await.unwrap(), 0, "nothing half-written");
    assert!(Outbox::with_table("no spaces").is_err());
    let refused = |b: idem::outbox::RelayBuilder| match b.build() {
        Err(IdemError::InvalidOptions { reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(
        refused(Relay::builder(db.pool(), tap.clone()).batch(0)).contains("batch is 1 to 10000")
    );
    assert!(
        refused(Relay::builder(db.pool(), tap.clone()).lease(Duration::ZERO)).contains("lease")
    );
    assert!(
        refused(
            Relay::builder(db.pool(), tap.clone())
                .retry_delay(Duration::from_secs(9))
                .max_retry_delay(Duration::from_secs(1))
        )
        .contains("shorter than retry_delay")
    );
    assert!(
        refused(Relay::builder(db.pool(), tap).retention(idem::MAX_DURATION * 2))
            .contains("retention")
    );
}
