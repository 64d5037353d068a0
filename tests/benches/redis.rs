//! The Redis store against the floor, side by side in one process.
//!
//! ```text
//! cargo bench -p idem-suite --bench redis --features redis              # full run on redis://127.0.0.1:6379
//! IDEM_REDIS_URL=redis://host:port/db cargo bench -p idem-suite --bench redis --features redis
//! IDEM_BENCH_ROUNDS=3 IDEM_BENCH_SCALE=0.2 cargo bench -p idem-suite --bench redis --features redis   # a quick look
//! ```
//!
//! Workload: a small serde result (`Receipt`: a string and two integers). "first" = a new key per
//! call (claim, body, mark SUCCEEDED with the stored result: two round trips); "replay" = the same
//! keys again, already SUCCEEDED (while repeats prevail, idem's claim is one `HMGET` of the
//! record, no script: one round trip, then decoding; the `floor` below still sends the claim
//! script).
//!
//! Contenders, each on a connection of its own of the same kind (one multiplexed
//! `ConnectionManager`, shared by all the tasks of that contender):
//! - `idem-call`: `Call::new(..).ttl(..).run(&RedisStore, ..)`;
//! - `idem-macro`: the same call written with `#[idempotent(store = store)]`;
//! - `floor`: a plain redis-rs loop with no framework sending the same commands: EVALSHA of idem's
//!   claim script, and for a new key EVALSHA of its complete script, on the same two keys (the
//!   record and the business type's stuck index; the script texts are the runtime's own, from
//!   `idem::__private::redis_scripts`); a replay is the claim script only, then `serde_json`
//!   decoding;
//! - `design`: the design floor, what a careful team would hand-write with the fewest
//!   commands, on keys of its own prefix: a first execution = `SET key <claim> NX PX lease` then
//!   `SET key <result> XX PX ttl`; a replay = one `GET` (the floor knows which workload it runs),
//!   then `serde_json` decoding;
//! - `contract`: the contract floor, a hand-written pair of scripts with the least the contract
//!   needs (Redis's clock, a fence that only grows, the record, its stuck-index entry; the mark
//!   under the fence with the entry removed); a replay = one `HMGET`, then decoding.
//!
//! Two modes: `seq` (one task on a current-thread runtime) and `c64` (64 tasks on a multi-thread
//! runtime with 2 workers). Each round runs every contender once per mode; the order rotates from
//! round to round; a ratio is taken within a round, then the median over rounds is reported.
//!
//! `IDEM_BENCH_ONLY=design` runs the design floor alone (`idem-call,design` idem against it).
//!
//! Besides the table it prints one line per contender, mode and workload,
//! `calls/s <contender> <mode> <workload> <value>` (medians over rounds), the format the peer
//! programs under `benches/peers/` print too, which `benches/redis_peers.sh` reads.

use std::future::Future;
use std::hint::black_box;
use std::time::{Duration, Instant};

use idem::__private::redis_scripts;
use idem::{Call, IdemError, RedisStore, idempotent};
use redis::aio::ConnectionManager;
use redis::{Script, Value};

mod support;
use support::{BIZ, Receipt, Table, median, r3, rate, receipt};

/// Record lifetime: long enough for a run, short enough that Redis drops what a run leaves behind.
const TTL: Duration = Duration::from_secs(3600);

#[idempotent(biz = "BENCH", key = "k", store = store, ttl = "1h")]
async fn via_macro(store: &RedisStore, k: u64) -> Result<Receipt, IdemError> {
    Ok(receipt(k))
}

/// One way of making call `k` (`replay`: the workload is the replay, which only the design floor
/// reads).
trait Contender: Clone + Send + Sync + 'static {
    fn call(&self, k: u64, replay: bool) -> impl Future<Output = Receipt> + Send;
}

#[derive(Clone)]
struct IdemCall(RedisStore);

impl Contender for IdemCall {
    async fn call(&self, k: u64, _replay: bool) -> Receipt {
        let r: Result<Receipt, IdemError> = Call::new(BIZ, &k)
            .ttl(TTL)
            .run(&self.0, async move { Ok(receipt(k)) })
            .await;
        r.unwrap()
    }
}

#[derive(Clone)]
struct IdemMacro(RedisStore);

impl Contender for IdemMacro {
    async fn call(&self, k: u64, _replay: bool) -> Receipt {
        via_macro(&self.0, k).await.unwrap()
    }
}

/// The plain loop: two scripts sent by hand, idem's own (the floor) or the contract floor's.
#[derive(Clone)]
struct Floor {
    conn: ConnectionManager,
    claim: &'static Script,
    complete: &'static Script,
    prefix: &'static str,
    lease_ms: u64,
    ttl_ms: u64,
}

impl Contender for Floor {
    async fn call(&self, k: u64, _replay: bool) -> Receipt {
        // The keys idem uses: the record `<prefix>{<n>:<biz>:<key>}` and the business type's stuck
        // index `<prefix>stuck:<n>:<biz>` (a claim adds the record to it, a mark removes it).
        let key = format!("{}{{{}:{BIZ}:{k}}}", self.prefix, BIZ.len());
        let index = format!("{}stuck:{}:{BIZ}", self.prefix, BIZ.len());
        let mut conn = self.conn.clone();
        // ARGV: fingerprint ("" for none), lease ms, ttl ms, test-clock offset ms.
        let reply: Value = self
            .claim
            .key(&key)
            .key(&index)
            .arg("")
            .arg(self.lease_ms)
            .arg(self.ttl_ms)
            .arg(0)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        match reply {
            // A fresh claim: its fence alone.
            Value::Int(fence) => {
                let receipt = receipt(k);
                let snapshot = serde_json::to_vec(&receipt).unwrap();
                // ARGV: fence, result, ttl ms, offset (the mark of one server with no offset and
                // no result ttl, as idem's store sends it).
                let changed: i64 = self
                    .complete
                    .key(&key)
                    .key(&index)
                    .arg(fence)
                    .arg(snapshot)
                    .arg(self.ttl_ms)
                    .arg(0)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(changed, 1, "complete lost its fence");
                receipt
            }
            Value::Array(items) => match items.as_slice() {
                [Value::BulkString(tag), Value::BulkString(result)] if tag == b"R" => {
                    serde_json::from_slice(result).unwrap()
                }
                other => panic!("unexpected claim reply {other:?}"),
            },
            other => panic!("unexpected claim reply {other:?}"),
        }
    }
}

/// The contract floor's claim: the least a claim keeps for the contract, by Redis's clock: a
/// record (status, a fence that only grows, the lease end) that expires after the ttl, and its
/// entry in the business type's stuck index. A success is replayed, a live claim refused, an
/// expired one taken over. KEYS: the record, the stuck index; ARGV: lease ms, ttl ms. Replies
/// the fence alone (an integer: one value for the client to read, as idem's fresh claim
/// replies), `{'R', result}` or `{'P'}`.
const CONTRACT_CLAIM: &str = r#"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local rec = redis.call('HMGET', KEYS[1], 's', 'f', 'lu', 'r')
if rec[1] == 'D' then return {'R', rec[4]} end
if rec[1] and tonumber(rec[3]) > now then return {'P'} end
local fence = now_us
if rec[2] then fence = math.max(tonumber(rec[2]) + 1, now_us) end
local lu = string.format('%d', now + tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 's', 'P', 'f', string.format('%d', fence), 'lu', lu)
redis.call('PEXPIREAT', KEYS[1], string.format('%d', now + tonumber(ARGV[2])))
redis.call('ZADD', KEYS[2], lu, KEYS[1])
return fence
"#;

/// The contract floor's mark: under the fence, the result stored, the expiry moved to the ttl
/// from now, the stuck index's entry removed. KEYS as the claim's; ARGV: fence, result, ttl ms.
const CONTRACT_COMPLETE: &str = r#"
if redis.call('HGET', KEYS[1], 'f') ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
redis.call('HSET', KEYS[1], 's', 'D', 'r', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], string.format('%d', now + tonumber(ARGV[3])))
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
"#;

/// The contract floor: a hand-written pair of scripts with the least the contract needs
/// ([`CONTRACT_CLAIM`], [`CONTRACT_COMPLETE`]), held as the floor holds idem's; a replay is one
/// `HMGET` of the status and the result (the floor knows which workload it runs), then decoding.
#[derive(Clone)]
struct Contract(Floor);

impl Contender for Contract {
    async fn call(&self, k: u64, replay: bool) -> Receipt {
        let this = &self.0;
        let key = format!("{}{{{BIZ}:{k}}}", this.prefix);
        let index = format!("{}stuck:{BIZ}", this.prefix);
        let mut conn = this.conn.clone();
        if replay {
            let (status, result): (Option<String>, Option<Vec<u8>>) = redis::cmd("HMGET")
                .arg(&key)
                .arg("s")
                .arg("r")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(status.as_deref(), Some("D"), "replay of a call not done");
            return serde_json::from_slice(&result.unwrap()).unwrap();
        }
        let reply: Value = this
            .claim
            .key(&key)
            .key(&index)
            .arg(this.lease_ms)
            .arg(this.ttl_ms)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        let Value::Int(fence) = reply else {
            panic!("the contract floor's key was taken: {reply:?}");
        };
        let receipt = receipt(k);
        let changed: i64 = this
            .complete
            .key(&key)
            .key(&index)
            .arg(fence)
            .arg(serde_json::to_vec(&receipt).unwrap())
            .arg(this.ttl_ms)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(changed, 1, "the contract floor's mark lost its fence");
        receipt
    }
}

/// The design floor: `SET NX PX` + `SET XX PX` for a first execution, one `GET` for a replay.
#[derive(Clone)]
struct Design {
    conn: ConnectionManager,
    prefix: &'static str,
    lease_ms: u64,
    ttl_ms: u64,
}

/// What the design floor stores while a call runs (not JSON, so never taken for a result).
const CLAIM_MARK: &[u8] = b"~";

impl Contender for Design {
    async fn call(&self, k: u64, replay: bool) -> Receipt {
        let key = format!("{}{BIZ}:{k}", self.prefix);
        let mut conn = self.conn.clone();
        if replay {
            let stored: Vec<u8> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_ne!(stored, CLAIM_MARK, "replay of a call still running");
            return serde_json::from_slice(&stored).unwrap();
        }
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(CLAIM_MARK)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(claimed.is_some(), "the design floor's key was taken");
        let receipt = receipt(k);
        let marked: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(serde_json::to_vec(&receipt).unwrap())
            .arg("XX")
            .arg("PX")
            .arg(self.ttl_ms)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(marked.is_some(), "the design floor's claim expired");
        receipt
    }
}

/// Runs calls `keys` split over `tasks` tasks (each its keys in order), all at once; returns calls/s.
async fn timed<C: Contender>(c: &C, keys: std::ops::Range<u64>, tasks: u64, replay: bool) -> f64 {
    let per = (keys.end - keys.start) / tasks;
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
    (per * tasks) as f64 / t.elapsed().as_secs_f64()
}

const NAMES: [&str; 5] = ["idem-call", "idem-macro", "floor", "design", "contract"];

/// Calls/s per contender (index as in [`NAMES`]) and workload (0 first, 1 replay), one per round.
#[derive(Default)]
struct Figures {
    ops: [[Vec<f64>; 2]; 5],
}

impl Figures {
    /// Per-round ratios of contender `a` over contender `b` for `workload`.
    fn ratio(&self, a: usize, b: usize, workload: usize) -> f64 {
        support::ratio(&self.ops[a][workload], &self.ops[b][workload])
    }
}

/// Every round runs the contenders, in an order rotating from round to round: each makes
/// `calls` first executions on keys of its own, then replays them.
async fn measure(
    url: &str,
    mode: &str,
    tasks: u64,
    calls: u64,
    rounds: usize,
    run_id: &str,
    picked: [bool; 5],
) -> Figures {
    static CLAIM: std::sync::LazyLock<Script> =
        std::sync::LazyLock::new(|| Script::new(redis_scripts::CLAIM));
    static COMPLETE: std::sync::LazyLock<Script> =
        std::sync::LazyLock::new(|| Script::new(redis_scripts::COMPLETE_PLAIN));
    static CONTRACT_CLAIM_SCRIPT: std::sync::LazyLock<Script> =
        std::sync::LazyLock::new(|| Script::new(CONTRACT_CLAIM));
    static CONTRACT_COMPLETE_SCRIPT: std::sync::LazyLock<Script> =
        std::sync::LazyLock::new(|| Script::new(CONTRACT_COMPLETE));
    // Each contender's own connection, of the same kind (RedisStore::connect's settings).
    let store = RedisStore::connect(url)
        .await
        .unwrap()
        .with_prefix(&format!("rbi{run_id}{mode}:"))
        .unwrap();
    let macro_store = RedisStore::connect(url)
        .await
        .unwrap()
        .with_prefix(&format!("rbm{run_id}{mode}:"))
        .unwrap();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(2)));
    let conn =
        ConnectionManager::new_with_config(redis::Client::open(url).unwrap(), config.clone())
            .await
            .unwrap();
    let contract = Contract(Floor {
        conn: ConnectionManager::new_with_config(redis::Client::open(url).unwrap(), config.clone())
            .await
            .unwrap(),
        claim: &CONTRACT_CLAIM_SCRIPT,
        complete: &CONTRACT_COMPLETE_SCRIPT,
        prefix: Box::leak(format!("rbc{run_id}{mode}:").into_boxed_str()),
        lease_ms: idem::DEFAULT_LEASE.as_millis() as u64,
        ttl_ms: TTL.as_millis() as u64,
    });
    let design = Design {
        conn: ConnectionManager::new_with_config(redis::Client::open(url).unwrap(), config)
            .await
            .unwrap(),
        prefix: Box::leak(format!("rbd{run_id}{mode}:").into_boxed_str()),
        lease_ms: idem::DEFAULT_LEASE.as_millis() as u64,
        ttl_ms: TTL.as_millis() as u64,
    };
    let floor = Floor {
        conn,
        claim: &CLAIM,
        complete: &COMPLETE,
        prefix: Box::leak(format!("rbf{run_id}{mode}:").into_boxed_str()),
        lease_ms: idem::DEFAULT_LEASE.as_millis() as u64,
        ttl_ms: TTL.as_millis() as u64,
    };
    let (call, mac) = (IdemCall(store), IdemMacro(macro_store));

    // A warm-up round, not counted: connections up, scripts loaded, allocator and caches warm.
    let warm = (calls / 5).max(tasks);
    let base = 1_000_000_000u64;
    if picked[0] {
        timed(&call, base..base + warm, tasks, false).await;
    }
    if picked[1] {
        timed(&mac, base..base + warm, tasks, false).await;
    }
    if picked[2] {
        timed(&floor, base..base + warm, tasks, false).await;
    }
    if picked[3] {
        timed(&design, base..base + warm, tasks, false).await;
        timed(&design, base..base + warm, tasks, true).await;
    }
    if picked[4] {
        timed(&contract, base..base + warm, tasks, false).await;
        timed(&contract, base..base + warm, tasks, true).await;
    }

    let mut figures = Figures::default();
    for round in 0..rounds {
        let keys = (round as u64 * calls)..(round as u64 + 1) * calls;
        for i in 0..5 {
            let who = (round + i) % 5;
            if !picked[who] {
                continue;
            }
            let (first, replay) = match who {
                0 => (
                    timed(&call, keys.clone(), tasks, false).await,
                    timed(&call, keys.clone(), tasks, true).await,
                ),
                1 => (
                    timed(&mac, keys.clone(), tasks, false).await,
                    timed(&mac, keys.clone(), tasks, true).await,
                ),
                2 => (
                    timed(&floor, keys.clone(), tasks, false).await,
                    timed(&floor, keys.clone(), tasks, true).await,
                ),
                3 => (
                    timed(&design, keys.clone(), tasks, false).await,
                    timed(&design, keys.clone(), tasks, true).await,
                ),
                _ => (
                    timed(&contract, keys.clone(), tasks, false).await,
                    timed(&contract, keys.clone(), tasks, true).await,
                ),
            };
            figures.ops[who][0].push(first);
            figures.ops[who][1].push(replay);
        }
        let at = |who: usize, w: usize| figures.ops[who][w].last().copied().unwrap_or(f64::NAN);
        let line = |w: usize| {
            let r: Vec<String> = (0..5).map(|who| format!("{:.0}", at(who, w))).collect();
            r.join(" / ")
        };
        eprintln!(
            "  {mode} round {round}: first {}, replay {} ({})",
            line(0),
            line(1),
            NAMES.join(" / ")
        );
    }
    // Leave nothing behind: the keys of this mode (they would expire within the TTL anyway).
    let mut conn = floor.conn.clone();
    for prefix in ["rbi", "rbm", "rbf", "rbd", "rbc"] {
        let pattern = format!("{prefix}{run_id}{mode}:*");
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap();
            if !batch.is_empty() {
                let _: i64 = redis::cmd("UNLINK")
                    .arg(&batch)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    figures
}

/// Whether Redis answers at `url` within two seconds.
async fn reachable(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let ping = async {
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("no answer within 2 s".to_owned()),
    }
}

fn main() {
    let url =
        std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let scale = support::scale();
    let rounds = support::rounds(9);
    // IDEM_BENCH_ONLY: a comma-separated choice of modes (seq, c64) and contenders (idem-call,
    // idem-macro, floor, design, contract), e.g. `c64,floor` to profile one; or `scripts`: load the
    // claim and complete scripts and print their SHA1s (for redis-benchmark's EVALSHA), nothing else.
    let only = support::only();
    let modes: Vec<&str> = ["seq", "c64"]
        .into_iter()
        .filter(|m| only.iter().any(|t| t == m))
        .collect();
    let modes = if modes.is_empty() {
        vec!["seq", "c64"]
    } else {
        modes
    };
    let mut picked = NAMES.map(|n| only.iter().any(|t| t == n));
    if picked == [false; 5] {
        picked = [true; 5];
    }
    let calls = |base: u64| ((base as f64 * scale) as u64).max(64) / 64 * 64;

    let seq_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Err(e) = seq_rt.block_on(reachable(&url)) {
        println!("skipped: Redis at {url} is unreachable ({e})");
        return;
    }
    if only.iter().any(|t| t == "scripts") {
        seq_rt.block_on(async {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            for (name, text) in [
                ("claim", redis_scripts::CLAIM),
                ("complete", redis_scripts::COMPLETE_PLAIN),
            ] {
                let sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(text)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                println!("script {name} {sha}");
            }
        });
        return;
    }
    let run_id = std::process::id().to_string();
    println!("idem on Redis ({url}), {rounds} rounds, median of per-round ratios; scale {scale}\n");

    let mut results = Vec::new();
    if modes.contains(&"seq") {
        let n = calls(5_000);
        let f = seq_rt.block_on(measure(&url, "seq", 1, n, rounds, &run_id, picked));
        results.push(("seq", "1", n, f));
    }
    drop(seq_rt);
    if modes.contains(&"c64") {
        let multi_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let n = calls(20_000);
        let f = multi_rt.block_on(measure(&url, "c64", 64, n, rounds, &run_id, picked));
        results.push(("c64", "64", n, f));
    }

    let mut table = Table::new(
        "redis",
        &[
            "workload",
            "tasks",
            "`Call::run` calls/s",
            "`#[idempotent]` calls/s",
            "idem / floor",
            "idem / contract floor",
            "idem / design floor",
        ],
    );
    for (_, label, _, f) in &results {
        for (w, workload) in ["first", "replay"].iter().enumerate() {
            table.row([
                workload.to_string(),
                label.to_string(),
                rate(median(f.ops[0][w].clone())),
                rate(median(f.ops[1][w].clone())),
                r3(f.ratio(0, 2, w)),
                r3(f.ratio(0, 4, w)),
                r3(f.ratio(0, 3, w)),
            ]);
        }
    }
    table.emit();
    println!();
    for (mode, _, _, f) in &results {
        for (i, name) in NAMES.iter().enumerate().filter(|(i, _)| picked[*i]) {
            for (w, workload) in ["first", "replay"].iter().enumerate() {
                println!(
                    "calls/s {name} {mode} {workload} {:.0}",
                    median(f.ops[i][w].clone())
                );
            }
        }
    }
}
