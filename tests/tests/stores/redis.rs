//! The store contract on `RedisStore`, against the local Redis (`IDEM_REDIS_URL`, default
//! `redis://127.0.0.1:6379`); each test's records under a prefix of its own.

use crate::contract;

use std::sync::Arc;

use crate::contract::server;

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    let url = server::redis_url();
    let store = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
    let prefix = format!("{}:", server::unique("idemt"));
    Some(Arc::new(
        store.with_test_clock(clock).with_prefix(&prefix).unwrap(),
    ))
}

contract_suite!(store, burst = (200, 64));

/// The collision a review found, through the attribute: a composite key under one business type
/// and a plain key under a business type that ends like the first key's first part. On Redis the
/// record keys were `idem:{ORDER:REFUND:7}` both; now each call runs its own body.
mod attribute_identity {
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem::{IdemError, idempotent};

    static ORDER_RUNS: AtomicU32 = AtomicU32::new(0);
    static REFUND_RUNS: AtomicU32 = AtomicU32::new(0);

    #[idempotent(biz = "ORDER", key = "(\"REFUND\", id)", store = "redis_identity")]
    async fn order_step(id: u64) -> Result<String, IdemError> {
        ORDER_RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("order step {id}"))
    }

    #[idempotent(biz = "ORDER:REFUND", key = "id", store = "redis_identity")]
    async fn refund(id: u64) -> Result<String, IdemError> {
        REFUND_RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("refund {id}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_composite_key_and_a_longer_biz_are_two_records() {
        let Some(store) = super::store(idem::TestClock::new()).await else {
            return;
        };
        idem::register_store("redis_identity", store);
        // Unique per run: the prefix is, and so is the id.
        let id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert_eq!(order_step(id).await.unwrap(), format!("order step {id}"));
        assert_eq!(refund(id).await.unwrap(), format!("refund {id}"));
        assert_eq!(
            refund(id).await.unwrap(),
            format!("refund {id}"),
            "a replay"
        );
        assert_eq!(
            order_step(id).await.unwrap(),
            format!("order step {id}"),
            "a replay"
        );
        assert_eq!(ORDER_RUNS.load(Ordering::SeqCst), 1);
        assert_eq!(REFUND_RUNS.load(Ordering::SeqCst), 1);
    }
}

/// `Store::stuck` on Redis: the stuck index (a sorted set per business type, by lease end) that
/// every script keeps, read without a SCAN, and what it does when Redis expired (or someone
/// deleted) a record behind its back.
mod stuck_index {
    use std::time::Duration;

    use idem::{
        RedisStore, Store, TestClock,
        store::{Claim, ClaimOutcome, ClaimRequest, Status},
    };
    use redis::aio::MultiplexedConnection;

    use super::contract::server;

    const LEASE: Duration = Duration::from_secs(10);
    const TTL: Duration = Duration::from_secs(3600);

    pub(super) struct Subject {
        pub(super) store: RedisStore,
        pub(super) clock: TestClock,
        pub(super) prefix: String,
        pub(super) raw: MultiplexedConnection,
    }

    impl Subject {
        /// The record key and the stuck index idem uses (`record_key`, `stuck_key`).
        pub(super) fn record(&self, biz: &str, key: &str) -> String {
            format!("{}{{{}:{biz}:{key}}}", self.prefix, biz.len())
        }

        fn index(&self, biz: &str) -> String {
            format!("{}stuck:{}:{biz}", self.prefix, biz.len())
        }

        /// The index's members, oldest lease first, with their scores.
        async fn members(&self, biz: &str) -> Vec<(String, i64)> {
            let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(self.index(biz))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut self.raw.clone())
                .await
                .unwrap();
            members.into_iter().map(|(m, s)| (m, s as i64)).collect()
        }

        async fn exists(&self, key: &str) -> bool {
            let n: i64 = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut self.raw.clone())
                .await
                .unwrap();
            n == 1
        }

        async fn claim(&self, biz: &str, key: &str) -> Claim {
            let req = ClaimRequest {
                biz,
                key,
                fingerprint: None,
                lease: LEASE,
                ttl: TTL,
            };
            match self.store.claim(&req).await.unwrap() {
                ClaimOutcome::Acquired { claim, .. } => claim,
                other => panic!("{biz}/{key}: {other:?}"),
            }
        }

        async fn stuck_keys(&self, biz: &str, batch: usize) -> Vec<String> {
            let stuck = self.store.stuck(biz, batch).await.unwrap();
            for r in &stuck {
                assert_eq!(r.biz, biz);
                assert_eq!(r.status, Status::Processing, "{r:?}");
                assert_eq!(
                    Some(r),
                    self.store.load(biz, &r.key).await.unwrap().as_ref(),
                    "stuck builds the record as load does"
                );
            }
            stuck.into_iter().map(|r| r.key).collect()
        }
    }

    pub(super) async fn subject() -> Option<Subject> {
        let url = server::redis_url();
        let store = server::reach("Redis", &url, RedisStore::connect(&url)).await?;
        let raw = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let clock = TestClock::new();
        let prefix = format!("{}:", server::unique("idems"));
        Some(Subject {
            store: store
                .with_test_clock(clock.clone())
                .with_prefix(&prefix)
                .unwrap(),
            clock,
            prefix,
            raw,
        })
    }

    #[tokio::test]
    async fn lists_expired_leases_in_lease_order_from_the_index() {
        let Some(s) = subject().await else {
            return;
        };
        let (biz, other) = ("PAY", "PAY:x");
        // Leases end a few ms apart, in this order.
        let a = s.claim(biz, "a").await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let b = s.claim(biz, "b").await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let _c = s.claim(biz, "c").await;
        // A business type whose index key would collide without the length: its own index.
        let _o = s.claim(other, "y").await;
        assert_eq!(s.members(biz).await.len(), 3);
        assert_eq!(s.members(other).await.len(), 1);

        // A live lease is not stuck.
        assert!(s.stuck_keys(biz, 10).await.is_empty());

        s.store.complete(biz, "b", &b, b"done", TTL).await.unwrap();
        let members = s.members(biz).await;
        assert!(
            !members.iter().any(|(m, _)| *m == s.record(biz, "b")),
            "a mark leaves the index: {members:?}"
        );
        s.clock.advance(Duration::from_secs(11));
        assert_eq!(s.stuck_keys(biz, 10).await, ["a", "c"]);
        assert_eq!(s.stuck_keys(biz, 1).await, ["a"]);
        assert_eq!(s.stuck_keys(biz, 0).await, Vec::<String>::new());
        assert_eq!(s.stuck_keys(other, 10).await, ["y"]);
        assert!(s.stuck_keys("NONE", 10).await.is_empty());

        // A renewal moves a record later in the order: now it is "c" then "a".
        s.store.renew(biz, "a", &a, LEASE).await.unwrap();
        assert_eq!(s.stuck_keys(biz, 10).await, ["c"]);
        s.clock.advance(Duration::from_secs(11));
        assert_eq!(s.stuck_keys(biz, 10).await, ["c", "a"]);
        // A release ends the lease now: last of the stuck, and its score is its lease end.
        s.store.release(biz, "a", &a).await.unwrap();
        let lu = s
            .store
            .load(biz, "a")
            .await
            .unwrap()
            .unwrap()
            .lease_until_ms;
        assert!(s.members(biz).await.contains(&(s.record(biz, "a"), lu)));
        assert_eq!(s.stuck_keys(biz, 10).await, ["c", "a"]);
    }

    #[tokio::test]
    async fn a_record_deleted_behind_the_index_is_skipped_and_dropped() {
        let Some(s) = subject().await else {
            return;
        };
        let biz = "GONE";
        for key in ["a", "b", "c"] {
            s.claim(biz, key).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // What Redis's own expiry does: the record goes, its member stays.
        let _: i64 = redis::cmd("DEL")
            .arg(s.record(biz, "a"))
            .query_async(&mut s.raw.clone())
            .await
            .unwrap();
        assert_eq!(s.members(biz).await.len(), 3);
        s.clock.advance(Duration::from_secs(11));
        assert_eq!(s.stuck_keys(biz, 1).await, ["b"], "the first stuck one");
        let members: Vec<String> = s.members(biz).await.into_iter().map(|m| m.0).collect();
        assert_eq!(members, [s.record(biz, "b"), s.record(biz, "c")]);
    }

    #[tokio::test]
    async fn the_index_is_gone_once_every_record_is_finished() {
        let Some(s) = subject().await else {
            return;
        };
        let biz = "DONE";
        let (a, b, c, d) = (
            s.claim(biz, "a").await,
            s.claim(biz, "b").await,
            s.claim(biz, "c").await,
            s.claim(biz, "d").await,
        );
        assert!(s.exists(&s.index(biz)).await);
        s.store.complete(biz, "a", &a, b"1", TTL).await.unwrap();
        s.store.fail(biz, "b", &b).await.unwrap();
        // A takeover keeps one member, at the new lease end.
        s.clock.advance(Duration::from_secs(11));
        let c2 = s.claim(biz, "c").await;
        assert_ne!(c2.fence, c.fence);
        assert_eq!(s.members(biz).await.len(), 2);
        s.store.complete(biz, "c", &c2, b"3", TTL).await.unwrap();
        // A retry after a failure is PROCESSING again: back in the index.
        let b2 = s.claim(biz, "b").await;
        assert_eq!(s.members(biz).await.len(), 2);
        s.store.complete(biz, "b", &b2, b"2", TTL).await.unwrap();
        // `d` expires by the store clock (lease and ttl over): the sweep deletes it and its member.
        s.clock.advance(TTL + Duration::from_secs(1));
        assert_eq!(s.stuck_keys(biz, 10).await, ["d"]);
        assert!(s.store.sweep_expired(1000).await.unwrap() >= 1);
        assert!(!s.exists(&s.record(biz, "d")).await);
        assert!(!s.exists(&s.index(biz)).await, "{:?}", s.members(biz).await);
        assert!(s.store.complete(biz, "d", &d, b"4", TTL).await.is_err());
        assert!(s.stuck_keys(biz, 10).await.is_empty());
    }

    /// Members whose records vanished are dropped by `sweep_expired` too, not only by `stuck`; and
    /// more stale members than one run of the script walks do not hide the stuck records behind
    /// them.
    #[tokio::test]
    async fn stale_members_are_trimmed_by_the_sweep_and_past_a_run_budget() {
        let Some(s) = subject().await else {
            return;
        };
        let biz = "STALE";
        // 1,500 members of records that are gone (more than one run of the script drops), the
        // oldest, then two stuck records.
        let stale: Vec<(i64, String)> = (0..1500)
            .map(|i| (i, format!("{}{{5:{biz}:gone-{i}}}", s.prefix)))
            .collect();
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(s.index(biz));
        for (score, member) in &stale {
            zadd.arg(*score).arg(member);
        }
        let _: i64 = zadd.query_async(&mut s.raw.clone()).await.unwrap();
        s.claim(biz, "x").await;
        s.claim(biz, "y").await;
        s.clock.advance(Duration::from_secs(11));
        let mut stuck = s.stuck_keys(biz, 10).await;
        stuck.sort();
        assert_eq!(stuck, ["x", "y"]);
        assert_eq!(s.members(biz).await.len(), 2);

        // Again, dropped by a sweep this time; the stuck records stay.
        let _: i64 = redis::cmd("ZADD")
            .arg(s.index(biz))
            .arg(0)
            .arg(format!("{}{{5:{biz}:gone}}", s.prefix))
            .query_async(&mut s.raw.clone())
            .await
            .unwrap();
        s.store.sweep_expired(1000).await.unwrap();
        assert_eq!(s.members(biz).await.len(), 2);
    }
}

/// The results index (`<prefix>results`, record keys by when their result is dropped) and the
/// registry of stuck indexes (`<prefix>indexes`): what a sweep reads on one server instead of
/// walking the keys. The test clock is never moved here, so a sweep takes the path production
/// takes (no walk): results are made due by a short result ttl on Redis's own clock.
mod sweep_indexes {
    use std::time::Duration;

    use idem::{
        Store,
        store::{ClaimOutcome, ClaimRequest, Status},
    };

    use super::stuck_index::{Subject, subject};

    const TTL: Duration = Duration::from_secs(3600);

    async fn score(s: &Subject, key: &str) -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg(format!("{}results", s.prefix))
            .arg(s.record("KEP", key))
            .query_async(&mut s.raw.clone())
            .await
            .unwrap()
    }

    /// A success under `key`, its result kept `keep` (or as long as the record).
    async fn done(s: &Subject, key: &str, keep: Option<Duration>) {
        let req = ClaimRequest {
            biz: "KEP",
            key,
            fingerprint: None,
            lease: Duration::from_secs(10),
            ttl: TTL,
        };
        let ClaimOutcome::Acquired { claim, .. } = s.store.claim(&req).await.unwrap() else {
            panic!("{key}: not acquired");
        };
        match keep {
            Some(keep) => s
                .store
                .complete_keeping("KEP", key, &claim, b"result", TTL, keep)
                .await
                .unwrap(),
            None => s
                .store
                .complete("KEP", key, &claim, b"result", TTL)
                .await
                .unwrap(),
        }
    }

    #[tokio::test]
    async fn due_results_come_from_the_index_a_batch_at_a_time() {
        let Some(s) = subject().await else {
            return;
        };
        let short = Duration::from_millis(50);
        for i in 0..5 {
            done(&s, &format!("due-{i}"), Some(short)).await;
        }
        done(&s, "later", Some(Duration::from_secs(600))).await;
        done(&s, "kept", None).await;
        for i in 0..5 {
            assert!(
                score(&s, &format!("due-{i}")).await.is_some(),
                "due-{i} is indexed"
            );
        }
        let later = score(&s, "later")
            .await
            .expect("a later result is indexed too");
        let rx = s
            .store
            .load("KEP", "later")
            .await
            .unwrap()
            .unwrap()
            .result_until_ms;
        assert_eq!(Some(later as i64), rx, "scored by its result expiry");
        assert_eq!(
            score(&s, "kept").await,
            None,
            "a result kept with its record is not"
        );

        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(s.store.sweep_expired(2).await.unwrap(), 2);
        assert_eq!(s.store.sweep_expired(2).await.unwrap(), 2);
        assert_eq!(s.store.sweep_expired(2).await.unwrap(), 1);
        assert_eq!(s.store.sweep_expired(2).await.unwrap(), 0);
        for i in 0..5 {
            let key = format!("due-{i}");
            let r = s.store.load("KEP", &key).await.unwrap().unwrap();
            assert_eq!(r.status, Status::Succeeded, "{key} stays, a tombstone");
            assert_eq!(r.snapshot, None, "{key}: its result is dropped");
            assert_eq!(score(&s, &key).await, None, "{key} left the index");
        }
        for key in ["later", "kept"] {
            let r = s.store.load("KEP", key).await.unwrap().unwrap();
            assert_eq!(
                r.snapshot.as_deref(),
                Some(&b"result"[..]),
                "{key} keeps its result"
            );
        }
        assert!(score(&s, "later").await.is_some());
    }

    #[tokio::test]
    async fn a_member_whose_record_is_gone_is_dropped_and_not_counted() {
        let Some(s) = subject().await else {
            return;
        };
        done(&s, "gone", Some(Duration::from_millis(20))).await;
        done(&s, "here", Some(Duration::from_millis(20))).await;
        let _: i64 = redis::cmd("DEL")
            .arg(s.record("KEP", "gone"))
            .query_async(&mut s.raw.clone())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(s.store.sweep_expired(10).await.unwrap(), 1);
        assert_eq!(score(&s, "gone").await, None);
        assert_eq!(score(&s, "here").await, None);
        let exists: i64 = redis::cmd("EXISTS")
            .arg(s.record("KEP", "gone"))
            .query_async(&mut s.raw.clone())
            .await
            .unwrap();
        assert_eq!(exists, 0, "the sweep does not bring a record back");
    }

    #[tokio::test]
    async fn a_claim_lists_its_stuck_index_in_the_registry() {
        let Some(s) = subject().await else {
            return;
        };
        done(&s, "a", None).await;
        let indexes: Vec<String> = redis::cmd("SMEMBERS")
            .arg(format!("{}indexes", s.prefix))
            .query_async(&mut s.raw.clone())
            .await
            .unwrap();
        assert_eq!(indexes, [format!("{}stuck:3:KEP", s.prefix)]);
    }
}

/// Without a test clock a replay is a plain `HGET` of the success's result, decided by the key's
/// own expiry: on the real
/// clock a success replays until its ttl passes and runs again after (the key is gone then, and
/// Redis never returns a key past its expiry), with no test clock to move it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_read_without_the_script_ends_with_the_ttl_on_the_real_clock() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    let url = server::redis_url();
    let Some(store) = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await else {
        return;
    };
    let store = store
        .with_prefix(&format!("{}:", server::unique("idemt")))
        .unwrap();
    contract::turned_to_read_first(&store).await;
    let runs = AtomicU32::new(0);
    let call = || {
        idem::Call::new("REAL_CLOCK", "k")
            .ttl(Duration::from_secs(2))
            .lease(Duration::from_millis(100))
            .run(&store, async {
                Ok::<_, idem::IdemError>(runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
    };
    let started = std::time::Instant::now();
    assert_eq!(call().await.unwrap(), 1);
    for _ in 0..5 {
        let replayed = call().await.unwrap();
        // (A machine so slow that 2 s passed would see the body run again.)
        if started.elapsed() < Duration::from_millis(1500) {
            assert_eq!(replayed, 1, "a replay within the ttl");
        }
    }
    tokio::time::sleep(Duration::from_millis(2100).saturating_sub(started.elapsed())).await;
    assert_eq!(
        call().await.unwrap(),
        2,
        "the ttl passed: the body runs again"
    );
    assert_eq!(call().await.unwrap(), 2, "and that success replays");
}

/// The record's layout: a success kept as long as its record holds its result in `d`, after its
/// fingerprint's digest, so a replay is one `HGET`; successes marked before that field existed
/// (their result in `r`) are still replayed and read whole.
mod record_layout {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use idem::{Call, IdemError, RedisStore, Store};

    use crate::contract::{self, server};

    async fn subject() -> Option<(RedisStore, String, redis::aio::MultiplexedConnection)> {
        let url = server::redis_url();
        let store = server::reach("Redis", &url, RedisStore::connect(&url)).await?;
        let prefix = format!("{}:", server::unique("idemt"));
        let store = store.with_prefix(&prefix).unwrap();
        let raw = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Some((store, prefix, raw))
    }

    async fn fields(
        raw: &redis::aio::MultiplexedConnection,
        key: &str,
    ) -> std::collections::HashMap<String, Vec<u8>> {
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut raw.clone())
            .await
            .unwrap()
    }

    /// A claim of `biz`/`key` with no fingerprint.
    fn request<'a>(
        biz: &'a str,
        key: &'a str,
        lease: Duration,
        ttl: Duration,
    ) -> idem::store::ClaimRequest<'a> {
        idem::store::ClaimRequest {
            biz,
            key,
            fingerprint: None,
            lease,
            ttl,
        }
    }

    /// A success marked by the earlier layout (its result in `r`, no `d`), written by hand as that
    /// version wrote it: repeats replay it (through the claim script: the plain read finds no
    /// `d`), mismatches are refused, and `load` reads its result.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_success_of_the_earlier_layout_replays_and_loads() {
        let Some((store, prefix, raw)) = subject().await else {
            return;
        };
        contract::turned_to_read_first(&store).await;
        let key = format!("{prefix}{{3:OLD:k}}");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let fp = idem::key::fingerprint(&"payload").unwrap();
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg(&key)
            .arg(&[
                ("s", "SUCCEEDED".to_owned()),
                ("a", "1".to_owned()),
                ("f", (now_ms * 1000).to_string()),
                ("fp", fp.clone()),
                ("lu", (now_ms - 1000).to_string()),
                ("ex", (now_ms + 60_000).to_string()),
                ("r", "{\"Ok\":41}".to_owned()),
            ])
            .ignore()
            .cmd("PEXPIREAT")
            .arg(&key)
            .arg(now_ms + 60_000)
            .ignore()
            .query_async(&mut raw.clone())
            .await
            .unwrap();
        let runs = AtomicU32::new(0);
        let call = |payload: &'static str| {
            Call::new("OLD", "k")
                .fingerprint(&payload)
                .run(&store, async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<u32, IdemError>(7)
                })
        };
        for _ in 0..3 {
            assert_eq!(call("payload").await.unwrap(), 41, "the stored result");
        }
        assert!(matches!(
            call("another").await,
            Err(IdemError::PayloadMismatch)
        ));
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
        let record = store.load("OLD", "k").await.unwrap().unwrap();
        assert_eq!(record.snapshot.as_deref(), Some(&b"{\"Ok\":41}"[..]));
        assert_eq!(record.fingerprint.as_deref(), Some(fp.as_str()));
    }

    /// A success's result goes to `d` after its digest, its saved steps (in `r` while it ran)
    /// are dropped, and every reader sees the result: the plain read (a replay, and a
    /// mismatch for another payload), the claim script (a batch), `load`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_success_holds_its_result_after_its_digest_and_drops_its_steps() {
        let Some((store, prefix, raw)) = subject().await else {
            return;
        };
        contract::turned_to_read_first(&store).await;
        let runs = AtomicU32::new(0);
        let call = |payload: &'static str| {
            Call::new("NEW", "k")
                .fingerprint(&payload)
                .run(&store, async {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let step: u32 =
                        idem::step("reserve", async { Ok::<_, IdemError>(n * 10) }).await?;
                    Ok::<u32, IdemError>(step + 1)
                })
        };
        assert_eq!(call("payload").await.unwrap(), 11);
        let record = fields(&raw, &format!("{prefix}{{3:NEW:k}}")).await;
        assert!(!record.contains_key("r"), "the steps went with the success");
        let fp = idem::key::fingerprint(&"payload").unwrap();
        let digest = fp.rsplit(' ').next().unwrap();
        assert_eq!(
            record["d"],
            format!("{digest}\n{{\"Ok\":11}}").into_bytes(),
            "the digest, a newline, the result"
        );
        for _ in 0..3 {
            assert_eq!(call("payload").await.unwrap(), 11);
        }
        assert!(matches!(
            call("another").await,
            Err(IdemError::PayloadMismatch)
        ));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let record = store.load("NEW", "k").await.unwrap().unwrap();
        assert_eq!(record.snapshot.as_deref(), Some(&b"{\"Ok\":11}"[..]));
        assert_eq!(record.steps, None);
        // The claim script reads `d` too: a batch claim of the key replays it.
        let items = [idem::store::BatchItem {
            key: "k",
            fingerprint: Some(fp.as_str()),
        }];
        let batch = idem::store::BatchClaim {
            biz: "NEW",
            items: &items,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
        };
        let outcomes = store.claim_batch(&batch).await.unwrap();
        assert!(matches!(
            outcomes.as_slice(),
            [idem::store::ClaimOutcome::Replay { snapshot }] if snapshot == b"{\"Ok\":11}"
        ));
    }

    /// A new record claimed without a fingerprint stores no empty `fp` field (one with a
    /// fingerprint stores it); both read back as claimed, and a retry of the fingerprinted one by
    /// a claim without a fingerprint leaves none behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_record_without_a_fingerprint_stores_none() {
        let Some((store, prefix, raw)) = subject().await else {
            return;
        };
        let fp = idem::key::fingerprint(&"payload").unwrap();
        for (key, fingerprint) in [("bare", None), ("printed", Some(fp.as_str()))] {
            let r = idem::store::ClaimRequest {
                fingerprint,
                ..request("FP", key, Duration::from_secs(30), Duration::from_secs(60))
            };
            assert!(matches!(
                store.claim(&r).await.unwrap(),
                idem::store::ClaimOutcome::Acquired { .. }
            ));
            let record = fields(&raw, &format!("{prefix}{{2:FP:{key}}}")).await;
            assert_eq!(record["a"], b"1".to_vec());
            assert_eq!(
                record.get("fp").map(Vec::as_slice),
                fingerprint.map(str::as_bytes)
            );
            let loaded = store.load("FP", key).await.unwrap().unwrap();
            assert_eq!(
                (loaded.attempt, loaded.fingerprint.as_deref()),
                (1, fingerprint)
            );
            if fingerprint.is_some() {
                let held = match store.claim(&r).await.unwrap() {
                    idem::store::ClaimOutcome::InProgress { .. } => loaded,
                    other => panic!("a live claim is in progress: {other:?}"),
                };
                let claim = idem::store::Claim {
                    attempt: held.attempt,
                    fence: held.fence,
                };
                store.fail("FP", key, &claim).await.unwrap();
                let retry = idem::store::ClaimRequest {
                    fingerprint: None,
                    ..r
                };
                assert!(matches!(
                    store.claim(&retry).await.unwrap(),
                    idem::store::ClaimOutcome::Acquired {
                        how: idem::store::Acquired::RetryAfterFailure,
                        ..
                    }
                ));
                let loaded = store.load("FP", key).await.unwrap().unwrap();
                assert_eq!((loaded.attempt, loaded.fingerprint), (2, None));
            }
        }
    }

    /// A server that lost its scripts (a restart, `SCRIPT FLUSH`) is given them again by the call
    /// that finds them missing, which then does its work once: a fresh claim (its reply, the fence
    /// alone, read as attempt 1 under the fence the record keeps), a mark and a batch claim, each
    /// sent right after a flush.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_without_the_scripts_is_given_them_again() {
        use idem::store::{Acquired, BatchClaim, BatchItem, ClaimOutcome};
        let Some((store, prefix, raw)) = subject().await else {
            return;
        };
        let (lease, ttl) = (Duration::from_secs(30), Duration::from_secs(60));
        let flush = || async {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut raw.clone())
                .await
                .unwrap();
        };
        let key = format!("{prefix}{{2:NS:a}}");
        flush().await;
        let r = request("NS", "a", lease, ttl);
        let ClaimOutcome::Acquired { claim, how } = store.claim(&r).await.unwrap() else {
            panic!("a new key is claimed");
        };
        assert!(matches!(how, Acquired::Fresh), "{how:?}");
        assert_eq!(claim.attempt, 1);
        let record = fields(&raw, &key).await;
        assert_eq!(record["f"], claim.fence.get().to_string().into_bytes());
        assert_eq!(record["s"], b"PROCESSING".to_vec());
        flush().await;
        store
            .complete("NS", "a", &claim, b"{\"Ok\":1}", ttl)
            .await
            .unwrap();
        assert_eq!(fields(&raw, &key).await["s"], b"SUCCEEDED".to_vec());
        flush().await;
        let items = [
            BatchItem {
                key: "a",
                fingerprint: None,
            },
            BatchItem {
                key: "b",
                fingerprint: None,
            },
        ];
        let outcomes = store
            .claim_batch(&BatchClaim {
                biz: "NS",
                items: &items,
                lease,
                ttl,
            })
            .await
            .unwrap();
        assert!(
            matches!(&outcomes[..], [
                ClaimOutcome::Replay { snapshot },
                ClaimOutcome::Acquired { claim, how: Acquired::Fresh },
            ] if snapshot == b"{\"Ok\":1}" && claim.attempt == 1),
            "{outcomes:?}"
        );
    }

    /// On one server with no test clock, a mark whose lease ends after its ttl keeps the key until
    /// the lease end (the later of the two), and its result goes to `r`: a live lease outlives
    /// the TTL on this path too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mark_keeps_the_key_to_a_lease_end_later_than_its_ttl() {
        let Some((store, prefix, raw)) = subject().await else {
            return;
        };
        let (lease, ttl) = (Duration::from_secs(120), Duration::from_secs(5));
        let r = request("LONG", "k", lease, ttl);
        let idem::store::ClaimOutcome::Acquired { claim, .. } = store.claim(&r).await.unwrap()
        else {
            panic!("a new key is claimed");
        };
        store
            .complete("LONG", "k", &claim, b"{\"Ok\":3}", ttl)
            .await
            .unwrap();
        let key = format!("{prefix}{{4:LONG:k}}");
        let record = fields(&raw, &key).await;
        assert_eq!(record["s"], b"SUCCEEDED".to_vec());
        assert_eq!(record["r"], b"{\"Ok\":3}".to_vec());
        assert!(
            !record.contains_key("d"),
            "the lease ends after the record's expiry"
        );
        let left: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut raw.clone())
            .await
            .unwrap();
        assert!(
            left > 60_000,
            "the key lives to the lease end, not the ttl: {left} ms left"
        );
    }

    /// A success whose result is kept for less than its record stays in `r` (its tombstone needs
    /// the clock), and replays through the script.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_result_kept_shorter_than_its_record_stays_in_r() {
        let Some((store, prefix, raw)) = subject().await else {
            return;
        };
        contract::turned_to_read_first(&store).await;
        let call = || {
            Call::new("KEPT", "k")
                .ttl(Duration::from_secs(60))
                .result_ttl(Duration::from_secs(30))
                .run(&store, async { Ok::<u32, IdemError>(5) })
        };
        assert_eq!(call().await.unwrap(), 5);
        let record = fields(&raw, &format!("{prefix}{{4:KEPT:k}}")).await;
        assert!(!record.contains_key("d"));
        assert_eq!(record["r"], b"{\"Ok\":5}".to_vec());
        assert_eq!(call().await.unwrap(), 5);
    }
}

/// `Store::list_keys` on one server lists the records of its own prefix and nothing else: not
/// those of a prefix that begins with its own, not its stuck index, registry or token keys, not a
/// key under `<prefix>{` that names no record.
mod key_walk {
    use std::collections::BTreeSet;

    use idem::{Call, IdemError, RedisStore, Store, TokenStore};

    use super::contract::server;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_keys_lists_the_records_of_its_prefix_only() {
        let url = server::redis_url();
        let Some(base) = server::reach("Redis", &url, RedisStore::connect(&url)).await else {
            return;
        };
        let prefix = format!("{}:", server::unique("idemk"));
        let own = base.clone().with_prefix(&prefix).unwrap();
        let nested = base.with_prefix(&format!("{prefix}in:")).unwrap();
        for (store, key) in [(&own, "mine"), (&nested, "theirs")] {
            let done: Result<u8, IdemError> =
                Call::new("PAY", key).run(store, async { Ok(1) }).await;
            done.unwrap();
        }
        // A record in progress: its business type's stuck index and the registry are written.
        let held = idem::store::ClaimRequest {
            biz: "HOLD",
            key: "h",
            fingerprint: None,
            lease: std::time::Duration::from_secs(30),
            ttl: std::time::Duration::from_secs(60),
        };
        own.claim(&held).await.unwrap();
        own.tokens()
            .issue(std::time::Duration::from_secs(60), None)
            .await
            .unwrap();
        let mut raw = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for junk in ["{junk", "{9:PAY:x}", "{3:PAY:x", "{x:PAY:y}"] {
            let _: () = redis::cmd("SET")
                .arg(format!("{prefix}{junk}"))
                .arg("x")
                .arg("EX")
                .arg(60)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        let want: BTreeSet<(String, String)> = [("HOLD", "h"), ("PAY", "mine")]
            .map(|(b, k)| (b.to_owned(), k.to_owned()))
            .into();
        assert_eq!(walk(&own, 1).await, want);
    }

    /// Every pair a walk in pages of `batch` lists.
    async fn walk(store: &RedisStore, batch: usize) -> BTreeSet<(String, String)> {
        let mut listed = BTreeSet::new();
        let mut after = None;
        for _ in 0..100_000 {
            let page = store.list_keys(after.as_deref(), batch).await.unwrap();
            assert!(page.keys.len() <= batch);
            listed.extend(page.keys);
            match page.next {
                Some(next) => after = Some(next),
                None => return listed,
            }
        }
        panic!("the walk did not end");
    }

    /// In a database of few keys Redis's table is small, so keys share its buckets and a SCAN
    /// reply often holds more keys than the `COUNT` a page of one asks for: the ones that do not
    /// fit wait in the cursor, and every record is listed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_a_reply_holds_past_the_page_come_on_the_next_pages() {
        let base = server::redis_url();
        // Database 15 (no other test writes there), unless the URL names a database itself.
        let url = match base.matches('/').count() {
            2 => format!("{}/15", base.trim_end_matches('/')),
            _ => base,
        };
        let Some(store) = server::reach("Redis", &url, RedisStore::connect(&url)).await else {
            return;
        };
        let store = store
            .with_prefix(&format!("{}:", server::unique("idemk")))
            .unwrap();
        let mut want = BTreeSet::new();
        for i in 0..200u32 {
            let key = format!("k{i}");
            let done: Result<u32, IdemError> = Call::new("FEW", &key)
                .ttl(std::time::Duration::from_secs(60))
                .run(&store, async move { Ok(i) })
                .await;
            done.unwrap();
            want.insert(("FEW".to_owned(), key));
        }
        assert_eq!(walk(&store, 1).await, want, "pages of 1");
        assert_eq!(walk(&store, 3).await, want, "pages of 3");
    }
}
