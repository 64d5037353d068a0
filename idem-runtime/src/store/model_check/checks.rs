//! The checks run on the model: the current protocol holds its properties, the old rules and
//! the protocol without recover are caught, and the probe trace of issue 6.

use std::time::Instant;

use stateright::{Checker, Model};

use super::{Action, Protocol, Rules, ci_bounds, recover_bounds};

#[test]
fn the_protocol_holds_its_properties() {
    let model = match std::env::var("IDEM_MODEL_BOUNDS").as_deref() {
        // Larger bounds, for the figures in docs/RELIABILITY.md.
        Ok("large") => Protocol {
            max_tick: 8,
            ..ci_bounds(Rules::Current)
        },
        _ => ci_bounds(Rules::Current),
    };
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "model check: {} states ({} unique) in {:?}",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// The checker finds the bugs of issue 6 when pointed at the old rules: two bodies running under
/// live claims (the TTL cut a live lease), and a stale holder's write accepted (a fence reused
/// after a sweep); and the bug of issue 20: a success stored with the claim's expiry, already
/// expired when the body outlived its ttl.
#[test]
fn the_check_finds_the_old_lease_and_fence_bugs() {
    // Breadth first on one thread, so each counterexample is a shortest one.
    let checker = ci_bounds(Rules::Before)
        .checker()
        .threads(1)
        .spawn_bfs()
        .join();
    let two_bodies = checker
        .discovery("never two bodies under live claims")
        .expect("the old rules let the TTL cut a live lease");
    println!(
        "counterexample (lease vs TTL): {:?}",
        two_bodies.into_actions()
    );
    let stale = checker
        .discovery("no step breaks a rule")
        .expect("the old rules reuse a fence after a sweep");
    println!("counterexample (fence reuse): {:?}", stale.into_actions());
    let short_lived = checker
        .discovery("a success lives a ttl from its mark")
        .expect("the old complete keeps the claim's expiry");
    println!(
        "counterexample (a success expiring early): {:?}",
        short_lived.into_actions()
    );
}

/// The probe of issue 6 as a trace: attempt 1 fails at t=0, a retry takes over at t=2 (lease to 4,
/// TTL to 3), a third caller arrives at t=3. The old rules let it in beside the retry; the current
/// rules tell it "in progress".
#[test]
fn the_probe_trace_breaks_the_old_rules_only() {
    let trace = [
        Action::Claim(0),
        Action::Fail(0),
        Action::Tick,
        Action::Tick,
        Action::Claim(1),
        Action::Tick,
        Action::Claim(2),
    ];
    let two_bodies = |rules| {
        let model = ci_bounds(rules);
        let mut state = model.init_states().remove(0);
        for action in trace {
            state = model
                .next_state(&state, action)
                .expect("every step applies");
        }
        let property = &model.properties()[0];
        assert_eq!(property.name, "never two bodies under live claims");
        !(property.condition)(&model, &state)
    };
    assert!(two_bodies(Rules::Before));
    assert!(!two_bodies(Rules::Current));
}

/// A holder that dies after its business effect and before its mark: today's protocol lets the
/// takeover run the body again (the checker finds the second effect); with recover asked on the
/// takeover, no effect happens twice (but for a holder that wakes past its lease, which no store
/// can stop: fenced downstream writes and step keys are for that).
#[test]
fn recover_keeps_a_dead_holders_effect_single() {
    let started = Instant::now();
    let without = recover_bounds(false)
        .checker()
        .threads(1)
        .spawn_bfs()
        .join();
    let twice = without
        .discovery("the business effect happens at most once (but for a holder past its lease)")
        .expect("without recover, a takeover re-runs a dead holder's effect");
    let trace = twice.into_actions();
    println!("counterexample (no recover): {trace:?}");
    let effects = trace
        .iter()
        .filter(|a| matches!(a, Action::Effect(_)))
        .count();
    assert_eq!(effects, 2, "{trace:?}");
    let with = recover_bounds(true).checker().spawn_bfs().join();
    println!(
        "model check with recover: {} states ({} unique) in {:?}",
        with.state_count(),
        with.unique_state_count(),
        started.elapsed()
    );
    // Every safety property holds (the TTL never passes within these bounds, so the sweep's
    // "sometimes" cannot be reached and is not asked).
    for property in recover_bounds(true).properties() {
        if property.expectation == stateright::Expectation::Always {
            assert!(
                with.discovery(property.name).is_none(),
                "{}: {:?}",
                property.name,
                with.discovery(property.name).map(|d| d.into_actions())
            );
        }
    }
    assert!(
        with.discovery("a takeover happens").is_some(),
        "the bounds reach a takeover"
    );
}
