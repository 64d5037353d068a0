//! What each Redis setup keeps when a server dies, on servers this test starts itself
//! (docs/RELIABILITY.md, "Redis: what survives"): a SIGKILL keeps exactly what AOF with
//! `appendfsync always` wrote and loses everything without persistence; a failover forgets a record
//! its replica never received, unless the store waits for replicas (`with_replica_acks`).
//!
//! "Ran again" is counted in an independent side-effect table, never by idem's counters.

mod contract;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::time::Duration;

use contract::Effects;
use idem::{Call, IdemError, RedisStore};
use redis_server::RedisServer;

const KEYS: usize = 40;

/// Runs the call for `key`; its body records one side effect.
async fn pay(store: &RedisStore, fx: &Effects, key: &str) -> Result<String, IdemError> {
    let (fx, owned) = (fx.clone(), key.to_owned());
    Call::new("DUR", key)
        .run(store, async move {
            fx.record("DUR", &owned).await;
            Ok::<_, IdemError>(format!("receipt for {owned}"))
        })
        .await
}

/// Connects, retrying while a restarted server comes up.
async fn connect(server: &RedisServer) -> RedisStore {
    for _ in 0..100 {
        if let Ok(store) = RedisStore::connect(&server.url()).await {
            return store.with_prefix("idemd:").unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("redis on {} does not answer", server.port)
}

/// Finishes `KEYS` calls, kills the server (SIGKILL), starts it again on the same files, repeats
/// every call: how many bodies ran a second time.
async fn ran_again_after_a_kill(server: &RedisServer) -> usize {
    let fx = Effects::new().await;
    let store = connect(server).await;
    let keys: Vec<String> = (0..KEYS).map(|k| format!("order-{k}")).collect();
    for key in &keys {
        pay(&store, &fx, key).await.unwrap();
    }
    server.kill();
    server.start_again();
    let store = connect(server).await;
    let mut again = 0;
    for key in &keys {
        assert_eq!(
            pay(&store, &fx, key).await.unwrap(),
            format!("receipt for {key}")
        );
        match fx.count("DUR", key).await {
            1 => {}
            2 => again += 1,
            n => panic!("{key} ran {n} times"),
        }
    }
    again
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_keeps_what_aof_always_wrote_and_nothing_else() {
    if !redis_server::installed() {
        return;
    }
    let dir = redis_server::scratch_dir("durability");
    let mut ports = redis_server::ports(25_000, 2);
    let (aof_dir, bare_dir) = (dir.join("aof"), dir.join("bare"));
    std::fs::create_dir_all(&aof_dir).unwrap();
    std::fs::create_dir_all(&bare_dir).unwrap();

    let aof = RedisServer::start_durable(ports.next().unwrap(), &aof_dir);
    assert_eq!(
        ran_again_after_a_kill(&aof).await,
        0,
        "AOF always: every record survives"
    );

    let bare = RedisServer::start(
        ports.next().unwrap(),
        &bare_dir,
        &["--appendonly", "no", "--save", ""],
    );
    assert_eq!(
        ran_again_after_a_kill(&bare).await,
        KEYS,
        "no persistence: every record is lost"
    );

    drop((aof, bare));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_forgets_what_its_replica_never_got_unless_writes_wait_for_it() {
    if !redis_server::installed() {
        return;
    }
    let dir = redis_server::scratch_dir("failover");
    let mut ports = redis_server::ports(27_000, 2);
    let no_persistence = ["--appendonly", "no", "--save", ""];
    let primary = RedisServer::start(ports.next().unwrap(), &dir, &no_persistence);
    let primary_port = primary.port.to_string();
    let mut replica_args = no_persistence.to_vec();
    replica_args.extend(["--replicaof", "127.0.0.1", &primary_port]);
    let replica = RedisServer::start(ports.next().unwrap(), &dir, &replica_args);
    replica.wait_for(
        |info| info.contains("master_link_status:up"),
        &["INFO", "replication"],
    );

    let fx = Effects::new().await;
    let plain = connect(&primary).await;
    let acked = plain
        .clone()
        .with_replica_acks(1, Duration::from_millis(300))
        .unwrap();

    // The replica is up: a call whose writes waited for it.
    pay(&acked, &fx, "acked").await.unwrap();

    // A partition: the replica is frozen and the primary drops its link, so nothing written from
    // now on reaches the replica (not even into its socket buffer).
    replica.pause();
    primary.cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    // Waiting for it, a claim is refused and the body does not run.
    let refused = pay(&acked, &fx, "refused").await;
    assert!(
        matches!(&refused, Err(IdemError::StoreUnavailable { source }) if source.to_string().contains("0 of 1 replicas")),
        "{refused:?}"
    );
    assert_eq!(fx.count("DUR", "refused").await, 0);
    // Without waiting, the call succeeds on the primary alone.
    pay(&plain, &fx, "unreplicated").await.unwrap();

    // Failover: the primary dies, the replica is promoted.
    primary.kill();
    replica.resume();
    assert!(replica.cli(&["REPLICAOF", "NO", "ONE"]).contains("OK"));
    let promoted = connect(&replica).await;

    pay(&promoted, &fx, "acked").await.unwrap();
    assert_eq!(
        fx.count("DUR", "acked").await,
        1,
        "a write the replica acknowledged survives"
    );
    pay(&promoted, &fx, "unreplicated").await.unwrap();
    assert_eq!(
        fx.count("DUR", "unreplicated").await,
        2,
        "the promoted replica never saw the record: the business ran again"
    );
    pay(&promoted, &fx, "refused").await.unwrap();
    assert_eq!(
        fx.count("DUR", "refused").await,
        1,
        "the refused call runs once, now"
    );

    drop((primary, replica));
    let _ = std::fs::remove_dir_all(&dir);
}
