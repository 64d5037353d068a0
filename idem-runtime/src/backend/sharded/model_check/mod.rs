//! A model check of online resharding (stateright): one key moving from its old shard A to its
//! new shard B while processes serve it, the layout's steps written by the reshard tool one after
//! another, and the tool's copy.
//!
//! Modelled: the two shards' records of the key, each decided by the store's own code (`decide`,
//! `taken`, `RecordState`); complete, fail, renew and release as the contract states them (they
//! change a record only while it is PROCESSING under the caller's fence; marking again under the
//! same fence changes nothing). The shards' clocks read half a millisecond apart, so their fences
//! never meet: a claim sent to the shard it was not made on is refused, as it is by real clocks.
//!
//! The layout: no step written (processes route over the old list: A), then `planned`,
//! `dual-old`, `dual-new`, the copy, `done`. The tool writes a step only once every process with a
//! call to make or in flight read the one before (the settle wait: a process routes by a reading
//! at most `STALE_AFTER` old and the tool waits longer), so a process routes by the newest step or
//! the one before. Where a step sends a claim, and where it writes a claim held on one shard, is
//! the code's routing (`View::route`, `View::claimed_on`) for a key that moves from `[a]` to
//! `[a, b]`.
//!
//! Each process runs one caller, which makes calls one after another. A call claims by its
//! process's view when it claims: A alone, A then B (two atomic steps, A's claim given back when
//! B's is not acquired: released after a takeover, failed otherwise, and B's answer is the
//! call's), or B alone. With both claims the call holds a pair, written in the order of its view
//! when it writes (A first before `dual-new`, B first from then on), each write an atomic step,
//! the first one's answer the call's; with one claim, it writes where `claimed_on` says. The
//! engine counts a lease from before its claim or renewal was sent; a claim that comes back after
//! its lease ended is confirmed by one renewal before anything runs. The body's effect is a step
//! of its own, counted outside the stores (`runs`); a body fails only before its effect. With
//! [`Resharding::recover`], a takeover asks recover first, which finds an effect made and marks
//! its result without running the body. Renewals come at any time; one refused stops the
//! renewals and the body goes on to its mark, as the engine's heartbeat does. A caller may stop
//! at any point for as long as it likes (between its two claims, between its two marks, past its
//! lease), and for good, which is how a crash looks to everyone else (its process still reads
//! the layout, so the tool is not held up).
//!
//! The copy, once every process is in `dual-new`, as `Reshard` runs it: read A's record, claim B
//! with its lease and ttl, read A again and give B's claim back if A changed (`recheck`), then
//! write a success or a failure there; for a record in progress, hold B's claim and mirror A's
//! (renew B to A's lease end while A's claim under the same fence is live, complete or fail B
//! when A ends so; when A's lease ends unfinished, take A over and give it back so its holder is
//! fenced out (`fence_out`), then release B; release B when A's claim is gone); skip the key when
//! B replays; when B answers "in progress", read A again later (`copy_waits`). Each read and each
//! write is an atomic step, any of them may wait while the clock runs. A copy write or a renewal
//! of B that B refuses (`LeaseLost`) starts the key's copy over (`lost_restarts`; the code waits
//! for A's claim to end first, which the model's restart covers). `done` is written once the
//! copy is done and its watched claim ended.
//!
//! The properties, as the base model states them (`store::model_check`): no second body runs
//! beside a holder whose lease is live by its own count; no effect happens after a success is
//! stored; a replay answers the first success's result; with recover, the effect happens at
//! most once. The last three but after a holder past its lease acted (see [`State`]'s `stale`),
//! the base protocol's own exception. And, so that the model is not vacuous: `done` is reached
//! with a success replayed from B, and the copy stands in for a live claim on A.
//!
//! [`Fixes`] are five changes to the protocol as it was first written, which the checker found
//! needed: without any one of them, it finds a second body beside a live one, or an effect run
//! again (`checks::each_fix_is_needed` replays the traces). The code makes all five. With them,
//! every property
//! holds over every state the bounds reach. [`Rules`] other than `Current` each break one rule of
//! the protocol; the checker finds each.
//!
//! Not modelled: a record's expiry (the TTL never passes within the bounds, and results are kept
//! as long as their record), payloads (one fingerprint), saved steps, transactions, batches, more
//! than one key, and a request that lands more than the settle margin after the view it was
//! routed by was read.

use std::time::Duration;

use super::layout::{Layout, Phase};
use super::moving::stronger;
use super::route;
use super::view::{Route, View};
use crate::store::decide::{Decision, RecordState, decide, taken};
use crate::store::{Acquired, Status};

/// The most processes the model runs.
const PROCESSES: usize = 3;

/// One tick of the clock, ms.
const TICK_MS: i64 = 1000;

/// The key's old shard and its new one, as indexes of a process's shards.
const A: usize = 0;
const B: usize = 1;

/// The layout's steps in the order the tool writes them: none (processes route over the old
/// list), then the phases.
const STEPS: [Option<Phase>; 5] = [
    None,
    Some(Phase::Planned),
    Some(Phase::DualOld),
    Some(Phase::DualNew),
    Some(Phase::Done),
];
const DUAL_NEW: u8 = 3;
const DONE: u8 = 4;

/// Which protocol the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Rules {
    /// As described above.
    Current,
    /// A pair is marked on A first in every phase.
    OneOrder,
    /// `done` is written without the copy.
    NoCopy,
    /// `done` is written once the copy walked the keys, without waiting for the claim it
    /// stands in for.
    NoWatch,
    /// No settle wait: the tool writes a step once every process read the one before it, so
    /// processes route by three adjacent steps.
    NoSettle,
}

/// The five changes the checker found needed; the code makes all of them (in parentheses, what
/// the protocol did without each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Fixes {
    /// A pair's renewal holds only when both shards take it: `LeaseLost` when either refuses
    /// (without: the first shard's answer, the second's logged).
    pub renew_both: bool,
    /// The copy reads A again later whenever B answers "in progress" (without: the key skipped
    /// when A's record is in progress too, taking B's claim for its holder's).
    pub copy_waits: bool,
    /// A watched claim whose lease ended unfinished is taken over on A by the tool (its holder
    /// fenced out) and given back before B is released (without: B released only, and the
    /// holder, if it wakes, may still renew A).
    pub fence_out: bool,
    /// Once B is acquired, the copy reads A again and writes A's state only if it is still the
    /// one it read; otherwise B's claim is given back and the copy starts over (without: what it
    /// read is written).
    pub recheck: bool,
    /// A write of a watched claim's end that B refuses (`LeaseLost`: B's claim was taken from
    /// the tool) makes the copy start over (without: the key counted as done).
    pub lost_restarts: bool,
}

impl Fixes {
    /// The protocol as first written.
    pub(crate) const NONE: Fixes = Fixes {
        renew_both: false,
        copy_waits: false,
        fence_out: false,
        recheck: false,
        lost_restarts: false,
    };
    pub(crate) const ALL: Fixes = Fixes {
        renew_both: true,
        copy_waits: true,
        fence_out: true,
        recheck: true,
        lost_restarts: true,
    };
}

/// The model: its rules and bounds, and the routing it takes from the code.
#[derive(Clone, Debug)]
pub(crate) struct Resharding {
    pub rules: Rules,
    pub fixes: Fixes,
    /// A takeover asks recover, which finds an effect made.
    pub recover: bool,
    pub processes: usize,
    /// Claims each caller may send (a call answered "in progress" uses one).
    pub calls: u8,
    /// The callers' lease, ticks.
    pub lease: i64,
    pub max_tick: i64,
    /// Each state is taken with its processes in a canonical order (they are alike): fewer
    /// states to check, but a trace's process numbers change along the way.
    pub symmetric: bool,
    /// Where each step routes a claim of the key (`View::route`).
    routes: [Route; 5],
    /// Where each step writes a claim held on one shard (`View::claimed_on`).
    claimed_on: [usize; 5],
}

impl Resharding {
    /// The CI bounds: 3 processes with one call each, lease 2 ticks, clock to 2 ticks.
    pub(crate) fn new(rules: Rules, fixes: Fixes, recover: bool) -> Self {
        let (routes, claimed_on) = routing();
        Resharding {
            rules,
            fixes,
            recover,
            processes: 3,
            calls: 1,
            lease: 2,
            max_tick: 2,
            symmetric: false,
            routes,
            claimed_on,
        }
    }

    fn lease_ms(&self) -> i64 {
        self.lease * TICK_MS
    }

    /// The callers' ttl: beyond the clock, so no record expires.
    fn ttl_ms(&self) -> i64 {
        (self.max_tick + 10) * TICK_MS
    }

    /// How many steps behind the newest a process may route by.
    fn lag(&self) -> u8 {
        if self.rules == Rules::NoSettle { 2 } else { 1 }
    }
}

/// The code's routing of a key that moves from `[a]` to `[a, b]`, at each step, for a process
/// given both shards (in that order): where a claim goes, and where a claim held on one shard is
/// written. Before any step, processes route over the old list (`[a]`).
fn routing() -> ([Route; 5], [usize; 5]) {
    let biz = "PAY";
    let key = (0..)
        .map(|n| format!("order-{n}"))
        .find(|k| route::shard(biz, k, 2) == B)
        .expect("a key that moves");
    let mut routes = [Route::One(A); 5];
    let mut claimed_on = [A; 5];
    for (i, step) in STEPS.iter().enumerate() {
        let (view, shards) = match step {
            None => (View::of(None, Vec::new(), Vec::new()), 1),
            Some(phase) => (
                View::of(
                    Some(Layout {
                        step: i as u64,
                        phase: *phase,
                        from: vec!["a".into()],
                        to: vec!["a".into(), "b".into()],
                    }),
                    vec![Some(A)],
                    vec![Some(A), Some(B)],
                ),
                2,
            ),
        };
        routes[i] = view.route(biz, &key, shards).expect("every shard given");
        claimed_on[i] = view
            .claimed_on(biz, &key, shards)
            .expect("every shard given");
    }
    (routes, claimed_on)
}

/// A shard's record of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Rec {
    status: Status,
    attempt: u32,
    fence: u64,
    lease_until: i64,
    expire_at: i64,
    /// A success's result: which run of the body made it (0 for none).
    result: u8,
}

impl Rec {
    fn state(&self) -> RecordState<'static> {
        RecordState {
            status: self.status,
            fingerprint: None,
            lease_until_ms: self.lease_until,
            expire_at_ms: self.expire_at,
            result_until_ms: None,
        }
    }
}

/// How a claim came about (the store's [`Acquired`], kept in the state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum How {
    Fresh,
    Retry,
    TakeOver,
}

impl From<Acquired> for How {
    fn from(how: Acquired) -> How {
        match how {
            Acquired::Fresh => How::Fresh,
            Acquired::RetryAfterFailure => How::Retry,
            Acquired::TakeOver => How::TakeOver,
        }
    }
}

impl From<How> for Acquired {
    fn from(how: How) -> Acquired {
        match how {
            How::Fresh => Acquired::Fresh,
            How::Retry => Acquired::RetryAfterFailure,
            How::TakeOver => Acquired::TakeOver,
        }
    }
}

impl How {
    /// How a claim not used is given back (as `claim_moving` gives back A's): released after a
    /// takeover, so that the next claim is a takeover again; failed otherwise.
    fn give_back(self) -> Op {
        match self {
            How::TakeOver => Op::Renew { lease: 0 },
            How::Fresh | How::Retry => Op::Fail,
        }
    }
}

/// The fences a call holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Held {
    /// A claim on one shard (the routing says which).
    One(u64),
    /// A moving key's pair.
    Both { a: u64, b: u64 },
}

/// A call that holds its claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Body {
    held: Held,
    /// When the lease ends by the holder's count: from its claim, or its last renewal that
    /// landed.
    lease_until: i64,
    /// The result it marks: 0 before the effect, else the run that made it (or the one recover
    /// found).
    result: u8,
    /// Recover found the effect: the body does not run, its result is marked.
    recovered: bool,
    /// No renewal was refused yet.
    renewing: bool,
    /// The claim came back after its lease had ended (by the holder's count): one renewal
    /// confirms it before anything runs, as the engine does, and if it is refused the call
    /// ends there.
    confirm: bool,
    calls: u8,
}

/// A write a caller sends under its claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Write {
    Complete(u8),
    Fail,
    Renew,
}

/// Where a caller goes once it gave A's claim back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Then {
    Ready(u8),
    Done,
}

impl Then {
    fn caller(self) -> Caller {
        match self {
            Then::Ready(calls) => Caller::Ready { calls },
            Then::Done => Caller::Done,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Caller {
    Ready {
        calls: u8,
    },
    /// In a dual phase, A acquired; B's claim is next.
    ClaimedA {
        a: u64,
        how: How,
        lease_until: i64,
        calls: u8,
    },
    /// B not acquired: A's claim is given back, then the call answers B's answer.
    GiveBack {
        a: u64,
        how: How,
        then: Then,
    },
    InBody(Body),
    /// The first of a pair's writes landed; the second is due. `body` is the call as it was
    /// when it sent the first, at `sent` (a renewal's body runs meanwhile, its lease counted as
    /// before).
    Second {
        shard: u8,
        fence: u64,
        write: Write,
        body: Body,
        sent: i64,
    },
    /// No call left to make.
    Done,
}

impl Caller {
    /// The body it runs, if any (not a recovered one: that body does not run).
    fn running(&self) -> Option<&Body> {
        match self {
            Caller::InBody(b)
            | Caller::Second {
                write: Write::Renew,
                body: b,
                ..
            } if !b.recovered => Some(b),
            _ => None,
        }
    }
}

/// A's record as the copy read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Snap {
    status: Status,
    fence: u64,
    expire_at: i64,
    result: u8,
}

/// What a poll of a watched claim read on A.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Seen {
    /// Still held, its lease live this many more ms.
    Live(i64),
    Succeeded {
        result: u8,
        expire_at: i64,
    },
    Failed,
    /// Still PROCESSING under the same fence, its lease ended.
    Ended,
    /// Gone, or another fence's.
    Other,
}

/// Where the tool's copy of the key stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Copy {
    Todo,
    /// A's record read: B is claimed with this lease and ttl (ms).
    Claim {
        snap: Snap,
        lease: i64,
        ttl: i64,
    },
    /// B acquired under `b`: A's success or failure is written there (with `recheck`, once A
    /// was read again: `checked`).
    Write {
        snap: Snap,
        b: u64,
        how: How,
        checked: bool,
    },
    /// With `recheck`: A changed since it was read; B's claim is given back.
    Undo {
        b: u64,
        how: How,
    },
    /// B held under `b`, standing for A's claim `a`; `seen`, what the last poll read.
    Watch {
        a: u64,
        b: u64,
        seen: Option<Seen>,
    },
    /// With `fence_out`: A taken by the tool under `a` (a takeover, or a retry when its holder
    /// failed meanwhile), B still held under `b`: both are given back.
    Fenced {
        a: u64,
        how: How,
        b: u64,
    },
    Copied,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct State {
    now: i64,
    /// The newest step written (an index of [`STEPS`]).
    step: u8,
    /// Each process's view: the step it routes by (0 once its caller is done).
    views: [u8; PROCESSES],
    callers: [Caller; PROCESSES],
    recs: [Option<Rec>; 2],
    copy: Copy,
    /// How many times the body's effect happened (ground truth, outside the stores).
    runs: u8,
    /// A holder past its lease acted: it made its effect after its lease had ended by its own
    /// count (it paused), or it stored its result on one shard of its pair after its claim on
    /// the other had been taken from it (a mark the base protocol refuses, and this one lets
    /// land on the shard written first).
    stale: bool,
    /// The result of the first success stored (0 before).
    first: u8,
    /// An effect happened after a success was stored, by a holder whose lease was live.
    ran_after_success: bool,
    /// A caller was answered with a replay of another result than the first success's.
    wrong_replay: bool,
    /// A caller was answered with a replay from B once `done` was written.
    replayed_on_b: bool,
}

impl State {
    /// The state with its processes in a canonical order (they are alike: symmetry reduction).
    fn representative(&self) -> State {
        let mut processes: [(Caller, u8); PROCESSES] =
            std::array::from_fn(|i| (self.callers[i], self.views[i]));
        processes.sort_unstable();
        State {
            callers: processes.map(|(c, _)| c),
            views: processes.map(|(_, v)| v),
            ..self.clone()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Tick,
    /// Process `i` reads the layout.
    Read(usize),
    /// Caller `i` claims by its view (A's claim of a pair).
    Claim(usize),
    /// Caller `i` claims B, A's claim held.
    ClaimB(usize),
    /// Caller `i` gives A's claim back.
    GiveBack(usize),
    /// Caller `i`'s body makes its effect.
    Effect(usize),
    /// Caller `i` marks success (the first write of a pair).
    Complete(usize),
    /// Caller `i`'s body failed before any effect: it marks the failure.
    Fail(usize),
    Renew(usize),
    /// Caller `i` sends the second write of a pair.
    Second(usize),
    /// The tool writes the next step.
    Step,
    CopyRead,
    CopyClaim,
    CopyWrite,
    /// With `recheck`: the copy reads A again.
    CopyCheck,
    /// With `recheck`: the copy gives B's claim back.
    CopyUndo,
    WatchRead,
    WatchWrite,
    /// With `fence_out`: the tool gives back A's claim and B's.
    GiveBackBoth,
}

/// A claim's answer.
enum Answer {
    Acquired { fence: u64, how: Acquired },
    Replay(u8),
    InProgress,
}

/// A write to a shard's record, as the store runs it (release: a renewal of no lease).
enum Op {
    Complete { result: u8, ttl: i64 },
    Fail,
    Renew { lease: i64 },
}

fn ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

pub(crate) const ONE_LIVE_BODY: &str = "no second body beside a live holder";
pub(crate) const NOT_AFTER_A_SUCCESS: &str =
    "no effect after a success is stored (but after a holder past its lease)";
pub(crate) const FIRST_RESULT: &str =
    "a replay answers the first success's result (but after a holder past its lease)";
pub(crate) const NO_EFFECT_TWICE: &str =
    "the effect happens at most once (but after a holder past its lease)";
pub(crate) const REPLAYED_ON_B: &str = "done, and a success replayed from B";
pub(crate) const STANDS_IN: &str = "the copy stands in for a live claim on A";

mod checks;
mod model;
mod steps;
