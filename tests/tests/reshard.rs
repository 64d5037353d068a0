//! Growing a sharded store from 2 shards to 3 and shrinking it back while it serves
//! (docs/DESIGN.md, "Resharding"): 3,000 finished keys, 300 in progress under live holders whose
//! bodies end during the move, and callers on two processes at once, one given the old list of
//! shards and one the union. Every execution is counted in an independent effects table: no key
//! runs twice, no second body starts beside a live holder, and every repeat gets the first answer.
//! On Postgres tables and on Redis prefixes (the same on SQLite files: the runtime's
//! `backend/sharded/tests.rs`).

mod contract;
#[path = "support/postgres.rs"]
mod postgres;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use contract::{Effects, server};
use idem::sharding::{Phase, Reshard};
use idem::{Call, IdemError, ShardedStore, Store};
use idem_suite::doc_table::{SharedRows, Table, rate};

const BIZ: &str = "RESHARD";
const FINISHED: usize = 3_000;
const HELD: usize = 300;
/// Keys first called while the shards move.
const NEW: usize = 300;

fn key(i: usize) -> String {
    format!("order-{i}")
}

/// What the callers saw.
#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    in_progress: AtomicU64,
    refused: AtomicU64,
}

/// One call of `key` on `store`: its body counts the execution and answers the key's receipt.
async fn call<S: Store>(
    store: &S,
    fx: &Effects,
    key: &str,
    body: Duration,
) -> Result<String, IdemError> {
    Call::new(BIZ, key)
        .lease(Duration::from_secs(60))
        .ttl(Duration::from_secs(3600))
        .run(store, async {
            fx.record(BIZ, key).await;
            tokio::time::sleep(body).await;
            Ok::<_, IdemError>(format!("receipt of {key}"))
        })
        .await
}

/// Calls random keys on `store` until `stop`, checking each answer.
async fn caller<S: Store>(
    store: S,
    fx: Effects,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    seed: u64,
    keys: usize,
) {
    let mut x = seed | 1;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = key((x % keys as u64) as usize);
        match call(&store, &fx, &k, Duration::ZERO).await {
            Ok(receipt) => {
                assert_eq!(receipt, format!("receipt of {k}"));
                tally.answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(IdemError::InProgress { .. }) => {
                tally.in_progress.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e @ IdemError::StoreUnavailable { .. }) => {
                assert!(
                    e.to_string().contains("not given") || e.to_string().contains("moving"),
                    "{k}: {e}"
                );
                tally.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{k}: {e:?}"),
        }
    }
}

/// Moves `BIZ`'s keys from `from` to `to` under load. `old` serves with the shards of `from`
/// only, `union` with every shard; both call keys all along.
async fn move_under_load<S: Store + Clone>(
    what: &str,
    fx: &Effects,
    old: ShardedStore<S>,
    union: ShardedStore<S>,
    from: &ShardedStore<S>,
    to: &ShardedStore<S>,
    finished: usize,
) {
    let start = Instant::now();
    // Live holders: bodies of 1 to 25 s, started before the move, on the old list's process; the
    // copy begins about 15 s in, so some are still running then and the tool waits for them.
    let held: Vec<_> = (0..HELD)
        .map(|i| {
            let (store, fx) = (old.clone(), fx.clone());
            let k = key(finished + i);
            let body = Duration::from_millis(1_000 + (i as u64 * 7_919) % 24_000);
            tokio::spawn(async move { call(&store, &fx, &k, body).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Announced: the union's process routes over the old list from now on.
    Reshard::new(from, to)
        .plan_only()
        .run(|_| {})
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let keys = finished + HELD + NEW;
    let mut callers = Vec::new();
    for (n, store) in [old.clone(), old, union.clone(), union.clone()]
        .into_iter()
        .enumerate()
    {
        let (fx, tally, stop) = (fx.clone(), tally.clone(), stop.clone());
        callers.push(tokio::spawn(caller(
            store,
            fx,
            tally,
            stop,
            7 + n as u64 * 1_000_003,
            keys,
        )));
    }
    let mut waited = 0;
    let done = Reshard::new(from, to)
        .batch(97)
        .unwrap()
        .run(|p| waited = waited.max(p.waiting))
        .await
        .unwrap();
    assert_eq!(done.phase, Some(Phase::Done));
    // A while on the new layout before the callers stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    for h in held {
        let answer = h.await.unwrap().unwrap();
        assert!(answer.starts_with("receipt of"));
    }
    // Every key ran exactly once, and the new list alone replays each.
    let mut ran: HashMap<i64, usize> = HashMap::new();
    for i in 0..finished + HELD {
        let k = key(i);
        let runs = fx.count(BIZ, &k).await;
        *ran.entry(runs).or_default() += 1;
        assert_eq!(runs, 1, "{what}: {k} ran {runs} times");
        let again = call(&union, fx, &k, Duration::ZERO).await.unwrap();
        assert_eq!(again, format!("receipt of {k}"));
    }
    for i in finished + HELD..keys {
        let runs = fx.count(BIZ, &key(i)).await;
        assert!(runs <= 1, "{what}: {} ran {runs} times", key(i));
    }
    assert_eq!(fx.count(BIZ, &key(0)).await, 1);
    println!(
        "{what}: {} answered calls, {} in progress, {} refused by the old list's process, copied {} \
         of {} moving records, waited for {waited} holders, {:?}; every key ran once",
        tally.answered.load(Ordering::Relaxed),
        tally.in_progress.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        done.copied,
        done.walked,
        start.elapsed()
    );
    let (shards, move_) = what.split_once(", ").unwrap_or((what, ""));
    let order = format!("{} {}", shards != "Postgres", move_ != "2 → 3");
    let twice: usize = ran
        .iter()
        .filter(|(runs, _)| **runs >= 2)
        .map(|(_, n)| n)
        .sum();
    Table::new(
        "reshard",
        &[
            "shards",
            "move",
            "calls answered",
            "answered \"in progress\"",
            "refused by the old list's process",
            "moving records copied / walked",
            "holders waited for",
            "move took",
            "keys run twice",
        ],
    )
    .emit_shared(
        &FIGURES,
        &order,
        [
            shards.to_owned(),
            move_.to_owned(),
            rate(tally.answered.load(Ordering::Relaxed) as f64),
            rate(tally.in_progress.load(Ordering::Relaxed) as f64),
            rate(tally.refused.load(Ordering::Relaxed) as f64),
            format!(
                "{} / {}",
                rate(done.copied as f64),
                rate(done.walked as f64)
            ),
            waited.to_string(),
            format!("{:.1} s", start.elapsed().as_secs_f64()),
            twice.to_string(),
        ],
    );
}

/// Every move's row, for docs/RELIABILITY.md (`tests/reliability.sh`).
static FIGURES: SharedRows = SharedRows::new();

/// The whole scenario over three shards `a`, `b`, `c` (each given twice: one connection per
/// process): 2 → 3, then 3 → 2.
async fn grow_and_shrink<S: Store + Clone>(what: &str, one: Vec<S>, two: Vec<S>) {
    let fx = Effects::new().await;
    let (a, b, c) = (one[0].clone(), one[1].clone(), one[2].clone());
    let (a2, b2, c2) = (two[0].clone(), two[1].clone(), two[2].clone());
    let two_shards = ShardedStore::new([a.clone(), b.clone()]).unwrap();
    // 3,000 keys finished on the old list.
    for i in 0..FINISHED {
        call(&two_shards, &fx, &key(i), Duration::ZERO)
            .await
            .unwrap();
    }
    let three_shards = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    let union = ShardedStore::new([a2.clone(), b2.clone(), c2.clone()]).unwrap();
    move_under_load(
        &format!("{what}, 2 → 3"),
        &fx,
        two_shards.clone(),
        union,
        &two_shards,
        &three_shards,
        FINISHED,
    )
    .await;
    // The keys first called during the move that no caller happened to call, finished now.
    for i in FINISHED + HELD..FINISHED + HELD + NEW {
        call(&three_shards, &fx, &key(i), Duration::ZERO)
            .await
            .unwrap();
    }
    // Back to two: every process keeps every shard until the move is done.
    let old = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    let union = ShardedStore::new([a2, b2, c2]).unwrap();
    let fx_total = fx.totals(BIZ).await;
    move_under_load(
        &format!("{what}, 3 → 2"),
        &fx,
        old,
        union,
        &three_shards,
        &two_shards,
        FINISHED + HELD + NEW,
    )
    .await;
    assert!(fx.totals(BIZ).await.1 > fx_total.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_shards_grow_and_shrink_under_load() {
    let mut one = Vec::new();
    let mut two = Vec::new();
    for _ in 0..3 {
        let Some(s) = postgres::store(8).await else {
            return;
        };
        let table = s.table().to_owned();
        let again = idem::PgStore::builder()
            .table(&table)
            .unwrap()
            .max_connections(8)
            .connect(&postgres::url())
            .await
            .unwrap();
        one.push(s);
        two.push(again);
    }
    let kept = one.clone();
    grow_and_shrink("Postgres", one, two).await;
    for s in &kept {
        postgres::drop_tables(s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_shards_grow_and_shrink_under_load() {
    let url = server::redis_url();
    let Some(store) = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await else {
        return;
    };
    let mut one = Vec::new();
    let mut two = Vec::new();
    for _ in 0..3 {
        let prefix = format!("{}:", server::unique("idemt"));
        one.push(store.clone().with_prefix(&prefix).unwrap());
        let again = idem::RedisStore::connect(&url).await.unwrap();
        two.push(again.with_prefix(&prefix).unwrap());
    }
    grow_and_shrink("Redis", one, two).await;
}
