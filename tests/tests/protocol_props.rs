//! Differential property tests of the claim protocol: random sequences of claims, completes,
//! fails, renewals, releases, saves of recovery points (`Store::save_steps`), sweeps and clock
//! advances, run against every store that is built, each step compared with a small reference
//! model written here from the decision table and the steps contract (independently of the stores' decision
//! code). A failing sequence shrinks to a minimal case; proptest keeps it in
//! `proptest-regressions/` and replays it first on every later run.
//!
//! The reference keeps each record's saved steps: a save lands only while the record is PROCESSING
//! under the saving claim's fence; a takeover and a retry after a failure keep them unless both
//! payloads are fingerprinted and differ; a fresh record, or one that expired and starts a new
//! life, starts without; a fail keeps them and a complete replaces them with the result. Every
//! save's outcome (saved or `LeaseLost`) and every `load`ed record's `steps` and `snapshot` are
//! compared.
//!
//! Cases per store: 64 (`PROPTEST_CASES` raises it; the figures are in docs/RELIABILITY.md).

use std::sync::Arc;
use std::time::Duration;

use idem::{Acquired, Claim, ClaimOutcome, ClaimRequest, IdemError, Status, Store, TestClock};
use proptest::prelude::*;

const KEYS: [&str; 2] = ["a", "b"];

#[derive(Debug, Clone)]
enum Op {
    /// Claim `key` with a fingerprint (or none), a lease and a TTL in seconds.
    Claim {
        key: usize,
        fp: Option<u8>,
        lease: u64,
        ttl: u64,
    },
    /// Complete / fail / renew with the `n`-th claim handed out so far (modulo); a complete passes
    /// that claim's ttl, as the call that made it does.
    Complete(usize),
    Fail(usize),
    Renew(usize, u64),
    /// Give the claim up with its lease ended now (what a failed recover does).
    Release(usize),
    /// Save the steps `{"s":<tag>}` with the `n`-th claim handed out so far (modulo); few tags,
    /// so the same bytes are saved again now and then.
    SaveSteps(usize, u8),
    Sweep,
    /// Move the store's clock forward by this many seconds.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Mostly fingerprinted, so a retry with another payload (which drops the saved steps)
        // comes up often enough.
        4 => (0..KEYS.len(), prop::option::weighted(0.75, 0u8..2), prop_oneof![Just(5u64), Just(10), Just(40)], prop_oneof![Just(15u64), Just(30)])
            .prop_map(|(key, fp, lease, ttl)| Op::Claim { key, fp, lease, ttl }),
        2 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Fail),
        1 => (any::<usize>(), prop_oneof![Just(5u64), Just(20)]).prop_map(|(n, s)| Op::Renew(n, s)),
        1 => any::<usize>().prop_map(Op::Release),
        3 => (any::<usize>(), 0u8..3).prop_map(|(n, tag)| Op::SaveSteps(n, tag)),
        1 => Just(Op::Sweep),
        3 => prop_oneof![Just(1u64), Just(4), Just(5), Just(10), Just(16), Just(31)].prop_map(Op::Advance),
    ]
}

/// The reference: one record per key, times in ms since the case began.
#[derive(Debug, Clone, PartialEq)]
struct Rec {
    status: Status,
    attempt: u32,
    fence: u64,
    fingerprint: Option<String>,
    /// The result, once SUCCEEDED.
    snapshot: Option<Vec<u8>>,
    /// The saved recovery points of an unfinished record (never set once SUCCEEDED).
    steps: Option<Vec<u8>>,
    lease_until: i64,
    expire_at: i64,
}

impl Rec {
    fn expired(&self, now: i64) -> bool {
        let live_lease = self.status == Status::Processing && self.lease_until > now;
        self.expire_at <= now && !live_lease
    }
}

#[derive(Debug, PartialEq)]
enum Expect {
    /// A new claim: attempt and how (the fence is the store's; checked to grow).
    Acquire(u32, Acquired),
    Replay(Option<Vec<u8>>),
    Mismatch,
    InProgress,
}

#[derive(Default)]
struct Reference {
    now: i64,
    recs: [Option<Rec>; 2],
    /// The largest fence handed out per key.
    last_fence: [u64; 2],
}

impl Reference {
    fn claim(&self, key: usize, fp: Option<&str>) -> Expect {
        let Some(rec) = &self.recs[key] else {
            return Expect::Acquire(1, Acquired::Fresh);
        };
        if rec.expired(self.now) {
            return Expect::Acquire(1, Acquired::Fresh);
        }
        let same = match (&rec.fingerprint, fp) {
            (Some(stored), Some(asked)) => stored == asked,
            _ => true,
        };
        match rec.status {
            Status::Failed => Expect::Acquire(rec.attempt + 1, Acquired::RetryAfterFailure),
            Status::Succeeded if same => Expect::Replay(rec.snapshot.clone()),
            Status::Succeeded | Status::Processing if !same => Expect::Mismatch,
            Status::Processing if rec.lease_until > self.now => Expect::InProgress,
            Status::Processing => Expect::Acquire(rec.attempt + 1, Acquired::TakeOver),
            Status::Succeeded => unreachable!(),
        }
    }

    fn acquired(
        &mut self,
        key: usize,
        claim: &Claim,
        fp: Option<&str>,
        lease: i64,
        ttl: i64,
        fresh: bool,
    ) {
        let now = self.now;
        let expire_at = match &self.recs[key] {
            Some(old) if !fresh => old.expire_at.max(now + lease),
            _ => now + ttl,
        };
        // A takeover or a retry (not a new life) resumes from the saved steps, unless the record
        // was made from another payload (both fingerprinted and different): that starts afresh.
        let steps = match &self.recs[key] {
            Some(old) if !fresh => match (&old.fingerprint, fp) {
                (Some(stored), Some(asked)) if stored != asked => None,
                _ => old.steps.clone(),
            },
            _ => None,
        };
        self.recs[key] = Some(Rec {
            status: Status::Processing,
            attempt: claim.attempt,
            fence: claim.fence.get(),
            fingerprint: fp.map(str::to_owned),
            snapshot: None,
            steps,
            lease_until: now + lease,
            expire_at,
        });
        self.last_fence[key] = claim.fence.get();
    }

    /// Whether a mark by `claim` that leaves the record `done` is accepted: the record is
    /// PROCESSING under its fence, or already `done` under it (the same mark again).
    fn holds(&self, key: usize, claim: &Claim, done: Status) -> bool {
        matches!(&self.recs[key], Some(r) if r.fence == claim.fence.get()
            && (r.status == Status::Processing || r.status == done))
    }
}

/// Runs `ops` against a fresh store and the reference, step by step.
async fn run(store: Arc<dyn Store>, clock: TestClock, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let biz = "PROP";
    let mut model = Reference::default();
    // Each claim handed out: its key, the claim and its call's ttl (ms).
    let mut claims: Vec<(usize, Claim, i64)> = Vec::new();
    let start = clock.offset();
    // The real time the case has run: the most two store-clock readings of it can differ by,
    // beyond the test clock's moves (a loaded machine, a sweep over a large server, a slow call).
    let real_start = std::time::Instant::now();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Claim {
                key,
                fp,
                lease,
                ttl,
            } => {
                let fp = fp.map(|f| format!("fp{f}"));
                let req = ClaimRequest {
                    biz,
                    key: KEYS[key],
                    fingerprint: fp.as_deref(),
                    lease: Duration::from_secs(lease),
                    ttl: Duration::from_secs(ttl),
                };
                let expect = model.claim(key, fp.as_deref());
                let got = store
                    .claim(&req)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                match (&expect, &got) {
                    (
                        Expect::Acquire(attempt, how),
                        ClaimOutcome::Acquired {
                            claim,
                            how: got_how,
                        },
                    ) => {
                        prop_assert_eq!(
                            (claim.attempt, got_how),
                            (*attempt, how),
                            "step {}: {:?}",
                            step,
                            op
                        );
                        prop_assert!(
                            claim.fence.get() > model.last_fence[key],
                            "step {}: fence {} does not grow past {}",
                            step,
                            claim.fence,
                            model.last_fence[key]
                        );
                        let fresh = *how == Acquired::Fresh;
                        model.acquired(
                            key,
                            claim,
                            fp.as_deref(),
                            lease as i64 * 1000,
                            ttl as i64 * 1000,
                            fresh,
                        );
                        claims.push((key, *claim, ttl as i64 * 1000));
                    }
                    (Expect::Replay(snapshot), ClaimOutcome::Replay { snapshot: got }) => {
                        prop_assert_eq!(
                            snapshot.as_deref().unwrap_or_default(),
                            &got[..],
                            "step {}",
                            step
                        );
                    }
                    (Expect::Mismatch, ClaimOutcome::Mismatch)
                    | (Expect::InProgress, ClaimOutcome::InProgress { .. }) => {}
                    _ => prop_assert!(
                        false,
                        "step {}: {:?}: expected {:?}, store said {:?}",
                        step,
                        op,
                        expect,
                        got
                    ),
                }
            }
            Op::SaveSteps(n, tag) => {
                if claims.is_empty() {
                    continue;
                }
                let (key, claim, _) = claims[n % claims.len()];
                let bytes = format!(r#"{{"s":{tag}}}"#).into_bytes();
                // Only while PROCESSING under the claim's fence (a FAILED or SUCCEEDED record
                // under the same fence refuses it, unlike a repeated mark).
                let held = matches!(&model.recs[key], Some(r) if r.fence == claim.fence.get()
                    && r.status == Status::Processing);
                match store.save_steps(biz, KEYS[key], &claim, &bytes).await {
                    Ok(()) => {
                        prop_assert!(
                            held,
                            "step {}: {:?} saved under a claim the store no longer holds",
                            step,
                            op
                        );
                        model.recs[key].as_mut().unwrap().steps = Some(bytes);
                    }
                    Err(IdemError::LeaseLost { .. }) => {
                        prop_assert!(!held, "step {}: {:?} refused a claim that holds", step, op)
                    }
                    Err(e) => prop_assert!(false, "step {}: {:?}: {}", step, op, e),
                }
            }
            Op::Complete(n) | Op::Fail(n) | Op::Renew(n, _) | Op::Release(n) => {
                if claims.is_empty() {
                    continue;
                }
                let (key, claim, ttl) = claims[n % claims.len()];
                let done = match op {
                    Op::Complete(_) => Status::Succeeded,
                    Op::Fail(_) => Status::Failed,
                    _ => Status::Processing,
                };
                let held = model.holds(key, &claim, done);
                let got = match op {
                    Op::Complete(_) => {
                        store
                            .complete(
                                biz,
                                KEYS[key],
                                &claim,
                                format!("r{step}").as_bytes(),
                                Duration::from_millis(ttl as u64),
                            )
                            .await
                    }
                    Op::Fail(_) => store.fail(biz, KEYS[key], &claim).await,
                    Op::Renew(_, secs) => {
                        store
                            .renew(biz, KEYS[key], &claim, Duration::from_secs(secs))
                            .await
                    }
                    Op::Release(_) => store.release(biz, KEYS[key], &claim).await,
                    _ => unreachable!(),
                };
                match got {
                    Ok(()) => {
                        prop_assert!(
                            held,
                            "step {}: {:?} accepted a claim the store no longer holds",
                            step,
                            op
                        );
                        let now = model.now;
                        let rec = model.recs[key].as_mut().unwrap();
                        match op {
                            Op::Complete(_) => {
                                // The first mark stores the result and lives a ttl from now at
                                // least; the same mark again changes nothing.
                                // The result replaces the saved steps.
                                if rec.status == Status::Processing {
                                    rec.status = Status::Succeeded;
                                    rec.snapshot = Some(format!("r{step}").into_bytes());
                                    rec.steps = None;
                                    rec.expire_at = rec.expire_at.max(now + ttl);
                                }
                            }
                            Op::Fail(_) => {
                                // The saved steps stay, for a retry of the same payload.
                                rec.status = Status::Failed;
                                rec.snapshot = None;
                            }
                            Op::Renew(_, secs) => {
                                rec.lease_until = now + secs as i64 * 1000;
                                rec.expire_at = rec.expire_at.max(rec.lease_until);
                            }
                            Op::Release(_) => {
                                rec.lease_until = now;
                                rec.expire_at = rec.expire_at.max(now);
                            }
                            _ => unreachable!(),
                        }
                        // A record released after its TTL has expired. Redis deletes a key at its
                        // expiry (the other stores keep the row for the sweeper); either way it
                        // counts as absent.
                        if matches!(op, Op::Release(_))
                            && store.backend().starts_with("redis")
                            && rec.expired(now)
                        {
                            model.recs[key] = None;
                        }
                    }
                    Err(IdemError::LeaseLost { .. }) => {
                        prop_assert!(!held, "step {}: {:?} refused a claim that holds", step, op)
                    }
                    Err(e) => prop_assert!(false, "step {}: {}", step, e),
                }
            }
            Op::Sweep => {
                let expected = model
                    .recs
                    .iter()
                    .filter(|r| matches!(r, Some(r) if r.expired(model.now)))
                    .count() as u64;
                let swept = store
                    .sweep_expired(100)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(swept, expected, "step {}: sweep", step);
                for rec in &mut model.recs {
                    if matches!(rec, Some(r) if r.expired(model.now)) {
                        *rec = None;
                    }
                }
            }
            Op::Advance(secs) => {
                clock.advance(Duration::from_secs(secs));
                model.now += secs as i64 * 1000;
            }
        }
        // The stored records agree with the reference (times within the real time that passed).
        prop_assert_eq!((clock.offset() - start).as_millis() as i64, model.now);
        for (key, expected) in model.recs.iter().enumerate() {
            let got = store
                .load(biz, KEYS[key])
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            match (expected, &got) {
                (None, None) => {}
                (Some(e), Some(g)) => {
                    prop_assert_eq!(
                        (
                            g.status,
                            g.attempt,
                            g.fence.get(),
                            &g.fingerprint,
                            &g.snapshot,
                            &g.steps
                        ),
                        (
                            e.status,
                            e.attempt,
                            e.fence,
                            &e.fingerprint,
                            &e.snapshot,
                            &e.steps
                        ),
                        "step {}: record {}",
                        step,
                        KEYS[key]
                    );
                    // Lease and expiry are set by the store's clock at different calls; the real time
                    // between them is the only difference allowed. It is bounded by the real time
                    // the case has run, measured, not by a guess of how fast this machine is (plus
                    // a millisecond of rounding on each side).
                    let drift = (g.expire_at_ms - g.lease_until_ms) - (e.expire_at - e.lease_until);
                    let ran = real_start.elapsed().as_millis() as i64 + 2;
                    prop_assert!(
                        drift.abs() <= ran,
                        "step {}: expiry vs lease of {}: {:?} against {:?}, a drift of {} ms in {} ms",
                        step,
                        KEYS[key],
                        g,
                        e,
                        drift,
                        ran
                    );
                }
                _ => prop_assert!(
                    false,
                    "step {}: record {}: expected {:?}, store has {:?}",
                    step,
                    KEYS[key],
                    expected,
                    got
                ),
            }
        }
    }
    Ok(())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn memory_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
        let clock = TestClock::new();
        let store: Arc<dyn Store> = Arc::new(idem::MemoryStore::new().with_test_clock(clock.clone()));
        rt().block_on(run(store, clock, ops))?;
    }

    #[test]
    fn sqlite_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
        rt().block_on(async {
            let clock = TestClock::new();
            let store = idem::SqliteStore::in_memory().await.unwrap().with_test_clock(clock.clone());
            store.migrate().await.unwrap();
            run(Arc::new(store), clock, ops).await
        })?;
    }
}

#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
#[path = "contract/server.rs"]
mod server;

#[cfg(feature = "redis")]
mod redis_store {
    use super::*;

    use super::server;

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
            ..ProptestConfig::default()
        })]

        #[test]
        fn redis_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
            rt().block_on(async {
                let url = server::url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
                let Some(store) = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await else {
                    return Ok(());
                };
                let clock = TestClock::new();
                let prefix = format!("{}:", server::unique("idemp"));
                let store = store.with_test_clock(clock.clone()).with_prefix(&prefix).unwrap();
                run(Arc::new(store), clock, ops).await
            })?;
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres_store {
    use super::server;
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// One table for this run's cases (emptied before each), so 64 cases do not make 64 tables.
    static TABLE: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| server::unique("idemp"));
    /// Set once the server did not answer: the other cases skip at once.
    static UNREACHABLE: AtomicBool = AtomicBool::new(false);

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
            ..ProptestConfig::default()
        })]

        #[test]
        fn postgres_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
            if UNREACHABLE.load(Ordering::Relaxed) {
                return Ok(());
            }
            rt().block_on(async {
                let url = server::url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
                let connect = idem::PgStore::builder()
                    .table(&TABLE)
                    .unwrap()
                    .token_table(&format!("{}_tok", *TABLE))
                    .unwrap()
                    .max_connections(2)
                    .acquire_timeout(std::time::Duration::from_secs(3))
                    .connect(&url);
                let Some(store) = server::reach("Postgres", &url, connect).await else {
                    UNREACHABLE.store(true, Ordering::Relaxed);
                    return Ok(());
                };
                store.migrate().await.unwrap();
                idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!("TRUNCATE {}", *TABLE)))
                    .execute(store.pool())
                    .await
                    .unwrap();
                let clock = TestClock::new();
                let out = run(Arc::new(store.clone().with_test_clock(clock.clone())), clock, ops).await;
                store.pool().close().await;
                out
            })?;
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql_store {
    use super::*;

    use super::server;

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
            ..ProptestConfig::default()
        })]

        #[test]
        fn mysql_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
            rt().block_on(async {
                let url = server::url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
                let connect = idem::MySqlStore::connect_with(&url, 2, Duration::from_secs(2));
                let Some(store) = server::reach("MySQL", &url, connect).await else {
                    return Ok(());
                };
                let clock = TestClock::new();
                let store = store
                    .with_table(&server::unique("idem_prop"))
                    .unwrap()
                    .with_test_clock(clock.clone());
                store.migrate().await.unwrap();
                let outcome = run(Arc::new(store.clone()), clock, ops).await;
                idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!("DROP TABLE {}", store.table())))
                    .execute(store.pool())
                    .await
                    .unwrap();
                outcome
            })?;
        }
    }
}
