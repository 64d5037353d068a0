//! The store contract on `RedisClusterStore`, against a 3-master Redis Cluster this test starts
//! itself from the installed `redis-server` (three loopback ports, no persistence) and stops at
//! the end; 10,000 keys over every slot; and what a node restart without persistence loses.

use crate::cluster as redis_cluster;
use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use redis_cluster::Cluster;

use crate::contract::server;
use idem::{Call, IdemError, RedisClusterStore, Store, TestClock};

async fn connect(cluster: &Cluster) -> RedisClusterStore {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisClusterStore::connect(&urls).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_on_a_three_master_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let base = connect(&cluster).await;
    let make = |clock: TestClock| {
        let store = base.clone();
        async move {
            let prefix = format!("{}:", server::unique("idemc"));
            Arc::new(store.with_test_clock(clock).with_prefix(&prefix).unwrap()) as Arc<dyn Store>
        }
    };
    contract_sequence!(make);
    let clock = TestClock::new();
    contract::burst_executes_each_key_once(
        contract::Subject {
            store: make(clock.clone()).await,
            clock,
        },
        100,
        32,
    )
    .await;

    ten_thousand_keys_over_every_slot(&base).await;
    replays_are_one_read_on_their_keys_node(&cluster, &base).await;
    due_results_come_from_the_slots_indexes(&cluster, &base).await;
    waiting_for_replicas_asks_the_keys_primary(&cluster, &base).await;
    a_node_restart_without_persistence_loses_its_records(&cluster, &base).await;
}

/// How many `command`s all the nodes served, from each node's own counters.
async fn served(cluster: &Cluster, command: &str) -> u64 {
    let mut total = 0u64;
    for url in cluster.urls() {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        let line = format!("cmdstat_{command}:calls=");
        total += info
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap());
    }
    total
}

/// Once repeats prevail, a replay on a cluster is one `HGET` on its key's node, no script, as on
/// one server (no test clock moved, so the read needs no `TIME`).
async fn replays_are_one_read_on_their_keys_node(cluster: &Cluster, store: &RedisClusterStore) {
    let prefix = format!("{}:", server::unique("idemh"));
    let store = store.clone().with_prefix(&prefix).unwrap();
    let keys: Vec<String> = (0..10).map(|k| format!("h-{k}")).collect();
    for (k, key) in keys.iter().enumerate() {
        let first: Result<usize, IdemError> = Call::new("HGET", key)
            .run(&store, async move { Ok(k) })
            .await;
        assert_eq!(first.unwrap(), k);
    }
    contract::turned_to_read_first(&store).await;
    let (scripts, reads) = (
        served(cluster, "evalsha").await,
        served(cluster, "hget").await,
    );
    for (k, key) in keys.iter().enumerate() {
        let again: Result<usize, IdemError> = Call::new("HGET", key)
            .run(&store, async { Ok(usize::MAX) })
            .await;
        assert_eq!(again.unwrap(), k, "{key}: a replay");
    }
    assert_eq!(served(cluster, "evalsha").await, scripts, "no script ran");
    assert_eq!(
        served(cluster, "hget").await - reads,
        10,
        "one HGET a replay"
    );
}

/// 10,000 keys, spread over every slot and so over all three masters: each claim, mark and replay
/// reaches its key's node (the client follows the cluster's map; no CROSSSLOT, no MOVED reaches
/// the caller).
async fn ten_thousand_keys_over_every_slot(store: &RedisClusterStore) {
    let store = store.clone().with_prefix("idemk:").unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|part| {
            let store = store.clone();
            tokio::spawn(async move {
                for k in (part..10_000).step_by(8) {
                    let key = format!("order-{k}");
                    let first: Result<u32, IdemError> =
                        Call::new("SPREAD", &key).run(&store, async { Ok(k) }).await;
                    let again: Result<u32, IdemError> = Call::new("SPREAD", &key)
                        .run(&store, async { Ok(u32::MAX) })
                        .await;
                    assert_eq!((first.unwrap(), again.unwrap()), (k, k), "{key}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// A success marked with a result ttl enters the results index of its own slot
/// (`<prefix>results{<tag>}`), listed in `<prefix>results-indexes`; a sweep drops the due results
/// from those indexes. No test clock moves here, so the sweep walks no keys: only the indexes can
/// have found them.
async fn due_results_come_from_the_slots_indexes(cluster: &Cluster, store: &RedisClusterStore) {
    use idem::store::{ClaimOutcome, ClaimRequest};
    // SCANs served by all the nodes, from each node's own counters.
    let scans = async || served(cluster, "scan").await;
    let prefix = format!("{}:", server::unique("idemr"));
    let store = store.clone().with_prefix(&prefix).unwrap();
    let ttl = Duration::from_secs(3600);
    for k in 0..30 {
        let key = format!("r-{k}");
        let req = ClaimRequest {
            biz: "KEEP",
            key: &key,
            fingerprint: None,
            lease: Duration::from_secs(10),
            ttl,
        };
        let ClaimOutcome::Acquired { claim, .. } = store.claim(&req).await.unwrap() else {
            panic!("{key}: not acquired");
        };
        store
            .complete_keeping(
                "KEEP",
                &key,
                &claim,
                b"result",
                ttl,
                Duration::from_millis(50),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let before = scans().await;
    assert_eq!(store.sweep_expired(1000).await.unwrap(), 30);
    assert_eq!(store.sweep_expired(1000).await.unwrap(), 0);
    assert_eq!(scans().await, before, "a sweep walks no keys");
    for k in 0..30 {
        let key = format!("r-{k}");
        let record = store.load("KEEP", &key).await.unwrap().unwrap();
        assert_eq!(record.snapshot, None, "{key}: its result is dropped");
        let again: Result<u32, IdemError> =
            Call::new("KEEP", &key).run(&store, async { Ok(1) }).await;
        assert!(
            matches!(again, Err(IdemError::ResultExpired)),
            "{key}: a tombstone, {again:?}"
        );
    }
}

/// `with_replica_acks` sends `WAIT` to the primary of each key's slot (keys on every primary): this
/// cluster has no replicas, so every claim is refused, the body never runs, and the claim is
/// released so a store without the option takes the key at once.
async fn waiting_for_replicas_asks_the_keys_primary(cluster: &Cluster, store: &RedisClusterStore) {
    let store = store.clone().with_prefix("idemw:").unwrap();
    let waiting = store
        .clone()
        .with_replica_acks(1, Duration::from_millis(50))
        .unwrap();
    let ran = std::sync::atomic::AtomicUsize::new(0);
    // Six keys land on all three primaries (checked below by their slots).
    let keys: Vec<String> = (0..6).map(|k| format!("acked-{k}")).collect();
    let primaries: std::collections::BTreeSet<u8> = keys
        .iter()
        .map(|k| {
            let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", &format!("idemw:{{ACK:{k}}}")]);
            // `redis-cli --cluster create` gives three masters these slot ranges.
            match slot.trim().parse::<u16>().unwrap() {
                0..=5460 => 0,
                5461..=10922 => 1,
                _ => 2,
            }
        })
        .collect();
    assert_eq!(
        primaries.len(),
        3,
        "the keys cover every primary's slot range"
    );
    for key in &keys {
        let r: Result<u8, IdemError> = Call::new("ACK", key)
            .run(&waiting, async {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(1)
            })
            .await;
        assert!(
            matches!(&r, Err(IdemError::StoreUnavailable { source }) if source.to_string().contains("0 of 1 replicas")),
            "{key}: {r:?}"
        );
        let r: Result<u8, IdemError> = Call::new("ACK", key).run(&store, async { Ok(2) }).await;
        assert_eq!(r.unwrap(), 2, "{key}: the refused claim was released");
    }
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// Without persistence a restarted node comes back empty: the records of its slots are gone, and
/// a repeat of a finished call runs again (docs/RELIABILITY.md: what each Redis setup keeps).
async fn a_node_restart_without_persistence_loses_its_records(
    cluster: &Cluster,
    store: &RedisClusterStore,
) {
    let store = store.clone().with_prefix("idemr:").unwrap();
    let keys: Vec<String> = (0..60).map(|k| format!("lost-{k}")).collect();
    for key in &keys {
        let done: Result<u8, IdemError> = Call::new("LOSS", key).run(&store, async { Ok(1) }).await;
        done.unwrap();
    }
    cluster.restart(0);
    // The client follows the restarted node back; give it a moment and retry transient errors.
    let mut ran_again = 0;
    for key in &keys {
        let mut tries = 0;
        let second = loop {
            let r: Result<u8, IdemError> =
                Call::new("LOSS", key).run(&store, async { Ok(2) }).await;
            match r {
                Err(e) if e.is_retryable() && tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other.unwrap(),
            }
        };
        ran_again += usize::from(second == 2);
    }
    assert!(
        (5..55).contains(&ran_again),
        "the records of one master's slots (about a third) were lost and ran again: {ran_again}"
    );
}
