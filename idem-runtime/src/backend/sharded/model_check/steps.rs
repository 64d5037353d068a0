//! The model's steps: claims, writes, and the copy, as the stores and the tool run them.

use super::*;

impl Resharding {
    /// Whether every process with a call routes by a step the tool may write the next after.
    pub(super) fn settled(&self, s: &State) -> bool {
        let oldest = s.step.saturating_sub(self.lag() - 1);
        s.callers
            .iter()
            .zip(&s.views)
            .all(|(c, v)| *c == Caller::Done || *v >= oldest)
    }

    /// A claim on `shard` at the store's time, as the store decides and writes it.
    pub(super) fn claim(&self, s: &mut State, shard: usize, lease: i64, ttl: i64) -> Answer {
        let now = s.now;
        let (old, reset, how) = match &s.recs[shard] {
            None => (None, true, Acquired::Fresh),
            Some(r) => match decide(&r.state(), None, now) {
                Decision::Take { how, reset } => {
                    (Some((r.attempt, r.fence, r.expire_at)), reset, how)
                }
                Decision::Replay => return Answer::Replay(r.result),
                Decision::InProgress(_) => return Answer::InProgress,
                d @ (Decision::ResultGone | Decision::Mismatch) => {
                    unreachable!("one payload, results kept: {d:?}")
                }
            },
        };
        // B's clock reads half a millisecond after A's.
        let clock_us = now * 1000 + shard as i64 * 500;
        let t = taken(old, reset, clock_us, ms(lease), ms(ttl));
        s.recs[shard] = Some(Rec {
            status: Status::Processing,
            attempt: t.attempt,
            fence: t.fence,
            lease_until: t.lease_until_ms,
            expire_at: t.expire_at_ms,
            result: 0,
        });
        Answer::Acquired {
            fence: t.fence,
            how,
        }
    }

    /// A write under `fence` to `shard`'s record: whether it landed (`LeaseLost` otherwise).
    pub(super) fn write(s: &mut State, shard: usize, fence: u64, op: Op) -> bool {
        let now = s.now;
        let Some(r) = s.recs[shard].as_mut().filter(|r| r.fence == fence) else {
            return false;
        };
        match op {
            Op::Complete { .. } if r.status == Status::Succeeded => true,
            Op::Fail if r.status == Status::Failed => true,
            _ if r.status != Status::Processing => false,
            Op::Complete { result, ttl } => {
                r.status = Status::Succeeded;
                r.result = result;
                r.expire_at = r.expire_at.max(now + ttl);
                if s.first == 0 {
                    s.first = result;
                }
                true
            }
            Op::Fail => {
                r.status = Status::Failed;
                true
            }
            Op::Renew { lease } => {
                r.lease_until = now + lease;
                r.expire_at = r.expire_at.max(r.lease_until);
                true
            }
        }
    }

    pub(super) fn op(&self, write: Write) -> Op {
        match write {
            Write::Complete(result) => Op::Complete {
                result,
                ttl: self.ttl_ms(),
            },
            Write::Fail => Op::Fail,
            Write::Renew => Op::Renew {
                lease: self.lease_ms(),
            },
        }
    }

    /// A caller's answer is a replay of `result` from `shard`.
    pub(super) fn replayed(s: &mut State, shard: usize, result: u8) {
        if s.first == 0 || result != s.first {
            s.wrong_replay = true;
        }
        if shard == B && s.step == DONE {
            s.replayed_on_b = true;
        }
    }

    /// The body of a call that acquired (recover asked first after a takeover).
    pub(super) fn acquired(
        &self,
        s: &State,
        held: Held,
        how: Acquired,
        lease_until: i64,
        calls: u8,
    ) -> Caller {
        let recovered = self.recover && how == Acquired::TakeOver && s.runs > 0;
        Caller::InBody(Body {
            held,
            lease_until,
            result: u8::from(recovered),
            recovered,
            renewing: true,
            confirm: lease_until <= s.now,
            calls,
        })
    }

    /// The caller after the answer to its write sent at `sent`: whether it landed.
    pub(super) fn after(&self, body: Body, write: Write, sent: i64, landed: bool) -> Caller {
        match write {
            Write::Complete(_) => Caller::Done,
            Write::Fail if landed => Caller::Ready { calls: body.calls },
            Write::Fail => Caller::Done,
            // The engine counts the lease from before the renewal was sent.
            Write::Renew if landed => Caller::InBody(Body {
                lease_until: sent + self.lease_ms(),
                confirm: false,
                ..body
            }),
            // The claim could not be confirmed: nothing ran, the call ends with `LeaseLost`.
            Write::Renew if body.confirm => Caller::Ready { calls: body.calls },
            // The heartbeat stops; the body goes on to its mark.
            Write::Renew => Caller::InBody(Body {
                renewing: false,
                ..body
            }),
        }
    }

    /// Caller `i`'s write under its claim: the first (or only) one.
    pub(super) fn first_write(&self, s: &mut State, i: usize, body: Body, write: Write) {
        let now = s.now;
        let view = usize::from(s.views[i]);
        s.callers[i] = match body.held {
            Held::One(fence) => {
                let landed = Self::write(s, self.claimed_on[view], fence, self.op(write));
                self.after(body, write, now, landed)
            }
            Held::Both { a, b } => {
                let old_first = view < usize::from(DUAL_NEW) || self.rules == Rules::OneOrder;
                let ((first, f1), (second, f2)) = if old_first {
                    ((A, a), (B, b))
                } else {
                    ((B, b), (A, a))
                };
                if Self::write(s, first, f1, self.op(write)) {
                    if matches!(write, Write::Complete(_))
                        && s.recs[second].is_none_or(|r| r.fence != f2)
                    {
                        s.stale = true;
                    }
                    // A mark's call needs only its calls left after it.
                    let (body, sent) = match write {
                        Write::Renew => (body, now),
                        _ => (
                            Body {
                                held: Held::One(0),
                                lease_until: 0,
                                result: 0,
                                recovered: false,
                                renewing: false,
                                confirm: false,
                                calls: body.calls,
                            },
                            0,
                        ),
                    };
                    Caller::Second {
                        shard: second as u8,
                        fence: f2,
                        write,
                        body,
                        sent,
                    }
                } else {
                    self.after(body, write, now, false)
                }
            }
        };
    }

    /// Where the copy stands after the write that ends a watched claim on B.
    pub(super) fn mirrored(&self, landed: bool) -> Copy {
        if landed || !self.fixes.lost_restarts {
            Copy::Copied
        } else {
            Copy::Todo
        }
    }

    /// The tool's next copy state after its claim of B for `snap`, read from A.
    pub(super) fn copy_claimed(&self, snap: Snap, answer: Answer) -> Copy {
        match answer {
            Answer::Acquired { fence: b, .. } if snap.status == Status::Processing => Copy::Watch {
                a: snap.fence,
                b,
                seen: None,
            },
            Answer::Acquired { fence: b, how } => Copy::Write {
                snap,
                b,
                how: how.into(),
                checked: false,
            },
            // Taken for the holder's own claim on B (it claimed in a dual phase).
            Answer::InProgress if snap.status == Status::Processing && !self.fixes.copy_waits => {
                Copy::Copied
            }
            // A mark about to land on B: A is read again later.
            Answer::InProgress => Copy::Todo,
            Answer::Replay(_) => Copy::Copied,
        }
    }
}
