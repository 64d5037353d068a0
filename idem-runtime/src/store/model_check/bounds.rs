//! The bounds each check runs the model with.

use super::{Protocol, Rules, StepRules, Steps};

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
        fails: true,
        steps: Steps::Off,
        save_errors: false,
        dedup: false,
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
        fails: true,
        steps: Steps::Off,
        save_errors: false,
        dedup: false,
    }
}

/// The bounds of the steps checks: the body as two steps, 2 callers with 2 calls each, lease 2
/// ticks, 5 ticks, a TTL beyond them (as for recover: a record never starts a new life here).
pub(crate) fn steps_bounds(steps: Steps, dedup: bool) -> Protocol {
    Protocol {
        rules: Rules::Current,
        callers: 2,
        claims_each: 2,
        lease: 2,
        ttl: 10,
        max_tick: 5,
        effects: false,
        recover: false,
        fails: true,
        steps,
        save_errors: false,
        dedup,
    }
}

/// The bounds of the steps check across lives of the record: lease 1 tick, TTL 2 ticks, 4 ticks,
/// so a record with saved steps is taken over, expires, is swept or taken as new, and is claimed
/// again.
pub(crate) fn steps_life_bounds(rules: StepRules) -> Protocol {
    Protocol {
        lease: 1,
        ttl: 2,
        max_tick: 4,
        ..steps_bounds(Steps::Saved(rules), false)
    }
}
