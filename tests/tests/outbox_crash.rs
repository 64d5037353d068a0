//! Relays that die: a relay process (this test binary run again as a child) is SIGKILLed at a
//! random point while it publishes an outbox to NATS JetStream, 10 times, each time right after a
//! publish and before its row is marked sent, or mid-publish; the next relay takes over once the
//! dead one's leases end. On SQLite (a file), MariaDB and Postgres (with their features): every row
//! reaches the stream exactly once (the stream's duplicate window drops the re-sends, by
//! `Nats-Msg-Id`), in order per key, and no row is left unsent.

#[path = "contract/server.rs"]
mod server;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_trait::async_trait;
use futures_util::StreamExt;
use idem::outbox::jetstream::{JetStreamPublisher, KEY_HEADER};
use idem::outbox::{Outbox, OutboxMessage, OutboxPool, Publisher, Relay};
use idem::{SqliteStore, error::BoxError};
use serde::{Deserialize, Serialize};

const KEYS: u32 = 5;
const PER_KEY: u32 = 12;
const KILLS: usize = 10;
const LEASE: Duration = Duration::from_millis(400);

/// What the child relay needs: the database, the outbox table, the NATS URL.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    db: String,
    table: String,
    nats: String,
}

/// Counts the publishes of the relay that drains what the dead ones left.
struct Counting(JetStreamPublisher, Arc<AtomicUsize>);

#[async_trait]
impl Publisher for Counting {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        self.0.publish(message).await?;
        self.1.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Publishes, says so on stdout, then dawdles before the relay marks the row: the parent kills the
/// process in that window (or mid-publish).
struct Announcing(JetStreamPublisher);

#[async_trait]
impl Publisher for Announcing {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        self.0.publish(message).await?;
        println!("PUBLISHED {}", message.message_id());
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..30))).await;
        Ok(())
    }
}

async fn pool_of(url: &str) -> OutboxPool {
    if let Some(path) = url.strip_prefix("sqlite:") {
        let store = SqliteStore::open(path).await.unwrap();
        return store.pool().into();
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") {
        return idem::MySqlStore::connect(url).await.unwrap().pool().into();
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") {
        return idem::PgStore::connect(url).await.unwrap().pool().into();
    }
    panic!("no database for {url}");
}

fn relay_for(pool: OutboxPool, table: &str, publisher: impl Publisher + 'static) -> Relay {
    Relay::builder(pool, publisher)
        .outbox(&Outbox::with_table(table).unwrap())
        .batch(20)
        .lease(LEASE)
        .poll(Duration::from_millis(10))
        .retry_delay(Duration::from_millis(10))
        .max_retry_delay(Duration::from_millis(50))
        .build()
        .unwrap()
}

/// The child: a relay that runs until it is killed.
async fn child(spec: Spec) {
    let js = jetstream::new(async_nats::connect(&spec.nats).await.unwrap());
    let relay = relay_for(
        pool_of(&spec.db).await,
        &spec.table,
        Announcing(JetStreamPublisher::new(js)),
    );
    println!("READY");
    loop {
        if let Ok(pass) = relay.run_once().await
            && pass.sent + pass.failed == 0
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

struct Relayer(Child);

impl Relayer {
    fn start(spec: &Spec) -> (Relayer, std::sync::mpsc::Receiver<String>) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "the_child_relay",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("IDEM_OUTBOX_CHILD", serde_json::to_string(spec).unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (Relayer(child), rx)
    }

    /// SIGKILL, and reap it.
    fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

/// The child's entry: does nothing unless `IDEM_OUTBOX_CHILD` is set.
#[test]
fn the_child_relay() {
    let Ok(spec) = std::env::var("IDEM_OUTBOX_CHILD") else {
        return;
    };
    let spec: Spec = serde_json::from_str(&spec).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(child(spec));
}

async fn enqueue_all(url: &str, table: &str, subject: &str) {
    macro_rules! fill {
        ($store:expr) => {{
            let store = $store;
            let outbox = Outbox::with_table(table).unwrap();
            outbox.migrate(store.pool()).await.unwrap();
            let mut tx = store.begin().await.unwrap();
            for n in 1..=PER_KEY {
                for k in 0..KEYS {
                    let payload = format!("K{k}#{n}");
                    outbox
                        .enqueue(&mut tx, subject, &format!("K{k}"), payload.as_bytes())
                        .await
                        .unwrap();
                }
            }
            tx.commit().await.unwrap();
        }};
    }
    if let Some(path) = url.strip_prefix("sqlite:") {
        let store = SqliteStore::open(path).await.unwrap();
        store.migrate().await.unwrap();
        fill!(store);
        return;
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") {
        fill!(idem::MySqlStore::connect(url).await.unwrap());
        return;
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") {
        fill!(idem::PgStore::connect(url).await.unwrap());
        return;
    }
    panic!("no database for {url}");
}

async fn drop_table(url: &str, table: &str) {
    let sql = idem::sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}"));
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") {
        let store = idem::MySqlStore::connect(url).await.unwrap();
        idem::sqlx::query(sql).execute(store.pool()).await.unwrap();
        return;
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") {
        let store = idem::PgStore::connect(url).await.unwrap();
        idem::sqlx::query(sql).execute(store.pool()).await.unwrap();
        return;
    }
    let _ = (url, sql);
}

/// One database: fill the outbox, kill 10 relays at random points, drain, audit the stream.
async fn relays_die(db: String, nats: &str) {
    let js = jetstream::new(async_nats::connect(nats).await.unwrap());
    let name = server::unique("idem_outbox_crash");
    let subject = format!("{name}.events");
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: jetstream::stream::StorageType::Memory,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    let table = server::unique("idemt_outbox_crash");
    enqueue_all(&db, &table, &subject).await;
    let spec = Spec {
        db: db.clone(),
        table: table.clone(),
        nats: nats.to_owned(),
    };
    let total = (KEYS * PER_KEY) as usize;
    let mut published = 0;
    for _ in 0..KILLS {
        let (relayer, lines) = Relayer::start(&spec);
        // Kill after a random number of its publishes (0: before or during its first one).
        let after = fastrand::usize(0..4);
        let mut seen = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while seen < after {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.starts_with("PUBLISHED ") => seen += 1,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if after == 0 {
            std::thread::sleep(Duration::from_millis(fastrand::u64(50..150)));
        }
        relayer.kill();
        // What it announced before it died, also after the lines read above.
        while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
            seen += usize::from(line.starts_with("PUBLISHED "));
        }
        published += seen;
    }
    // A last relay, in this process, drains what is left once the dead ones' leases end.
    let drained = Arc::new(AtomicUsize::new(0));
    let relay = relay_for(
        pool_of(&db).await,
        &table,
        Counting(JetStreamPublisher::new(js.clone()), drained.clone()),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while relay.pending().await.unwrap() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows still pending after 30 s"
        );
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The stream: every row once, in order per key.
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config::default())
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(total * 2)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(msg) = batch.next().await {
        let msg = msg.unwrap();
        let key = msg
            .headers
            .as_ref()
            .unwrap()
            .get(KEY_HEADER)
            .unwrap()
            .to_string();
        got.push((key, String::from_utf8(msg.payload.to_vec()).unwrap()));
    }
    // Publishes that reached the broker: what the dead relays announced (a publish cut off
    // between the broker's ack and its line is not counted) and what the last one sent. Above
    // the rows' count, the difference is re-sends the duplicate window dropped.
    let sent = published + drained.load(Ordering::Relaxed);
    eprintln!(
        "{db}: {KILLS} relays killed; {sent} publishes counted for {total} rows; the stream holds {}",
        got.len()
    );
    assert_eq!(got.len(), total, "every row exactly once in the stream");
    for k in 0..KEYS {
        let key = format!("K{k}");
        let seen: Vec<_> = got
            .iter()
            .filter(|(g, _)| *g == key)
            .map(|(_, p)| p.clone())
            .collect();
        let expected: Vec<_> = (1..=PER_KEY).map(|n| format!("{key}#{n}")).collect();
        assert_eq!(seen, expected, "{key} in enqueue order");
    }
    js.delete_stream(&name).await.unwrap();
    drop_table(&db, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_killed_mid_publish_leave_every_row_in_the_stream_once_and_in_order() {
    if std::env::var("IDEM_OUTBOX_CHILD").is_ok() {
        return;
    }
    let nats = server::nats_url();
    if server::reach("NATS", &nats, async_nats::connect(&nats))
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut dbs = vec![format!("sqlite:{}", dir.path().join("outbox.db").display())];
    #[cfg(feature = "mysql")]
    {
        let url = server::mysql_url();
        if server::reach("MariaDB", &url, idem::MySqlStore::connect(&url))
            .await
            .is_some()
        {
            dbs.push(url);
        }
    }
    #[cfg(feature = "postgres")]
    {
        let url = server::pg_url();
        if server::reach("Postgres", &url, idem::PgStore::connect(&url))
            .await
            .is_some()
        {
            dbs.push(url);
        }
    }
    for db in dbs {
        relays_die(db, &nats).await;
    }
}
