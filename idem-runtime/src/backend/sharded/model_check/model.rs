//! The model's actions and properties (stateright's `Model`).

use stateright::{Model, Property};

use super::*;

impl Model for Resharding {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            step: 0,
            views: [0; PROCESSES],
            // Processes beyond the bounds' have no call to make.
            callers: std::array::from_fn(|i| {
                if i < self.processes {
                    Caller::Ready { calls: self.calls }
                } else {
                    Caller::Done
                }
            }),
            recs: [None, None],
            copy: Copy::Todo,
            runs: 0,
            stale: false,
            first: 0,
            ran_after_success: false,
            wrong_replay: false,
            replayed_on_b: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.max_tick * TICK_MS {
            actions.push(Action::Tick);
        }
        for (i, caller) in s.callers.iter().enumerate() {
            if *caller != Caller::Done && s.views[i] < s.step {
                actions.push(Action::Read(i));
            }
            match caller {
                Caller::Ready { .. } => actions.push(Action::Claim(i)),
                Caller::ClaimedA { .. } => actions.push(Action::ClaimB(i)),
                Caller::GiveBack { .. } => actions.push(Action::GiveBack(i)),
                Caller::InBody(b) => {
                    // A renewal sent at the tick of the last one changes nothing: left out.
                    if b.renewing && b.lease_until != s.now + self.lease_ms() {
                        actions.push(Action::Renew(i));
                    }
                    if b.confirm {
                        // Nothing else before the confirming renewal.
                    } else if b.result == 0 {
                        actions.extend([Action::Effect(i), Action::Fail(i)]);
                    } else {
                        actions.push(Action::Complete(i));
                    }
                }
                Caller::Second { .. } => actions.push(Action::Second(i)),
                Caller::Done => {}
            }
        }
        let copied = matches!(
            (self.rules, s.copy),
            (Rules::NoCopy, _) | (_, Copy::Copied) | (Rules::NoWatch, Copy::Watch { .. })
        );
        if s.step < DONE && self.settled(s) && (s.step < DUAL_NEW || copied) {
            actions.push(Action::Step);
        }
        if s.step == DUAL_NEW && self.rules != Rules::NoCopy {
            match s.copy {
                Copy::Todo if self.settled(s) => actions.push(Action::CopyRead),
                Copy::Claim { .. } => actions.push(Action::CopyClaim),
                Copy::Write { checked: false, .. } if self.fixes.recheck => {
                    actions.push(Action::CopyCheck);
                }
                Copy::Write { .. } => actions.push(Action::CopyWrite),
                Copy::Undo { .. } => actions.push(Action::CopyUndo),
                Copy::Watch { seen: None, .. } => actions.push(Action::WatchRead),
                Copy::Watch { seen: Some(_), .. } => actions.push(Action::WatchWrite),
                Copy::Fenced { .. } => actions.push(Action::GiveBackBoth),
                Copy::Todo | Copy::Copied => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += TICK_MS,
            Action::Read(i) => s.views[i] = s.step,
            Action::Claim(i) => self.on_claim(&mut s, i)?,
            Action::ClaimB(i) => self.on_claim_b(&mut s, i)?,
            Action::GiveBack(i) => {
                let Caller::GiveBack { a, how, then } = s.callers[i] else {
                    return None;
                };
                // Its answer is logged only.
                Self::write(&mut s, A, a, how.give_back());
                s.callers[i] = then.caller();
            }
            Action::Effect(i) => Self::on_effect(&mut s, i)?,
            Action::Complete(i) | Action::Fail(i) | Action::Renew(i) => {
                let Caller::InBody(body) = s.callers[i] else {
                    return None;
                };
                let write = match action {
                    Action::Complete(_) => Write::Complete(body.result),
                    Action::Fail(_) => Write::Fail,
                    _ => Write::Renew,
                };
                self.first_write(&mut s, i, body, write);
            }
            Action::Second(i) => self.on_second(&mut s, i)?,
            Action::Step => {
                s.step += 1;
                if matches!(s.copy, Copy::Watch { .. }) {
                    // Without the wait for its watched claim: the tool is gone.
                    s.copy = Copy::Copied;
                }
            }
            Action::CopyRead => self.on_copy_read(&mut s),
            Action::CopyClaim => {
                let Copy::Claim { snap, lease, ttl } = s.copy else {
                    return None;
                };
                let answer = self.claim(&mut s, B, lease, ttl);
                s.copy = self.copy_claimed(snap, answer);
            }
            Action::CopyCheck => Self::on_copy_check(&mut s)?,
            Action::CopyUndo => {
                let Copy::Undo { b, how } = s.copy else {
                    return None;
                };
                Self::write(&mut s, B, b, how.give_back());
                s.copy = Copy::Todo;
            }
            Action::CopyWrite => Self::on_copy_write(&mut s)?,
            Action::WatchRead => Self::on_watch_read(&mut s)?,
            Action::WatchWrite => self.on_watch_write(&mut s)?,
            Action::GiveBackBoth => {
                let Copy::Fenced { a, how, b } = s.copy else {
                    return None;
                };
                Self::write(&mut s, A, a, how.give_back());
                let landed = Self::write(&mut s, B, b, how.give_back());
                s.copy = self.mirrored(landed);
            }
        }
        // A caller with no claim left is done, and its process no longer waited for.
        for (caller, view) in s.callers.iter_mut().zip(&mut s.views) {
            if *caller == (Caller::Ready { calls: 0 }) {
                *caller = Caller::Done;
            }
            if *caller == Caller::Done {
                *view = 0;
            }
        }
        Some(if self.symmetric {
            s.representative()
        } else {
            s
        })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(ONE_LIVE_BODY, |_, s: &State| {
                s.callers
                    .iter()
                    .filter_map(Caller::running)
                    .filter(|b| b.lease_until > s.now)
                    .count()
                    <= 1
            }),
            Property::always(NOT_AFTER_A_SUCCESS, |_, s: &State| {
                !s.ran_after_success || s.stale
            }),
            Property::always(FIRST_RESULT, |_, s: &State| !s.wrong_replay || s.stale),
            Property::sometimes(REPLAYED_ON_B, |_, s: &State| s.replayed_on_b),
            Property::sometimes(STANDS_IN, |_, s: &State| {
                matches!((s.copy, s.recs[A]), (Copy::Watch { a, .. }, Some(r))
                    if r.fence == a && r.status == Status::Processing && r.lease_until > s.now)
            }),
        ];
        if self.recover {
            // Without recover, a takeover runs the body again after a holder died after its
            // effect: the base protocol's own case, not the move's.
            properties.push(Property::always(NO_EFFECT_TWICE, |_, s: &State| {
                s.runs <= 1 || s.stale
            }));
        }
        properties
    }
}

/// The actions' effects on the state that take more than a few lines (`None`: the action does
/// not apply to the state).
impl Resharding {
    /// Process `i` claims the key: on A alone, or on A first when the key moves.
    fn on_claim(&self, s: &mut State, i: usize) -> Option<()> {
        let now = s.now;
        let (lease, ttl) = (self.lease_ms(), self.ttl_ms());
        let Caller::Ready { calls } = s.callers[i] else {
            return None;
        };
        let calls = calls - 1;
        let (shard, pair) = match self.routes[usize::from(s.views[i])] {
            Route::One(shard) => (shard, false),
            Route::Move { a, .. } => (a, true),
        };
        s.callers[i] = match self.claim(s, shard, lease, ttl) {
            // The engine counts the lease from before the claim was sent.
            Answer::Acquired { fence, how } if pair => Caller::ClaimedA {
                a: fence,
                how: how.into(),
                lease_until: now + lease,
                calls,
            },
            Answer::Acquired { fence, how } => {
                self.acquired(s, Held::One(fence), how, now + lease, calls)
            }
            Answer::Replay(result) => {
                Self::replayed(s, shard, result);
                Caller::Done
            }
            Answer::InProgress => Caller::Ready { calls },
        };
        Some(())
    }

    /// Process `i`, holding A of a moving key, claims B.
    fn on_claim_b(&self, s: &mut State, i: usize) -> Option<()> {
        let (lease, ttl) = (self.lease_ms(), self.ttl_ms());
        let Caller::ClaimedA {
            a,
            how,
            lease_until,
            calls,
        } = s.callers[i]
        else {
            return None;
        };
        s.callers[i] = match self.claim(s, B, lease, ttl) {
            Answer::Acquired { fence: b, how: hb } => self.acquired(
                s,
                Held::Both { a, b },
                stronger(how.into(), hb),
                lease_until,
                calls,
            ),
            Answer::Replay(result) => {
                Self::replayed(s, B, result);
                Caller::GiveBack {
                    a,
                    how,
                    then: Then::Done,
                }
            }
            Answer::InProgress => Caller::GiveBack {
                a,
                how,
                then: Then::Ready(calls),
            },
        };
        Some(())
    }

    /// Process `i`'s body makes its effect.
    fn on_effect(s: &mut State, i: usize) -> Option<()> {
        let now = s.now;
        let Caller::InBody(ref mut body) = s.callers[i] else {
            return None;
        };
        s.runs += 1;
        body.result = s.runs;
        if body.lease_until <= now {
            s.stale = true;
        } else if s.first != 0 {
            s.ran_after_success = true;
        }
        Some(())
    }

    /// Process `i` sends the second write of a pair's mark or renewal.
    fn on_second(&self, s: &mut State, i: usize) -> Option<()> {
        let Caller::Second {
            shard,
            fence,
            write,
            body,
            sent,
        } = s.callers[i]
        else {
            return None;
        };
        let landed = Self::write(s, usize::from(shard), fence, self.op(write));
        // The first write's answer is the call's (but with `renew_both`, a renewal
        // holds only if both landed).
        let answer = landed || !(write == Write::Renew && self.fixes.renew_both);
        s.callers[i] = self.after(body, write, sent, answer);
        Some(())
    }

    /// The tool reads the key's record on A, to copy it.
    fn on_copy_read(&self, s: &mut State) {
        let now = s.now;
        let lease = self.lease_ms();
        s.copy = match s.recs[A] {
            Some(r) if r.expire_at - now >= 2 => {
                let left = r.expire_at - now;
                let lease = if r.status == Status::Processing && r.lease_until > now {
                    r.lease_until - now
                } else {
                    // The tool's own lease (10 s in the code).
                    lease
                };
                let lease = lease.min(left / 2).max(1);
                Copy::Claim {
                    snap: Snap {
                        status: r.status,
                        fence: r.fence,
                        expire_at: r.expire_at,
                        result: r.result,
                    },
                    lease,
                    ttl: left.max(lease + 1),
                }
            }
            // No record (or one about to expire): nothing to copy.
            _ => Copy::Copied,
        };
    }

    /// The tool checks that A is still as it read it before it writes B.
    fn on_copy_check(s: &mut State) -> Option<()> {
        let Copy::Write { snap, b, how, .. } = s.copy else {
            return None;
        };
        let same = matches!(s.recs[A], Some(r) if r.fence == snap.fence && r.status == snap.status);
        s.copy = if same {
            Copy::Write {
                snap,
                b,
                how,
                checked: true,
            }
        } else {
            Copy::Undo { b, how }
        };
        Some(())
    }

    /// The tool writes what it read of A to B.
    fn on_copy_write(s: &mut State) -> Option<()> {
        let now = s.now;
        let Copy::Write { snap, b, .. } = s.copy else {
            return None;
        };
        let op = match snap.status {
            Status::Succeeded => Op::Complete {
                result: snap.result,
                ttl: (snap.expire_at - now).max(1),
            },
            _ => Op::Fail,
        };
        // `LeaseLost` stops the tool; run again, it copies again.
        s.copy = if Self::write(s, B, b, op) {
            Copy::Copied
        } else {
            Copy::Todo
        };
        Some(())
    }

    /// The tool reads the claim on A that it stands in for on B.
    fn on_watch_read(s: &mut State) -> Option<()> {
        let now = s.now;
        let Copy::Watch { a, b, seen: None } = s.copy else {
            return None;
        };
        let seen = match s.recs[A] {
            Some(r) if r.fence == a => match r.status {
                Status::Processing if r.lease_until > now => Seen::Live(r.lease_until - now),
                Status::Processing => Seen::Ended,
                Status::Succeeded => Seen::Succeeded {
                    result: r.result,
                    expire_at: r.expire_at,
                },
                Status::Failed => Seen::Failed,
            },
            _ => Seen::Other,
        };
        s.copy = Copy::Watch {
            a,
            b,
            seen: Some(seen),
        };
        Some(())
    }

    /// The tool mirrors on B what it saw of the watched claim on A.
    fn on_watch_write(&self, s: &mut State) -> Option<()> {
        let now = s.now;
        let (lease, ttl) = (self.lease_ms(), self.ttl_ms());
        let Copy::Watch {
            a,
            b,
            seen: Some(seen),
        } = s.copy
        else {
            return None;
        };
        s.copy = match seen {
            Seen::Live(left) => {
                if Self::write(s, B, b, Op::Renew { lease: left.max(1) }) {
                    Copy::Watch { a, b, seen: None }
                } else {
                    // `LeaseLost` stops the tool; run again, it copies again.
                    Copy::Todo
                }
            }
            Seen::Succeeded { result, expire_at } => {
                let ttl = (expire_at - now).max(1);
                let landed = Self::write(s, B, b, Op::Complete { result, ttl });
                self.mirrored(landed)
            }
            Seen::Failed => {
                let landed = Self::write(s, B, b, Op::Fail);
                self.mirrored(landed)
            }
            Seen::Ended if self.fixes.fence_out => {
                match self.claim(s, A, lease, ttl) {
                    Answer::Acquired { fence, how } => Copy::Fenced {
                        a: fence,
                        how: how.into(),
                        b,
                    },
                    // Renewed or finished meanwhile: read again.
                    _ => Copy::Watch { a, b, seen: None },
                }
            }
            Seen::Ended | Seen::Other => {
                let landed = Self::write(s, B, b, Op::Renew { lease: 0 });
                self.mirrored(landed)
            }
        };
        Some(())
    }
}
