//! The checks run on the resharding model: the protocol with its fixes (as the code runs it)
//! holds; without any one fix, a second body runs (a trace for each); each broken rule is
//! caught; and what a holder past its lease can still do.

use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use super::*;

/// The bounds: the CI's, or with `IDEM_MODEL_BOUNDS=large` the clock to 3 ticks (a claim made
/// after the first tick can run out too).
fn bounded(model: Resharding) -> Resharding {
    match std::env::var("IDEM_MODEL_BOUNDS").as_deref() {
        Ok("large") => Resharding {
            max_tick: 3,
            ..model
        },
        _ => model,
    }
}

/// Checks `model` breadth first, its processes taken as alike, printing its state counts.
fn check(what: &str, model: &Resharding) -> impl Checker<Resharding> + use<> {
    let started = Instant::now();
    let checker = Resharding {
        symmetric: true,
        ..model.clone()
    }
    .checker()
    .spawn_bfs()
    .join();
    println!(
        "model check ({what}): {} states ({} unique) in {:?}",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed()
    );
    checker
}

/// Asserts that every property of `model` holds in `checker`, and every "sometimes" is reached.
fn holds(checker: &impl Checker<Resharding>, model: &Resharding) {
    for property in model.properties() {
        let found = checker.discovery(property.name);
        match property.expectation {
            Expectation::Sometimes => assert!(found.is_some(), "never reached: {}", property.name),
            _ => assert!(
                found.is_none(),
                "{}: {:?}",
                property.name,
                found.map(|d| d.into_actions())
            ),
        }
    }
}

/// The first counterexample to `property` the checker finds in `model` (breadth first, so a
/// short one), printed under `what`.
fn caught(what: &str, model: &Resharding, property: &'static str) -> Vec<Action> {
    let started = Instant::now();
    let checker = model
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    let trace = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{what}: no counterexample to {property:?}"))
        .into_actions();
    println!(
        "counterexample ({what}, {} states in {:?}): {trace:?}",
        checker.state_count(),
        started.elapsed()
    );
    trace
}

/// The states `actions` go through from the initial state, as long as each applies.
fn replay(model: &Resharding, actions: &[Action]) -> Vec<State> {
    let mut states = model.init_states();
    for action in actions {
        let last = states.last().expect("an initial state");
        let mut enabled = Vec::new();
        model.actions(last, &mut enabled);
        if !enabled.contains(action) {
            break;
        }
        states.push(model.next_state(last, *action).expect("an enabled action"));
    }
    states
}

/// The "always" properties `state` breaks.
fn broken(model: &Resharding, state: &State) -> Vec<&'static str> {
    model
        .properties()
        .into_iter()
        .filter(|p| p.expectation == Expectation::Always && !(p.condition)(model, state))
        .map(|p| p.name)
        .collect()
}

#[test]
fn the_routing_is_the_phase_tables() {
    let (routes, claimed_on) = routing();
    let moving = |phase| Route::Move { a: A, b: B, phase };
    assert_eq!(
        routes,
        [
            Route::One(A),
            Route::One(A),
            moving(Phase::DualOld),
            moving(Phase::DualNew),
            Route::One(B)
        ]
    );
    assert_eq!(claimed_on, [A, A, A, A, B]);
}

/// With the five fixes, every property holds over every reachable state: with recover (the
/// effect happens at most once but after a holder past its lease) and without (the body runs
/// again only where the base protocol runs it again: never after a success).
#[test]
fn the_reshard_protocol_holds_with_its_fixes() {
    for recover in [true, false] {
        let model = bounded(Resharding::new(Rules::Current, Fixes::ALL, recover));
        let checker = check(&format!("reshard, recover {recover}"), &model);
        holds(&checker, &model);
    }
}

/// A trace for each fix: the protocol with every fix but that one breaks a property at its end;
/// with all five, no state the same steps reach (as far as they apply) breaks one. The code
/// makes all five (`moving.rs`: a pair's renewal; `reshard.rs`: the copy and its watched claims).
#[test]
fn each_fix_is_needed() {
    for (fix, model, property, trace) in fix_traces() {
        let states = replay(&model, trace);
        assert_eq!(states.len(), trace.len() + 1, "{fix}: the trace applies");
        let last = states.last().expect("states");
        assert!(
            broken(&model, last).contains(&property),
            "{fix}: {property:?} holds at the end: {last:?}"
        );
        for (i, state) in states.iter().enumerate() {
            assert!(
                broken(&model, state).is_empty() || i == trace.len(),
                "{fix}: {state:?}"
            );
        }
        let fixed = Resharding {
            fixes: Fixes::ALL,
            ..model.clone()
        };
        for state in replay(&fixed, trace) {
            assert!(broken(&fixed, &state).is_empty(), "{fix}, fixed: {state:?}");
        }
        println!("without {fix}, {property:?} breaks: {trace:?}");
    }
}

/// The traces of [`each_fix_is_needed`]: the fix left out, the model, the property its trace
/// breaks, and the trace.
// table: one trace per fix, an action a line
fn fix_traces() -> [(&'static str, Resharding, &'static str, &'static [Action]); 5] {
    use Action::*;
    let without = |fix: &str| {
        let mut f = Fixes::ALL;
        match fix {
            "renew_both" => f.renew_both = false,
            "copy_waits" => f.copy_waits = false,
            "fence_out" => f.fence_out = false,
            "recheck" => f.recheck = false,
            "lost_restarts" => f.lost_restarts = false,
            other => panic!("no fix {other}"),
        }
        f
    };
    let code = |fix, recover, max_tick| Resharding {
        max_tick,
        ..Resharding::new(Rules::Current, without(fix), recover)
    };
    [
        (
            // Process 1 claims A in dual-old and stalls a lease before its claim of B comes
            // back; meanwhile process 2, still in planned, takes A over and runs. In dual-new the
            // confirming renewal goes to B first, which takes it: A's refusal is only logged.
            "renew_both",
            code("renew_both", true, 2),
            ONE_LIVE_BODY,
            &[
                Claim(0),
                Fail(0),
                Step,
                Read(1),
                Read(2),
                Step,
                Read(1),
                Claim(1),
                Tick,
                Tick,
                ClaimB(1),
                Claim(2),
                Read(2),
                Step,
                Read(1),
                Renew(1),
                Second(1),
            ],
        ),
        (
            // Process 0 fails A in dual-old; before its failure reaches B, process 2 (planned)
            // retries A and runs. The copy finds B in progress and skips the key, taking B's
            // claim for the holder of A's; B is failed, and in done process 1 retries B.
            "copy_waits",
            code("copy_waits", true, 2),
            ONE_LIVE_BODY,
            &[
                Step,
                Read(0),
                Read(1),
                Read(2),
                Step,
                Read(0),
                Claim(0),
                ClaimB(0),
                Fail(0),
                Read(1),
                Claim(2),
                Read(2),
                Step,
                Read(0),
                Read(1),
                Read(2),
                CopyRead,
                CopyClaim,
                Second(0),
                Step,
                Read(1),
                Claim(1),
            ],
        ),
        (
            // Process 0 claims A before the move and stalls past its lease. The copy stands in
            // for it on B, sees its lease ended and releases B; process 0 wakes and renews A,
            // which nobody took over, and in done process 2 takes B over and runs beside it.
            "fence_out",
            code("fence_out", true, 2),
            ONE_LIVE_BODY,
            &[
                Claim(0),
                Tick,
                Claim(1),
                Tick,
                Step,
                Read(0),
                Read(2),
                Step,
                Read(0),
                Read(2),
                Step,
                Read(0),
                Read(2),
                CopyRead,
                CopyClaim,
                WatchRead,
                Renew(0),
                WatchWrite,
                Step,
                Read(2),
                Claim(2),
            ],
        ),
        (
            // The copy reads A failed; process 1 retries A, claims B, makes its effect and
            // stalls past its lease. The copy takes B over and writes the failure it read, so in
            // done process 2 retries B (a retry asks no recover) and the effect happens again.
            "recheck",
            code("recheck", true, 2),
            NO_EFFECT_TWICE,
            &[
                Claim(0),
                Fail(0),
                Step,
                Read(1),
                Read(2),
                Step,
                Read(1),
                Read(2),
                Step,
                Read(1),
                Read(2),
                CopyRead,
                Claim(1),
                ClaimB(1),
                Tick,
                Effect(1),
                Tick,
                CopyClaim,
                CopyWrite,
                Step,
                Read(2),
                Claim(2),
                Effect(2),
            ],
        ),
        (
            // Process 2 (planned) takes A over from process 0, stalled between its claims; the
            // tool stalls too and its claim on B, standing for process 2's, lapses. Process 0's
            // claim of B comes back: it takes B. Process 2 succeeds on A; the tool's mirror of the
            // success on B is refused and the key counted as done; once process 0's claim on B
            // ends, process 1 (done) takes B over and runs again after the success.
            "lost_restarts",
            code("lost_restarts", false, 6),
            NOT_AFTER_A_SUCCESS,
            &[
                Step,
                Read(0),
                Read(1),
                Read(2),
                Step,
                Read(0),
                Claim(0),
                Tick,
                Tick,
                Read(1),
                Claim(2),
                Tick,
                Read(2),
                Step,
                Read(0),
                Read(1),
                Read(2),
                CopyRead,
                CopyClaim,
                Tick,
                ClaimB(0),
                Renew(2),
                Effect(2),
                Complete(2),
                WatchRead,
                WatchWrite,
                Renew(0),
                Second(0),
                Step,
                Tick,
                Tick,
                Read(1),
                Claim(1),
                Effect(1),
            ],
        ),
    ]
}

/// Pairs marked on A first in every phase: a holder in dual-new that dies between its two marks
/// leaves B, which done reads, in progress; once its claim ends, done takes it over and runs the
/// body again after the success on A (without recover).
#[test]
fn marks_in_one_order_are_caught() {
    let model = bounded(Resharding::new(Rules::OneOrder, Fixes::ALL, false));
    caught("marks in one order", &model, NOT_AFTER_A_SUCCESS);
}

/// `done` written without the copy: a success on A is not on B, and done runs the body again.
#[test]
fn done_without_the_copy_is_caught() {
    let model = bounded(Resharding::new(Rules::NoCopy, Fixes::ALL, true));
    let trace = caught("done without the copy", &model, NOT_AFTER_A_SUCCESS);
    assert!(!trace.contains(&Action::CopyRead));
}

/// `done` written without waiting for the claim the copy stands in for: done takes B over beside
/// the live holder of A.
#[test]
fn done_without_waiting_for_the_watched_claim_is_caught() {
    let model = bounded(Resharding::new(Rules::NoWatch, Fixes::ALL, true));
    caught("done without the wait", &model, ONE_LIVE_BODY);
}

/// No settle wait, so processes route by steps two apart: a planned process takes A over from a
/// dual-new holder that marked B and died before A, and runs the body again.
#[test]
fn views_two_steps_behind_are_caught() {
    let model = bounded(Resharding::new(Rules::NoSettle, Fixes::ALL, false));
    caught("no settle wait", &model, NOT_AFTER_A_SUCCESS);
}

/// What the fixes leave of the base protocol's exception for a holder past its lease: it can
/// still store its result on B, which it holds, after A was taken from it. The base protocol
/// refuses that mark; here the two shards then keep two results, and a replay answers one or the
/// other by the phase the caller routes by. (Its effect and the taker's both happened: the case
/// the base protocol does not cover either.)
#[test]
fn a_holder_past_its_lease_can_store_its_result_on_b() {
    use Action::*;
    let model = Resharding::new(Rules::Current, Fixes::ALL, false);
    let trace = [
        Step,
        Claim(0),
        Read(1),
        Read(2),
        Fail(0),
        Step,
        Read(1),
        Claim(1),
        ClaimB(1),
        Effect(1),
        Tick,
        Renew(1),
        Second(1),
        Tick,
        Tick,
        Claim(2),
        Read(2),
        Step,
        Read(1),
        Renew(1),
        Second(1),
        Complete(1),
        Effect(2),
        Second(1),
        Complete(2),
    ];
    let model = Resharding {
        max_tick: 3,
        ..model
    };
    let states = replay(&model, &trace);
    assert_eq!(states.len(), trace.len() + 1, "the trace applies");
    let last = states.last().expect("states");
    let results = last.recs.map(|r| {
        r.filter(|r| r.status == Status::Succeeded)
            .map(|r| r.result)
    });
    assert_eq!(results, [Some(2), Some(1)], "{last:?}");
    assert!(last.stale && last.runs == 2, "{last:?}");
    for state in &states {
        assert!(broken(&model, state).is_empty(), "{state:?}");
    }
}

/// Explores the model `IDEM_RESHARD` names (comma-separated: `none` (no fix), or fixes left out as
/// `-renew_both` …; a broken rule as `one_order`, `no_copy`, `no_watch`, `no_settle`;
/// `no_recover`; `sym`; `processes=N`, `calls=N`, `ticks=N`) up to its first counterexample,
/// and prints it.
#[test]
#[ignore]
fn explore() {
    let spec = std::env::var("IDEM_RESHARD").unwrap_or_default();
    let mut model = Resharding::new(Rules::Current, Fixes::ALL, true);
    for word in spec.split(',').filter(|w| !w.is_empty()) {
        match word.split_once('=') {
            Some(("processes", n)) => model.processes = n.parse().expect("a number"),
            Some(("calls", n)) => model.calls = n.parse().expect("a number"),
            Some(("ticks", n)) => model.max_tick = n.parse().expect("a number"),
            _ => match word {
                "none" => model.fixes = Fixes::NONE,
                "-renew_both" => model.fixes.renew_both = false,
                "-copy_waits" => model.fixes.copy_waits = false,
                "-fence_out" => model.fixes.fence_out = false,
                "-recheck" => model.fixes.recheck = false,
                "-lost_restarts" => model.fixes.lost_restarts = false,
                "one_order" => model.rules = Rules::OneOrder,
                "no_copy" => model.rules = Rules::NoCopy,
                "no_watch" => model.rules = Rules::NoWatch,
                "no_settle" => model.rules = Rules::NoSettle,
                "no_recover" => model.recover = false,
                "sym" => model.symmetric = true,
                other => panic!("{other}?"),
            },
        }
    }
    assert!(model.processes <= PROCESSES);
    let started = Instant::now();
    let checker = model
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    println!(
        "{:?} {:?} recover {} {}x{} ticks {}: {} states ({} unique) in {:?}",
        model.rules,
        model.fixes,
        model.recover,
        model.processes,
        model.calls,
        model.max_tick,
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed()
    );
    for property in model.properties() {
        if property.expectation == Expectation::Always
            && let Some(d) = checker.discovery(property.name)
        {
            println!("{}:", property.name);
            for (state, action) in d.into_vec() {
                println!("  {state:?}\n    -> {action:?}");
            }
        }
    }
}
