//! What the model checks: the protocol's properties, and the steps properties by name (the checks
//! ask for them).

use stateright::Property;

use super::{Caller, Decision, Protocol, Rec, State, Status, StepFault, Steps, TICK_MS};

/// Every property the model checks: the protocol's, and with steps the steps'.
pub(super) fn all(model: &Protocol) -> Vec<Property<Protocol>> {
    let mut properties = vec![
        Property::always("never two bodies under live claims", |_, s: &State| {
            let live = s
                .callers
                .iter()
                .filter(|c| matches!(c, Caller::InBody { lease_until, .. } if *lease_until > s.now))
                .count();
            live <= 1
        }),
        Property::always(
            "a stored result is the current claim's",
            |_, s: &State| match &s.rec {
                Some(rec) if rec.status == Status::Succeeded => rec.result_by == Some(rec.holder),
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
    ];
    if model.steps != Steps::Off {
        properties.extend(step_properties());
    }
    properties
}

/// The names of the steps properties, as the checks ask for them.
pub(crate) mod step_property {
    pub const SAVED_NEVER_RERUN: &str = "a step whose save landed never runs in a later holder";
    pub const WINDOW_ONLY: &str =
        "a step runs again only if its save never landed, or by a holder taken over";
    pub const STALE_SAVE: &str = "a stale holder's save never lands";
    pub const SKIPS_ONLY_SAVED: &str = "a holder skips only steps saved in this life of the record";
    pub const RUNS_ONCE: &str = "each step's effect runs at most once";
    pub const APPLIED_ONCE: &str = "downstream applies each step at most once";
    pub const NO_STEPS_IN_RESULT: &str = "a success holds no saved steps";
    pub const SKIP: &str = "a holder skips a saved step";
    pub const STALE_HOLDER_SAVES: &str = "a stale holder comes to save after a takeover";
    pub const EXPIRES_WITH_STEPS: &str = "a record expires with a step saved";
}

fn step_properties() -> Vec<Property<Protocol>> {
    use step_property::*;
    vec![
        Property::always(SAVED_NEVER_RERUN, |_, s: &State| {
            s.faults & StepFault::RerunSaved.bit() == 0
        }),
        Property::always(WINDOW_ONLY, |_, s: &State| {
            s.faults & StepFault::RerunOutsideWindow.bit() == 0
        }),
        Property::always(STALE_SAVE, |_, s: &State| {
            s.faults & StepFault::StaleSave.bit() == 0
        }),
        Property::always(SKIPS_ONLY_SAVED, |_, s: &State| {
            s.faults & StepFault::SkippedUnsaved.bit() == 0
        }),
        Property::always(RUNS_ONCE, |_, s: &State| s.runs.iter().all(|&n| n <= 1)),
        Property::always(APPLIED_ONCE, |_, s: &State| {
            s.applied.iter().all(|&n| n <= 1)
        }),
        Property::always(
            NO_STEPS_IN_RESULT,
            |_, s: &State| !matches!(&s.rec, Some(r) if r.status == Status::Succeeded && r.steps != 0),
        ),
        Property::sometimes(SKIP, |_, s: &State| {
            s.callers
                .iter()
                .any(|c| matches!(c, Caller::InBody { known, .. } if *known != 0))
        }),
        Property::sometimes(STALE_HOLDER_SAVES, |m: &Protocol, s: &State| {
            let Some(rec) = &s.rec else {
                return false;
            };
            s.callers.iter().any(|c| match *c {
                Caller::InBody {
                    claim,
                    known,
                    ran,
                    saved,
                    ..
                } => {
                    claim != rec.holder
                        && rec.status == Status::Processing
                        && matches!(m.next_step(known, ran, saved), Some((_, true)))
                }
                _ => false,
            })
        }),
        Property::sometimes(
            EXPIRES_WITH_STEPS,
            |m: &Protocol, s: &State| matches!(&s.rec, Some(r) if r.steps != 0 && m.expired(r, s.now)),
        ),
    ]
}
