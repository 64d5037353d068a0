//! The checks run on the model: the current protocol holds its properties, the old rules and
//! the protocol without recover are caught, and the probe trace of a lease cut short by the TTL; for recovery points,
//! a saved step never runs again, a body without steps runs its first step again after its holder
//! died, a step with steps runs twice only when its save never landed (and downstream applies it
//! once when it deduplicates by the step key), a stale holder's save never lands, and each broken
//! store rule for saved steps is caught.

use std::time::Instant;

use stateright::{Checker, Expectation, Model};

use super::step_property::*;
use super::{
    Action, Caller, Protocol, Rules, State, Status, Step, StepRules, Steps, ci_bounds,
    recover_bounds, steps_bounds, steps_life_bounds,
};

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

/// The checker finds the bugs of the old decision order when pointed at the old rules: two bodies running under
/// live claims (the TTL cut a live lease), and a stale holder's write accepted (a fence reused
/// after a sweep); and the bug of the old mark: a success stored with the claim's expiry, already
/// expired when the body outlived its ttl.
#[test]
fn the_check_finds_the_old_lease_and_fence_bugs() {
    // Breadth first on one thread. Stateright keeps the last counterexample it meets for each
    // property, so these are not the shortest ones (`shortest` below finds those).
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

/// The probe of a lease cut short by the TTL, as a trace: attempt 1 fails at t=0, a retry takes over at t=2 (lease to 4,
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

/// Checks `model` breadth first, printing its state counts under `what`.
fn check(what: &str, model: Protocol) -> impl Checker<Protocol> {
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "model check ({what}): {} states ({} unique) in {:?}",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed()
    );
    checker
}

/// Asserts that every "always" property of `model` holds in `checker` but those named in
/// `except`, and that each "sometimes" property named in `reached` is reached.
fn holds(
    checker: &impl Checker<Protocol>,
    model: &Protocol,
    except: &[&str],
    reached: &[&'static str],
) {
    for property in model.properties() {
        if property.expectation == Expectation::Always && !except.contains(&property.name) {
            assert!(
                checker.discovery(property.name).is_none(),
                "{}: {:?}",
                property.name,
                checker.discovery(property.name).map(|d| d.into_actions())
            );
        }
    }
    for name in reached {
        assert!(checker.discovery(name).is_some(), "never reached: {name}");
    }
}

/// A shortest counterexample to `property` in `model`, printed under `what`: the checker's
/// breadth-first search keeps the last counterexample it meets, so the depth is bounded one step
/// more at a time until one is found.
fn shortest(model: &Protocol, property: &'static str, what: &str) -> Vec<(State, Option<Action>)> {
    for depth in 2..=40 {
        let checker = model
            .clone()
            .checker()
            .target_max_depth(depth)
            .spawn_bfs()
            .join();
        if let Some(path) = checker.discovery(property) {
            println!("counterexample ({what}): {:?}", path.clone().into_actions());
            return path.into_vec();
        }
    }
    panic!("{what}: no counterexample to {property:?}");
}

/// Runs `actions` from the initial state: the state before each action, and the last one.
fn replay(model: &Protocol, actions: &[Action]) -> Vec<State> {
    let mut states = model.init_states();
    for action in actions {
        let last = states.last().expect("an initial state");
        let next = model
            .next_state(last, *action)
            .unwrap_or_else(|| panic!("{action:?} applies"));
        states.push(next);
    }
    states
}

/// The two runs of `step` in a trace: each one's index in the trace and its caller.
fn two_runs(trace: &[(State, Option<Action>)], step: Step) -> [(usize, usize); 2] {
    let runs: Vec<(usize, usize)> = trace
        .iter()
        .enumerate()
        .filter_map(|(at, (_, action))| match action {
            Some(Action::Work(i, s)) if *s == step => Some((at, *i)),
            _ => None,
        })
        .collect();
    assert_eq!(runs.len(), 2, "{trace:?}");
    [runs[0], runs[1]]
}

/// The claim caller `i` holds in `state` (0 when it holds none).
fn claim_of(state: &State, i: usize) -> u32 {
    match state.callers[i] {
        Caller::InBody { claim, .. } => claim,
        _ => 0,
    }
}

/// Asserts that in `state`, just before a second run of a step by `second`, the record was taken
/// over by `second` from `first`, which died there or sits paused with its lease over, having
/// run the step and saved nothing.
fn taken_from_a_dead_or_paused_holder(state: &State, first: usize, second: usize) {
    assert_ne!(first, second, "{state:?}");
    assert!(
        matches!(&state.rec, Some(r) if r.holder == claim_of(state, second)
            && r.attempt == 2 && r.status == Status::Processing),
        "the second run is a takeover's: {state:?}"
    );
    match state.callers[first] {
        Caller::Crashed => {}
        Caller::InBody {
            lease_until,
            ran,
            saved,
            ..
        } => {
            assert!(lease_until <= state.now, "{state:?}");
            assert_ne!(ran & Step::A.bit(), 0, "{state:?}");
            assert_eq!(saved, 0, "{state:?}");
        }
        other => panic!("the first holder is {other:?}: {state:?}"),
    }
}

/// A step whose save landed is never run again by a later holder, across takeovers, retries
/// after failures (also a failure of the save itself) and new lives of the record; the record's
/// saved steps follow the store rules (kept by a takeover and a failure, dropped by a new life,
/// replaced by the result); a holder skips only steps saved in this life; a step runs again only
/// in the window between an effect and its save, or by a holder taken over.
#[test]
fn a_saved_step_never_runs_again() {
    let within_a_life = Protocol {
        save_errors: true,
        ..steps_bounds(Steps::Saved(StepRules::Store), false)
    };
    let checker = check("steps saved, save errors", within_a_life.clone());
    holds(
        &checker,
        &within_a_life,
        &[RUNS_ONCE, APPLIED_ONCE],
        &[SKIP, STALE_HOLDER_SAVES, "a takeover happens"],
    );
    let lives = steps_life_bounds(StepRules::Store);
    let checker = check("steps saved, new lives", lives.clone());
    holds(
        &checker,
        &lives,
        &[RUNS_ONCE, APPLIED_ONCE],
        &[
            SKIP,
            EXPIRES_WITH_STEPS,
            "a takeover happens",
            "a sweep then a new claim happen",
        ],
    );
}

/// A body of two plain effects (no steps): the checker finds A's effect done twice, by a takeover
/// after A's holder died (or paused) right after A. With steps, the same death after A's save
/// leaves the takeover B only.
#[test]
fn without_steps_a_takeover_runs_the_first_step_again() {
    // Bodies that never fail: the second run of A can only come from a takeover.
    let model = Protocol {
        fails: false,
        ..steps_bounds(Steps::Unsaved, false)
    };
    let trace = shortest(&model, RUNS_ONCE, "no steps");
    let [(_, first), (second_at, second)] = two_runs(&trace, Step::A);
    taken_from_a_dead_or_paused_holder(&trace[second_at].0, first, second);

    let died_after_save = [
        Action::Claim(0),
        Action::Work(0, Step::A),
        Action::Save(0, Step::A),
        Action::Crash(0),
        Action::Tick,
        Action::Tick,
        Action::Claim(1),
    ];
    let saved = steps_bounds(Steps::Saved(StepRules::Store), false);
    let last = replay(&saved, &died_after_save).pop().unwrap();
    let Caller::InBody {
        known,
        ran,
        saved: s,
        ..
    } = last.callers[1]
    else {
        panic!("{last:?}")
    };
    assert_eq!(saved.next_step(known, ran, s), Some((Step::B, false)));
    let actions = {
        let mut actions = Vec::new();
        saved.actions(&last, &mut actions);
        actions
    };
    assert!(!actions.contains(&Action::Work(1, Step::A)), "{actions:?}");
    assert!(actions.contains(&Action::Work(1, Step::B)), "{actions:?}");
}

/// With steps, modelling the window honestly: A's effect still runs twice when its first holder
/// died or paused between A's effect and A's save (the shortest counterexample is exactly that:
/// its save never landed, a takeover ran A again), or when the save itself failed (the call
/// fails, the retry runs A again); also when a holder paused before A wakes after a takeover
/// whose holder ran and saved A (no fence stops an effect, only its save). Over every path, a
/// step runs again only in those cases. With a downstream that deduplicates by the step key, no
/// effect is applied twice.
#[test]
fn with_steps_a_step_runs_twice_only_between_its_effect_and_its_save() {
    let model = steps_bounds(Steps::Saved(StepRules::Store), false);
    let checker = check("steps saved", model.clone());
    holds(&checker, &model, &[RUNS_ONCE, APPLIED_ONCE], &[]);
    let trace = shortest(&model, RUNS_ONCE, "the window");
    let [(first_at, first), (second_at, second)] = two_runs(&trace, Step::A);
    let before = &trace[second_at].0;
    assert_eq!(before.landed & Step::A.bit(), 0, "A's save never landed");
    assert!(
        !trace[first_at..second_at]
            .iter()
            .any(|(_, a)| *a == Some(Action::Save(first, Step::A))),
        "{trace:?}"
    );
    taken_from_a_dead_or_paused_holder(before, first, second);

    // A save that fails for good: the call fails, and the retry runs A again.
    let failing = Protocol {
        save_errors: true,
        ..model.clone()
    };
    let trace = shortest(&failing, RUNS_ONCE, "a failed save");
    let [(first_at, first), (second_at, _)] = two_runs(&trace, Step::A);
    assert_eq!(trace[second_at].0.landed & Step::A.bit(), 0, "{trace:?}");
    assert_eq!(
        trace[first_at + 1].1,
        Some(Action::Fail(first)),
        "{trace:?}"
    );

    // A holder paused before A, taken over: it wakes and runs A, which its successor ran and
    // saved. Its own save is refused; the effect happened.
    let paused_before_a = [
        Action::Claim(0),
        Action::Tick,
        Action::Tick,
        Action::Claim(1),
        Action::Work(1, Step::A),
        Action::Save(1, Step::A),
        Action::Work(0, Step::A),
        Action::Save(0, Step::A),
    ];
    let states = replay(&model, &paused_before_a);
    let last = states.last().unwrap();
    assert_eq!(last.runs, [2, 0]);
    assert_eq!(last.applied, [2, 0]);
    assert_eq!(last.faults, 0, "a holder taken over, not a rule broken");
    assert_eq!(last.callers[0], Caller::Done, "its save was refused");
    assert!(last.stale_effect);

    // Downstream deduplicates by the step key: A runs twice in these cases, it is applied once.
    let dedup = Protocol {
        save_errors: true,
        ..steps_bounds(Steps::Saved(StepRules::Store), true)
    };
    let last = replay(&dedup, &paused_before_a).pop().unwrap();
    assert_eq!((last.runs, last.applied), ([2, 0], [1, 0]));
    let checker = check("steps saved, downstream deduplicates", dedup.clone());
    holds(&checker, &dedup, &[RUNS_ONCE], &[SKIP]);
    assert!(checker.discovery(RUNS_ONCE).is_some());
}

/// A holder that paused past its lease and wakes after a takeover cannot save: its save is
/// refused (fenced) and it stops; the checker finds no save landing on another claim's record.
/// Without the fence, it finds one.
#[test]
fn a_stale_holders_save_never_lands() {
    let model = steps_bounds(Steps::Saved(StepRules::Store), false);
    let checker = check("steps saved, fenced", model.clone());
    holds(
        &checker,
        &model,
        &[RUNS_ONCE, APPLIED_ONCE],
        &[STALE_HOLDER_SAVES],
    );
    let late_save = [
        Action::Claim(0),
        Action::Work(0, Step::A),
        Action::Tick,
        Action::Tick,
        Action::Claim(1),
        Action::Save(0, Step::A),
    ];
    let last = replay(&model, &late_save).pop().unwrap();
    assert_eq!(last.callers[0], Caller::Done, "LeaseLost: it stops");
    assert!(matches!(&last.rec, Some(r) if r.steps == 0 && r.holder == 2));
    assert_eq!(last.landed, 0);

    let unfenced = steps_bounds(Steps::Saved(StepRules::Unfenced), false);
    let last = replay(&unfenced, &late_save).pop().unwrap();
    assert!(matches!(&last.rec, Some(r) if r.steps == Step::A.bit() && r.holder == 2));
    let trace = shortest(&unfenced, STALE_SAVE, "an unfenced save");
    let (before, Some(Action::Save(stale, _))) = &trace[trace.len() - 2] else {
        panic!("the last step is a save: {trace:?}");
    };
    assert!(
        matches!(&before.rec, Some(r) if r.holder != claim_of(before, *stale)),
        "{trace:?}"
    );
}

/// The checker finds each store rule for saved steps broken: a takeover that drops the steps (a
/// saved step runs again in the next holder), and a new life that keeps them (a holder skips a
/// step of the old life).
#[test]
fn the_steps_checks_find_broken_keep_rules() {
    let drops = steps_bounds(Steps::Saved(StepRules::TakeDrops), false);
    let trace = shortest(&drops, SAVED_NEVER_RERUN, "a takeover drops the steps");
    let [_, (second_at, second)] = two_runs(&trace, Step::A);
    assert!(
        matches!(
            trace[second_at].0.callers[second],
            Caller::InBody { known: 0, .. }
        ),
        "{trace:?}"
    );
    let keeps = steps_life_bounds(StepRules::NewLifeKeeps);
    let trace = shortest(&keeps, SKIPS_ONLY_SAVED, "a new life keeps the steps");
    let (before, Some(Action::Claim(_))) = &trace[trace.len() - 2] else {
        panic!("the last step is a claim: {trace:?}");
    };
    assert!(
        matches!(&before.rec, Some(r) if r.steps != 0 && keeps.expired(r, before.now)),
        "the record expired with its steps, then was claimed: {trace:?}"
    );
}
