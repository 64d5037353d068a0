//! The recovery points of the model: the two-step body, the store rules for its saved steps (and
//! the broken ones the checks must catch), and what a holder does next.

use super::{Protocol, Rec, Status};
use crate::store::keeps_steps;

/// A step of the two-step body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    A,
    B,
}

impl Step {
    pub(super) const ALL: [Step; 2] = [Step::A, Step::B];

    pub(super) fn bit(self) -> u8 {
        1 << self as u8
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// How the body's two steps run (the steps checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Steps {
    /// No two-step body (the single effect of [`Protocol::effects`], or none).
    Off,
    /// A and B, as plain code: both effects run in every attempt and nothing is saved.
    Unsaved,
    /// `idem::step`: each step saved after its effect, under these rules.
    Saved(StepRules),
}

/// The store rules for saved steps: the stores' own, or one of them broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum StepRules {
    /// A save is fenced; a take keeps the steps as `keeps_steps` says.
    Store,
    /// A save lands on any PROCESSING record, whatever its fence.
    Unfenced,
    /// A takeover or a retry starts with no steps.
    TakeDrops,
    /// A record that starts a new life keeps the steps of the old one.
    NewLifeKeeps,
}

/// A rule of the steps that an action broke (only the action itself can see it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum StepFault {
    /// A step's effect ran in a holder that claimed the record after the step's save had landed
    /// (in this life of the record).
    RerunSaved,
    /// A step's effect ran again, by the record's current holder, although a save of it had
    /// landed: not the window between an effect and its save, nor a holder taken over.
    RerunOutsideWindow,
    /// A save landed on a record that another claim holds.
    StaleSave,
    /// A holder skipped a step whose save had not landed in this life of the record.
    SkippedUnsaved,
}

impl StepFault {
    pub(super) fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl Protocol {
    /// Whether a save under `fence` lands.
    pub(super) fn save_lands(&self, rec: &Option<Rec>, fence: u64) -> bool {
        match self.steps {
            Steps::Saved(StepRules::Unfenced) => {
                matches!(rec, Some(r) if r.status == Status::Processing)
            }
            _ => Self::holds(rec, fence),
        }
    }

    /// The saved steps a take of `old` leaves in the record (`reset`: a new life).
    pub(super) fn kept_steps(&self, old: Option<&Rec>, reset: bool) -> u8 {
        let Some(old) = old else {
            return 0;
        };
        let keep = match self.steps {
            Steps::Saved(StepRules::TakeDrops) => false,
            Steps::Saved(StepRules::NewLifeKeeps) => true,
            // The model has no fingerprints (one payload).
            _ => keeps_steps(reset, None, None),
        };
        if keep { old.steps } else { 0 }
    }

    /// What a holder does next in its body of steps: the first step it neither skipped nor
    /// finished, and whether that step's effect already ran (its save is due); `None` when the
    /// body is done.
    pub(super) fn next_step(&self, known: u8, ran: u8, saved: u8) -> Option<(Step, bool)> {
        let done = match self.steps {
            Steps::Off => return None,
            Steps::Unsaved => ran,
            Steps::Saved(_) => known | saved,
        };
        Step::ALL
            .into_iter()
            .find(|step| done & step.bit() == 0)
            .map(|step| (step, ran & step.bit() != 0))
    }
}
