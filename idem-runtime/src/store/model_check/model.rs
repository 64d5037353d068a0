//! The model's actions and their effects (stateright's `Model`).

use stateright::{Model, Property};

use super::*;

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
            runs: [0; 2],
            applied: [0; 2],
            landed: 0,
            faults: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.broken.is_some() || state.faults != 0 {
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
                Caller::InBody {
                    did_effect,
                    known,
                    ran,
                    saved,
                    ..
                } => {
                    actions.extend([Action::Renew(i), Action::Crash(i)]);
                    if self.steps != Steps::Off {
                        match self.next_step(*known, *ran, *saved) {
                            // The step's effect, or its work returns an error before any effect
                            // (nothing saved) and the body fails.
                            Some((step, false)) => {
                                actions.push(Action::Work(i, step));
                                if self.fails {
                                    actions.push(Action::Fail(i));
                                }
                            }
                            Some((step, true)) => {
                                actions.push(Action::Save(i, step));
                                if self.save_errors {
                                    actions.push(Action::Fail(i));
                                }
                            }
                            None => actions.push(Action::Complete(i)),
                        }
                    } else if !self.effects {
                        actions.push(Action::Complete(i));
                        if self.fails {
                            actions.push(Action::Fail(i));
                        }
                    } else if *did_effect {
                        actions.push(Action::Complete(i));
                    } else {
                        actions.push(Action::Effect(i));
                        if self.fails {
                            actions.push(Action::Fail(i));
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => s.now += TICK_MS,
            Action::Sweep => {
                s.rec = None;
                s.landed = 0;
            }
            Action::Claim(i) => self.claim(&mut s, i)?,
            Action::Effect(i) => Self::effect(&mut s, i)?,
            Action::Work(i, step) => self.work(&mut s, i, step)?,
            Action::Save(i, step) => self.save(&mut s, i, step)?,
            Action::Complete(i) | Action::Fail(i) | Action::Renew(i) => {
                self.mark(&mut s, i, action)?;
            }
            Action::Crash(i) => s.callers[i] = Caller::Crashed,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(self)
    }
}

/// The actions' effects on the state, one function per kind of action (`None`: the action does
/// not apply to the caller's state).
impl Protocol {
    /// Caller `i` claims: an insert or a take (a recover that finds the effect marks the record
    /// at once), or a replay, or a refusal.
    fn claim(&self, s: &mut State, i: usize) -> Option<()> {
        let now = s.now;
        let Caller::Ready { claims } = s.callers[i] else {
            return None;
        };
        let claim = s.next_claim;
        let mut recovered = false;
        let next = match &s.rec {
            None => Some(self.take(None, true, now, claim)),
            Some(rec) => match self.decide(rec, now) {
                Decision::Take { reset, how } => {
                    if self.expired(rec, now) {
                        // A new life of the record: nothing of the old one is saved in it.
                        s.landed = 0;
                    }
                    if rec.status == Status::Succeeded && rec.expire_at > now {
                        s.broken = Some("a repeat within the TTL ran the body");
                    }
                    // Recover looks the real business up: the effect count.
                    recovered =
                        self.recover && how == crate::store::Acquired::TakeOver && s.effects > 0;
                    Some(self.take(Some(rec), reset, now, claim))
                }
                Decision::Replay | Decision::ResultGone => {
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
                rec.steps = 0;
                s.callers[i] = Caller::Done;
            } else {
                // The engine reads the saved steps (fenced) before the first step runs.
                if rec.steps & !s.landed != 0 {
                    s.faults |= StepFault::SkippedUnsaved.bit();
                }
                s.callers[i] = Caller::InBody {
                    claim,
                    fence: rec.fence,
                    lease_until: rec.lease_until,
                    claims: claims - 1,
                    did_effect: false,
                    known: rec.steps,
                    before: s.landed,
                    ran: 0,
                    saved: 0,
                };
            }
            s.rec = Some(rec);
        }
        Some(())
    }

    /// Caller `i`'s body makes its business effect.
    fn effect(s: &mut State, i: usize) -> Option<()> {
        let now = s.now;
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
        Some(())
    }

    /// Caller `i` runs `step`'s effect.
    fn work(&self, s: &mut State, i: usize, step: Step) -> Option<()> {
        let now = s.now;
        let Caller::InBody {
            claim,
            ref mut ran,
            before,
            lease_until,
            ..
        } = s.callers[i]
        else {
            return None;
        };
        *ran |= step.bit();
        let n = step.index();
        if before & step.bit() != 0 {
            s.faults |= StepFault::RerunSaved.bit();
        }
        let holds = matches!(&s.rec, Some(r) if r.holder == claim);
        if s.runs[n] > 0 && s.landed & step.bit() != 0 && holds {
            s.faults |= StepFault::RerunOutsideWindow.bit();
        }
        s.runs[n] += 1;
        if !self.dedup || s.applied[n] == 0 {
            s.applied[n] += 1;
        }
        if lease_until <= now {
            s.stale_effect = true;
        }
        Some(())
    }

    /// Caller `i` saves `step` (fenced), or stops when the save does not land.
    fn save(&self, s: &mut State, i: usize, step: Step) -> Option<()> {
        let Caller::InBody {
            claim,
            fence,
            ref mut saved,
            ..
        } = s.callers[i]
        else {
            return None;
        };
        if self.save_lands(&s.rec, fence) {
            *saved |= step.bit();
            let rec = s.rec.as_mut().expect("held");
            if rec.holder != claim {
                s.faults |= StepFault::StaleSave.bit();
            }
            rec.steps |= step.bit();
            s.landed |= step.bit();
        } else {
            // LeaseLost: the step returns it, the body with it; the call stops.
            s.callers[i] = Caller::Done;
        }
        Some(())
    }

    /// Caller `i` completes, fails or renews (`action`), under its fence, or stops when it no
    /// longer holds the record.
    fn mark(&self, s: &mut State, i: usize, action: Action) -> Option<()> {
        let now = s.now;
        let Caller::InBody {
            claim,
            fence,
            claims,
            did_effect,
            known,
            before,
            ran,
            saved,
            ..
        } = s.callers[i]
        else {
            return None;
        };
        if Self::holds(&s.rec, fence) {
            let rec = s.rec.as_mut().expect("held");
            if rec.holder != claim {
                s.broken = Some("a stale holder's write was accepted (its fence was reused)");
            }
            match action {
                Action::Complete(_) => {
                    rec.status = Status::Succeeded;
                    rec.result_by = Some(claim);
                    rec.marked_at = Some(now);
                    // The result replaces the saved steps.
                    rec.steps = 0;
                    if self.rules == Rules::Current {
                        rec.expire_at = rec.expire_at.max(now + self.ttl * TICK_MS);
                    }
                    s.callers[i] = Caller::Done;
                }
                Action::Fail(_) => {
                    // The saved steps stay, for the retry.
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
                        known,
                        before,
                        ran,
                        saved,
                    };
                }
            }
        } else {
            // LeaseLost: the record is untouched and the caller stops.
            s.callers[i] = Caller::Done;
        }
        Some(())
    }
}
