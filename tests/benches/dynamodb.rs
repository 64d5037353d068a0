//! The DynamoDB store against a hand-written conditional-put loop, side by side in one process,
//! on the same DynamoDB-compatible server.
//!
//! ```text
//! cargo bench -p idem-suite --bench dynamodb --features dynamodb         # on http://127.0.0.1:8000
//! IDEM_DYNAMO_URL=http://host:port cargo bench -p idem-suite --bench dynamodb --features dynamodb
//! IDEM_BENCH_ROUNDS=3 IDEM_BENCH_SCALE=0.2 cargo bench -p idem-suite --bench dynamodb --features dynamodb
//! ```
//!
//! Workload: a small serde result (`Receipt`: a string and two integers). "first" = a new key per
//! call; "replay" = the same keys again, already SUCCEEDED.
//!
//! Contenders, each with an SDK client of its own, made the same way (`DynamoStore::connect`), on
//! a table of its own:
//! - `idem`: `Call::new(..).ttl(..).run(&DynamoStore, ..)`: a first execution is a conditional
//!   PutItem (the claim) and a conditional UpdateItem (the mark); a replay one request, a refused
//!   PutItem that hands back the record while new keys prevail, a consistent GetItem once repeats
//!   do;
//! - `floor`: what a hand-written Lambda does: PutItem with `attribute_not_exists(pk)` to claim,
//!   UpdateItem (on condition that it is still the claim) to store the result, and for a replay a
//!   consistent GetItem, then `serde_json` decoding. No lease, fence or expiry logic.
//!
//! Two modes: `seq` (one task on a current-thread runtime) and `c16` (16 tasks on a multi-thread
//! runtime with 2 workers). Each round runs both contenders once per mode, the order alternating
//! from round to round; a ratio is taken within a round, then the median over rounds is reported.
//! Besides calls/s it prints the requests each contender sent per call (counted by an interceptor
//! on its client), the median over rounds.
//!
//! The server under the suite is moto, which answers one request at a time and is far slower than
//! DynamoDB: read the ratios, not the calls/s.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::aws_sdk_dynamodb::Client;
use idem::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use idem::aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use idem::aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use idem::{Call, DynamoStore, IdemError};

mod support;
use support::{BIZ, Receipt, Table, median, now_ms, r3, receipt};

const TTL: Duration = Duration::from_secs(3600);

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// Counts the HTTP requests a client sends (the SDK's retries included).
#[derive(Debug, Clone, Default)]
struct Requests(Arc<AtomicU64>);

impl Requests {
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "bench request counter"
    }

    fn read_before_transmit(
        &self,
        _: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// One way of making call `k` (`replay`: the workload is the replay, which only the floor reads).
#[derive(Clone)]
enum Contender {
    Idem(DynamoStore, Requests),
    Floor {
        client: Client,
        table: String,
        sent: Requests,
    },
}

impl Contender {
    fn requests(&self) -> u64 {
        match self {
            Contender::Idem(_, sent) | Contender::Floor { sent, .. } => sent.get(),
        }
    }

    async fn call(&self, k: u64, replay: bool) -> Receipt {
        match self {
            Contender::Idem(store, _) => {
                let r: Result<Receipt, IdemError> = Call::new(BIZ, &k)
                    .ttl(TTL)
                    .run(store, async move { Ok(receipt(k)) })
                    .await;
                r.unwrap()
            }
            Contender::Floor { client, table, .. } => floor(client, table, k, replay).await,
        }
    }
}

/// The hand-written loop: conditional put to claim, update to store the result; a consistent get
/// for a replay.
async fn floor(client: &Client, table: &str, k: u64, replay: bool) -> Receipt {
    let pk = format!("{BIZ}:{k}");
    if replay {
        let got = client
            .get_item()
            .table_name(table)
            .key("pk", s(&pk))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        let item = got.item().expect("a replay of a stored result");
        let Some(AttributeValue::S(result)) = item.get("result") else {
            panic!("a replay of a call still running");
        };
        return serde_json::from_str(result).unwrap();
    }
    let lease_until = now_ms() + idem::DEFAULT_LEASE.as_millis() as i64;
    client
        .put_item()
        .table_name(table)
        .item("pk", s(&pk))
        .item("st", s("P"))
        .item("lease", AttributeValue::N(lease_until.to_string()))
        .condition_expression("attribute_not_exists(pk)")
        .send()
        .await
        .expect("the floor's key was taken");
    let receipt = receipt(k);
    let expires = (now_ms() + TTL.as_millis() as i64) / 1000;
    client
        .update_item()
        .table_name(table)
        .key("pk", s(&pk))
        .update_expression("SET #s = :d, #r = :r, #e = :e REMOVE #l")
        .condition_expression("#s = :p")
        .expression_attribute_names("#s", "st")
        .expression_attribute_names("#r", "result")
        .expression_attribute_names("#e", "expires")
        .expression_attribute_names("#l", "lease")
        .expression_attribute_values(":d", s("D"))
        .expression_attribute_values(":p", s("P"))
        .expression_attribute_values(":r", s(serde_json::to_string(&receipt).unwrap()))
        .expression_attribute_values(":e", AttributeValue::N(expires.to_string()))
        .send()
        .await
        .expect("the floor's claim was lost");
    receipt
}

/// Creates the floor's table (partition key `pk`, on demand).
async fn floor_table(client: &Client, table: &str) {
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

/// Runs calls `keys` split over `tasks` tasks (each its keys in order), all at once; calls/s and
/// requests sent per call.
async fn timed(c: &Contender, keys: std::ops::Range<u64>, tasks: u64, replay: bool) -> (f64, f64) {
    let per = (keys.end - keys.start) / tasks;
    let sent = c.requests();
    let t = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let c = c.clone();
            let start = keys.start + i * per;
            tokio::spawn(async move {
                for k in start..start + per {
                    let r = c.call(k, replay).await;
                    assert_eq!(black_box(r).seq, k);
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let calls = (per * tasks) as f64;
    (
        calls / t.elapsed().as_secs_f64(),
        (c.requests() - sent) as f64 / calls,
    )
}

/// Calls/s and requests per call, per contender (0 idem, 1 floor) and workload (0 first,
/// 1 replay), one per round.
#[derive(Default)]
struct Figures {
    ops: [[Vec<f64>; 2]; 2],
    requests: [[Vec<f64>; 2]; 2],
}

impl Figures {
    /// The per-round ratios idem / floor for `workload`, their median.
    fn ratio(&self, workload: usize) -> f64 {
        support::ratio(&self.ops[0][workload], &self.ops[1][workload])
    }

    fn ratios(&self, workload: usize) -> Vec<f64> {
        self.ops[0][workload]
            .iter()
            .zip(&self.ops[1][workload])
            .map(|(x, y)| x / y)
            .collect()
    }
}

/// Tables of this run (`idemb_<pid>_<mode>_{i,f}`): the store's, migrated, and the floor's.
async fn contenders(endpoint: &str, mode: &str) -> (Contender, Contender) {
    let run = std::process::id();
    let url = |who: &str| format!("dynamodb://idemb_{run}_{mode}_{who}?endpoint={endpoint}");
    let counted = |sent: &Requests| {
        let sent = sent.clone();
        move |config: idem::aws_sdk_dynamodb::config::Builder| config.interceptor(sent)
    };
    let (idem_sent, floor_sent) = (Requests::default(), Requests::default());
    let store = DynamoStore::connect_with(&url("i"), counted(&idem_sent))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    // The floor's client is made as the store's is (same HTTP client, timeouts, credentials).
    let floor_store = DynamoStore::connect_with(&url("f"), counted(&floor_sent))
        .await
        .unwrap();
    let table = floor_store.table().to_owned();
    let client = floor_store.client().clone();
    floor_table(&client, &table).await;
    (
        Contender::Idem(store, idem_sent),
        Contender::Floor {
            client,
            table,
            sent: floor_sent,
        },
    )
}

/// Drops the run's tables.
async fn drop_tables(contenders: &[&Contender]) {
    for c in contenders {
        let (client, table) = match c {
            Contender::Idem(store, _) => (store.client().clone(), store.table().to_owned()),
            Contender::Floor { client, table, .. } => (client.clone(), table.clone()),
        };
        let _ = client.delete_table().table_name(table).send().await;
    }
}

/// Every round runs both contenders, in an order alternating from round to round: each makes
/// `calls` first executions on keys of its own, then replays them.
async fn measure(endpoint: &str, mode: &str, tasks: u64, calls: u64, rounds: usize) -> Figures {
    let (idem, floor) = contenders(endpoint, mode).await;
    // A warm-up, not counted: connections up, caches warm.
    let warm = (calls / 5).max(tasks);
    let base = 1_000_000_000u64;
    for c in [&idem, &floor] {
        timed(c, base..base + warm, tasks, false).await;
        timed(c, base..base + warm, tasks, true).await;
    }
    let mut figures = Figures::default();
    for round in 0..rounds {
        let keys = (round as u64 * calls)..(round as u64 + 1) * calls;
        for i in 0..2 {
            let who = (round + i) % 2;
            let c = [&idem, &floor][who];
            for (w, replay) in [false, true].into_iter().enumerate() {
                let (ops, requests) = timed(c, keys.clone(), tasks, replay).await;
                figures.ops[who][w].push(ops);
                figures.requests[who][w].push(requests);
            }
        }
        let at = |who: usize, w: usize| figures.ops[who][w].last().copied().unwrap_or(f64::NAN);
        eprintln!(
            "  {mode} round {round}: first {:.1} / {:.1}, replay {:.1} / {:.1} (idem / floor)",
            at(0, 0),
            at(1, 0),
            at(0, 1),
            at(1, 1),
        );
    }
    drop_tables(&[&idem, &floor]).await;
    figures
}

fn main() {
    let endpoint =
        std::env::var("IDEM_DYNAMO_URL").unwrap_or_else(|_| "http://127.0.0.1:8000".to_owned());
    let scale = support::scale();
    let rounds = support::rounds(5);
    // IDEM_BENCH_ONLY: a comma-separated choice of modes (seq, c16).
    let only = support::only();
    let runs = |mode: &str| only.is_empty() || only.iter().any(|t| t == mode);
    let calls = |base: u64| ((base as f64 * scale) as u64).max(16) / 16 * 16;

    let seq_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let probe = format!("dynamodb://idemb_probe?endpoint={endpoint}");
    let reached = seq_rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), DynamoStore::connect(&probe)).await
    });
    match reached {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            println!("skipped: DynamoDB at {endpoint} is unreachable ({e})");
            return;
        }
        Err(_) => {
            println!("skipped: DynamoDB at {endpoint} is unreachable (no answer within 5 s)");
            return;
        }
    }
    println!(
        "idem on DynamoDB ({endpoint}), {rounds} rounds, median of per-round ratios; scale {scale}\n"
    );

    let mut results = Vec::new();
    if runs("seq") {
        let n = calls(160);
        let f = seq_rt.block_on(measure(&endpoint, "seq", 1, n, rounds));
        results.push(("1", n, f));
    }
    drop(seq_rt);
    if runs("c16") {
        let multi_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let n = calls(320);
        let f = multi_rt.block_on(measure(&endpoint, "c16", 16, n, rounds));
        results.push(("16", n, f));
    }

    let mut table = Table::new(
        "dynamodb",
        &[
            "workload",
            "tasks",
            "idem calls/s",
            "floor calls/s",
            "idem / floor",
            "per-round ratios",
            "idem requests per call",
            "floor requests per call",
        ],
    );
    for (label, _, f) in &results {
        for (w, workload) in ["first", "replay"].iter().enumerate() {
            let r = f.ratios(w);
            let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let requests = |i: usize| format!("{:.2}", median(f.requests[i][w].clone()));
            table.row([
                workload.to_string(),
                label.to_string(),
                format!("{:.1}", median(f.ops[0][w].clone())),
                format!("{:.1}", median(f.ops[1][w].clone())),
                r3(f.ratio(w)),
                format!("{lo:.3}–{hi:.3}"),
                requests(0),
                requests(1),
            ]);
        }
    }
    table.emit();
}
