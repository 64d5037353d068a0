//! A model check of the claim protocol (stateright), over the decision table the stores run.
//!
//! Modelled: N callers and one key; a store clock that advances in ticks; the store's operations
//! (claim — which inserts, replays, refuses or takes over —, complete, fail, renew, sweep; TTL expiry
//! through the clock); callers that crash while holding a claim, or stall (any caller may sit still
//! while the clock runs). The claim decision, the takeover's new fence/lease/expiry and the
//! expiry test are the store's own code (`decide`, `taken`, `RecordState::is_expired`); only
//! complete/fail/renew are written here, as the contract states them (they change the record only
//! while it is PROCESSING under the caller's fence, and a complete moves the expiry to at least
//! now + ttl).
//!
//! With `effects`, the body's business effect is a step of its own, counted outside the store; with
//! `recover`, a takeover asks the engine's recover fn first (it reads that count). Without recover
//! the checker finds a dead or paused holder's effect run again by a takeover; with it, no effect
//! happens twice, but for one made by a holder that woke past its lease.
//!
//! With `steps`, the body is two recovery points, A then B (`idem::step`), each with its own
//! business effect counted outside the store (`runs`), and what the downstream system applied
//! (`applied`; with `dedup` it applies a step once per step key, as an API given `idem::steps::step_key`
//! as its idempotency key does). After a step's effect the holder saves it (`Save`, an action of
//! its own, so a crash, a pause past the lease or, with `save_errors`, a failed save can fall
//! between the effect and the save). The save is fenced: it lands only while the record is
//! PROCESSING under the caller's fence, else the call stops (`LeaseLost`). A claim that takes the
//! record reads its saved steps (as the engine does before the first step) and skips their effects.
//! The record's saved steps follow the store rules: a take keeps them when the store's own
//! `keeps_steps` says so (a takeover, a retry after a failure: not a new life; the model has one
//! payload), a fail or a renewal keeps them, a complete replaces them with the result, a sweep or a
//! new life drops them. Ground truth is kept apart from the record's field: `landed`, the steps
//! whose save landed in this life of the record, and each holder's `before`, what had landed when
//! it claimed. The checker finds that a step whose save landed never runs in a later holder, that
//! no save lands on another claim's record, and that a holder skips only steps saved in this life;
//! and it finds a step's effect run twice: without steps by a takeover after the holder died after
//! it; with steps only when that run's save never landed (its holder died, paused, or its save
//! failed) or by a holder that paused before the step and woke after a takeover (no fence stops an
//! effect, only its save). With `dedup` nothing is applied twice downstream. `StepRules` other than
//! `Store` each break one rule (an unfenced save, a take that drops the steps, a new life that
//! keeps them); the checker finds each, so those checks are known to bite.
//!
//! `Rules::Before` is the decision order before the lease was checked first (TTL checked before the lease,
//! a takeover keeping the old expiry, the attempt number as the fence), with a complete that keeps
//! the claim's expiry (as the mark once did); the checker finds its counterexamples, so the check is
//! known to bite.

use std::time::Duration;

use super::Status;
use super::decide::{Decision, RecordState, decide, taken};

mod bounds;
mod model;
mod properties;
mod steps;

pub(crate) use bounds::*;
pub(crate) use properties::step_property;
use steps::StepFault;
pub(crate) use steps::{Step, StepRules, Steps};

/// One tick of the store clock.
const TICK_MS: i64 = 1000;

/// Which decision table the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Rules {
    /// The stores' code.
    Current,
    /// The decision order before the lease was checked first.
    Before,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Rec {
    status: Status,
    attempt: u32,
    fence: u64,
    lease_until: i64,
    expire_at: i64,
    /// The model's own name for the claim that holds (or last held) the record: ground truth,
    /// independent of fences.
    holder: u32,
    /// The claim whose complete stored the result.
    result_by: Option<u32>,
    /// When that complete landed (store clock).
    marked_at: Option<i64>,
    /// The saved steps (bits of [`Step::bit`]): the store's field.
    steps: u8,
}

impl Rec {
    fn state(&self) -> RecordState<'_> {
        RecordState {
            status: self.status,
            fingerprint: None,
            lease_until_ms: self.lease_until,
            expire_at_ms: self.expire_at,
            // The model keeps every result as long as its record.
            result_until_ms: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Caller {
    /// May call; `claims` calls left (bounds retries after "in progress").
    Ready { claims: u8 },
    /// Holds a claim and runs the body (its side effect happens here); `claims` calls left after.
    InBody {
        claim: u32,
        fence: u64,
        lease_until: i64,
        claims: u8,
        /// The body's business effect happened (modelled with [`Protocol::effects`]).
        did_effect: bool,
        /// The steps the claim found saved (it skips them).
        known: u8,
        /// The steps whose save had landed in this life of the record when the claim took it
        /// (ground truth, apart from the record's field).
        before: u8,
        /// The steps whose effect this holder ran.
        ran: u8,
        /// The steps whose save this holder landed.
        saved: u8,
    },
    /// Died; never acts again.
    Crashed,
    /// Got its answer.
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct State {
    now: i64,
    rec: Option<Rec>,
    callers: Vec<Caller>,
    next_claim: u32,
    /// Set when a step broke a rule that only the step itself can see.
    broken: Option<&'static str>,
    /// How many times the business effect happened (ground truth, outside the store).
    effects: u8,
    /// An effect was made by a holder whose lease had ended (a paused holder woke up): recover
    /// cannot undo that; fenced downstream writes or step keys are what stop it.
    stale_effect: bool,
    /// How many times each step's effect ran (ground truth, outside the store), by [`Step::index`].
    runs: [u8; 2],
    /// How many times the downstream system applied each step (with [`Protocol::dedup`], once
    /// per step key at most).
    applied: [u8; 2],
    /// The steps whose save landed in the record's current life (ground truth, apart from the
    /// record's field: cleared only when the record is swept or taken after it expired).
    landed: u8,
    /// The rules of the steps an action broke (bits of [`StepFault::bit`]).
    faults: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Tick,
    Sweep,
    Claim(usize),
    Complete(usize),
    Fail(usize),
    Renew(usize),
    Crash(usize),
    /// The body's business effect (with [`Protocol::effects`]).
    Effect(usize),
    /// The effect of a step (with [`Protocol::steps`]).
    Work(usize, Step),
    /// The save of a step whose effect ran: fenced, or the call stops (`LeaseLost`).
    Save(usize, Step),
}

/// The protocol with `callers` callers, a lease and TTL in ticks, and the clock bounded.
#[derive(Clone)]
pub(crate) struct Protocol {
    pub rules: Rules,
    pub callers: usize,
    pub claims_each: u8,
    pub lease: i64,
    pub ttl: i64,
    pub max_tick: i64,
    /// Models the body's business effect as a step of its own (a complete only after it, a fail
    /// only before it), counted outside the store.
    pub effects: bool,
    /// A takeover asks recover first: when the effect already happened, the recovered result is
    /// stored and the body does not run (the engine's `Call::recover`).
    pub recover: bool,
    /// The body may fail (return an error before its effect, or before a step's effect): the
    /// caller marks the record FAILED and may retry.
    pub fails: bool,
    /// The body as two steps (A then B) instead, with or without saving them.
    pub steps: Steps,
    /// A save may fail (the store unreachable for the rest of the lease): the step returns the
    /// error, the body with it, and the call fails (a `Fail` after the effect, before the save).
    pub save_errors: bool,
    /// The downstream system deduplicates each step by its step key (`idem::steps::step_key`: the same
    /// in every attempt, every life of the record): it applies a step's effect once, however many
    /// times the step runs.
    pub dedup: bool,
}

impl Protocol {
    fn lease(&self) -> Duration {
        Duration::from_millis((self.lease * TICK_MS) as u64)
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis((self.ttl * TICK_MS) as u64)
    }

    fn expired(&self, rec: &Rec, now: i64) -> bool {
        match self.rules {
            Rules::Current => rec.state().is_expired(now),
            Rules::Before => rec.expire_at <= now,
        }
    }

    fn decide(&self, rec: &Rec, now: i64) -> Decision {
        match self.rules {
            Rules::Current => decide(&rec.state(), None, now),
            Rules::Before => {
                if rec.expire_at <= now {
                    return Decision::Take {
                        how: super::Acquired::Fresh,
                        reset: true,
                    };
                }
                // The rest of the table was already right.
                decide(
                    &RecordState {
                        expire_at_ms: i64::MAX,
                        ..rec.state()
                    },
                    None,
                    now,
                )
            }
        }
    }

    /// The record after a take (or an insert when `old` is `None`), as the store writes it.
    fn take(&self, old: Option<&Rec>, reset: bool, now: i64, claim: u32) -> Rec {
        let (attempt, fence, lease_until, expire_at) = match self.rules {
            Rules::Current => {
                let t = taken(
                    old.map(|r| (r.attempt, r.fence, r.expire_at)),
                    reset,
                    now * 1000,
                    self.lease(),
                    self.ttl(),
                );
                (t.attempt, t.fence, t.lease_until_ms, t.expire_at_ms)
            }
            Rules::Before => {
                // attempt + 1 on every take, a fresh record at attempt 1, the attempt as fence, and
                // the old expiry kept unless the record had expired.
                let attempt = old.map_or(1, |r| r.attempt + 1);
                let expire_at = match old {
                    Some(r) if !reset => r.expire_at,
                    _ => now + self.ttl * TICK_MS,
                };
                (
                    attempt,
                    u64::from(attempt),
                    now + self.lease * TICK_MS,
                    expire_at,
                )
            }
        };
        Rec {
            status: Status::Processing,
            attempt,
            fence,
            lease_until,
            expire_at,
            holder: claim,
            result_by: None,
            marked_at: None,
            steps: self.kept_steps(old, reset),
        }
    }

    /// Whether `fence` holds the record (the contract's condition for complete, fail, renew).
    fn holds(rec: &Option<Rec>, fence: u64) -> bool {
        matches!(rec, Some(r) if r.fence == fence && r.status == Status::Processing)
    }
}

#[cfg(test)]
mod checks;
