//! A Redis Cluster with a replica per master (six nodes this test starts, no persistence, a node
//! timeout of 2 s), under 12 callers: a master is killed (SIGKILL), its replica takes over (Redis
//! Cluster's own failover), and the dead node, started again, rejoins as the new master's replica.
//! With `with_replica_acks(1, …)` every claim and mark reached the replica before the call went on,
//! so the promoted replica has it: every key runs once. Meanwhile the promoted master has no
//! replica, and writes that must reach one are refused (`StoreUnavailable`) until the dead node is
//! back. "Runs" is counted in an independent side-effect table, never by idem's counters.
//! docs/RELIABILITY.md, "Growing and scaling out", gives the figures, and what slot migration adds.

#[path = "support/callers.rs"]
mod callers;
#[path = "support/redis_cluster.rs"]
mod cluster;
mod contract;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use callers::{Seen, all_answers, answered, ran_again, spawn_callers};
use cluster::Cluster;
use contract::Effects;
use idem::{Call, IdemError, RedisClusterStore};
use tokio::sync::Barrier;

/// One cluster at a time: each test starts six nodes on ports picked from the process id.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One call of `key`, tried again on an answer that says so (the cluster failing over, a write
/// the replica did not acknowledge); its body records one side effect.
async fn call(store: &RedisClusterStore, fx: &Effects, key: &str, seen: &Seen) -> String {
    answered(seen, key, |_| {
        let (fx, key) = (fx.clone(), key.to_owned());
        async move {
            Call::new("RCF", &key)
                .lease(Duration::from_secs(10))
                .wait(Duration::from_secs(5))
                // The default store timeout (10 s) outlasts the failover (the node timeout, 2 s,
                // then an election): a mark sent to the dying master is tried again until the
                // replica has taken over. With 3 s, a mark gave up before it, and its record,
                // still PROCESSING, was taken over once its lease ended and the body ran again.
                .run(store, async {
                    fx.record("RCF", &key).await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<_, IdemError>(format!("receipt for {key}"))
                })
                .await
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_loses_no_acknowledged_call() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = Cluster::start_with_replicas(&["--cluster-node-timeout", "2000"]) else {
        return;
    };
    // The masters are nodes 0–2; master 1 dies, and its replica takes over.
    let to = 1usize;
    let replica = (3..6)
        .find(|&n| cluster.master_of(n) == Some(to))
        .expect("a replica of the killed master");
    for node in 3..6 {
        cluster.nodes[node].wait_for(
            |info| info.contains("master_link_status:up"),
            &["INFO", "replication"],
        );
    }
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisClusterStore::connect(&urls)
        .await
        .unwrap()
        .with_replica_acks(1, Duration::from_millis(500))
        .unwrap();
    let fx = Effects::new().await;
    let seen = Arc::new(Seen::default());

    // 12 callers over 600 keys, each from another place in them, so every key is called twice
    // (two callers meet on it) while the slots move and the master dies.
    let keys: Vec<String> = (0..600).map(|k| format!("m{k}")).collect();
    let barrier = Arc::new(Barrier::new(13));
    let tasks = spawn_callers(12, &barrier, |caller| {
        let (store, fx, keys, seen) = (store.clone(), fx.clone(), keys.clone(), seen.clone());
        async move {
            let mut answers = Vec::new();
            for k in 0..keys.len() / 6 {
                let key = &keys[(k + (caller / 2) * 100) % keys.len()];
                answers.push((key.clone(), call(&store, &fx, key, &seen).await));
            }
            answers
        }
    });
    barrier.wait().await;

    // Kill master 1 once the calls are under way.
    while seen.answered.load(Ordering::Relaxed) < 150 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before_kill = seen.answered.load(Ordering::Relaxed);
    let killed_at = Instant::now();
    cluster.nodes[to].kill();

    // The replica takes over by itself (the node timeout, then an election).
    let start = Instant::now();
    while !cluster.nodes[replica]
        .cli(&["INFO", "replication"])
        .contains("role:master")
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the replica of the killed master did not take over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let promoted_after = killed_at.elapsed();
    // Meanwhile the promoted master has no replica, so writes that must reach one are refused
    // (`StoreUnavailable`, retried). The operator starts the dead node again: it rejoins as the
    // replica of the master that took its place (its cluster config survives; its data does not).
    cluster.nodes[to].start_again();
    let rejoined = Instant::now();
    while !cluster.nodes[to]
        .cli(&["INFO", "replication"])
        .contains("role:slave")
    {
        if rejoined.elapsed() > Duration::from_secs(10) {
            // It has not turned into a replica by itself: the operator says whose.
            let promoted = cluster.id(replica);
            cluster.nodes[to].cli(&["CLUSTER", "REPLICATE", &promoted]);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.nodes[to].wait_for(
        |info| info.contains("master_link_status:up"),
        &["INFO", "replication"],
    );
    let replica_back_after = killed_at.elapsed();
    let answers = all_answers(tasks).await;
    let ran_again = ran_again(&fx, "RCF", &keys, &answers).await;
    eprintln!(
        "redis cluster failover: {} calls on 600 keys; master killed after {before_kill} \
         answers, replica promoted {promoted_after:?} later, the dead node back as its replica \
         after {replica_back_after:?}; {}; keys run more than once: {ran_again:?}",
        seen.answered.load(Ordering::Relaxed),
        seen.report(),
    );
    assert!(
        ran_again.is_empty(),
        "with replica acknowledgements no call runs twice: {ran_again:?}"
    );
}

/// A write that a slot migration redirects (`ASK`) is taken by the receiving master, and must be
/// on that master's replica before the call goes on. The slot of one new key is put in migration
/// by hand (`CLUSTER SETSLOT … IMPORTING` / `MIGRATING`, as `redis-cli --cluster reshard` does)
/// and the receiving master's replica is cut off (frozen, its link dropped): the claim, redirected
/// there, is refused ("0 of 1 replicas") and the body does not run. Sending `WAIT` to the slot's
/// owner in the client's map instead (the sending master, whose replica is fine) acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_redirected_by_a_migration_waits_for_the_receiving_masters_replica() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(cluster) = Cluster::start_with_replicas(&[]) else {
        return;
    };
    for node in 3..6 {
        cluster.nodes[node].wait_for(
            |info| info.contains("master_link_status:up"),
            &["INFO", "replication"],
        );
    }
    let key = "moving";
    let record = format!("idem:{{3:RCF:{key}}}");
    let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", &record]);
    let slot = slot.trim().to_owned();
    // `redis-cli --cluster create` gives masters 0, 1, 2 the slots 0–5460, 5461–10922, 10923–.
    let owner = match slot.parse::<u16>().unwrap() {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    };
    let receiver = (owner + 1) % 3;
    let replica = (3..6)
        .find(|&n| cluster.master_of(n) == Some(receiver))
        .expect("the receiving master's replica");
    let (owner_id, receiver_id) = (cluster.id(owner), cluster.id(receiver));
    assert!(
        cluster.nodes[receiver]
            .cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &owner_id])
            .contains("OK")
    );
    assert!(
        cluster.nodes[owner]
            .cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &receiver_id])
            .contains("OK")
    );
    cluster.nodes[replica].pause();
    cluster.nodes[receiver].cli(&["CLIENT", "KILL", "TYPE", "replica"]);

    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisClusterStore::connect(&urls)
        .await
        .unwrap()
        .with_replica_acks(1, Duration::from_millis(300))
        .unwrap();
    let fx = Effects::new().await;
    let (fx2, key2) = (fx.clone(), key.to_owned());
    let answer: Result<String, IdemError> = Call::new("RCF", key)
        .run(&store, async move {
            fx2.record("RCF", &key2).await;
            Ok(key2)
        })
        .await;
    cluster.nodes[replica].resume();
    assert!(
        matches!(&answer, Err(IdemError::StoreUnavailable { source }) if source.to_string().contains("0 of 1 replicas")),
        "the claim, taken by the receiving master, never reached its replica: {answer:?}"
    );
    assert_eq!(fx.count("RCF", key).await, 0, "the body did not run");
    // The sending master does not have the record: it redirects a read of it.
    let read = cluster.nodes[owner].cli(&["EXISTS", &record]);
    assert!(read.contains("ASK"), "{read}");
}
