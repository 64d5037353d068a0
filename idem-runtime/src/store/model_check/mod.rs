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
//! `Rules::Before` is the decision order before the fix of issue 6 (TTL checked before the lease,
//! a takeover keeping the old expiry, the attempt number as the fence), with a complete that keeps
//! the claim's expiry (before issue 20); the checker finds its counterexamples, so the check is
//! known to bite.

use std::time::Duration;

use stateright::{Model, Property};

use super::Status;
use super::decide::{Decision, RecordState, decide, taken};

/// One tick of the store clock.
const TICK_MS: i64 = 1000;

/// Which decision table the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Rules {
    /// The stores' code.
    Current,
    /// Before issue 6.
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
}

impl Rec {
    fn state(&self) -> RecordState<'_> {
        RecordState {
            status: self.status,
            fingerprint: None,
            lease_until_ms: self.lease_until,
            expire_at_ms: self.expire_at,
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
        }
    }

    /// Whether `fence` holds the record (the contract's condition for complete, fail, renew).
    fn holds(rec: &Option<Rec>, fence: u64) -> bool {
        matches!(rec, Some(r) if r.fence == fence && r.status == Status::Processing)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            rec: None,
            callers: vec![
                Caller::Ready {
                    claims: self.claims_each
                };
                self.callers
            ],
            next_claim: 1,
            broken: None,
            effects: 0,
            stale_effect: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.broken.is_some() {
            return;
        }
        if state.now < self.max_tick * TICK_MS {
            actions.push(Action::Tick);
        }
        if let Some(rec) = &state.rec
            && self.expired(rec, state.now)
        {
            actions.push(Action::Sweep);
        }
        for (i, caller) in state.callers.iter().enumerate() {
            match caller {
                Caller::Ready { claims } if *claims > 0 => actions.push(Action::Claim(i)),
                Caller::InBody { did_effect, .. } => {
                    actions.extend([Action::Renew(i), Action::Crash(i)]);
                    if !self.effects {
                        actions.extend([Action::Complete(i), Action::Fail(i)]);
                    } else if *did_effect {
                        actions.push(Action::Complete(i));
                    } else {
                        actions.extend([Action::Effect(i), Action::Fail(i)]);
                    }
                }
                _ => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let now = s.now;
        match action {
            Action::Tick => s.now += TICK_MS,
            Action::Sweep => s.rec = None,
            Action::Claim(i) => {
                let Caller::Ready { claims } = s.callers[i] else {
                    return None;
                };
                let claim = s.next_claim;
                let mut recovered = false;
                let next = match &s.rec {
                    None => Some(self.take(None, true, now, claim)),
                    Some(rec) => match self.decide(rec, now) {
                        Decision::Take { reset, how } => {
                            if rec.status == Status::Succeeded && rec.expire_at > now {
                                s.broken = Some("a repeat within the TTL ran the body");
                            }
                            // Recover looks the real business up: the effect count.
                            recovered =
                                self.recover && how == super::Acquired::TakeOver && s.effects > 0;
                            Some(self.take(Some(rec), reset, now, claim))
                        }
                        Decision::Replay => {
                            s.callers[i] = Caller::Done;
                            None
                        }
                        Decision::InProgress(_) | Decision::Mismatch => {
                            s.callers[i] = Caller::Ready { claims: claims - 1 };
                            None
                        }
                    },
                };
                if let Some(mut rec) = next {
                    s.next_claim += 1;
                    if recovered {
                        // Marked SUCCEEDED with the recovered result in the same step (the
                        // engine's complete under the takeover's fence); the body never runs.
                        rec.status = Status::Succeeded;
                        rec.result_by = Some(claim);
                        rec.marked_at = Some(now);
                        rec.expire_at = rec.expire_at.max(now + self.ttl * TICK_MS);
                        s.callers[i] = Caller::Done;
                    } else {
                        s.callers[i] = Caller::InBody {
                            claim,
                            fence: rec.fence,
                            lease_until: rec.lease_until,
                            claims: claims - 1,
                            did_effect: false,
                        };
                    }
                    s.rec = Some(rec);
                }
            }
            Action::Effect(i) => {
                let Caller::InBody {
                    ref mut did_effect,
                    lease_until,
                    ..
                } = s.callers[i]
                else {
                    return None;
                };
                *did_effect = true;
                s.effects += 1;
                if lease_until <= now {
                    s.stale_effect = true;
                }
            }
            Action::Complete(i) | Action::Fail(i) | Action::Renew(i) => {
                let Caller::InBody {
                    claim,
                    fence,
                    claims,
                    did_effect,
                    ..
                } = s.callers[i]
                else {
                    return None;
                };
                if Self::holds(&s.rec, fence) {
                    let rec = s.rec.as_mut().expect("held");
                    if rec.holder != claim {
                        s.broken =
                            Some("a stale holder's write was accepted (its fence was reused)");
                    }
                    match action {
                        Action::Complete(_) => {
                            rec.status = Status::Succeeded;
                            rec.result_by = Some(claim);
                            rec.marked_at = Some(now);
                            if self.rules == Rules::Current {
                                rec.expire_at = rec.expire_at.max(now + self.ttl * TICK_MS);
                            }
                            s.callers[i] = Caller::Done;
                        }
                        Action::Fail(_) => {
                            rec.status = Status::Failed;
                            s.callers[i] = Caller::Ready { claims };
                        }
                        _ => {
                            rec.lease_until = now + self.lease * TICK_MS;
                            rec.expire_at = rec.expire_at.max(rec.lease_until);
                            let lease_until = rec.lease_until;
                            s.callers[i] = Caller::InBody {
                                claim,
                                fence,
                                lease_until,
                                claims,
                                did_effect,
                            };
                        }
                    }
                } else {
                    // LeaseLost: the record is untouched and the caller stops.
                    s.callers[i] = Caller::Done;
                }
            }
            Action::Crash(i) => s.callers[i] = Caller::Crashed,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never two bodies under live claims", |_, s: &State| {
                let live = s
                    .callers
                    .iter()
                    .filter(
                        |c| matches!(c, Caller::InBody { lease_until, .. } if *lease_until > s.now),
                    )
                    .count();
                live <= 1
            }),
            Property::always(
                "a stored result is the current claim's",
                |_, s: &State| match &s.rec {
                    Some(rec) if rec.status == Status::Succeeded => {
                        rec.result_by == Some(rec.holder)
                    }
                    _ => true,
                },
            ),
            Property::always("no step breaks a rule", |_, s: &State| s.broken.is_none()),
            Property::always(
                "a success lives a ttl from its mark",
                |m: &Protocol, s: &State| match &s.rec {
                    Some(Rec {
                        status: Status::Succeeded,
                        marked_at: Some(at),
                        expire_at,
                        ..
                    }) => *expire_at >= at + m.ttl * TICK_MS,
                    _ => true,
                },
            ),
            Property::always(
                "a claim whose holder is gone is taken over once its lease ends",
                |m: &Protocol, s: &State| match &s.rec {
                    Some(rec) if rec.status == Status::Processing && rec.lease_until <= s.now => {
                        matches!(m.decide(rec, s.now), Decision::Take { .. })
                    }
                    _ => true,
                },
            ),
            Property::always(
                "the business effect happens at most once (but for a holder past its lease)",
                |_, s: &State| s.effects <= 1 || s.stale_effect,
            ),
            Property::sometimes(
                "a takeover happens",
                |_, s: &State| matches!(&s.rec, Some(r) if r.attempt >= 2 && r.status == Status::Processing),
            ),
            Property::sometimes("a sweep then a new claim happen", |_, s: &State| {
                s.next_claim >= 3 && matches!(&s.rec, Some(r) if r.attempt == 1 && r.holder >= 2)
            }),
        ]
    }
}

/// The bounds CI checks: 3 callers with 2 calls each, lease 2 ticks, TTL 3 ticks, 6 ticks.
pub(crate) fn ci_bounds(rules: Rules) -> Protocol {
    Protocol {
        rules,
        callers: 3,
        claims_each: 2,
        lease: 2,
        ttl: 3,
        max_tick: 6,
        effects: false,
        recover: false,
    }
}

/// The bounds of the recover check: the business effect modelled, 2 callers with 2 calls each,
/// lease 2 ticks, 5 ticks, a TTL beyond them (a record whose TTL passes unfinished counts as
/// absent, which recover is not asked about: the reconciler's case).
pub(crate) fn recover_bounds(recover: bool) -> Protocol {
    Protocol {
        rules: Rules::Current,
        callers: 2,
        claims_each: 2,
        lease: 2,
        ttl: 10,
        max_tick: 5,
        effects: true,
        recover,
    }
}

#[cfg(test)]
mod checks;
