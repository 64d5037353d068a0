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
//! Time. Every store reads its own real clock plus the test clock's offset, so between two
//! calls the store's clock moves by the test clock's steps *and* by the real time that passed. The
//! reference keeps both: a time it knows is an interval (`At`), the test clock's moves plus the
//! real time since the case began, read before and after the call that read the store's clock.
//! Where a decision (expired or not, a lease live or not) falls inside that interval, the reference
//! accepts either answer and follows the one the store gave. Without this, a slow case (a loaded
//! machine, or a Redis with many other keys, whose sweeps under a moved test clock SCAN them all)
//! carries a record past its expiry in the store and not in the reference, and the store is blamed
//! for a record that was really due to go: `real_time_carries_a_record_past_its_expiry` below
//! makes that happen on purpose.
//!
//! Redis also deletes a key by itself once its expiry passes (`PEXPIREAT` at the later of the
//! record's expiry and its lease end, in real time: the test clock's offset at that write left
//! out); the reference knows when, and expects the key gone then.
//!
//! Cases per store: 64 (`PROPTEST_CASES` raises it; the figures are in docs/RELIABILITY.md).

use std::sync::Arc;
use std::time::Duration;

use idem::{
    IdemError, Store, TestClock,
    store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Status},
};
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
    /// Sleep this many milliseconds of real time (never generated: the fixed cases use it to put
    /// real time between two steps on purpose).
    Sleep(u64),
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

/// A reading of the store's clock, as the reference knows it: somewhere in `lo..=hi` ms since the
/// case began (the test clock's moves plus the real time that had passed before and after the
/// call that read it, widened by the clocks' rounding and rates).
#[derive(Debug, Clone, Copy, PartialEq)]
struct At {
    lo: i64,
    hi: i64,
}

impl At {
    fn plus(self, ms: i64) -> At {
        At {
            lo: self.lo + ms,
            hi: self.hi + ms,
        }
    }

    fn max(self, other: At) -> At {
        At {
            lo: self.lo.max(other.lo),
            hi: self.hi.max(other.hi),
        }
    }
}

/// Whether `a <= b`: `Some` when every pair of times in the two intervals agrees, `None` when the
/// real time leaves it open (the store may have found either).
fn at_or_before(a: At, b: At) -> Option<bool> {
    if a.hi <= b.lo {
        Some(true)
    } else if a.lo > b.hi {
        Some(false)
    } else {
        None
    }
}

/// The reference: one record per key.
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
    lease_until: At,
    expire_at: At,
    /// The test clock's offset (ms) when the store last set the key's own expiry (Redis: every
    /// claim, mark but a fail, renewal and release); Redis deletes the key at the later of
    /// `expire_at` and `lease_until` less that offset, in real time.
    expiry_offset: i64,
}

impl Rec {
    /// Expired by the store's clock at `now`: its TTL passed and no live lease.
    fn expired(&self, now: At) -> Option<bool> {
        let past = at_or_before(self.expire_at, now);
        let live = match self.status {
            Status::Processing => at_or_before(self.lease_until, now).map(|ended| !ended),
            _ => Some(false),
        };
        match (past, live) {
            (Some(false), _) | (_, Some(true)) => Some(false),
            (Some(true), Some(false)) => Some(true),
            _ => None,
        }
    }

    /// Whether Redis has deleted the key by itself at `now`, when the test clock's offset is
    /// `offset` (the key's real expiry, moved onto the reference's scale).
    fn deleted_by_redis(&self, now: At, offset: i64) -> Option<bool> {
        let due = self
            .expire_at
            .max(self.lease_until)
            .plus(offset - self.expiry_offset);
        at_or_before(due, now)
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

struct Reference {
    /// How far the test clock moved (ms).
    moved: i64,
    /// When the case began, on the real clock.
    began: std::time::Instant,
    recs: [Option<Rec>; 2],
    /// The largest fence handed out per key.
    last_fence: [u64; 2],
}

impl Reference {
    fn new() -> Self {
        Reference {
            moved: 0,
            began: std::time::Instant::now(),
            recs: [None, None],
            last_fence: [0; 2],
        }
    }

    /// The real time since the case began, in µs.
    fn real(&self) -> i64 {
        self.began.elapsed().as_micros() as i64
    }

    /// The store's clock during a call that began at `before` and returned at `after` (µs of real
    /// time): the test clock's moves plus that real time, widened by 2 ms of rounding and by a
    /// thousandth of the time the case ran (the store's clock and this process's may run at
    /// slightly different rates).
    fn at(&self, before: i64, after: i64) -> At {
        let slack = 2 + after / 1_000_000;
        At {
            lo: self.moved + before.div_euclid(1000) - slack,
            hi: self.moved + after.div_euclid(1000) + 1 + slack,
        }
    }

    /// Every answer the store may give a claim at `now`: one, or several where the real time
    /// leaves an expiry or a lease end open.
    fn claim(&self, key: usize, fp: Option<&str>, now: At) -> Vec<Expect> {
        let Some(rec) = &self.recs[key] else {
            return vec![Expect::Acquire(1, Acquired::Fresh)];
        };
        let mut may = Vec::new();
        let expired = rec.expired(now);
        if expired != Some(false) {
            may.push(Expect::Acquire(1, Acquired::Fresh));
        }
        if expired == Some(true) {
            return may;
        }
        let same = match (&rec.fingerprint, fp) {
            (Some(stored), Some(asked)) => stored == asked,
            _ => true,
        };
        match rec.status {
            Status::Failed => may.push(Expect::Acquire(
                rec.attempt + 1,
                Acquired::RetryAfterFailure,
            )),
            Status::Succeeded if same => may.push(Expect::Replay(rec.snapshot.clone())),
            Status::Succeeded | Status::Processing if !same => may.push(Expect::Mismatch),
            Status::Processing => {
                let ended = at_or_before(rec.lease_until, now);
                if ended != Some(true) {
                    may.push(Expect::InProgress);
                }
                if ended != Some(false) {
                    may.push(Expect::Acquire(rec.attempt + 1, Acquired::TakeOver));
                }
            }
            Status::Succeeded => unreachable!(),
        }
        may
    }

    #[allow(clippy::too_many_arguments)]
    fn acquired(
        &mut self,
        key: usize,
        claim: &Claim,
        fp: Option<&str>,
        now: At,
        lease: i64,
        ttl: i64,
        fresh: bool,
    ) {
        let expire_at = match &self.recs[key] {
            Some(old) if !fresh => old.expire_at.max(now.plus(lease)),
            _ => now.plus(ttl),
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
            lease_until: now.plus(lease),
            expire_at,
            expiry_offset: self.moved,
        });
        self.last_fence[key] = claim.fence.get();
    }

    /// Whether a mark or a save refused at `now` (`LeaseLost`) may be: the claim no longer `held`,
    /// or, on Redis, the key deleted by the server at its real expiry (or maybe so), which takes
    /// no mark; then the record is gone.
    fn refused(&mut self, key: usize, held: bool, redis: bool, now: At) -> bool {
        let gone = redis
            && matches!(&self.recs[key], Some(rec)
                if rec.deleted_by_redis(now, self.moved) != Some(false));
        if gone {
            self.recs[key] = None;
        }
        !held || gone
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
    let redis = store.backend().starts_with("redis");
    let mut model = Reference::new();
    // Each claim handed out: its key, the claim and its call's ttl (ms).
    let mut claims: Vec<(usize, Claim, i64)> = Vec::new();
    let start = clock.offset();
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
                let before = model.real();
                let got = store
                    .claim(&req)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                let now = model.at(before, model.real());
                let may = model.claim(key, fp.as_deref(), now);
                let matched = may.iter().find(|expect| match (expect, &got) {
                    (Expect::Acquire(attempt, how), ClaimOutcome::Acquired { claim, how: got }) => {
                        (claim.attempt, got) == (*attempt, how)
                    }
                    (Expect::Replay(snapshot), ClaimOutcome::Replay { snapshot: got }) => {
                        snapshot.as_deref().unwrap_or_default() == &got[..]
                    }
                    (Expect::Mismatch, ClaimOutcome::Mismatch)
                    | (Expect::InProgress, ClaimOutcome::InProgress { .. }) => true,
                    _ => false,
                });
                prop_assert!(
                    matched.is_some(),
                    "step {}: {:?} at {:?}: expected one of {:?}, store said {:?}",
                    step,
                    op,
                    now,
                    may,
                    got
                );
                if let ClaimOutcome::Acquired { claim, how } = &got {
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
                        now,
                        lease as i64 * 1000,
                        ttl as i64 * 1000,
                        fresh,
                    );
                    claims.push((key, *claim, ttl as i64 * 1000));
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
                let before = model.real();
                let got = store.save_steps(biz, KEYS[key], &claim, &bytes).await;
                let now = model.at(before, model.real());
                match got {
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
                        let refused = model.refused(key, held, redis, now);
                        prop_assert!(
                            refused,
                            "step {}: {:?} refused a claim that holds",
                            step,
                            op
                        );
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
                let before = model.real();
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
                let now = model.at(before, model.real());
                match got {
                    Ok(()) => {
                        prop_assert!(
                            held,
                            "step {}: {:?} accepted a claim the store no longer holds",
                            step,
                            op
                        );
                        let moved = model.moved;
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
                                    rec.expire_at = rec.expire_at.max(now.plus(ttl));
                                    rec.expiry_offset = moved;
                                }
                            }
                            Op::Fail(_) => {
                                // The saved steps stay, for a retry of the same payload.
                                rec.status = Status::Failed;
                                rec.snapshot = None;
                            }
                            Op::Renew(_, secs) => {
                                rec.lease_until = now.plus(secs as i64 * 1000);
                                rec.expire_at = rec.expire_at.max(rec.lease_until);
                                rec.expiry_offset = moved;
                            }
                            Op::Release(_) => {
                                rec.lease_until = now;
                                rec.expire_at = rec.expire_at.max(now);
                                rec.expiry_offset = moved;
                            }
                            _ => unreachable!(),
                        }
                    }
                    Err(IdemError::LeaseLost { .. }) => {
                        let refused = model.refused(key, held, redis, now);
                        prop_assert!(
                            refused,
                            "step {}: {:?} refused a claim that holds",
                            step,
                            op
                        );
                    }
                    Err(e) => prop_assert!(false, "step {}: {}", step, e),
                }
            }
            Op::Sweep => {
                let before = model.real();
                let swept = store
                    .sweep_expired(100)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let now = model.at(before, model.real());
                // A record counts when it expired and the sweep found it (on Redis, one the
                // server already deleted by itself is not found).
                let (mut least, mut most) = (0, 0);
                for rec in model.recs.iter().flatten() {
                    let expired = rec.expired(now);
                    let found = if redis {
                        rec.deleted_by_redis(now, model.moved).map(|gone| !gone)
                    } else {
                        Some(true)
                    };
                    if expired == Some(true) && found == Some(true) {
                        least += 1;
                    }
                    if expired != Some(false) && found != Some(false) {
                        most += 1;
                    }
                }
                prop_assert!(
                    (least..=most).contains(&swept),
                    "step {}: sweep at {:?} deleted {}, expected {}..={}",
                    step,
                    now,
                    swept,
                    least,
                    most
                );
                for (name, slot) in KEYS.iter().zip(model.recs.iter_mut()) {
                    let expired = match slot {
                        Some(rec) => rec.expired(now),
                        None => continue,
                    };
                    // Where the real time left it open, the store's record says which it was.
                    let gone = match expired {
                        Some(gone) => gone,
                        None => store
                            .load(biz, name)
                            .await
                            .map_err(|e| TestCaseError::fail(e.to_string()))?
                            .is_none(),
                    };
                    if gone {
                        *slot = None;
                    }
                }
            }
            Op::Advance(secs) => {
                clock.advance(Duration::from_secs(secs));
                model.moved += secs as i64 * 1000;
            }
            Op::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
        // The stored records agree with the reference.
        prop_assert_eq!((clock.offset() - start).as_millis() as i64, model.moved);
        for (key, name) in KEYS.iter().enumerate() {
            let before = model.real();
            let got = store
                .load(biz, name)
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let now = model.at(before, model.real());
            // Redis deletes a key by itself at its real expiry: where that has come (or may
            // have), the reference lets it go too.
            if redis && let Some(rec) = &model.recs[key] {
                match rec.deleted_by_redis(now, model.moved) {
                    Some(true) => model.recs[key] = None,
                    None if got.is_none() => model.recs[key] = None,
                    _ => {}
                }
            }
            let expected = &model.recs[key];
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
                        name
                    );
                    // The store's times are on its own clock, whose origin the reference does not
                    // know: their difference is what can be compared.
                    let gap = g.expire_at_ms - g.lease_until_ms;
                    let (least, most) = (
                        e.expire_at.lo - e.lease_until.hi,
                        e.expire_at.hi - e.lease_until.lo,
                    );
                    prop_assert!(
                        (least..=most).contains(&gap),
                        "step {}: expiry less lease end of {}: {} ms, expected {}..={} ({:?} against {:?})",
                        step,
                        name,
                        gap,
                        least,
                        most,
                        g,
                        e
                    );
                }
                _ => prop_assert!(
                    false,
                    "step {}: record {}: expected {:?}, store has {:?}",
                    step,
                    name,
                    expected,
                    got
                ),
            }
        }
    }
    Ok(())
}

/// The deterministic case behind a failure the Redis store's test once showed under load: the
/// store's clock runs in real time beside the test clock. A claim (lease 10 s, ttl 15 s), the test
/// clock moved 14 s (the lease ended, the ttl has not), then 1.1 s of real time: by the store's
/// clock the record expired, so the next claim is a new life (attempt 1), not a takeover. A
/// reference that counted only the test clock's moves expected the takeover (attempt 2).
fn real_time_carries_a_record_past_its_expiry() -> Vec<Op> {
    let claim = |ttl| Op::Claim {
        key: 0,
        fp: None,
        lease: 10,
        ttl,
    };
    vec![
        claim(15),
        Op::SaveSteps(0, 1),
        Op::Advance(14),
        Op::Sleep(1100),
        claim(30),
        Op::Complete(1),
    ]
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

/// Runs [`real_time_carries_a_record_past_its_expiry`] on `store` and checks that its second claim
/// was the new life the store's clock made it.
async fn past_its_expiry_in_real_time(store: Arc<dyn Store>, clock: TestClock) {
    run(
        store.clone(),
        clock,
        real_time_carries_a_record_past_its_expiry(),
    )
    .await
    .unwrap();
    let rec = store
        .load("PROP", KEYS[0])
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(
        (rec.status, rec.attempt, rec.steps),
        (Status::Succeeded, 1, None),
        "the claim after the record's expiry by the store's clock starts a new life"
    );
}

proptest! {
    #![proptest_config(config())]

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
            let store = sqlite(&clock).await;
            run(store, clock, ops).await
        })?;
    }
}

async fn sqlite(clock: &TestClock) -> Arc<dyn Store> {
    let store = idem::SqliteStore::in_memory()
        .await
        .unwrap()
        .with_test_clock(clock.clone());
    store.migrate().await.unwrap();
    Arc::new(store)
}

#[test]
fn memory_store_expires_in_real_time() {
    let clock = TestClock::new();
    let store = Arc::new(idem::MemoryStore::new().with_test_clock(clock.clone()));
    rt().block_on(past_its_expiry_in_real_time(store, clock));
}

#[test]
fn sqlite_store_expires_in_real_time() {
    rt().block_on(async {
        let clock = TestClock::new();
        past_its_expiry_in_real_time(sqlite(&clock).await, clock).await
    });
}

#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
#[path = "contract/server.rs"]
mod server;

#[cfg(feature = "redis")]
mod redis_store {
    use super::*;

    use super::server;

    /// A store under a prefix of its own, or `None` (one skip line) when Redis does not answer.
    async fn connect(clock: &TestClock) -> Option<Arc<dyn Store>> {
        let url = server::redis_url();
        let store = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
        let prefix = format!("{}:", server::unique("idemp"));
        Some(Arc::new(
            store
                .with_test_clock(clock.clone())
                .with_prefix(&prefix)
                .unwrap(),
        ))
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn redis_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
            rt().block_on(async {
                let clock = TestClock::new();
                let Some(store) = connect(&clock).await else {
                    return Ok(());
                };
                run(store, clock, ops).await
            })?;
        }
    }

    #[test]
    fn redis_store_expires_in_real_time() {
        rt().block_on(async {
            let clock = TestClock::new();
            if let Some(store) = connect(&clock).await {
                past_its_expiry_in_real_time(store, clock).await;
            }
        });
    }
}

#[cfg(feature = "redis")]
#[path = "support/redis_cluster.rs"]
mod cluster;
#[cfg(feature = "redis")]
#[path = "support/redis_server.rs"]
mod redis_server;

/// The same property on a 3-master Redis Cluster this test starts (each case under its own
/// prefix), where records of one business type spread over the nodes and the sweep walks each.
#[cfg(feature = "redis")]
mod redis_cluster_store {
    use super::*;
    use crate::cluster;

    async fn connect(urls: &[String], clock: &TestClock) -> Arc<dyn Store> {
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let store = idem::RedisClusterStore::connect(&urls).await.unwrap();
        let prefix = format!("{}:", super::server::unique("idempc"));
        Arc::new(
            store
                .with_test_clock(clock.clone())
                .with_prefix(&prefix)
                .unwrap(),
        )
    }

    #[test]
    fn redis_cluster_store_follows_the_reference() {
        let Some(cluster) = cluster::Cluster::start() else {
            return;
        };
        let urls = cluster.urls();
        let rt = rt();
        rt.block_on(async {
            let clock = TestClock::new();
            past_its_expiry_in_real_time(connect(&urls, &clock).await, clock).await;
        });
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            source_file: Some(file!()),
            ..config()
        });
        runner
            .run(&prop::collection::vec(op(), 1..40), |ops| {
                rt.block_on(async {
                    let clock = TestClock::new();
                    run(connect(&urls, &clock).await, clock, ops).await
                })
            })
            .unwrap();
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

    /// A store on `table` (made and emptied), or `None` (one skip line) when Postgres does not
    /// answer.
    async fn connect(table: &str) -> Option<idem::PgStore> {
        let url = server::pg_url();
        let connect = idem::PgStore::builder()
            .table(table)
            .unwrap()
            .token_table(&format!("{table}_tok"))
            .unwrap()
            .max_connections(2)
            .acquire_timeout(std::time::Duration::from_secs(3))
            .connect(&url);
        let store = server::reach("Postgres", &url, connect).await?;
        store.migrate().await.unwrap();
        idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!("TRUNCATE {table}")))
            .execute(store.pool())
            .await
            .unwrap();
        Some(store)
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn postgres_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
            if UNREACHABLE.load(Ordering::Relaxed) {
                return Ok(());
            }
            rt().block_on(async {
                let Some(store) = connect(&TABLE).await else {
                    UNREACHABLE.store(true, Ordering::Relaxed);
                    return Ok(());
                };
                let clock = TestClock::new();
                let out = run(Arc::new(store.clone().with_test_clock(clock.clone())), clock, ops).await;
                store.pool().close().await;
                out
            })?;
        }
    }

    #[test]
    fn postgres_store_expires_in_real_time() {
        rt().block_on(async {
            let Some(store) = connect(&format!("{}_rt", *TABLE)).await else {
                return;
            };
            let clock = TestClock::new();
            past_its_expiry_in_real_time(Arc::new(store.with_test_clock(clock.clone())), clock)
                .await;
        });
    }
}

#[cfg(feature = "mysql")]
mod mysql_store {
    use super::*;

    use super::server;

    /// A store on a table of its own, or `None` (one skip line) when MariaDB does not answer.
    async fn connect(clock: &TestClock) -> Option<idem::MySqlStore> {
        let url = server::mysql_url();
        let connect = idem::MySqlStore::connect_with(&url, 2, Duration::from_secs(2));
        let store = server::reach("MySQL", &url, connect).await?;
        let store = store
            .with_table(&server::unique("idem_prop"))
            .unwrap()
            .with_test_clock(clock.clone());
        store.migrate().await.unwrap();
        Some(store)
    }

    async fn drop_table(store: &idem::MySqlStore) {
        idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(format!(
            "DROP TABLE {}",
            store.table()
        )))
        .execute(store.pool())
        .await
        .unwrap();
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn mysql_store_follows_the_reference(ops in prop::collection::vec(op(), 1..40)) {
            rt().block_on(async {
                let clock = TestClock::new();
                let Some(store) = connect(&clock).await else {
                    return Ok(());
                };
                let outcome = run(Arc::new(store.clone()), clock, ops).await;
                drop_table(&store).await;
                outcome
            })?;
        }
    }

    #[test]
    fn mysql_store_expires_in_real_time() {
        rt().block_on(async {
            let clock = TestClock::new();
            let Some(store) = connect(&clock).await else {
                return;
            };
            past_its_expiry_in_real_time(Arc::new(store.clone()), clock).await;
            drop_table(&store).await;
        });
    }
}
